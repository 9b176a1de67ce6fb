"""The block-id pool a scheduler drives with a plan: one pool shared by every group.

A plan has ``num_blocks`` block ids. A block id belongs to at most one group at a time, which is
what lets groups share bytes (see :mod:`kvcore.plan`). A group's *page* is what its block-table
entries name and what a layer's view indexes along its block dimension:

- a group with ``blocks_per_page == 1`` (attention) takes single block ids; page ``j`` is block
  id ``j``;
- a group with ``blocks_per_page == s > 1`` (a large per-request state) takes aligned runs:
  page ``j`` is block ids ``[j*s, (j+1)*s)``.

To keep aligned runs available, single blocks are taken from the low end of the id space and runs
from the high end. Free ids are a min-heap and free runs are tracked per run length with a count of
free ids per aligned chunk and a heap of fully free chunks, so every operation costs
``O(log num_blocks)`` per block. A simulator drives the pool millions of times
(:mod:`kvcore.simulation`), so the request methods take and free every group's pages in bulk.

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
from itertools import chain, repeat
from typing import Final

from kvcore.errors import BlockPoolExhaustedError, InvalidInputError
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.spec import KVCacheSpec
from kvcore.validators import check_int

#: Block-table entry of a page that was freed because no later token reads it.
NULL_PAGE: Final = -1
_FREE: Final = -1
#: Owner of the plan's null block: no group, never free.
_NULL: Final = -2
_NOT_NULL: Final = NULL_PAGE.__ne__


def _default_paging(spec: KVCacheSpec) -> int:
    """Tokens per page when ``spec`` keeps the default :meth:`~kvcore.KVCacheSpec.live_pages`
    (entries ``first_retained_token(computed) // T`` to ``ceil(tokens / T)``), else 0."""
    per_page = spec.tokens_per_page
    return per_page if per_page and type(spec).live_pages is KVCacheSpec.live_pages else 0


def _holder(owner: int) -> str:
    """How an error names a block id's owner."""
    if owner == _FREE:
        return "free"
    return "the null block" if owner == _NULL else f"held by group {owner}"


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
        lowest_first: hand out the lowest free block ids first (the default). ``False`` hands
            out the ids freed last first (a stack, several times faster), for callers that only
            count pages, such as the simulator; a plan with aligned runs always takes single
            ids lowest first, which keeps runs free at the high end.
    """

    def __init__(self, plan: KVCachePlan, *, lowest_first: bool = True) -> None:
        self.plan = plan
        self.groups: tuple[KVCacheGroup, ...] = plan.groups
        self.num_blocks: int = plan.num_blocks
        self._owner = [_FREE] * plan.num_blocks
        self._num_free = plan.num_blocks
        # a min-heap (sorted) of free ids; with aligned runs it keeps ids a run took (lazily cleaned)
        self._singles = list(range(plan.num_blocks))
        # a subclass that overrides a per-block step (tests break pools that way) gets the
        # per-block path everywhere, so its override sees every block
        cls = type(self)
        self._bulk = (
            cls._take is BlockPool._take and cls._release is BlockPool._release and cls.free is BlockPool.free
        )
        self._spans = [g.blocks_per_page for g in plan.groups]
        # without aligned runs and lowest_first=False, the free ids are a stack instead
        self._stacked = self._bulk and not lowest_first and all(span == 1 for span in self._spans)
        if self._stacked:
            self._singles.reverse()
        # per group: tokens per page when the spec keeps the default live_pages rule (so the
        # table's length is inline arithmetic), else 0; and whether it never frees a page
        self._paged = [_default_paging(g.spec) for g in plan.groups]
        self._keeps_all = [
            bool(paged) and type(g.spec).first_retained_token is KVCacheSpec.first_retained_token
            for g, paged in zip(plan.groups, self._paged, strict=True)
        ]
        # a stacked pool whose kinds all follow the default rule handles groups with equal specs
        # together: their tables of one request always have the same length and released count
        classes: dict[tuple[KVCacheSpec, int], list[int]] = {}
        for index, group in enumerate(plan.groups):
            classes.setdefault((group.spec, group.blocks_per_page), []).append(index)
        #: (tokens per page, the first group, all groups) of each spec, and (the same, the
        #: spec's first_retained_token) of each spec that frees pages
        self._classes = [
            (self._paged[members[0]], members[0], tuple(members)) for members in classes.values()
        ]
        self._freeing = [
            (
                self._paged[members[0]],
                members[0],
                tuple(members),
                plan.groups[members[0]].spec.first_retained_token,
            )
            for members in classes.values()
            if not self._keeps_all[members[0]]
        ]
        self._by_class = self._stacked and all(self._paged)
        self._runs = {
            span: _Runs(span, plan.num_blocks)
            for span in sorted({g.blocks_per_page for g in plan.groups if g.blocks_per_page > 1})
        }
        if plan.null_block is not None and plan.num_blocks:
            self._hold_null_block(plan.null_block)
        self._tables: dict[Hashable, list[list[int]]] = {}
        self._tokens: dict[Hashable, int] = {}
        self._computed: dict[Hashable, int] = {}  # the largest num_computed_tokens released
        self._released: dict[Hashable, list[int]] = {}

    # -- pages of a group ------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Block ids no group holds (the null block is never free)."""
        return self._num_free

    @property
    def num_usable_blocks(self) -> int:
        """Block ids groups may hold: all of them but the plan's null block, if it has one.
        The pool is empty again when :attr:`num_free_blocks` equals this."""
        return self.num_blocks - (1 if self.plan.null_block is not None and self.num_blocks else 0)

    def num_free_pages(self, group: int) -> int:
        """Pages ``group`` could take now: free ids, or fully free aligned runs."""
        span = self._group(group).blocks_per_page
        return self._num_free if span == 1 else self._runs[span].full

    def blocks_of(self, group: int, page: int) -> range:
        """The block ids page ``page`` of ``group`` covers."""
        span = self._group(group).blocks_per_page
        return range(page * span, (page + 1) * span)

    def owner(self, block: int) -> int | None:
        """The group holding block id ``block``, or ``None`` when no group does (a free id, or
        the plan's null block, which is never free)."""
        group = self._owner[block]
        return None if group < 0 else group

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
        group = self._index(group)
        span = self._spans[group]
        if num_pages > (self._num_free if span == 1 else self._runs[span].full):
            raise self._exhausted(group, num_pages)
        pages: list[int] = []
        if span == 1 and self._bulk:
            return self._take_singles(group, num_pages)
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
                    held = _holder(self._owner[block])
                    raise InvalidInputError(
                        f"cannot free page {page} of group {group}: block id {block} is {held}, "
                        "not held by that group (freed twice?)"
                    )
        if len(set(pages)) != len(pages):
            raise InvalidInputError(f"cannot free the same page twice in one call (got {pages})")
        if self._bulk:
            self._give_back(self._index(group), pages)
            return
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
        if type(num_tokens) is not int or num_tokens < 0:
            check_int(num_tokens, "'num_tokens'", minimum=0)
        if self._by_class:
            return self._reserve_by_class(request_id, num_tokens)
        tables = self._tables.get(request_id)
        if tables is None:
            tables = [[] for _ in self.groups]
            released = [0] * len(self.groups)
            computed = 0
        else:
            released = self._released[request_id]
            computed = self._computed[request_id]
        grows: list[tuple[int, int]] = []
        padding: list[tuple[int, int]] = []
        for index, want in enumerate(self._stops(num_tokens, computed)):
            length = len(tables[index])
            if want <= length:
                continue
            nulls = min(released[index], want) - length
            if nulls > 0:
                padding.append((index, nulls))
                length += nulls
            if want > length:
                grows.append((index, want - length))
        taken: dict[int, list[int]] = {}
        if grows:
            try:
                taken = self._take_for(grows)
            except BlockPoolExhaustedError:
                raise self._request_exhausted(request_id, num_tokens) from None
        for index, nulls in padding:
            tables[index].extend(repeat(NULL_PAGE, nulls))
        for index, pages in taken.items():
            tables[index].extend(pages)
        self._tables[request_id] = tables
        self._released[request_id] = released
        self._computed.setdefault(request_id, 0)
        tokens = self._tokens.get(request_id, 0)
        self._tokens[request_id] = num_tokens if num_tokens > tokens else tokens
        return taken

    def _reserve_by_class(self, request_id: Hashable, num_tokens: int) -> dict[int, list[int]]:
        """:meth:`reserve` of a stacked pool of default-rule kinds, one spec at a time."""
        tables = self._tables.get(request_id)
        if tables is None:
            tables = [[] for _ in self.groups]
            released = [0] * len(self.groups)
        else:
            released = self._released[request_id]
        needs: list[tuple[tuple[int, ...], int, int]] = []
        total = 0
        for per_page, lead, members in self._classes:
            want = -(-num_tokens // per_page)
            length = len(tables[lead])
            if want <= length:
                continue
            nulls = released[lead]
            if nulls > want:
                nulls = want
            nulls -= length
            if nulls < 0:
                nulls = 0
            count = want - length - nulls
            needs.append((members, count, nulls))
            total += count * len(members)
        taken: dict[int, list[int]] = {}
        if total > self._num_free:
            raise self._request_exhausted(request_id, num_tokens)
        if needs:
            singles, owner = self._singles, self._owner
            at = len(singles) - total
            ids = singles[at:]
            del singles[at:]
            self._num_free -= total
            at = 0
            for members, count, nulls in needs:
                for index in members:
                    table = tables[index]
                    if nulls:
                        table.extend(repeat(NULL_PAGE, nulls))
                    if count == 1:
                        block = ids[at]
                        owner[block] = index
                        table.append(block)
                        taken[index] = [block]
                    elif count:
                        pages = taken[index] = ids[at : at + count]
                        list(map(owner.__setitem__, pages, repeat(index, count)))
                        table.extend(pages)
                    at += count
        if request_id not in self._computed:
            self._tables[request_id] = tables
            self._released[request_id] = released
            self._computed[request_id] = 0
            self._tokens[request_id] = num_tokens
        elif num_tokens > self._tokens[request_id]:
            self._tokens[request_id] = num_tokens
        return taken

    def _request_exhausted(self, request_id: Hashable, num_tokens: int) -> BlockPoolExhaustedError:
        """The error of a :meth:`reserve` that found too few free ids (nothing was taken)."""
        needed = self.new_blocks_needed(request_id, num_tokens)
        return BlockPoolExhaustedError(
            f"request {request_id!r} needs {needed} more block ids to cover {num_tokens} tokens "
            f"but {self._num_free} of {self.num_blocks} are free (or no aligned run is); nothing "
            "was taken: free or preempt another request, or plan more blocks",
            requested_blocks=needed,
            free_blocks=self._num_free,
        )

    def _release_by_class(self, request_id: Hashable, computed: int) -> dict[int, list[int]]:
        """:meth:`release_stale` of a stacked pool of default-rule kinds, one spec at a time."""
        tables = self._tables[request_id]
        released = self._released[request_id]
        freed: dict[int, list[int]] = {}
        for per_page, lead, members, first_retained_token in self._freeing:
            first = first_retained_token(computed) // per_page
            done = released[lead]
            if first <= done:
                continue
            one = first == done + 1 and done < len(tables[lead])  # one page, the usual step
            for index in members:
                table = tables[index]
                released[index] = first
                if one:
                    page = table[done]
                    if page != NULL_PAGE:
                        table[done] = NULL_PAGE
                        freed[index] = [page]
                    continue
                end = min(first, len(table))
                pages = [page for page in table[done:end] if page != NULL_PAGE]
                table[done:end] = repeat(NULL_PAGE, max(0, end - done))
                if pages:
                    freed[index] = pages
        if freed:
            self._free_groups(freed)
        return freed

    def _stops(self, num_tokens: int, computed: int) -> list[int]:
        """``live_pages(num_tokens, computed).stop`` of every group (the default rule inline)."""
        computed = min(computed, num_tokens)
        return [
            -(-num_tokens // per_page) if per_page else group.spec.live_pages(num_tokens, computed).stop
            for group, per_page in zip(self.groups, self._paged, strict=True)
        ]

    def _take_for(self, grows: list[tuple[int, int]]) -> dict[int, list[int]]:
        """Take ``count`` pages for each ``(group, count)``, all or none (in that order)."""
        if self._bulk and not self._runs:
            total = sum(count for _, count in grows)
            if total > self._num_free:
                index, count = grows[0]
                raise self._exhausted(index, count)
            ids = self._take_singles(None, total)
            taken: dict[int, list[int]] = {}
            owner, at = self._owner, 0
            for index, count in grows:
                pages = taken[index] = ids[at : at + count]
                list(map(owner.__setitem__, pages, repeat(index, count)))
                at += count
            return taken
        taken = {}
        try:
            for index, count in grows:
                taken[index] = self.allocate(index, count)
        except BlockPoolExhaustedError:
            for index, pages in taken.items():
                self._free_own(index, pages)
            raise
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
        tables = self._tables[request_id]
        if type(num_computed_tokens) is not int or num_computed_tokens < 0:
            check_int(num_computed_tokens, "'num_computed_tokens'", minimum=0)
        released = self._released[request_id]
        computed = self._computed[request_id]
        if num_computed_tokens > computed:
            computed = self._computed[request_id] = num_computed_tokens
        if self._by_class:
            return self._release_by_class(request_id, computed)
        tokens = max(self._tokens[request_id], computed)
        freed: dict[int, list[int]] = {}
        firsts: dict[KVCacheSpec, int] = {}  # groups with equal specs free alike
        for index, group in enumerate(self.groups):
            if self._keeps_all[index]:
                continue
            per_page = self._paged[index]
            if per_page:
                spec = group.spec
                first = firsts.get(spec)
                if first is None:
                    first = firsts[spec] = spec.first_retained_token(computed) // per_page
            else:
                first = self._live(group, tokens, computed).start
            done = released[index]
            if first <= done:
                continue
            table = tables[index]
            end = min(first, len(table))
            pages = [page for page in table[done:end] if page != NULL_PAGE]
            table[done:end] = repeat(NULL_PAGE, max(0, end - done))
            released[index] = first
            if pages:
                freed[index] = pages
        if freed:
            self._free_groups(freed)
        return freed

    def free_request(self, request_id: Hashable) -> None:
        """Free every page the request holds and forget it.

        Raises:
            InvalidInputError: unknown request.
        """
        self._check_request(request_id)
        held = {}
        for index, table in enumerate(self._tables[request_id]):
            pages = list(filter(_NOT_NULL, table))
            if pages:
                held[index] = pages
        self._free_groups(held)
        del self._tables[request_id]
        del self._tokens[request_id], self._released[request_id], self._computed[request_id]

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _live(group: KVCacheGroup, num_tokens: int, num_computed_tokens: int) -> range:
        return group.spec.live_pages(num_tokens, min(num_computed_tokens, num_tokens))

    def _group(self, group: int) -> KVCacheGroup:
        return self.groups[self._index(group)]

    def _index(self, group: int) -> int:
        if type(group) is int and 0 <= group < len(self.groups):
            return group
        return check_int(group, "group index", minimum=0, below=len(self.groups))

    def _take_singles(self, group: int | None, num_pages: int) -> list[int]:
        """The ``num_pages`` lowest free ids for ``group`` (the caller checked they exist);
        ``None``: the caller sets the owners (only without aligned runs)."""
        singles, owner = self._singles, self._owner
        if self._runs:  # the heap may hold ids a run took: check each
            assert group is not None, "groups are taken one by one when there are aligned runs"
            pages: list[int] = []
            while len(pages) < num_pages:
                block = heapq.heappop(singles)
                if owner[block] == _FREE:
                    self._take(block, group)
                    pages.append(block)
            return pages
        if self._stacked:
            pages = singles[len(singles) - num_pages :]
            del singles[len(singles) - num_pages :]
        else:
            pop = heapq.heappop
            pages = [pop(singles) for _ in range(num_pages)]
        if group is not None:
            list(map(owner.__setitem__, pages, repeat(group, num_pages)))
        self._num_free -= num_pages
        return pages

    def _free_groups(self, pages: dict[int, list[int]]) -> None:
        """Free the pages the pool's own tables say each group holds, all at once when it can."""
        if not (self._bulk and not self._runs):
            for index, held in pages.items():
                self._free_own(index, held)
            return
        blocks = list(chain.from_iterable(pages.values()))
        list(map(self._owner.__setitem__, blocks, repeat(_FREE, len(blocks))))
        self._num_free += len(blocks)
        if self._stacked:
            self._singles.extend(blocks)
        else:
            list(map(heapq.heappush, repeat(self._singles, len(blocks)), blocks))
            self._compact()

    def _free_own(self, group: int, pages: list[int]) -> None:
        """Free pages the pool's own tables say ``group`` holds (no checks needed)."""
        if self._bulk:
            self._give_back(group, pages)
        else:
            self.free(group, pages)

    def _give_back(self, group: int, pages: list[int]) -> None:
        """Free ``group``'s ``pages`` at once (checked by the caller)."""
        span = self._spans[group]
        blocks = pages if span == 1 else [b for page in pages for b in range(page * span, (page + 1) * span)]
        if not blocks:
            return
        list(map(self._owner.__setitem__, blocks, repeat(_FREE, len(blocks))))
        if self._stacked:
            self._singles.extend(blocks)
        else:
            list(map(heapq.heappush, repeat(self._singles, len(blocks)), blocks))
        self._num_free += len(blocks)
        if self._runs:
            for runs in self._runs.values():
                for block in blocks:
                    runs.released(block)
        self._compact()

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

    def _hold_null_block(self, block: int) -> None:
        """Keep the plan's null block out of every free list, for good (and, with aligned runs,
        the run around it, as :attr:`KVCachePlan.reserved_blocks` counts)."""
        self._owner[block] = _NULL
        self._num_free -= 1
        self._singles.remove(block)
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
