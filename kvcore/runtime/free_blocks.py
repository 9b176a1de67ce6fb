"""The free block ids of one pool, and which group holds each id.

A pool of ``num_blocks`` ids hands them to groups. A group whose page is one block id takes
single ids; a group of ``blocks_per_page == s > 1`` takes aligned runs (page ``j`` is ids
``[j*s, (j+1)*s)``). Single ids come from the low end of the id space and runs from the high
end, which keeps runs free. A pool of runs of several lengths and no single ids (a
``unified_pool`` plan: each kind's page a run of rows) takes the shortest runs from the low end
instead, so that the two kinds grow towards each other. Three ways to keep the free ids, chosen by
:func:`free_blocks_for`:

- :class:`FreeBlocks` (any plan; the only one with aligned runs): a min-heap of free ids (kept
  only where a group takes single ids), and per run length a count of free ids per aligned
  chunk with a heap of fully free chunks. A single id costs ``O(log num_blocks)``; a page of an
  aligned run is taken (:meth:`FreeBlocks.take_pages`) and given back
  (:meth:`FreeBlocks.give_back_pages`) whole, in steps of the chunks it overlaps of each run
  length, not id by id. :meth:`FreeBlocks.take` and :meth:`FreeBlocks.release` are the seam a
  test replaces to break a pool on purpose (``BlockPool(plan, free_blocks=...)``): a subclass
  that overrides either sees every id go through it, one at a time, and the whole-run path
  leaves exactly the state that one does.
- :class:`MappedFreeBlocks` (lowest first, no runs): a free map, one byte per id, and the
  lowest id that may be free, so a request takes whole runs of free ids (two C scans per run)
  in the order the heap would give them.
- :class:`StackedFreeBlocks` (``lowest_first=False``, no runs): a stack, the ids freed last
  handed out first, several times faster; for callers that only count pages (the simulator).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from itertools import repeat
from typing import ClassVar, Final

#: Owner of a free id.
FREE: Final = -1
#: Owner of the plan's null block: no group, never free.
NULL_OWNER: Final = -2

#: What ``BlockPool(plan, free_blocks=...)`` takes: ``(num_blocks, {group index:
#: blocks_per_page} of the pool's groups) -> FreeBlocks``, called once per pool.
FreeBlocksFactory = Callable[[int, Mapping[int, int]], "FreeBlocks"]


def holder(owner: int) -> str:
    """How an error names a block id's owner."""
    if owner == FREE:
        return "free"
    return "the null block" if owner == NULL_OWNER else f"held by group {owner}"


class AlignedRuns:
    """Free aligned runs of one length: free ids per chunk, and a heap of full chunks (the
    highest first, or with ``lowest_first`` the lowest)."""

    def __init__(self, span: int, num_blocks: int, *, lowest_first: bool = False) -> None:
        self.span = span
        self.chunks = num_blocks // span
        self.free_in = [span] * self.chunks
        self.full = self.chunks
        self.sign = 1 if lowest_first else -1  # heap keys: k (lowest first) or -k (highest first)
        self.heap = [self.sign * k for k in range(self.chunks)]
        heapq.heapify(self.heap)

    def taken(self, block: int) -> None:
        k = block // self.span
        if k < self.chunks:
            if self.free_in[k] == self.span:
                self.full -= 1
            self.free_in[k] -= 1

    def released(self, block: int) -> None:
        k = block // self.span
        if k < self.chunks:
            self.free_in[k] += 1
            if self.free_in[k] == self.span:
                self.full += 1
                heapq.heappush(self.heap, self.sign * k)

    def taken_range(self, first: int, stop: int) -> None:
        """:meth:`taken` for every id of ``[first, stop)``, a chunk at a time."""
        span, free_in = self.span, self.free_in
        k = first // span
        last = (stop - 1) // span
        if last >= self.chunks:  # ids past the last whole chunk are in none
            last = self.chunks - 1
        while k <= last:
            end = (k + 1) * span
            before = free_in[k]
            after = free_in[k] = before - ((end if end < stop else stop) - first)
            if after < span <= before:  # an id at a time would have passed through ``span`` once
                self.full -= 1
            first, k = end, k + 1

    def released_range(self, first: int, stop: int) -> None:
        """:meth:`released` for every id of ``[first, stop)``, a chunk at a time (chunks made
        full pushed in the order id by id would push them: ascending)."""
        span, free_in = self.span, self.free_in
        k = first // span
        last = (stop - 1) // span
        if last >= self.chunks:
            last = self.chunks - 1
        while k <= last:
            end = (k + 1) * span
            before = free_in[k]
            after = free_in[k] = before + ((end if end < stop else stop) - first)
            if before < span <= after:  # an id at a time would have reached ``span`` once
                self.full += 1
                heapq.heappush(self.heap, self.sign * k)
            first, k = end, k + 1

    def pop_full(self) -> int:
        """The highest (or lowest) fully free chunk (the caller checked that one exists)."""
        while True:
            k = self.sign * heapq.heappop(self.heap)
            if self.free_in[k] == self.span:
                return k

    def compact(self) -> None:
        if len(self.heap) > 2 * self.chunks + 64:
            self.heap = [self.sign * k for k in range(self.chunks) if self.free_in[k] == self.span]
            heapq.heapify(self.heap)


