"""The ``vllm`` profile's shared runs (speed path ``shared_runs``, needs ``lazy_hashing``): the
pages a request with shared blocks (a hit, a shared prefix) frees before its windows and when
it finishes, its own blocks queued as runs and only the shared ones looked at one by one.

A request's blocks from ``_exposed_to`` on are its own and unhashed (lazy hashing): nothing
else holds them, and freed they lie in the free queue as runs (the compact tables' case). Only
the blocks before it may be held by another request or hashed; the plain path
(:meth:`~kvcore.simulation.profiles.vllm.manager.KVCacheManager._remove_skipped`,
:meth:`~kvcore.simulation.profiles.vllm.manager.KVCacheManager._free`) then takes every block
of such a group through :meth:`~kvcore.simulation.profiles.vllm.block_pool.BlockPools._release`
one by one. Here a group's own part joins the run of the groups before it and its shared part
is walked once, top first (vLLM's order): a block another request still holds only drops a
holder, which leaves the queue as it is, so the groups' runs stay one entry while no shared
block enters the queue between them.

Two more speed paths for shared content live here: ``preempted_runs`` (a preempted request's
own blocks queued as runs it owns, hashed when it is next looked up:
:meth:`SharedRuns._queue_preempted`, :meth:`SharedRuns._find_hit`) and ``hit_memo`` (a request
that never ran takes the hit the last request of its prefix found, while the prefix's cached
blocks stay as they were).
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.manager import KVCacheManager
from kvcore.simulation.profiles.vllm.state import WAITING, leading_nulls

if TYPE_CHECKING:
    from collections.abc import Hashable

    from kvcore.simulation.profiles.vllm.free_queue import Pool


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class SharedRuns(KVCacheManager):
    """The window's free and the finish of tables with shared blocks (see the module
    docstring)."""

    def _remove_skipped(self, r: int, tables: list[list[int | None]], processed: int) -> None:
        """``remove_skipped_blocks``: with ``shared_runs`` on, tables that are not compact free
        their own pages as runs (:meth:`_free_before_windows`)."""
        if not self._shared_runs or self._compact[r]:
            super()._remove_skipped(r, tables, processed)
            return
        by_class = self._skipped_by_class(tables, processed)
        if by_class:
            self._free_before_windows(r, tables, by_class)

    def _own_from(self, r: int, per_page: int, first: int, end: int) -> int:
        """The first page from ``first`` to ``end`` of request ``r``'s group of ``per_page``
        tokens a page (0: a state) that is its own (see the module docstring)."""
        if not self._exposed[r]:  # nothing of it hashed or held twice yet: every page its own
            return first
        if not per_page:
            return end
        return min(end, max(first, -(-self._exposed_to[r] // per_page)))

    def _free_before_windows(
        self, r: int, tables: list[list[int | None]], by_class: dict[int, tuple[int, int]]
    ) -> None:
        """Free the pages before each window (``by_class``: per class, pages before the window
        and first held), group by group, last first: what
        :meth:`~kvcore.simulation.profiles.vllm.manager.KVCacheManager._remove_skipped` does, a
        stretch of groups' own pages (``_window_segments``: one class, pool and span) queued as
        one run."""
        hashed = self._hashed[r]
        for c, members in self._window_segments:
            if c not in by_class:
                continue
            skipped, low = by_class[c]
            mid = self._own_from(r, self.groups[members[0]].tokens_per_page, low, skipped)
            if skipped > hashed[c]:  # some page released one by one (the plain path's)
                for g in members:
                    held = tables[g][low:skipped]
                    held.reverse()
                    tables[g][low:skipped] = repeat(None, skipped - low)
                    self._release(r, g, held, skipped - 1, live=True, window=True)  # type: ignore[arg-type]
                continue
            if mid == low:  # every page its own: the stretch's pages as one run
                for g in members:
                    tables[g][low:skipped] = repeat(None, skipped - low)
                self._queue_own(r, members, c, low, skipped)
            else:
                self._free_shared_before_window(r, tables, members, (c, low, mid, skipped))

    def _free_shared_before_window(
        self,
        r: int,
        tables: list[list[int | None]],
        members: tuple[int, ...],
        pages: tuple[int, int, int, int],
    ) -> None:
        """Free pages ``low`` to ``skipped`` of request ``r``'s groups ``members`` (``pages``: their
        class, low, its first own page ``mid``, skipped), group by group, last first: the own
        pages as one run while no shared page between them enters the queue; a shared page
        drops a holder, or when it was the last, goes to the queue by itself."""
        c, low, mid, skipped = pages
        ref = self._ref
        if mid == skipped == low + 1:  # the usual step over a shared prefix: one shared page each
            group, hash_of = self.groups[members[0]], self._hash_of  # (members: one pool and span)
            pool, span = self.pools[group.pool], group.span
            for g in members:
                table = tables[g]
                block = table[low]  # (not narrowed to int: see BlockKey)
                table[low] = None
                held = ref.get(block, 1)  # no entry: one holder
                if held > 1:
                    ref[block] = held - 1
                elif block in hash_of:  # _queue_freed of a hashed block, inlined
                    ref[block] = 0
                    pool.cached_free[block] = span
                    pool.cached_span += span
                else:
                    self._queue_freed(r, g, [block], low, [0])
            return
        batch: list[int] = []  # groups whose own pages wait to be queued as one run
        for g in members:
            table = tables[g]
            shared = table[low:mid]
            table[low:skipped] = repeat(None, skipped - low)
            if mid < skipped:
                batch.append(g)
            queued: list[int] = []  # the shared pages no other request holds, last first
            for index in range(mid - low - 1, -1, -1):
                block = shared[index]
                held = ref.get(block, 1)  # no entry: one holder
                if held > 1:
                    ref[block] = held - 1
                else:
                    queued.append(index)
            if queued:
                if batch:  # the shared pages go behind the run
                    self._queue_own(r, tuple(batch), c, mid, skipped)
                    batch = []
                self._queue_freed(r, g, shared, low, queued)
        if batch:
            self._queue_own(r, tuple(batch), c, mid, skipped)

    def _drop_held(self, blocks: list[int | None]) -> list[int]:
        """Of ``blocks`` (a table's pages, none ``None``) freed last first: drop a holder of
        each that another request holds too, and return the indices, last first, of the others
        (they go to the free queue)."""
        ref = self._ref
        last: list[int] = []
        for index in range(len(blocks) - 1, -1, -1):
            held = ref.get(blocks[index], 1)  # no entry: one holder
            if held > 1:
                ref[blocks[index]] = held - 1
            else:
                last.append(index)
        return last

    def _queue_freed(self, r: int, g: int, blocks: list[int | None], low: int, indices: list[int]) -> None:
        """Queue ``blocks[i]`` (table position ``low + i`` of request ``r``'s group ``g``, below
        its hashed count) for each of ``indices`` in turn, freed before its window: a hashed
        block by itself, another as a run the request owns (hashed if it is preempted) when
        lazy hashing counts it as cached (:meth:`_lazy_runs`), else back among the uncached."""
        group, c = self.groups[g], self._class_of[g]
        pool, span, ref, hash_of = self.pools[group.pool], group.span, self._ref, self._hash_of
        thinned = c in self._thinned_classes
        kept: set[int] | None = None  # a thinned window's: the positions lazy hashing counts as cached
        for index in indices:
            block: int = blocks[index]  # type: ignore[assignment]
            if block in hash_of:
                ref[block] = 0
                pool.cached_free[block] = span
                pool.cached_span += span
                continue
            if thinned and kept is None:  # worked out once a block is not hashed (seldom)
                runs = self._lazy_runs(r, c, low, low + len(blocks))
                kept = {j for start, end in runs for j in range(start, end)}
            if kept is None or low + index in kept:
                ref.pop(block, None)
                self._queue_pending(r, (g,), low + index, 1)
            else:
                ref.pop(block, None)
                pool.uncached += span

    def _free(self, r: int, *, live: bool) -> None:
        """``KVCacheManager.free``: with ``shared_runs`` on, a finished request's tables go as
        :meth:`_finish_tables` frees them."""
        tables = self._tables[r]
        if not tables or not self._shared_runs:
            super()._free(r, live=live)
            return
        if live and self._preempted_runs:
            self._queue_preempted(r, tables)
        elif live:
            if self._compact[r]:  # each block is hashed: each needs its own id
                self._materialise(r)
            for g, table in enumerate(tables):
                self._preempt_table(r, g, table)
        else:
            self._finish_tables(r, tables)
        self._forget(r, live=live)

    def _queue_preempted(self, r: int, tables: list[list[int | None]]) -> None:
        """Free a preempted request's pages group by group, tail first (``_release`` with
        ``live``), its own pages below its hashed count queued as runs it owns, hashed only when
        it is next looked up (:meth:`_find_hit`; speed path ``preempted_runs``): only it can hit
        them, and most are evicted, by count, before it is admitted again. A compact table's
        pages need no ids for that."""
        hashed, pools = self._hashed[r], self.pools
        batch: list[int] = []  # groups in a row whose own pages go to the queue as one run
        key = (0, 0, 0, 0)  # its pool, span, pages below the hashed count and first own page
        for g, table in enumerate(tables):
            group, c = self.groups[g], self._class_of[g]
            first = leading_nulls(table)  # freed pages lead a table
            mid = self._own_from(r, group.tokens_per_page, first, len(table))
            runs = self._lazy_runs(r, c, mid, min(hashed[c], len(table)))
            # own pages above the hashed count (or a thinned window's not kept): the uncached
            kept = sum(end - start for start, end in runs)
            pools[group.pool].uncached += (len(table) - mid - kept) * group.span
            if len(runs) == 1:
                below, low = runs[0][1], runs[0][0]
                if batch and (group.pool, group.span, below, low) != key:
                    self._queue_pending(r, tuple(batch), key[2] - 1, key[2] - key[3])
                    batch = []
                batch.append(g)
                key = (group.pool, group.span, below, low)
            elif runs:  # a thinned window's own pages kept in stretches: the group alone
                if batch:
                    self._queue_pending(r, tuple(batch), key[2] - 1, key[2] - key[3])
                    batch = []
                for start, end in reversed(runs):
                    self._queue_pending(r, (g,), end - 1, end - start)
            if mid > first:  # its shared pages, behind its own
                if batch:
                    self._queue_pending(r, tuple(batch), key[2] - 1, key[2] - key[3])
                    batch = []
                shared = table[first:mid]
                shared.reverse()
                self._release(r, g, shared, mid - 1, live=True)  # type: ignore[arg-type]
        if batch:
            self._queue_pending(r, tuple(batch), key[2] - 1, key[2] - key[3])

    def _find_hit(self, r: int) -> tuple[int, list[list[int | None]] | None]:
        """``get_computed_blocks``, once the runs request ``r`` owns (see
        :meth:`_queue_preempted`) are hashed."""
        pending = self._pending[r]
        if pending:  # a waiting request's runs: it was preempted
            if self._unread_runs and self._leaves_runs_unread(r):
                return super()._find_hit(r)
            for key in pending:
                self._expand(key, r)
            self._pending[r] = []
        request = self.requests[r]
        if not (
            self._hit_memo and self._status[r] == WAITING and 0 < request.prefix_tokens < self._tokens[r]
        ):
            return super()._find_hit(r)
        # a request that never ran, longer than its shared prefix: its hit lies in the prefix
        # (nothing of its own is cached) and the search looks no further (see _find_hit), so
        # it is the last such request's while the prefix's cached blocks stay as they were
        # (a prefix's requests may share more or less of it: the memo is per length too)
        version = self._prefix_versions.get(request.prefix_id, 0)
        memo: Hashable = (request.prefix_id, request.prefix_tokens)
        known = self._prefix_hits.get(memo)
        if known is not None and known[0] == version:
            return known[1], known[2]
        hit, blocks = super()._find_hit(r)
        self._prefix_hits[memo] = (version, hit, blocks)
        return hit, blocks

    def _leaves_runs_unread(self, r: int) -> bool:
        """Whether preempted request ``r``'s lookup finds the hit it would find with its runs hashed
        (speed path ``unread_runs``), and if so mark them ``deferred`` (hashed, in their order,
        before any other block of its own content is: :meth:`_hash_own`).

        It does when none of its own content is hashed and some group of the first hit type, or
        of the second after full attention, has none of its blocks left in the runs: that type
        then hits nothing of its own content, so its length, whatever it is asked, is the one
        the shared prefix's blocks give, at most the prefix, and every length asked after it
        (the only thing that can differ with the runs hashed is the first type's length, which
        reaches the prefix either way) reads the prefix's blocks alone. It needs every hit type
        of one block, the scheduler's, and no chunked one (whose blocks before the chunk count
        as hit).
        """
        pending = tuple(self._pending[r])
        if self._unread.get(r) == pending:  # as before: the runs only lost blocks since
            return True
        types = self._hit_types
        if not types or r in self._own_hashed:
            return False
        if any(chunk or self.groups[ids[0]].tokens_per_page != self._align for _, chunk, ids in types):
            return False
        left = self._groups_left(pending)
        checked = types[:2] if types[0][0] == 0 else types[:1]  # (full attention first)
        if all(left.issuperset(ids) for _, _, ids in checked):
            return False
        for key in pending:
            run = self._runs.get(key)
            if run is not None:
                run.deferred = True
        self._unread[r] = pending
        return True

    def _groups_left(self, pending: tuple[int, ...]) -> set[int]:
        """The groups with a block left in runs ``pending`` (a request's, in queue order). The
        queue is evicted from the front, and nothing takes a block from the middle of a run
        that is not expanded, so what is left of them is what follows the first ``consumed``
        blocks of the first run not evicted whole."""
        left: set[int] = set()
        skip = -1  # blocks of the first run left evicted (-1: no run left yet)
        for key in pending:
            run = self._runs.get(key)
            if run is None:
                continue
            if skip < 0:
                skip = run.consumed
            for groups, _, count in run.segments:
                if skip >= count * len(groups):
                    skip -= count * len(groups)
                    continue
                left.update(groups[skip // count :])
                skip = 0
        return left

    def _preempt_table(self, r: int, g: int, table: list[int | None]) -> None:
        """Free a preempted request's pages of group ``g``, tail first (``_release`` with
        ``live``): its own pages above its hashed count back among the uncached, those below
        hashed now (it may hit them once admitted again) and queued, then its shared pages."""
        group, c = self.groups[g], self._class_of[g]
        first = leading_nulls(table)  # freed pages lead a table
        mid = self._own_from(r, group.tokens_per_page, first, len(table))
        runs = self._lazy_runs(r, c, mid, min(self._hashed[r][c], len(table)))
        kept = sum(end - start for start, end in runs)
        pool, span = self.pools[group.pool], group.span
        pool.uncached += (len(table) - mid - kept) * span
        # _hash of each, inlined (no shared prefix's content: no version bump)
        ref, hash_of, hashes = self._ref, self._hash_of, self._hashes[group.pool]
        held, cached_free = self._held_by_class, pool.cached_free
        for start, end in reversed(runs):
            for j in range(end - 1, start - 1, -1):
                block = table[j]  # (not narrowed to int: see BlockKey)
                key: Hashable = (g, False, r, j)  # (boxed once: a tuple local is a C struct)
                hash_of[block] = key
                holders = hashes.get(key)
                if holders is None:
                    hashes[key] = {block: None}
                    by_class: Hashable = (c, False, r, j)
                    held[by_class] = held.get(by_class, 0) + 1
                else:
                    holders[block] = None
                ref[block] = 0
                cached_free[block] = span
        pool.cached_span += kept * span
        if mid > first:
            shared = table[first:mid]
            shared.reverse()
            self._release(r, g, shared, mid - 1, live=True)  # type: ignore[arg-type]

    def _finish_tables(self, r: int, tables: list[list[int | None]]) -> None:
        """Free a finished request's pages group by group, tail first: its own pages above its
        hashed count back among the uncached, those below queued as runs (of groups in a row of
        one pool and span), then its shared pages one by one."""
        groups, hashed, of_class, pools = self.groups, self._hashed[r], self._class_of, self.pools
        # per class (one member answers for its class: the same pages held and freed): the
        # first held page, the first own page, own pages cached (lazy hashing: below the
        # hashed count) and not, and the indices from the first held page below the first own
        # one that lazy hashing counts as cached (see _lazy_runs)
        shape: list[tuple[int, int, int, int, list[tuple[int, int]]]] = []
        for c, (g, _) in enumerate(self._classes):
            table = tables[g]
            first = leading_nulls(table)  # freed pages lead a table
            mid = self._own_from(r, groups[g].tokens_per_page, first, len(table))
            below = self._lazy_count(r, c, mid, min(hashed[c], len(table)))
            lazy = [
                (low - first, high - first) for low, high in self._lazy_runs(r, c, first, min(hashed[c], mid))
            ]
            shape.append((first, mid, below, len(table) - mid - below, lazy))
        run_pool, run_span, run_count = -1, 0, 0  # own pages of groups in a row, not queued yet
        for g, table in enumerate(tables):
            group = groups[g]
            first, mid, below, above, lazy = shape[of_class[g]]
            pool = pools[group.pool]
            pool.uncached += above * group.span
            if below:
                if group.pool == run_pool and group.span == run_span:
                    run_count += below
                else:
                    if run_count:
                        self._queue_run(run_pool, run_span, run_count, -1)
                    run_pool, run_span, run_count = group.pool, group.span, below
            if mid == first:
                continue
            shared = table[first:mid]
            queued = self._drop_held(shared)
            if queued and run_count:  # the shared blocks go behind the run
                self._queue_run(run_pool, run_span, run_count, -1)
                run_pool, run_span, run_count = -1, 0, 0
            self._finish_freed(pool, group.span, shared, lazy, queued)
        if run_count:
            self._queue_run(run_pool, run_span, run_count, -1)

    def _finish_freed(
        self,
        pool: Pool,
        span: int,
        blocks: list[int | None],
        lazy: list[tuple[int, int]],
        indices: list[int],
    ) -> None:
        """A finished request's ``blocks[i]`` for each of ``indices`` in turn, which no other
        request holds: to the back of the free queue when it is hashed or its index lies in one
        of the ``lazy`` ranges (cached, see ``_lazy_runs``), else back among the uncached."""
        ref, hash_of = self._ref, self._hash_of
        for index in indices:
            block: int = blocks[index]  # type: ignore[assignment]
            if block in hash_of or any(low <= index < high for low, high in lazy):
                ref[block] = 0
                pool.cached_free[block] = span
                pool.cached_span += span
            else:
                ref.pop(block, None)
                pool.uncached += span
