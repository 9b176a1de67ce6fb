"""The ``vllm`` profile's KV-cache manager (``vllm/v1/core/kv_cache_manager.py``,
``KVCacheManager``): ``allocate_slots`` with its admission gate, ``remove_skipped_blocks`` of
windowed groups, ``free``, and ``get_new_blocks``; and the event bounds (when a request's
tables next change) that let a decode short of them skip the manager.
"""

from __future__ import annotations

from itertools import repeat
from typing import cast

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.prefix_cache import PrefixCache
from kvcore.simulation.profiles.vllm.state import HELD, NEVER, WAITING, leading_nulls
from kvcore.simulation.profiles.vllm_groups import ManagerGroup, pages as _pages


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class KVCacheManager(PrefixCache):
    """The KV-cache manager's operations (see the module docstring)."""

    def _note_events(self, r: int, *, grew: bool = True, freed: bool = True, cached: bool = True) -> None:
        """When request ``r``'s tables next change: the slots that take a new page in some group
        (less one, and at most ``max_model_len - 1``: ``_quiet``), the processed tokens that
        free a page before a window (``_free_at``) and the tokens that complete a block to cache
        (``_cache_at``).

        Args:
            grew, freed, cached: which may have changed since they were last noted (a table's
                length, the pages freed before a window, the blocks counted as cached); the
                others are kept.

        With the speed path ``event_bounds`` off, every bound is 0: every step of every request
        takes the manager's path.
        """
        if not self._event_bounds:
            self._quiet[r] = self._free_at[r] = self._cache_at[r] = 0
            return
        grow = free = cache = NEVER
        table_of, hashed, align = self._tables[r], self._hashed[r], self._align
        freeing = self._freeing
        for c, (g, per_page, first_retained, _, hashes) in enumerate(self._decode_classes):
            table = table_of[g]  # one member answers for its class
            if not per_page:
                if not table:
                    grow = min(grow, 1)
                continue
            if grew:
                grow = min(grow, len(table) * per_page + 1)
            if freed and first_retained is not None:
                # the pages freed before the window: a table's None entries lead it (freed from
                # the start, hits from a window's end), so their count is the first block's index
                target = (leading_nulls(table) + 1) * per_page
                known = freeing.get((g, target))
                free = min(free, self._first_freeing(g, target) if known is None else known)
            if cached and hashes:
                # tokens are cached in multiples of the scheduler block
                cache = min(cache, -(-(hashed[c] + 1) * per_page // align) * align)
        if grew:
            # a decode computing below quiet takes no page and stays within max_model_len
            self._quiet[r] = min(grow, self.max_model_len) - 1
        if freed:
            self._free_at[r] = free
        if cached:
            self._cache_at[r] = cache

    def _first_freeing(self, g: int, target: int) -> int:
        """The fewest processed tokens whose first retained token in group ``g`` is at least
        ``target`` (the count is non-decreasing in the tokens: a binary search, memoized), or
        never."""
        known = self._freeing.get((g, target))
        if known is None:
            known = self._freeing[g, target] = self._search_freeing(self.groups[g], target)
        return known

    def _search_freeing(self, group: ManagerGroup, target: int) -> int:
        first = group.spec.first_retained_token
        low, high = target, self.max_model_len + 1
        if first(high) < target:
            return NEVER
        while low < high:
            middle = (low + high) // 2
            if first(middle) >= target:
                high = middle
            else:
                low = middle + 1
        return low

    def _allocate(
        self,
        r: int,
        new: int,
        *,
        gate: bool,
        hit: int = 0,
        hit_blocks: list[list[int | None]] | None = None,
    ) -> bool:
        """``KVCacheManager.allocate_slots`` for ``new`` tokens after ``hit`` cached ones; granted,
        when the tables next change is noted (:meth:`_note_events`: a decode short of it needs
        no call, see :meth:`_schedule`)."""
        groups, pools = self.groups, self.pools
        tables = self._tables[r]
        self._evictable = None  # (see _to_allocate)
        if hit and self._compact[r]:  # admitted with a hit after a try without: hit blocks have ids
            tables.clear()
        if not tables:
            if self._lazy and not hit and self._compact_tables:
                # compact tables: while every block is the request's own and unhashed, a block's
                # id means nothing (runs count them, a preemption hashes fresh ids): the members
                # of a class share one table, as without caching, until _materialise
                shared: list[list[int | None]] = [[] for _ in self._classes]
                tables.extend(shared[c] for c in self._class_of)
                self._compact[r] = True
            else:
                tables.extend([] for _ in groups)
                self._compact[r] = False
            self._hashed[r] = [0] * len(self._classes)
            self._exposed_to[r] = self.requests[r].prefix_tokens
        computed = min(self._computed[r] + hit, self.max_model_len)
        if gate:
            whole = min(self._tokens[r], self.max_model_len)
            need = self._to_allocate(tables, whole, hit_blocks, computed, cap=True)
            if any(n > pool.free for n, pool in zip(need, pools, strict=True)):
                if self._gate_memo and self._status[r] == WAITING:
                    version = self._prefix_versions.get(self.requests[r].prefix_id, 0)
                    self._blocked[r] = (need, version)  # (see _blocked)
                return False
        if self._windowed:
            self._remove_skipped(r, tables, max(0, computed - self._in_flight[r]))
        slots = min(computed + new, self.max_model_len)
        need = self._to_allocate(tables, slots, hit_blocks, computed, cap=False)
        if any(n > pool.free for n, pool in zip(need, pools, strict=True)):
            return False
        if hit_blocks is not None and hit:
            for g, group in enumerate(groups):
                self._touch(group.pool, hit_blocks[g])
                tables[g].extend(hit_blocks[g])
            self._exposed[r] = True
            if hit > self._exposed_to[r]:
                self._exposed_to[r] = hit
            # the hit blocks are cached (under their full hash): _cache_blocks, which counts
            # them as cached below, need not look at them one by one
            hashed = self._hashed[r]
            for c, (g, _) in enumerate(self._classes):
                per_page = groups[g].tokens_per_page
                if per_page and hit // per_page > hashed[c]:
                    hashed[c] = hit // per_page
        pages = [_pages(groups[g], slots) - len(tables[g]) for g, _ in self._classes]
        if not self.caching:
            # no block is shared or cached, so an id means nothing: one table per class, and
            # the pools count every member's pages
            for c, (g, _) in enumerate(self._classes):
                if pages[c] > 0:
                    for p, span in self._class_spans[c]:
                        pools[p].uncached -= pages[c] * span
                    tables[g].extend(repeat(HELD, pages[c]))
        elif any(n > 0 for n in pages):
            self._take(tables, pages, compact=self._compact[r])
        if self.caching:
            self._cache_blocks(r, min(computed + new, self._tokens[r]))
        self._note_events(r)
        return True

    def _to_allocate(
        self,
        tables: list[list[int | None]],
        tokens: int,
        hit_blocks: list[list[int | None]] | None,
        computed: int,
        *,
        cap: bool,
    ) -> list[int]:
        """``get_num_blocks_to_allocate`` summed over the groups: block ids per pool."""
        groups = self.groups
        need = [0] * len(self.pools)
        for c, (g, _) in enumerate(self._classes):
            group, table = groups[g], tables[g]
            required = _pages(group, tokens)
            if cap and group.cap is not None:
                required = min(required, group.cap)
            skipped = 0
            if group.windowed:
                skipped = group.spec.first_retained_token(computed) // group.tokens_per_page
            hits = len(hit_blocks[g]) if hit_blocks is not None else 0  # one length in a class
            pages = max(required - max(skipped, hits + len(table)), 0)
            if pages:
                for p, span in self._class_spans[c]:
                    need[p] += pages * span
        if hit_blocks is not None:
            # the gate's call and the slots' count the same blocks (nothing is freed between
            # them: a request with hit blocks has no pages yet), so the second reads the first's
            known = self._evictable
            if known is None or known[0] is not hit_blocks or known[1] != computed:
                counts = self._evictable_need(tables, hit_blocks, computed)
                known = self._evictable = (hit_blocks, computed, counts)
            for p, ids in enumerate(known[2]):
                need[p] += ids
        return need

    def _evictable_need(
        self, tables: list[list[int | None]], hit_blocks: list[list[int | None]], computed: int
    ) -> list[int]:
        """Block ids per pool of the cached hit blocks nobody holds (each leaves the free queue
        when taken), from each window's first retained page on."""
        groups, ref = self.groups, self._ref
        need = [0] * len(self.pools)
        for g, ids in self._classes:
            group = groups[g]
            if not hit_blocks[g]:  # one length in a class
                continue
            skipped = 0
            if group.windowed:
                skipped = group.spec.first_retained_token(computed) // group.tokens_per_page
            start = max(0, skipped - len(tables[g]))
            for i in ids:
                evictable = 0
                # why a plain loop: compiled, it is native (a map's calls are not); a null block,
                # None, has no entry (ids stay objects: see BlockKey)
                for block in hit_blocks[i][start:]:
                    if ref.get(block, 1) == 0:
                        evictable += 1
                need[groups[i].pool] += evictable * groups[i].span
        return need

    def _remove_skipped(self, r: int, tables: list[list[int | None]], processed: int) -> None:
        """``remove_skipped_blocks`` of every windowed group: free the pages before the window,
        last first."""
        groups = self.groups
        by_class = self._skipped_by_class(tables, processed)
        if not by_class:
            return
        hashed = self._hashed[r]
        if self._compact[r]:
            if all(skipped <= hashed[c] for c, (skipped, _) in by_class.items()):
                # one table per class, every block its own and below the hashed count: each
                # class's pages to the back of the queue as runs, group by group
                for c, (skipped, low) in by_class.items():
                    tables[self._classes[c][0]][low:skipped] = repeat(None, skipped - low)
                for c, members in self._window_segments:
                    if c in by_class:
                        skipped, low = by_class[c]
                        self._queue_own(r, members, c, low, skipped)
                return
            self._materialise(r)  # some block goes back among the uncached one by one (_release)
        # in group order: the order vLLM frees them in
        freeing = sorted(
            (i, *by_class[c]) for c, (_, ids) in enumerate(self._classes) if c in by_class for i in ids
        )
        ref, hash_of, lazy = self._ref, self._hash_of, self._lazy
        own = lazy and not self._exposed[r]  # every block is the request's own, unhashed
        batch: list[int] = []  # groups in a row whose blocks go to the queue as one run
        # its pool, span, pages before and after the window, class
        batch_key: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
        for g, skipped, low in freeing:
            table = tables[g]
            if (
                lazy
                and skipped <= hashed[self._class_of[g]]
                and (
                    own
                    or (
                        ref.keys().isdisjoint(table[low:skipped])
                        and hash_of.keys().isdisjoint(table[low:skipped])
                    )
                )
            ):
                # the usual case: the request's own blocks, unhashed and below its hashed count,
                # all to the back of the queue (what _release does block by block)
                if table[low] is not None:  # a compact table is its class's: freed once
                    table[low:skipped] = repeat(None, skipped - low)
                key = (groups[g].pool, groups[g].span, skipped, low, self._class_of[g])
                if batch and key != batch_key:
                    self._queue_own(r, tuple(batch), batch_key[4], batch_key[3], batch_key[2])
                    batch = []
                batch.append(g)
                batch_key = key
                continue
            if batch:
                self._queue_own(r, tuple(batch), batch_key[4], batch_key[3], batch_key[2])
                batch = []
            held = cast("list[int]", table[low:skipped])  # pages still held: no None among them
            held.reverse()  # last first
            table[low:skipped] = repeat(None, skipped - low)
            self._release(r, g, held, skipped - 1, live=True, window=True)
        if batch:
            self._queue_own(r, tuple(batch), batch_key[4], batch_key[3], batch_key[2])

    def _skipped_by_class(self, tables: list[list[int | None]], processed: int) -> dict[int, tuple[int, int]]:
        """Per windowed class with pages before its window still held: (pages before the window,
        first held page). Without caching those pages are freed here at once, and no class is
        returned for it."""
        groups = self.groups
        by_class: dict[int, tuple[int, int]] = {}  # class -> (pages before the window, first held)
        for c, (g, _) in enumerate(self._classes):
            group, table = groups[g], tables[g]
            if not group.windowed:
                continue
            skipped = min(group.spec.first_retained_token(processed) // group.tokens_per_page, len(table))
            if not skipped or table[skipped - 1] is None:  # every member has freed them
                continue
            if self.caching:
                low = skipped - 1  # the lowest page still held: the same in every member
                while low > 0 and table[low - 1] is not None:
                    low -= 1
                by_class[c] = (skipped, low)
                continue
            count = 0  # without caching: the class's one table (see _allocate)
            for i in range(skipped - 1, -1, -1):
                if table[i] is None:
                    break
                table[i] = None
                count += 1
            for p, span in self._class_spans[c]:
                self.pools[p].uncached += count * span
        return by_class

    def _free(self, r: int, *, live: bool) -> None:
        """``KVCacheManager.free``: every group's pages, group by group, tail first (``live``:
        the request may come back, preempted, and hit its own blocks)."""
        tables = self._tables[r]
        if not tables:
            pass
        elif self.caching:
            if live and self._compact[r]:  # released block by block: each needs its own id
                self._materialise(r)
            ref, hash_of, hashed, groups = self._ref, self._hash_of, self._hashed[r], self.groups
            own = self._lazy and not self._exposed[r]  # every block is the request's own, unhashed
            own_from = self._exposed_to[r]  # with lazy hashing, blocks from there on are its own
            # runs of groups in a row of one pool and span: queued as one (the second would join
            # the first at the back of the queue): pool, span, blocks
            run_pool, run_span, run_count = -1, 0, 0
            for g, table in enumerate(tables):
                if (
                    not live
                    and self._lazy
                    and (
                        own
                        or leading_nulls(table) * groups[g].tokens_per_page >= own_from
                        or (ref.keys().isdisjoint(table) and hash_of.keys().isdisjoint(table))
                    )
                ):
                    # the usual finish: the request's own blocks only, those above its hashed
                    # count back among the uncached, those below as one run (as _release does)
                    group = groups[g]
                    first = leading_nulls(table)  # freed pages lead a table
                    below = self._lazy_count(
                        r, self._class_of[g], first, min(hashed[self._class_of[g]], len(table))
                    )
                    self.pools[group.pool].uncached += (len(table) - first - below) * group.span
                    if below:
                        if group.pool == run_pool and group.span == run_span:
                            run_count += below
                        else:
                            if run_count:
                                self._queue_run(run_pool, run_span, run_count, -1)
                            run_pool, run_span, run_count = group.pool, group.span, below
                    continue
                if run_count:  # queued before this group's blocks
                    self._queue_run(run_pool, run_span, run_count, -1)
                    run_pool, run_span, run_count = -1, 0, 0
                self._release(r, g, [b for b in reversed(table) if b is not None], len(table) - 1, live=live)
            if run_count:
                self._queue_run(run_pool, run_span, run_count, -1)
        else:  # the class's one table (see _allocate)
            for c, (g, _) in enumerate(self._classes):
                held = len(tables[g]) - leading_nulls(tables[g])
                for p, span in self._class_spans[c]:
                    self.pools[p].uncached += held * span
        self._forget(r, live=live)

    def _forget(self, r: int, *, live: bool) -> None:
        """What :meth:`_free` leaves of request ``r``: no tables, and (``live`` false: it
        finished) no runs that wait for its preemption to be hashed."""
        self._tables[r] = []
        self._hashed[r] = []
        self._exposed[r] = self._compact[r] = False
        if not live:  # finished: nothing will hash its runs
            for key in self._pending[r]:
                run = self._runs.get(key)
                if run is not None:
                    run.owner = -1
                    run.segments = []
            self._pending[r] = []
            self._unread.pop(r, None)
        self._quiet[r] = self._cache_at[r] = 0  # the next allocation takes the full path

    def _take(self, tables: list[list[int | None]], pages: list[int], *, compact: bool) -> None:
        """``BlockPool.get_new_blocks`` for ``pages[c]`` new pages of every group of class ``c``:
        uncached blocks first, then the oldest cached ones (their hashes evicted).

        vLLM takes group by group, each evicting from the front of the queue while the uncached
        blocks fall short of its pages; together that evicts the shortest front of the queue
        that covers every group's pages, so each pool evicts once for all of them.
        """
        pools = self.pools
        need = [0] * len(pools)  # block ids per pool, every class's together
        for c, spans in enumerate(self._class_spans):
            if pages[c] > 0:
                for p, span in spans:
                    need[p] += pages[c] * span
        for p, ids in enumerate(need):
            if ids:
                pool = pools[p]
                if pool.uncached < ids:  # why once: class by class evicts the same front
                    self._evict(p, ids)
                pool.uncached -= ids
        if compact:  # one shared table per class (see _allocate)
            for c, (g, _) in enumerate(self._classes):
                if pages[c] > 0:
                    tables[g].extend(repeat(HELD, pages[c]))
            return
        of_class = self._class_of
        for g in range(len(self.groups)):  # fresh ids, one holder each (no _ref entry)
            count = pages[of_class[g]]
            if count > 0:
                first = self._next_id
                self._next_id = first + count
                tables[g].extend(range(first, first + count))