class FreeBlocks:
    """The free ids of one pool as a min-heap, with aligned runs; every id one at a time.

    Args:
        num_blocks: ids in the pool.
        spans: ``{group index: blocks_per_page}`` of the groups drawing from the pool (a span
            above 1 keeps aligned runs of that length).

    Attributes:
        owner: per id, the group holding it (:data:`FREE`, or :data:`NULL_OWNER`).
        num_free: ids no group holds.
    """

    #: Whether the ids come in no particular order (a stack), so that a request's groups of
    #: one spec may take theirs together.
    any_order: ClassVar[bool] = False

    def __init__(self, num_blocks: int, spans: Mapping[int, int]) -> None:
        self.num_blocks = num_blocks
        self.spans = spans
        self.owner = [FREE] * num_blocks
        self.num_free = num_blocks
        # a min-heap (sorted) of free ids; with aligned runs it keeps ids a run took (lazily
        # cleaned), and a pool with no single-id group never pops it, so pushes nothing onto it
        self.singles = list(range(num_blocks))
        lengths = sorted({s for s in spans.values() if s > 1})
        # with no single-id group, the shortest runs take the low end that singles would, so
        # that two kinds of runs grow towards each other (unified_pool) instead of interleaving
        low = lengths[0] if len(lengths) > 1 and 1 not in spans.values() else None
        self.runs = {span: AlignedRuns(span, num_blocks, lowest_first=span == low) for span in lengths}
        # per run length, the others: a run taken whole empties its own chunk and counts theirs down
        self.other_runs = {span: [r for s, r in self.runs.items() if s != span] for span in lengths}
        # a subclass replacing the seam sees every id; else a whole run is taken and freed at once
        self.whole_runs = type(self).take is FreeBlocks.take and type(self).release is FreeBlocks.release
        self.has_singles = 1 in spans.values()

    # -- the seam: one id at a time ----------------------------------------------------------

    def take(self, block: int, group: int) -> None:
        """Hand free id ``block`` to ``group``."""
        self.owner[block] = group
        self.num_free -= 1
        for runs in self.runs.values():
            runs.taken(block)

    def release(self, block: int) -> None:
        """Make held id ``block`` free again."""
        self.owner[block] = FREE
        self.num_free += 1
        if self.has_singles:
            heapq.heappush(self.singles, block)
        for runs in self.runs.values():
            runs.released(block)

    # -- what a pool calls -------------------------------------------------------------------

    def available(self, span: int) -> int:
        """Pages of ``span`` ids that could be taken now: free ids, or fully free runs."""
        return self.num_free if span == 1 else self.runs[span].full

    def take_pages(self, group: int, count: int) -> list[int]:
        """``count`` pages for ``group`` (the caller checked :meth:`available`): the lowest
        free ids, or aligned-run indices highest first (lowest first for the shortest runs of a
        pool of runs only)."""
        span = self.spans[group]
        pages: list[int] = []
        if span == 1:
            singles, owner = self.singles, self.owner
            while len(pages) < count:
                block = heapq.heappop(singles)
                if owner[block] == FREE:
                    self.take(block, group)
                    pages.append(block)
            return pages
        runs = self.runs[span]
        if self.whole_runs:
            return self._take_whole_runs(group, span, count)
        for _ in range(count):
            chunk = runs.pop_full()
            for block in range(chunk * span, (chunk + 1) * span):
                self.take(block, group)
            pages.append(chunk)
        return pages

    def _take_whole_runs(self, group: int, span: int, count: int) -> list[int]:
        """:meth:`take_pages` of ``count`` aligned runs, each taken whole: the state :meth:`take`
        of every id would leave, its own chunk emptied and the other lengths' chunks it overlaps
        counted down at once."""
        runs, others, owner = self.runs[span], self.other_runs[span], self.owner
        free_in, fill = runs.free_in, [group] * span
        pages: list[int] = []
        for _ in range(count):
            chunk = runs.pop_full()
            first = chunk * span
            owner[first : first + span] = fill
            free_in[chunk] = 0  # it was full: pop_full checked
            for other in others:
                other.taken_range(first, first + span)
            pages.append(chunk)
        runs.full -= count
        self.num_free -= count * span
        return pages

    def take_for(self, grows: list[tuple[int, int]]) -> dict[int, list[int]] | None:
        """Take ``count`` pages for each ``(group, count)``, in that order, all or none.

        Returns:
            ``{group: pages}``, or ``None`` when some group found too few (nothing taken).
        """
        taken: dict[int, list[int]] = {}
        for group, count in grows:
            if count > self.available(self.spans[group]):  # give back what the others took
                for index, pages in taken.items():
                    self.give_back_pages({index: pages})
                return None
            taken[group] = self.take_pages(group, count)
        return taken

    def take_ids(self, count: int) -> list[int]:
        """``count`` free single ids whose owners the caller sets (the caller checked they
        exist; only a pool without aligned runs)."""
        assert not self.runs, "ids without owners are only taken where no aligned run is kept"
        pop = heapq.heappop
        ids = [pop(self.singles) for _ in range(count)]
        self.num_free -= count
        return ids

    def give_back(self, blocks: list[int]) -> None:
        """Make held ids free again (their owners cleared here)."""
        for block in blocks:
            self.release(block)
        self.compact()

    def give_back_pages(self, pages: Mapping[int, list[int]]) -> None:
        """Make the pages ``{group: pages}`` hold free again: :meth:`give_back` of the ids
        :meth:`blocks` names, in that order, with a page of an aligned run freed whole."""
        if not (self.runs and self.whole_runs):
            self.give_back([b for group, held in pages.items() for b in self.blocks(group, held)])
            return
        owner, singles, push = self.owner, self.singles, heapq.heappush
        for group, held in pages.items():
            span = self.spans[group]
            if span == 1:
                for block in held:
                    self.release(block)
                continue
            runs, others = self.runs[span], self.other_runs[span]
            free_in, heap, sign, fill = runs.free_in, runs.heap, runs.sign, [FREE] * span
            for page in held:
                first = page * span
                stop = first + span
                owner[first:stop] = fill
                before = free_in[page]
                after = free_in[page] = before + span
                if before < span <= after:  # as id by id: full once its last id is back
                    runs.full += 1
                    push(heap, sign * page)
                if self.has_singles:  # pushed as release would push them: ascending
                    list(map(push, repeat(singles, span), range(first, stop)))
                for other in others:
                    other.released_range(first, stop)
            self.num_free += span * len(held)
        self.compact()

    def hold_null(self, block: int) -> None:
        """Keep the plan's null block out of every free list, for good (and, with aligned
        runs, the run around it, as :attr:`~kvcore.KVCachePlan.reserved_blocks` counts)."""
        self.owner[block] = NULL_OWNER
        self.num_free -= 1
        self.singles.remove(block)
        for runs in self.runs.values():
            runs.taken(block)

    def compact(self) -> None:
        """Drop stale heap entries once they outnumber the ids."""
        if len(self.singles) > 2 * self.num_blocks + 64:
            self.singles = [b for b in range(self.num_blocks) if self.owner[b] == FREE]
        for runs in self.runs.values():
            runs.compact()

    def blocks(self, group: int, pages: list[int]) -> list[int]:
        """The ids ``group``'s ``pages`` cover."""
        span = self.spans[group]
        return pages if span == 1 else [b for page in pages for b in range(page * span, (page + 1) * span)]


