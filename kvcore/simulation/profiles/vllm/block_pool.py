"""The ``vllm`` profile's block pools (``vllm/v1/core/block_pool.py``, ``BlockPool``): the free
queue, the hash table of cached blocks, taking, touching, freeing and evicting blocks.

Where the fast path keeps them otherwise than vLLM (the figures are the same, see
:mod:`~kvcore.simulation.profiles.vllm_reference.block_pool`): free blocks that hold no cached
content are interchangeable and only counted
(:class:`~kvcore.simulation.profiles.vllm.free_queue.Pool`); a request's own unhashed blocks
lie in the free queue as one entry, a :class:`~kvcore.simulation.profiles.vllm.free_queue.Run`
(lazy hashing); a block's holders are counted only once it is cached or shared (no entry: one
holder).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any, cast

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.free_queue import BlockKey, Run
from kvcore.simulation.profiles.vllm.state import VllmState

if TYPE_CHECKING:
    from collections.abc import Hashable


def is_partial(key: Hashable) -> bool:
    """Whether a hash key is a partial tail block's (see ``_cache_partial_tail``)."""
    return isinstance(key, tuple) and len(key) > 1 and key[1] == "partial"


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class BlockPools(VllmState):
    """The block pools' operations (see the module docstring), over :class:`VllmState`'s
    tables."""

    def _hash(self, p: int, block: BlockKey, key: Hashable) -> None:
        """Cache ``block`` of pool ``p`` with content ``key``."""
        self._hash_of[block] = key
        holders = self._hashes[p].get(key)
        if holders is None:
            self._hashes[p][key] = {block: None}
            self._keyed(key)
        else:
            holders[block] = None

    def _hash_own(self, r: int, p: int, block: BlockKey, key: Hashable) -> None:
        """:meth:`_hash` of request ``r``'s own content: its runs a lookup read unexpanded (see
        ``Run.deferred``) are hashed first, as they would have been at that lookup."""
        if r not in self._own_hashed:
            self._expand_deferred(r)
        self._hash(p, block, key)

    def _expand_deferred(self, r: int) -> None:
        """Hash request ``r``'s runs that a lookup read unexpanded (they lead its pending runs),
        and note that its own content is in the hash table from now on."""
        pending = self._pending[r]
        count = 0
        while count < len(pending) and self._is_deferred(pending[count]):
            self._expand(pending[count], r)
            count += 1
        del pending[:count]
        self._own_hashed.add(r)

    def _is_deferred(self, key: int) -> bool:
        run = self._runs.get(key)
        return run is None or run.deferred  # (an evicted run was read, or read nothing)

    def _unhash(self, p: int, block: int) -> None:
        """``block`` of pool ``p`` leaves the cache."""
        key = self._hash_of.pop(block)
        holders = self._hashes[p][key]
        del holders[block]
        if not holders:
            del self._hashes[p][key]
            self._unkeyed(key)
        elif cast("tuple[Any, ...]", key)[1] is True:
            self._bump(cast("tuple[Any, ...]", key)[2])

    def _keyed(self, key: Any) -> None:
        """A first block of content ``key`` (``(group, kind, owner, j)``) is cached: count it for
        the group's class (and a shared prefix's content makes a new version of it)."""
        by_class: Hashable = (self._class_of[key[0]], key[1], key[2], key[3])  # (boxed once)
        self._held_by_class[by_class] = self._held_by_class.get(by_class, 0) + 1
        if key[1] is True:
            self._bump(key[2])

    def _unkeyed(self, key: Any) -> None:
        """The last block of content ``key`` left the cache."""
        by_class: Hashable = (self._class_of[key[0]], key[1], key[2], key[3])  # (boxed once)
        left = self._held_by_class[by_class] - 1
        if left:
            self._held_by_class[by_class] = left
        else:
            del self._held_by_class[by_class]
        if key[1] is True:
            self._bump(key[2])

    def _bump(self, prefix: Hashable) -> None:
        """A new version of shared prefix ``prefix``'s cached blocks (see ``_blocked``)."""
        self._prefix_versions[prefix] = self._prefix_versions.get(prefix, 0) + 1

    def _touch(self, p: int, blocks: list[int | None]) -> None:
        """``BlockPool.touch``: a hit block leaves the free queue when nobody held it."""
        pool, ref = self.pools[p], self._ref
        for block in cast("list[object]", blocks):  # (ids not narrowed to int: see BlockKey)
            if block is None:
                continue
            held = ref.get(block, 1)  # no entry: one holder
            if held == 0:
                span = pool.cached_free.pop(block, 0)
                if span:
                    pool.cached_span -= span
                else:  # a member of an expanded run: taken from its middle
                    member = cast("int", block)
                    key = self._member_run(member)
                    run = self._runs[key]
                    run.taken.add(member)
                    run.left -= 1
                    self._hash_of[block] = run.contents[member - run.first]  # in a table now
                    pool.cached_span -= run.span
                    pool.cached_free[key] -= run.span
                    if not run.left:
                        del pool.cached_free[key], self._runs[key]
            ref[block] = held + 1

    def _evict(self, p: int, need: int) -> None:
        """Evict the oldest cached free blocks of pool ``p`` until ``need`` block ids are uncached."""
        pool = self.pools[p]
        ref, hash_of, hashes, cached_free = self._ref, self._hash_of, self._hashes[p], pool.cached_free
        runs = self._runs
        while pool.uncached < need:
            key = next(iter(cached_free))  # the front (a run partly used stays there)
            ids = cached_free[key]
            if key < 0:  # a run: as many of its blocks as the pages need, from its front
                run = runs[key]
                span = run.span
                used = -(-(need - pool.uncached) // span) * span  # whole blocks (ids is too)
                if used > ids:
                    used = ids
                pool.cached_span -= used
                pool.uncached += used
                if run.expanded:  # hashed blocks, each evicted as one
                    self._evict_members(p, run, used // span)
                run.consumed += used // span
                if used < ids:  # the rest stays at the front
                    cached_free[key] = ids - used
                else:
                    del cached_free[key], runs[key]
                continue
            del cached_free[key]
            pool.cached_span -= ids
            pool.uncached += ids
            # the block's hash goes (one freed by a finished request has none), and its count
            hashed = hash_of.pop(key, None)
            if hashed is not None:
                holders = hashes[hashed]
                del holders[key]
                if not holders:
                    del hashes[hashed]
                    self._unkeyed(hashed)
                elif cast("tuple[Any, ...]", hashed)[1] is True:
                    self._bump(cast("tuple[Any, ...]", hashed)[2])
            del ref[key]

    def _release(
        self, r: int, g: int, blocks: list[int], top: int, *, live: bool, window: bool = False
    ) -> None:
        """``BlockPool.free_blocks`` of request ``r``'s blocks of group ``g``, listed from table
        position ``top`` down: a cached block to the back of the free queue, another one back
        among the interchangeable uncached blocks at the front.

        With lazy hashing (see :meth:`_cache_blocks`) a block of the request's own below its
        hashed count is cached too: its hash is made now when the request is ``live`` (only it
        can hit its own blocks, and only once it is admitted again), else it is queued with no
        hash, and a run of such blocks as one entry of the queue (nothing can hit them; they
        keep their place). Blocks freed as they leave a ``window`` wait for the request's
        preemption to be hashed (a request that finishes unpreempted never hashes them).
        """
        group, c = self.groups[g], self._class_of[g]
        pool, span = self.pools[group.pool], group.span
        ref, hash_of, cached_free = self._ref, self._hash_of, pool.cached_free
        # blocks[lazy:] lie below the hashed count: cached, hashed or not
        lazy = max(0, top - self._hashed[r][c] + 1) if self._lazy else len(blocks)
        kept: set[int] = set()  # a thinned window's: the positions of its own blocks cached
        if self._lazy and c in self._thinned_classes:
            below = min(self._hashed[r][c], top + 1)
            kept.update(j for low, high in self._lazy_runs(r, c, 0, below) for j in range(low, high))
            lazy = len(blocks)  # the others are not cached (see _lazy_runs)
        if not live and lazy < len(blocks):
            # a finished request's own blocks (a request's own block has one holder and no hash:
            # no _ref entry, not in _hash_of) are queued as one run; a shared block still goes alone
            end = len(blocks)
            while end > lazy and blocks[end - 1] in hash_of:  # the shared prefix and hits: the lowest
                end -= 1
            run = blocks[lazy:end]
            if run and hash_of.keys().isdisjoint(run) and ref.keys().isdisjoint(run):
                self._release(r, g, blocks[:lazy], top, live=live)
                self._queue_run(group.pool, span, len(run), -1)
                self._release(r, g, blocks[end:], top - end, live=live)
                return
        for index, block in enumerate(cast("list[object]", blocks)):  # (not narrowed: see BlockKey)
            left = ref.get(block, 1) - 1  # no entry: one holder
            if left:
                ref[block] = left
            elif index >= lazy or block in hash_of or top - index in kept:
                if live and block not in hash_of:
                    if window:  # hashed if the request is preempted (_preempt), else never
                        ref.pop(block, None)
                        self._queue_pending(r, (g,), top - index, 1)
                        continue
                    self._hash_own(r, group.pool, block, (g, False, r, top - index))
                ref[block] = 0
                cached_free[block] = span
                pool.cached_span += span
            else:
                ref.pop(block, None)
                pool.uncached += span

    def _lazy_runs(self, r: int, c: int, low: int, high: int) -> list[tuple[int, int]]:
        """The table positions from ``low`` to ``high`` (below request ``r``'s hashed count) of
        class ``c`` whose blocks lazy hashing counts as cached: a freed one is hashed (or queued
        as a run) as vLLM would have hashed it when computed. Here every one; a thinned window
        keeps fewer (:class:`~kvcore.simulation.profiles.vllm.retention.SparseRetention`).

        Returns:
            Sorted, disjoint ``(low, high)`` ranges.
        """
        return [(low, high)] if low < high else []

    def _lazy_count(self, r: int, c: int, low: int, high: int) -> int:
        """How many positions of :meth:`_lazy_runs` there are."""
        if c not in self._thinned_classes:
            return high - low if low < high else 0
        return sum(end - start for start, end in self._lazy_runs(r, c, low, high))

    def _queue_own(self, r: int, groups: tuple[int, ...], c: int, low: int, high: int) -> None:
        """Queue request ``r``'s own unhashed pages ``low`` to ``high`` of ``groups`` (of class
        ``c``, one pool and span), freed before their window: those lazy hashing counts as cached
        (:meth:`_lazy_runs`) as a run it owns (:meth:`_queue_pending`), the others back among
        the uncached."""
        runs = self._lazy_runs(r, c, low, high)
        if runs == [(low, high)]:  # every page (the usual case): one segment
            self._queue_pending(r, groups, high - 1, high - low)
            return
        group = self.groups[groups[0]]
        kept = sum(end - start for start, end in runs)
        self.pools[group.pool].uncached += (high - low - kept) * group.span * len(groups)
        if len(runs) == 1:
            start, end = runs[0]
            self._queue_pending(r, groups, end - 1, end - start)
            return
        for g in groups:  # vLLM frees group by group, each last first
            for start, end in reversed(runs):
                self._queue_pending(r, (g,), end - 1, end - start)

    def _materialise(self, r: int) -> None:
        """Give request ``r``'s compact tables (see :meth:`_allocate`) one table per group
        and a fresh id per page, before a block of them is hashed or released one by one."""
        tables = self._tables[r]
        for g, shared in enumerate(tables):
            first = self._next_id
            self._next_id += len(shared)
            tables[g] = [None if block is None else first + j for j, block in enumerate(shared)]
        self._compact[r] = False

    def _queue_run(self, p: int, span: int, count: int, owner: int) -> Run:
        """Queue ``count`` blocks of ``span`` ids at the back of pool ``p``'s free queue as a run
        (see :class:`Run`), joining the run at the back when it is one of the same kind."""
        cached_free = self.pools[p].cached_free
        self.pools[p].cached_span += count * span
        if cached_free:
            last = next(reversed(cached_free))
            # why: blocks evicted by count from one entry or from two in a row are the same blocks
            run = self._runs.get(last) if last < 0 else None
            if (
                run is not None
                and run.span == span
                and run.owner == owner
                and not run.expanded
                and not run.deferred
            ):
                cached_free[last] += count * span
                return run
        key = self._next_run = self._next_run - 1
        run = self._runs[key] = Run(span, owner)
        cached_free[key] = count * span
        if owner >= 0:
            self._pending[owner].append(key)
        return run

    def _queue_pending(self, r: int, groups: tuple[int, ...], top: int, count: int) -> None:
        """Queue request ``r``'s own unhashed blocks at table positions ``top``, ``top - 1``, ...
        (``count`` of them) of each of ``groups`` in turn (one pool, one span), freed before
        their window, as a run it owns (hashed if ``r`` is preempted, see :meth:`_expand`)."""
        group = self.groups[groups[0]]
        segments = self._queue_run(group.pool, group.span, count * len(groups), r).segments
        last = segments[-1] if segments else None
        if last is not None and len(groups) == 1 and last[0] == groups and last[1] - last[2] == top:
            last[2] += count  # the next positions down of the same group
        else:
            segments.append([groups, top, count])

    def _expand(self, key: int, r: int) -> None:
        """Hash the blocks left in request ``r``'s run ``key`` (``r`` is preempted: it may hit them
        once admitted again), each its own member of the run, in the run's order."""
        run = self._runs.get(key)
        if run is None:  # evicted whole
            return
        run.first = run.front = self._next_id
        skip = run.consumed
        for groups, top, count in run.segments:
            for g in groups:
                if skip >= count:
                    skip -= count
                    continue
                self._hash_members(run.contents, g, r, range(top - skip, top - count, -1))
                skip = 0
        run.left = len(run.contents)
        self._member_firsts.append(run.first)  # ids only grow: the list stays sorted
        self._member_runs.append(key)
        run.owner = -1
        run.segments = []
        self._own_hashed.add(r)

    def _hash_members(self, contents: list[Hashable], g: int, r: int, positions: range) -> None:
        """Hash request ``r``'s own blocks of group ``g`` at table ``positions``, each a fresh id
        (the freed one is in no table any more), the next members of a run, their contents
        appended to its ``contents`` (:meth:`_hash` of each, inlined, with no ``_hash_of`` entry
        while it is a member: a request's own content makes no version of a shared prefix)."""
        hashes, held = self._hashes[self.groups[g].pool], self._held_by_class
        ref, c = self._ref, self._class_of[g]
        block = self._next_id
        for j in positions:
            key = cast("object", block)  # boxed once (see BlockKey)
            content: Hashable = (g, False, r, j)  # (boxed once: a tuple local is a C struct)
            contents.append(content)
            holders = hashes.get(content)
            if holders is None:
                hashes[content] = {key: None}
                by_class: Hashable = (c, False, r, j)
                held[by_class] = held.get(by_class, 0) + 1
            else:
                holders[key] = None
            ref[key] = 0
            block += 1
        self._next_id = block

    def _evict_members(self, p: int, run: Run, count: int) -> None:
        """Evict the first ``count`` members left of an expanded run of pool ``p`` (:meth:`_unhash`
        of each, inlined: a run holds a request's own content, which makes no version)."""
        hashes, held, ref, of_class = self._hashes[p], self._held_by_class, self._ref, self._class_of
        block, first, contents, taken = run.front, run.first, run.contents, run.taken
        for _ in range(count):
            while taken and block in taken:  # taken from the middle by a hit: not in the queue
                taken.discard(block)
                block += 1
            key = cast("object", block)  # boxed once (see BlockKey)
            content = contents[block - first]
            holders = hashes[content]
            del holders[key]
            if not holders:
                del hashes[content]
                g, _, owner, j = cast("tuple[int, bool, int, int]", content)
                by_class: Hashable = (of_class[g], False, owner, j)
                left = held[by_class] - 1
                if left:
                    held[by_class] = left
                else:
                    del held[by_class]
            del ref[key]
            block += 1
        run.front = block
        run.left -= count

    def _member_run(self, block: int) -> int:
        """The key of the expanded run whose members include ``block`` (the last to start at or
        below it: fresh ids only grow)."""
        return self._member_runs[bisect_right(self._member_firsts, block) - 1]

    def _content_of(self, block: int) -> Hashable | None:
        """The content ``block`` is cached with, if any (a member of an expanded run has no
        ``_hash_of`` entry until a hit takes it)."""
        content = self._hash_of.get(block)
        if content is not None or not self._member_firsts or block < self._member_firsts[0]:
            return content
        run = self._runs.get(self._member_run(block))
        if run is None or block < run.front or block in run.taken or block >= run.first + len(run.contents):
            return None
        return run.contents[block - run.first]
