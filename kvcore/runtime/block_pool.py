"""The block-id pool a scheduler drives with a plan: one pool shared by every group.

A plan has ``num_blocks`` block ids. A block id belongs to at most one group at a time, which is
what lets groups share bytes (see :mod:`kvcore.plan`). A group's *page* is what its block-table
entries name and what a layer's view indexes along its block dimension:

- a group with ``blocks_per_page == 1`` (attention) takes single block ids; page ``j`` is block
  id ``j``;
- a group with ``blocks_per_page == s > 1`` (a large per-request state) takes aligned runs:
  page ``j`` is block ids ``[j*s, (j+1)*s)``.

To keep aligned runs available, single blocks are taken from the low end of the id space and runs
from the high end. Free runs are tracked per run length with a count of free ids per aligned
chunk and a heap of fully free chunks, so every operation costs ``O(log num_blocks)`` per block.

On top of that the pool keeps one block table per request and group (:meth:`BlockPool.reserve`,
:meth:`BlockPool.release_stale`, :meth:`BlockPool.free_request`). What a request holds comes
from its group's spec, :meth:`~kvcore.KVCacheSpec.live_pages`, the same method the planner's
worst case (:meth:`~kvcore.KVCacheSpec.max_num_blocks`) reads: ``reserve`` grows a table to
``live_pages(...).stop`` entries and ``release_stale`` frees the entries before
``live_pages(...).start``. For a token-paged kind, entry ``k`` is the page holding the
request's tokens ``[k*B, (k+1)*B)`` (``B`` the group's block size), or :data:`NULL_PAGE` once
those tokens fell out of a sliding window or chunk and the page was freed; a state group's
table has one entry; a kind with a fixed per-request size (cross attention over an encoder
output) has all its entries from the first token on.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from typing import Final

from kvcore.errors import BlockPoolExhaustedError, InvalidInputError
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.validators import check_int

#: Block-table entry of a page that was freed because no later token reads it.
NULL_PAGE: Final = -1
_FREE: Final = -1


class _Runs:
    """Free aligned runs of one length: free ids per chunk, and a max-heap of full chunks."""

    def __init__(self, span: int, num_blocks: int) -> None:
        self.span = span
        self.chunks = num_blocks // span
        self.free_in = [span] * self.chunks
        self.full = self.chunks
        self.heap = [-k for k in range(self.chunks)]
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
                heapq.heappush(self.heap, -k)

    def pop_full(self) -> int:
        """The highest fully free chunk (the caller checked that one exists)."""
        while True:
            k = -heapq.heappop(self.heap)
            if self.free_in[k] == self.span:
                return k

    def compact(self) -> None:
        if len(self.heap) > 2 * self.chunks + 64:
            self.heap = [-k for k in range(self.chunks) if self.free_in[k] == self.span]
            heapq.heapify(self.heap)


class BlockPool:
    """Block ids of a plan, handed to groups and tracked per request.

    Args:
        plan: the plan whose ``num_blocks`` and groups the pool serves.
    """

    def __init__(self, plan: KVCachePlan) -> None:
        self.plan = plan
        self.groups: tuple[KVCacheGroup, ...] = plan.groups
        self.num_blocks: int = plan.num_blocks
        self._owner = [_FREE] * plan.num_blocks
        self._num_free = plan.num_blocks
        self._singles = list(range(plan.num_blocks))  # a min-heap (sorted), lazily cleaned
        self._runs = {
            span: _Runs(span, plan.num_blocks)
            for span in sorted({g.blocks_per_page for g in plan.groups if g.blocks_per_page > 1})
        }
        self._tables: dict[Hashable, list[list[int]]] = {}
        self._tokens: dict[Hashable, int] = {}
        self._computed: dict[Hashable, int] = {}  # the largest num_computed_tokens released
        self._released: dict[Hashable, list[int]] = {}

    # -- pages of a group ------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Block ids no group holds."""
        return self._num_free

    def num_free_pages(self, group: int) -> int:
        """Pages ``group`` could take now: free ids, or fully free aligned runs."""
        span = self._group(group).blocks_per_page
        return self._num_free if span == 1 else self._runs[span].full

    def blocks_of(self, group: int, page: int) -> range:
        """The block ids page ``page`` of ``group`` covers."""
        span = self._group(group).blocks_per_page
        return range(page * span, (page + 1) * span)

    def owner(self, block: int) -> int | None:
        """The group holding block id ``block``, or ``None`` when it is free."""
        group = self._owner[block]
        return None if group == _FREE else group

    def allocate(self, group: int, num_pages: int) -> list[int]:
        """Take ``num_pages`` pages for ``group``, all or none.

        Args:
            group: index of the group in the plan.
            num_pages: pages to take.

        Returns:
            The pages (block-table entries): block ids for single-block pages (lowest first),
            aligned-run indices for larger pages (highest first).

        Raises:
            BlockPoolExhaustedError: too few free ids (or free aligned runs); nothing was taken.
        """
        g = self._group(group)
        span = g.blocks_per_page
        if num_pages > self.num_free_pages(group):
            raise self._exhausted(group, num_pages)
        pages: list[int] = []
        if span == 1:
            while len(pages) < num_pages:
                block = heapq.heappop(self._singles)
                if self._owner[block] == _FREE:
                    self._take(block, group)
                    pages.append(block)
        else:
            runs = self._runs[span]
            for _ in range(num_pages):
                chunk = runs.pop_full()
                for block in range(chunk * span, (chunk + 1) * span):
                    self._take(block, group)
                pages.append(chunk)
        return pages

    def free(self, group: int, pages: Iterable[int]) -> None:
        """Give ``group``'s ``pages`` back to the pool.

        Raises:
            InvalidInputError: a page is out of range or not held by ``group``; nothing was freed.
        """
        pages = list(pages)
        for page in pages:
            if not 0 <= page < self.plan.num_pages(self._group(group)):
                raise InvalidInputError(
                    f"page {page} is out of range for group {group}, which has "
                    f"{self.plan.num_pages(self.groups[group])} pages"
                )
            for block in self.blocks_of(group, page):
                if self._owner[block] != group:
                    held = "free" if self._owner[block] == _FREE else f"held by group {self._owner[block]}"
                    raise InvalidInputError(
                        f"cannot free page {page} of group {group}: block id {block} is {held}, "
                        "not held by that group (freed twice?)"
                    )
        if len(set(pages)) != len(pages):
            raise InvalidInputError(f"cannot free the same page twice in one call (got {pages})")
        for page in pages:
            for block in self.blocks_of(group, page):
                self._release(block)
        self._compact()

    # -- requests --------------------------------------------------------------------------

    @property
    def requests(self) -> tuple[Hashable, ...]:
        """The requests holding pages, in arrival order."""
        return tuple(self._tables)

    def num_tokens(self, request_id: Hashable) -> int:
        """Tokens the request's tables cover (the largest ``num_tokens`` reserved)."""
        self._check_request(request_id)
        return self._tokens[request_id]

    def block_table(self, request_id: Hashable, group: int) -> list[int]:
        """A copy of the request's block table for ``group`` (``NULL_PAGE`` where freed)."""
        self._check_request(request_id)
        return list(self._tables[request_id][self._index(group)])

    def live_pages(self, request_id: Hashable, group: int) -> list[int]:
        """The pages the request holds in ``group`` now (its table without freed entries)."""
        return [page for page in self.block_table(request_id, group) if page != NULL_PAGE]

    def blocks_needed(self, group: int, num_tokens: int) -> int:
        """Block ids ``group`` holds at most for a request of ``num_tokens`` tokens.

        From the spec (``max_num_blocks`` times ``blocks_per_page``), with the plan's step size:
        what a scheduler reserves to admit such a request without preemption.
        """
        context = self.plan.context.with_max_model_len(num_tokens)
        return self._group(group).blocks_per_request(context)

    def new_blocks_needed(self, request_id: Hashable, num_tokens: int) -> int:
        """Block ids :meth:`reserve` would take to cover ``num_tokens`` tokens now."""
        tables = self._tables.get(request_id)
        released = self._released.get(request_id)
        computed = self._computed.get(request_id, 0)
        total = 0
        for index, group in enumerate(self.groups):
            start = max(len(tables[index]) if tables else 0, released[index] if released else 0)
            want = self._live(group, num_tokens, computed).stop
            total += max(0, want - start) * group.blocks_per_page
        return total

    def reserve(self, request_id: Hashable, num_tokens: int) -> dict[int, list[int]]:
        """Grow the request's tables (every group) to cover ``num_tokens`` tokens, all or none.

        Call it before a step that computes tokens up to position ``num_tokens - 1``. A new
        request starts empty. Each group's table grows to ``spec.live_pages(num_tokens,
        computed).stop`` entries (``computed`` the last :meth:`release_stale` count), never
        more; entries already released stay :data:`NULL_PAGE`.

        Returns:
            ``{group index: pages taken}`` for the groups that grew.

        Raises:
            InvalidInputError: ``num_tokens`` is negative.
            BlockPoolExhaustedError: too few free ids; nothing was taken.
        """
        check_int(num_tokens, "'num_tokens'", minimum=0)
        tables = self._tables.get(request_id) or [[] for _ in self.groups]
        released = self._released.get(request_id) or [0] * len(self.groups)
        computed = self._computed.get(request_id, 0)
        wants = [self._live(group, num_tokens, computed).stop for group in self.groups]
        taken: dict[int, list[int]] = {}
        try:
            for index, want in enumerate(wants):
                table = tables[index]
                nulls = max(0, min(released[index], want) - len(table))
                grow = want - len(table) - nulls
                if grow > 0:
                    taken[index] = self.allocate(index, grow)
        except BlockPoolExhaustedError:
            for index, pages in taken.items():
                self.free(index, pages)
            needed = self.new_blocks_needed(request_id, num_tokens)
            raise BlockPoolExhaustedError(
                f"request {request_id!r} needs {needed} more block ids to cover {num_tokens} tokens "
                f"but {self._num_free} of {self.num_blocks} are free (or no aligned run is); nothing "
                "was taken: free or preempt another request, or plan more blocks",
                requested_blocks=needed,
                free_blocks=self._num_free,
            ) from None
        for index, want in enumerate(wants):
            table = tables[index]
            while len(table) < min(released[index], want):
                table.append(NULL_PAGE)
            table.extend(taken.get(index, ()))
        self._tables[request_id] = tables
        self._released[request_id] = released
        self._computed.setdefault(request_id, 0)
        self._tokens[request_id] = max(num_tokens, self._tokens.get(request_id, 0))
        return taken

    def release_stale(self, request_id: Hashable, num_computed_tokens: int) -> dict[int, list[int]]:
        """Free the pages no later token reads, once ``num_computed_tokens`` tokens are cached.

        For each group, the entries before ``spec.live_pages(tokens,
        num_computed_tokens).start`` are freed and set to :data:`NULL_PAGE` (sliding-window and
        chunked groups; full attention keeps everything).

        Returns:
            ``{group index: pages freed}`` for the groups that shrank.

        Raises:
            InvalidInputError: unknown request, or a negative token count.
        """
        self._check_request(request_id)
        check_int(num_computed_tokens, "'num_computed_tokens'", minimum=0)
        tables = self._tables[request_id]
        released = self._released[request_id]
        computed = self._computed[request_id] = max(self._computed[request_id], num_computed_tokens)
        tokens = max(self._tokens[request_id], computed)
        freed: dict[int, list[int]] = {}
        for index, group in enumerate(self.groups):
            first = self._live(group, tokens, computed).start
            table = tables[index]
            stale = range(released[index], min(first, len(table)))
            pages = [table[k] for k in stale if table[k] != NULL_PAGE]
            for k in stale:
                table[k] = NULL_PAGE
            released[index] = max(released[index], first)
            if pages:
                self.free(index, pages)
                freed[index] = pages
        return freed

    def free_request(self, request_id: Hashable) -> None:
        """Free every page the request holds and forget it.

        Raises:
            InvalidInputError: unknown request.
        """
        self._check_request(request_id)
        for index in range(len(self.groups)):
            self.free(index, self.live_pages(request_id, index))
        del self._tables[request_id]
        del self._tokens[request_id], self._released[request_id], self._computed[request_id]

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _live(group: KVCacheGroup, num_tokens: int, num_computed_tokens: int) -> range:
        return group.spec.live_pages(num_tokens, min(num_computed_tokens, num_tokens))

    def _group(self, group: int) -> KVCacheGroup:
        return self.groups[self._index(group)]

    def _index(self, group: int) -> int:
        return check_int(group, "group index", minimum=0, below=len(self.groups))

    def _check_request(self, request_id: Hashable) -> None:
        if request_id not in self._tables:
            raise InvalidInputError(
                f"unknown request {request_id!r}; reserve() it first ({len(self._tables)} requests live)"
            )

    def _take(self, block: int, group: int) -> None:
        self._owner[block] = group
        self._num_free -= 1
        for runs in self._runs.values():
            runs.taken(block)

    def _release(self, block: int) -> None:
        self._owner[block] = _FREE
        self._num_free += 1
        heapq.heappush(self._singles, block)
        for runs in self._runs.values():
            runs.released(block)

    def _compact(self) -> None:
        if len(self._singles) > 2 * self.num_blocks + 64:
            self._singles = [b for b in range(self.num_blocks) if self._owner[b] == _FREE]
        for runs in self._runs.values():
            runs.compact()

    def _exhausted(self, group: int, num_pages: int) -> BlockPoolExhaustedError:
        g = self.groups[group]
        span = g.blocks_per_page
        if span == 1:
            short = f"{self._num_free} of {self.num_blocks} block ids are free"
        else:
            short = (
                f"only {self._runs[span].full} such runs are free ({self._num_free} of {self.num_blocks} "
                "block ids, the rest scattered)"
            )
        need = f"{num_pages} page(s)" if span == 1 else f"{num_pages} aligned run(s) of {span} block ids"
        return BlockPoolExhaustedError(
            f"group {group} ({g.spec.kind}) needs {need} but {short}: free or preempt a request, or "
            "plan more blocks",
            requested_blocks=num_pages * span,
            free_blocks=self._num_free,
        )