class StackedFreeBlocks(FreeBlocks):
    """Free ids as a stack, the ids freed last handed out first (no aligned runs)."""

    any_order = True

    def __init__(self, num_blocks: int, spans: Mapping[int, int]) -> None:
        super().__init__(num_blocks, spans)
        self.singles.reverse()

    def take_pages(self, group: int, count: int) -> list[int]:
        pages = self.take_ids(count)
        list(map(self.owner.__setitem__, pages, repeat(group, count)))
        return pages

    def take_for(self, grows: list[tuple[int, int]]) -> dict[int, list[int]] | None:
        total = sum(count for _, count in grows)
        if total > self.num_free:
            return None
        ids = self.take_ids(total)
        owner, at = self.owner, 0
        taken: dict[int, list[int]] = {}
        for group, count in grows:
            pages = taken[group] = ids[at : at + count]
            list(map(owner.__setitem__, pages, repeat(group, count)))
            at += count
        return taken

    def take_ids(self, count: int) -> list[int]:
        singles = self.singles
        at = len(singles) - count
        ids = singles[at:]
        del singles[at:]
        self.num_free -= count
        return ids

    def give_back(self, blocks: list[int]) -> None:
        list(map(self.owner.__setitem__, blocks, repeat(FREE, len(blocks))))
        self.num_free += len(blocks)
        self.singles.extend(blocks)


