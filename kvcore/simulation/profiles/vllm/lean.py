"""The ``vllm`` profile's lean paths (speed paths ``lean_decode`` and ``lean_finish``): a
decode's boundary call and a finished request's free over compact tables, each worked out once
per class of groups instead of group by group. Each gives what
:meth:`~kvcore.simulation.profiles.vllm.manager.KVCacheManager._allocate` and
:meth:`~kvcore.simulation.profiles.vllm.manager.KVCacheManager._free` give.
"""

from __future__ import annotations

from itertools import repeat

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.shared import SharedRuns
from kvcore.simulation.profiles.vllm.state import HELD, leading_nulls


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class LeanPaths(SharedRuns):
    """The lean boundary call and finish (see the module docstring)."""

    def _allocate_decode(self, r: int) -> bool:
        """:meth:`_allocate` of one decode token of request ``r`` with lazy hashing (no admission
        gate), with what depends on the class alone looked up once: the window's free, the fit
        check, the new pages, the blocks to cache and the next events, in :meth:`_allocate`'s
        order. Compact tables (every block its own and unhashed) have one table per class; other
        tables (a hit, a shared prefix) have a table per group, whose blocks from
        ``_exposed_to`` on are the request's own and unhashed: pages freed before a window
        there go as runs, as a compact table's do.

        It assumes what a decode's scheduling checked: ``computed + 1`` is within
        ``max_model_len``. A page before the window above the hashed count (then
        :meth:`_remove_skipped` materialises the tables) takes :meth:`_allocate` instead,
        before anything changed; pages that may be hashed or held by another request are freed
        by :meth:`_remove_skipped`.
        """
        tables, compact, computed = self._tables[r], self._compact[r], self._computed[r]
        processed = max(computed - self._in_flight[r], 0)
        freeing: dict[int, tuple[int, int]] = {}
        # short of _note_events' next free no window frees a page: nothing to look at
        if processed >= self._free_at[r]:
            found = self._lean_window_free(r, tables, processed)
            if found is None:  # released one by one: the full path materialises
                return self._allocate(r, 1, gate=False)
            freeing = found
        classes = self._decode_classes
        slots = computed + 1
        pools = self.pools
        need = [0] * len(pools)  # block ids to allocate (_to_allocate)
        take = [0] * len(pools)  # block ids taken (_take)
        grown: dict[int, int] = {}  # class -> its new pages
        grows = False
        # below _note_events' quiet bound no table grows: the loop is skipped
        for c, (g, per_page, first_retained, spans, _) in enumerate(
            classes if computed >= self._quiet[r] else ()
        ):
            table = tables[g]
            held = len(table)
            required = (slots + per_page - 1) // per_page if per_page else 1  # _pages
            if required > held:
                grown[c] = required - held
                for p, span in spans:
                    take[p] += (required - held) * span
                if first_retained is not None:  # _to_allocate: pages before the window need none
                    skipped = first_retained(computed) // per_page
                    if skipped > held:
                        held = skipped
                if required > held:
                    grows = True
                    for p, span in spans:
                        need[p] += (required - held) * span
        if grows:
            for n, pool in zip(need, pools, strict=True):
                if n > pool.uncached + pool.cached_span:  # pool.free, inlined
                    return False
        for p, ids in enumerate(take):  # _take of the compact tables, inlined
            if ids:
                pool = pools[p]
                if pool.uncached < ids:
                    self._evict(p, ids)
                pool.uncached -= ids
        if compact:
            for c, count in grown.items():
                tables[self._classes[c][0]].extend(repeat(HELD, count))
        elif grown:  # fresh ids, one holder each (_take; an id is a name, its value means nothing)
            first = self._next_id
            for c, count in grown.items():
                for g in self._classes[c][1]:
                    if count == 1:  # the usual page boundary
                        tables[g].append(first)
                    else:
                        tables[g].extend(range(first, first + count))
                    first += count
            self._next_id = first
        grew = bool(grown)
        cached = self._lean_cache(r, slots)
        # what did not change keeps its bound (a cache bound may be stale-low after
        # _update_from_output's caching, so it is noted again whenever it was reached)
        if grew or freeing or cached:
            self._note_events(r, grew=grew, freed=bool(freeing), cached=cached)
        return True

    def _lean_cache(self, r: int, slots: int) -> bool:
        """The blocks to cache of :meth:`_allocate_decode` (``_cache_blocks``); whether its
        bound was reached."""
        known = self._tokens[r]
        tokens = slots if slots < known else known
        tokens -= tokens % self._align
        # below the next block to cache (_note_events' bound) _cache_blocks hashes nothing
        if tokens < self._cache_at[r]:
            return False
        hashed, prefix = self._hashed[r], self.requests[r].prefix_tokens
        if prefix and any(
            hashes and hashed[c] < prefix // per_page
            for c, (_, per_page, _, _, hashes) in enumerate(self._decode_classes)
        ):
            self._cache_blocks(r, tokens)  # (materialising keeps the tables' shape)
        else:  # no shared prefix left to hash: lazy hashing only counts the full blocks
            for c, (_, per_page, _, _, hashes) in enumerate(self._decode_classes):
                if hashes and tokens // per_page > hashed[c]:
                    hashed[c] = tokens // per_page
        return True

    def _lean_window_free(
        self, r: int, tables: list[list[int | None]], processed: int
    ) -> dict[int, tuple[int, int]] | None:
        """The window's free of :meth:`_allocate_decode`: per class, (pages before the window,
        first held) of the pages it freed; ``None`` (nothing changed) where a page above the
        hashed count must go one by one (the full path's)."""
        hashed, compact, own_from = self._hashed[r], self._compact[r], self._exposed_to[r]
        freeing: dict[int, tuple[int, int]] = {}  # class -> (pages before the window, first held)
        exposed = False  # some page freed may be hashed or held by another request
        for c, (g, per_page, first_retained, _, _) in enumerate(self._decode_classes):
            if first_retained is None:
                continue
            table = tables[g]
            skipped = first_retained(processed) // per_page
            if skipped > len(table):
                skipped = len(table)
            if not skipped or table[skipped - 1] is None:  # freed already
                continue
            if skipped > hashed[c]:  # released one by one: the full path materialises
                return None
            low = skipped - 1  # freed pages lead a table: walk down to the first held
            while low > 0 and table[low - 1] is not None:
                low -= 1
            if not compact and low * per_page < own_from:
                exposed = True
            freeing[c] = (skipped, low)
        if exposed and self._shared_runs:  # _remove_skipped's, with the pages found here
            self._free_before_windows(r, tables, freeing)
        elif exposed:  # some pages one by one: _remove_skipped's own order
            self._remove_skipped(r, tables, processed)
        elif freeing:  # _remove_skipped's own case: each class's pages as runs, group by group
            for c, (skipped, low) in freeing.items():
                held = (self._classes[c][0],) if compact else self._classes[c][1]
                if skipped == low + 1:  # the usual step: one page each
                    for g in held:
                        tables[g][low] = None
                    continue
                for g in held:
                    tables[g][low:skipped] = repeat(None, skipped - low)
            for c, members in self._window_segments:
                if c in freeing:
                    skipped, low = freeing[c]
                    self._queue_own(r, members, c, low, skipped)
        return freeing

    def _free(self, r: int, *, live: bool) -> None:
        """:meth:`~kvcore.simulation.profiles.vllm.manager.KVCacheManager._free`, with the usual
        finish of compact tables counted per class (:meth:`_finish_compact`)."""
        if self._lean_finish and not live and self.caching and self._compact[r] and self._tables[r]:
            self._finish_compact(r)
            self._forget(r, live=False)
            return
        super()._free(r, live=live)

    def _finish_compact(self, r: int) -> None:
        """The usual finish of :meth:`_free` for compact tables (every block the request's own and
        unhashed, one table per class): each class's pages above its hashed count back among
        the uncached, those below queued group by group, counted once per class and queued
        per run of groups in a row of one pool and span (:attr:`_free_segments`)."""
        tables, hashed, pools = self._tables[r], self._hashed[r], self.pools
        below: list[int] = []  # per class: pages below the hashed count, still held
        for c, (g, _) in enumerate(self._classes):
            table = tables[g]
            first = leading_nulls(table)  # freed pages lead a table
            queued = self._lazy_count(r, c, first, min(hashed[c], len(table)))
            below.append(queued)
            for p, span in self._class_spans[c]:
                pools[p].uncached += (len(table) - first - queued) * span
        # a group with nothing below keeps the batch open, as in _free
        run_pool, run_span, run_count = -1, 0, 0
        for p, span, members in self._free_segments:
            count = sum(n * below[c] for c, n in members)
            if not count:
                continue
            if p == run_pool and span == run_span:
                run_count += count
            else:
                if run_count:
                    self._queue_run(run_pool, run_span, run_count, -1)
                run_pool, run_span, run_count = p, span, count
        if run_count:
            self._queue_run(run_pool, run_span, run_count, -1)