class MappedFreeBlocks(FreeBlocks):
    """Free ids as a free map (one byte per id) and the lowest id that may be free; a request
    takes whole runs of free ids, lowest first (no aligned runs)."""

    def __init__(self, num_blocks: int, spans: Mapping[int, int]) -> None:
        super().__init__(num_blocks, spans)
        self.singles = []
        self.free_map = bytearray(b"\x01") * num_blocks
        self.low = 0

    def take_pages(self, group: int, count: int) -> list[int]:
        pages = self._take_runs(count, group)
        self.num_free -= count
        return pages

    def take_for(self, grows: list[tuple[int, int]]) -> dict[int, list[int]] | None:
        total = sum(count for _, count in grows)
        if total > self.num_free:
            return None
        taken = {group: self._take_runs(count, group) for group, count in grows}  # owners a run at a time
        self.num_free -= total
        return taken

    def take_ids(self, count: int) -> list[int]:
        ids = self._take_runs(count, None)
        self.num_free -= count
        return ids

    def give_back(self, blocks: list[int]) -> None:
        if not blocks:
            return
        list(map(self.owner.__setitem__, blocks, repeat(FREE, len(blocks))))
        self.num_free += len(blocks)
        free_map = self.free_map
        list(map(free_map.__setitem__, blocks, repeat(1, len(blocks))))
        low = min(blocks)
        if low < self.low:
            self.low = low

    def hold_null(self, block: int) -> None:
        self.owner[block] = NULL_OWNER
        self.num_free -= 1
        self.free_map[block] = 0

    def _take_runs(self, count: int, group: int | None) -> list[int]:
        """The ``count`` lowest free ids, taken run by run, owned by ``group`` unless ``None``
        (the caller checked they exist and counts them)."""
        free_map, owner, at, last = self.free_map, self.owner, self.low, self.num_blocks
        pages: list[int] = []
        need = count
        while need:
            start = free_map.find(1, at)
            stop = min(start + need, last)
            end = free_map.find(0, start, stop)  # the run ends at the first taken id, or at need
            if end < 0:
                end = stop
            pages.extend(range(start, end))
            free_map[start:end] = bytes(end - start)
            if group is not None:
                owner[start:end] = [group] * (end - start)
            need -= end - start
            at = end
        self.low = at  # every id below it is taken
        return pages


def free_blocks_for(num_blocks: int, spans: Mapping[int, int], *, lowest_first: bool) -> FreeBlocks:
    """The fastest free-id keeping for a pool: a heap with aligned runs when a group's page is
    several ids, else a stack (``lowest_first=False``) or a free map."""
    if any(span > 1 for span in spans.values()):
        return FreeBlocks(num_blocks, spans)
    return MappedFreeBlocks(num_blocks, spans) if lowest_first else StackedFreeBlocks(num_blocks, spans)
