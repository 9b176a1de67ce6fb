"""The block-id pool a scheduler drives with a plan: one pool shared by every group.

(A plan of several pools, :attr:`~kvcore.KVCachePlan.pools`, gets a :class:`MultiPoolBlockPool`
from ``BlockPool(plan)``: one plain pool per plan pool, over
:meth:`~kvcore.KVCachePlan.pool_plan`, behind the same methods; group indices stay the plan's,
block ids are the group's pool's, a request takes its pages in every pool or in none, and a
prefix hit is the prefix every pool has cached. What follows is one pool's.)

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
``O(log num_blocks)`` per block. A pool without aligned runs keeps a free map (one byte per id)
instead of the heap and hands a request whole runs of the lowest free ids at once. A simulator
drives the pool millions of times (:mod:`kvcore.simulation`), so the request methods take and
free every group's pages in bulk.

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
import math
import re
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from itertools import chain, repeat
from typing import Final

from kvcore.errors import BlockPoolExhaustedError, InvalidInputError, MultiplePoolsError
from kvcore.limits import MAX_TOKENS, shown
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.runtime.prefix_cache import PrefixCacheStats, PrefixKey, token_block_keys
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


def _check_hashable(request_id: object) -> None:
    """Refuse a request id that cannot key a dict (a list, a dict, a tuple holding a list).

    Raises:
        InvalidInputError: naming the id's type.
    """
    try:
        hash(request_id)
    except TypeError:
        raise InvalidInputError(
            f"request ids must be hashable, such as a str or an int (got a {type(request_id).__name__}: "
            f"{request_id!r:.60})"
        ) from None


def _too_long(request_id: Hashable, num_tokens: int, max_model_len: int, what: str) -> InvalidInputError:
    """The error for a request of more tokens than the plan's ``max_model_len``."""
    return InvalidInputError(
        f"cannot {what} {shown(num_tokens)} tokens of request {request_id!r:.60}: the plan's max_model_len "
        f"is {max_model_len:,}, the most tokens one request holds; plan for a longer max_model_len or "
        "shorten the request"
    )


def _checked_prefix(
    request_id: Hashable,
    known_request: bool,
    content: Sequence[int] | PrefixKey,
    num_tokens: int | None,
    max_model_len: int,
) -> tuple[int, int]:
    """The arguments of ``attach_prefix``, checked: ``(num_tokens, tokens the content has)``.

    Raises:
        InvalidInputError: the request has tables already, the content is neither token ids
            nor a :class:`PrefixKey`, or ``num_tokens`` is negative or above ``max_model_len``.
    """
    if known_request:
        raise InvalidInputError(
            f"request {request_id!r} already has tables; attach_prefix() comes before its first reserve()"
        )
    if isinstance(content, PrefixKey):
        known = content.num_tokens
    elif isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
        known = len(content)
    else:
        raise InvalidInputError(
            f"a request's content is its token ids or a PrefixKey (got {type(content).__name__})"
        )
    if num_tokens is None:
        num_tokens = known
    check_int(num_tokens, "'num_tokens'", minimum=0)
    if num_tokens > max_model_len:  # a hit walks the blocks of num_tokens: 10**9 would run for minutes
        raise _too_long(request_id, num_tokens, max_model_len, "attach")
    return num_tokens, known


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
        prefix_caching: share full blocks of equal leading tokens across requests
            (:meth:`attach_prefix`), keep freed ones cached until their ids are needed, and count
            hits (:attr:`prefix_cache_stats`). Off by default; off, the pool behaves and runs as
            it always did. A plan with a group that cannot cache (a per-request state, or a
            kind with its own ``live_pages``) gets a pool that caches nothing (the stats say
            why).
    """

    def __new__(cls, plan: KVCachePlan | None = None, **options: bool) -> BlockPool:
        """A :class:`MultiPoolBlockPool` for a plan of several
        pools (one ``BlockPool`` per pool behind the same methods), else a ``BlockPool``."""
        if cls is BlockPool and plan is not None and len(plan.pools) > 1:
            return super().__new__(MultiPoolBlockPool)
        return super().__new__(cls)

    def __init__(self, plan: KVCachePlan, *, lowest_first: bool = True, prefix_caching: bool = False) -> None:
        if len(plan.pools) > 1:
            raise MultiplePoolsError(
                f"{type(self).__name__} serves a plan of one pool but this plan has {len(plan.pools)}; "
                "BlockPool(plan) drives a plan of several pools (one pool per plan.pool_plan(p))"
            )
        self.plan = plan
        self.groups: tuple[KVCacheGroup, ...] = plan.groups
        self.num_blocks: int = plan.num_blocks
        self._max_len = plan.context.max_model_len
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
        # lowest first without aligned runs: a free map (one byte per id) and the lowest id that
        # may be free, so a request takes whole runs of free ids (two C scans per run) instead
        # of one heap pop per id, in the same order the heap would give them
        self._flat = self._bulk and not self._stacked and all(span == 1 for span in self._spans)
        self._free_map = bytearray(b"\x01") * (plan.num_blocks if self._flat else 0)
        self._low = 0
        if self._flat:
            self._singles = []
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
        self._class_of = [0] * len(plan.groups)  # groups with equal specs free alike
        for number, members in enumerate(classes.values()):
            for index in members:
                self._class_of[index] = number
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
        # the pages allocate() handed out, per group: free() gives back only these, never a page
        # a request's table holds; _inside counts the request methods' own allocate/free calls
        self._loose: list[set[int]] = [set() for _ in plan.groups]
        self._inside = 0
        self._tokens: dict[Hashable, int] = {}
        self._computed: dict[Hashable, int] = {}  # the largest num_computed_tokens released
        self._released: dict[Hashable, list[int]] = {}
        self._init_prefix_cache(prefix_caching)

    # -- pages of a group ------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Block ids a request could take now: those no group holds and, with prefix caching,
        the cached blocks no request holds (:attr:`num_evictable_blocks`), which are evicted
        least recently used first when needed. The null block is never free."""
        return self._num_free + len(self._lru)

    def num_free_blocks_in(self, pool: int) -> int:
        """:attr:`num_free_blocks` of pool ``pool`` of the plan (a one-pool plan has pool 0 only).

        Raises:
            InvalidInputError: the plan has no pool ``pool``.
        """
        self._pool_index(pool)
        return self.num_free_blocks

    def num_usable_blocks_in(self, pool: int) -> int:
        """:attr:`num_usable_blocks` of pool ``pool`` of the plan.

        Raises:
            InvalidInputError: the plan has no pool ``pool``.
        """
        self._pool_index(pool)
        return self.num_usable_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no request holds: counted free, kept until their ids are needed
        (always 0 without prefix caching)."""
        return len(self._lru)

    @property
    def num_usable_blocks(self) -> int:
        """Block ids groups may hold: all of them but the plan's null block, if it has one.
        The pool is empty again when :attr:`num_free_blocks` equals this."""
        return self.num_blocks - (1 if self.plan.null_block is not None and self.num_blocks else 0)

    def num_free_pages(self, group: int) -> int:
        """Pages ``group`` could take now: free ids (cached ones no request holds included), or
        fully free aligned runs."""
        span = self._group(group).blocks_per_page
        return self.num_free_blocks if span == 1 else self._runs[span].full

    def blocks_of(self, group: int, page: int) -> range:
        """The block ids page ``page`` of ``group`` covers."""
        span = self._group(group).blocks_per_page
        return range(page * span, (page + 1) * span)

    def owner(self, block: int, pool: int = 0) -> int | None:
        """The group holding block id ``block`` of pool ``pool``, or ``None`` when no group
        does (a free id, or the plan's null block, which is never free)."""
        self._pool_index(pool)
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
            InvalidInputError: the pool caches prefixes (its request methods own every id).
        """
        self._refuse_if_caching("allocate")
        group = self._index(group)
        pages = self._allocate(group, num_pages)
        if not self._inside:  # a page of the caller's own, which free() may give back
            self._loose[group].update(pages)
        return pages

    def _allocate(self, group: int, num_pages: int) -> list[int]:
        """:meth:`allocate` of a checked group index."""
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

        Only pages :meth:`allocate` handed out may be freed here: a request's pages are freed by
        :meth:`free_request`, :meth:`truncate` and :meth:`release_stale`, which also clear its
        table (freeing them here would leave the table naming ids the pool hands out again).

        Raises:
            InvalidInputError: a page is out of range or not held by ``group``, is held by a
                request's table, or the pool caches prefixes (its request methods own every id);
                nothing was freed.
        """
        self._refuse_if_caching("free")
        pages = list(pages)
        inside = self._inside
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
        if not inside:
            loose = self._loose[self._index(group)]
            for page in pages:
                if page not in loose:
                    raise self._not_loose(group, page)
            loose.difference_update(pages)
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

    def table_extent(self, request_id: Hashable, group: int) -> range:
        """``range(first entry not released, table length)`` of the request's table for
        ``group``, in O(1): the entries before it are :data:`NULL_PAGE`, those in it may hold
        pages. :class:`~kvcore.runtime.block_tables.BlockTables` reads it to apply a change in
        place."""
        tables = self._tables.get(request_id)
        if tables is None:
            self._check_request(request_id)
        index = group if type(group) is int and 0 <= group < len(self.groups) else self._index(group)
        length = len(tables[index])  # type: ignore[index]
        return range(min(self._released[request_id][index], length), length)

    def live_pages(self, request_id: Hashable, group: int) -> list[int]:
        """The pages the request holds in ``group`` now (its table without freed entries)."""
        return [page for page in self.block_table(request_id, group) if page != NULL_PAGE]

    def blocks_needed(self, group: int, num_tokens: int) -> int:
        """Block ids ``group`` holds at most for a request of ``num_tokens`` tokens.

        From the spec (``max_num_blocks`` times ``blocks_per_page``), with the plan's step size:
        the group's own worst case (a request's reservation over all groups is
        :meth:`request_blocks_needed`).
        """
        context = self.plan.context.with_max_model_len(num_tokens)
        return self._group(group).blocks_per_request(context)

    def request_blocks_needed(self, num_tokens: int) -> tuple[int, ...]:
        """Block ids a request of ``num_tokens`` tokens holds at most in each pool, all its
        groups together at their worst moment (the plan's joint peak,
        :meth:`~kvcore.KVCachePlan.blocks_per_request_by_pool`): what a scheduler reserves to
        admit it without preemption. Below the sum of :meth:`blocks_needed` over the groups
        when their worst cases come at different moments."""
        return self.plan.blocks_per_request_by_pool(num_tokens)

    def new_blocks_needed(self, request_id: Hashable, num_tokens: int) -> int:
        """Block ids :meth:`reserve` would take to cover ``num_tokens`` tokens now."""
        _check_hashable(request_id)
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
        more; entries already released stay :data:`NULL_PAGE`. Reserving the tokens a request
        already covers changes nothing; fewer is an error (:meth:`truncate` shrinks a request).

        Returns:
            ``{group index: pages taken}`` for the groups that grew (the new pages are the
            tables' last entries).

        Raises:
            InvalidInputError: ``num_tokens`` is negative, above the plan's ``max_model_len``, or
                fewer than the request covers; the request id is not hashable.
            BlockPoolExhaustedError: too few free ids; nothing was taken.
        """
        if type(num_tokens) is not int or num_tokens < 0 or num_tokens > self._max_len:
            self._check_reserve(request_id, num_tokens)
        _check_hashable(request_id)  # a list or dict: refused before any table is touched
        if self._by_class:  # checks a shrinking count itself
            grown = self._reserve_by_class(request_id, num_tokens)
            if self._pending:
                self._count_lookup(request_id)
            return grown
        tables = self._tables.get(request_id)
        if tables is None:
            tables = [[] for _ in self.groups]
            released = [0] * len(self.groups)
            computed = 0
        else:
            if num_tokens < self._tokens[request_id]:
                raise self._shrinking(request_id, num_tokens)
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
        if self._pending:
            self._count_lookup(request_id)
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
        elif num_tokens < self._tokens[request_id]:
            raise self._shrinking(request_id, num_tokens)  # nothing was taken: every table was long enough
        return taken

    def _shrinking(self, request_id: Hashable, num_tokens: int) -> InvalidInputError:
        held = self._tokens[request_id]
        return InvalidInputError(
            f"cannot reserve {num_tokens} tokens for request {request_id!r}: its tables already cover "
            f"{held}; reserve() only grows a request, truncate(request, {num_tokens}) shrinks it"
        )

    def _request_exhausted(self, request_id: Hashable, num_tokens: int) -> BlockPoolExhaustedError:
        """The error of a :meth:`reserve` that found too few free ids (nothing was taken)."""
        needed = self.new_blocks_needed(request_id, num_tokens)
        free = self.num_free_blocks
        return BlockPoolExhaustedError(
            f"request {request_id!r} needs {needed} more block ids to cover {num_tokens} tokens "
            f"but {free} of {self.num_blocks} are free (or no aligned run is); nothing "
            "was taken: free or preempt another request, or plan more blocks",
            requested_blocks=needed,
            free_blocks=free,
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
        if self._caching:
            return self._take_cached(grows)
        if self._bulk and not self._runs:
            total = sum(count for _, count in grows)
            if total > self._num_free:
                index, count = grows[0]
                raise self._exhausted(index, count)
            taken: dict[int, list[int]] = {}
            if self._flat:  # each group's runs, owners set a run at a time
                for index, count in grows:
                    taken[index] = self._take_runs(count, index)
                self._num_free -= total
                return taken
            ids = self._take_singles(None, total)
            owner, at = self._owner, 0
            for index, count in grows:
                pages = taken[index] = ids[at : at + count]
                list(map(owner.__setitem__, pages, repeat(index, count)))
                at += count
            return taken
        taken = {}
        self._inside += 1  # the pages are the request's: allocate() does not count them loose
        try:
            for index, count in grows:
                taken[index] = self.allocate(index, count)
        except BlockPoolExhaustedError:
            for index, pages in taken.items():
                self._free_own(index, pages)
            raise
        finally:
            self._inside -= 1
        return taken

    def release_stale(self, request_id: Hashable, num_computed_tokens: int) -> dict[int, list[int]]:
        """Free the pages no later token reads, once ``num_computed_tokens`` tokens are cached.

        For each group, the entries before ``spec.live_pages(tokens,
        num_computed_tokens).start`` are freed and set to :data:`NULL_PAGE` (sliding-window and
        chunked groups; full attention keeps everything). With prefix caching, the request's
        full blocks among its first ``num_computed_tokens`` tokens are cached first (so call it
        after every step), and a freed cached block stays cached until its id is needed.

        Returns:
            ``{group index: pages freed}`` for the groups that shrank (with prefix caching, a
            page another request still holds is dropped from this request's table but stays
            held).

        Raises:
            InvalidInputError: unknown request, a negative token count, or more tokens than the
                request's tables cover (tokens not reserved cannot be computed).
        """
        self._check_request(request_id)
        tables = self._tables[request_id]
        if type(num_computed_tokens) is not int or num_computed_tokens < 0:
            check_int(num_computed_tokens, "'num_computed_tokens'", minimum=0)
        if num_computed_tokens > self._tokens[request_id]:
            self._cover(request_id, num_computed_tokens)
        released = self._released[request_id]
        computed = self._computed[request_id]
        if num_computed_tokens > computed:
            computed = self._computed[request_id] = num_computed_tokens
        if self._caching:
            self._register(request_id, computed)
        if self._by_class:
            return self._release_by_class(request_id, computed)
        tokens = self._tokens[request_id]
        freed: dict[int, list[int]] = {}
        firsts: dict[int, int] = {}  # per class of equal specs, which free alike
        class_of = self._class_of
        for index, group in enumerate(self.groups):
            if self._keeps_all[index]:
                continue
            per_page = self._paged[index]
            if per_page:
                first = firsts.get(class_of[index], -1)
                if first < 0:
                    first = firsts[class_of[index]] = group.spec.first_retained_token(computed) // per_page
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

    def _cover(self, request_id: Hashable, num_tokens: int) -> None:
        """Count ``num_tokens`` as reserved if the tables already hold every page they need (a
        caller may skip a :meth:`reserve` that would take nothing), else raise."""
        if not self._covers(request_id, num_tokens):
            raise InvalidInputError(
                f"request {request_id!r} cannot have {num_tokens} computed tokens: its tables cover "
                f"{self._tokens[request_id]}; reserve() the tokens before computing them"
            )
        self._tokens[request_id] = num_tokens

    def _covers(self, request_id: Hashable, num_tokens: int) -> bool:
        """Whether the request's tables hold every page ``num_tokens`` tokens need."""
        tables = self._tables[request_id]
        if self._by_class:  # one group of each spec says for all
            return all(-(-num_tokens // per_page) <= len(tables[lead]) for per_page, lead, _ in self._classes)
        stops = self._stops(num_tokens, self._computed[request_id])
        return all(stop <= len(table) for stop, table in zip(stops, tables, strict=True))

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
        if self._content:
            self._content.pop(request_id, None)
            self._chains.pop(request_id, None)
            self._registered.pop(request_id, None)
            self._due.pop(request_id, None)
        if self._pending:
            self._pending.pop(request_id, None)

    def truncate(self, request_id: Hashable, num_tokens: int) -> dict[int, list[int]]:
        """Shrink the request to its first ``num_tokens`` tokens, freeing the pages past them.

        For rollback: speculative decoding reserves and computes draft tokens, then keeps only
        the accepted ones. Each group's table is cut to ``spec.live_pages(num_tokens,
        computed).stop`` entries (``computed`` = ``min(num_computed_tokens, num_tokens)``, which
        becomes the request's computed count); the pages cut off are freed. With prefix
        caching, a cut-off page another request shares is only dropped from this table, and
        a kept page that is cached but will be written again (``num_tokens`` ends inside it)
        leaves the cache. Truncating to the tokens the request covers changes nothing.

        Args:
            request_id: the request.
            num_tokens: tokens to keep (``0`` keeps the request with empty tables).

        Returns:
            ``{group index: pages freed}`` for the groups that shrank.

        Raises:
            InvalidInputError: unknown request; ``num_tokens`` negative or more than the request
                covers; a page the shorter request still reads was already freed by
                :meth:`release_stale` (call ``truncate`` before releasing the rejected tokens);
                or ``num_tokens`` ends inside a cached block another request shares (its other
                tokens would be overwritten). Nothing changed.
        """
        checked = self._check_truncate(request_id, num_tokens)
        if checked is None:
            return {}
        computed, stops, rewritten = checked
        tables, released = self._tables[request_id], self._released[request_id]
        freed: dict[int, list[int]] = {}
        for index, stop in enumerate(stops):
            table = tables[index]
            cut = [page for page in table[stop:] if page != NULL_PAGE]
            del table[stop:]
            if released[index] > stop:
                released[index] = stop
            if cut:
                freed[index] = cut
        for page in rewritten:
            self._uncache(page)
        if self._caching and request_id in self._registered:
            registered = self._registered[request_id]
            for index, per_page in enumerate(self._paged):
                registered[index] = min(registered[index], num_tokens // per_page)
            self._due[request_id] = 0
            for per_page, keys in self._chains.get(request_id, {}).items():
                del keys[num_tokens // per_page :]
        self._tokens[request_id] = num_tokens
        self._computed[request_id] = computed
        if freed:
            self._free_groups(freed)
        return freed

    def _check_truncate(
        self, request_id: Hashable, num_tokens: int
    ) -> tuple[int, list[int], list[int]] | None:
        """What :meth:`truncate` would do: ``(computed, table stops, cached pages to uncache)``,
        or ``None`` when nothing changes; raises as :meth:`truncate` does, having changed
        nothing (a pool of several pools checks every pool before truncating any)."""
        self._check_request(request_id)
        tokens = self._tokens[request_id]
        check_int(num_tokens, "'num_tokens'", minimum=0)
        if num_tokens > tokens:
            raise InvalidInputError(
                f"cannot truncate request {request_id!r} to {num_tokens} tokens: it covers {tokens}; "
                "reserve() grows a request"
            )
        if num_tokens == tokens:
            return None
        tables, released = self._tables[request_id], self._released[request_id]
        computed = min(self._computed[request_id], num_tokens)
        stops: list[int] = []
        for index, group in enumerate(self.groups):
            live = self._live(group, num_tokens, computed)
            if released[index] > live.start:
                raise InvalidInputError(
                    f"cannot truncate request {request_id!r} to {num_tokens} tokens: group {index} "
                    f"({group.spec.kind}) already freed its entries before {released[index]}, and "
                    f"{computed} computed tokens still read entry {live.start}; truncate before "
                    "release_stale() counts the rejected tokens"
                )
            stops.append(live.stop)
        rewritten: list[int] = []  # cached pages this request alone holds and will write into
        if self._caching:
            for index, stop in enumerate(stops):
                per_page = self._paged[index]
                if num_tokens % per_page and stop and stop <= len(tables[index]):
                    page = tables[index][stop - 1]
                    if page != NULL_PAGE and self._key[page] is not None:
                        if self._ref[page] > 1:
                            raise InvalidInputError(
                                f"cannot truncate request {request_id!r} to {num_tokens} tokens: that "
                                f"ends inside block {page} of group {index}, a cached block "
                                f"{self._ref[page] - 1} other request(s) share; truncate to a multiple "
                                f"of {per_page} tokens or more"
                            )
                        rewritten.append(page)
        return computed, stops, rewritten

    # -- prefix caching --------------------------------------------------------------------

    @property
    def prefix_caching(self) -> bool:
        """Whether the pool caches prefixes (asked for, and every group can)."""
        return self._caching

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups, hits and evictions so far (see :class:`~kvcore.runtime.prefix_cache.PrefixCacheStats`)."""
        return PrefixCacheStats(
            enabled=self._caching,
            reason=self._cache_reason,
            lookups=self._lookups,
            hits=self._hits,
            queried_tokens=self._queried,
            hit_tokens=self._hit_tokens,
            evictions=self._evictions,
        )

    def ref_count(self, block: int, pool: int = 0) -> int:
        """How many requests' tables hold block id ``block`` of pool ``pool`` (with prefix
        caching; without it, 1 for a block a request's table holds, else 0 — pages taken
        with :meth:`allocate` are not counted)."""
        self._pool_index(pool)
        if self._caching:
            return self._ref[block]
        return sum(block in table for tables in self._tables.values() for table in tables)

    def is_cached(self, block: int, pool: int = 0) -> bool:
        """Whether block id ``block`` of pool ``pool`` is in the prefix cache (held by requests
        or evictable)."""
        self._pool_index(pool)
        return self._caching and self._key[block] is not None

    def attach_prefix(
        self, request_id: Hashable, content: Sequence[int] | PrefixKey, num_tokens: int | None = None
    ) -> int:
        """Start a request with its cached prefix: the longest run of leading tokens whose
        blocks every group has cached.

        Call it once, before the request's first :meth:`reserve` (again after
        :meth:`free_request`, e.g. when a preempted request is scheduled again). The request
        then covers, and has computed, the returned number of tokens; its tables hold the
        cached blocks (shared with other requests, reference-counted). At most ``num_tokens -
        1`` tokens hit, so that the last prompt token is computed and yields logits.

        A hit of ``h`` tokens needs, in every group, the blocks ``spec.live_pages(h, h)``
        names, cached: all of them from block 0 for full attention (and MLA), only those of
        the last window (or chunk) for sliding-window (chunked) groups, whose earlier entries
        stay :data:`NULL_PAGE`. ``h`` is a multiple of every group's tokens per page, since
        only full blocks are cached. Without prefix caching nothing hits (the lookup is still
        counted).

        The pool keeps a reference to a token-id ``content`` and reads it again when it caches
        the request's later blocks (:meth:`release_stale`): an engine may append the tokens it
        samples.

        Args:
            request_id: a request the pool does not know yet.
            content: the request's token ids, or a :class:`~kvcore.runtime.prefix_cache.PrefixKey`.
            num_tokens: the tokens the request has now, its prompt (default: ``len(content)``,
                or the key's ``num_tokens``).

        Returns:
            Tokens found cached; the request starts from there.

        Raises:
            InvalidInputError: the request is known already, ``num_tokens`` is negative, or the
                content is neither token ids nor a key.
        """
        _check_hashable(request_id)
        num_tokens, known = _checked_prefix(
            request_id, request_id in self._tables, content, num_tokens, self._max_len
        )
        return self._attach_prefix_within(request_id, content, num_tokens, min(num_tokens - 1, known))

    def _probe_hit(self, request_id: Hashable, content: Sequence[int] | PrefixKey, limit: int) -> int:
        """The tokens :meth:`attach_prefix` would find cached, at most ``limit``, changing
        nothing the request's attach does not redo (0 without prefix caching)."""
        if not self._caching:
            return 0
        self._chains.setdefault(request_id, {})
        return self._find_hit(request_id, content, limit)

    def _attach_prefix_within(
        self, request_id: Hashable, content: Sequence[int] | PrefixKey, num_tokens: int, limit: int
    ) -> int:
        """:meth:`attach_prefix` of checked arguments, hitting at most ``limit`` tokens."""
        self._tables[request_id] = [[] for _ in self.groups]
        self._released[request_id] = [0] * len(self.groups)
        self._computed[request_id] = 0
        self._tokens[request_id] = 0
        hit = 0
        if self._caching:
            self._content[request_id] = content
            self._chains.setdefault(request_id, {})
            self._registered[request_id] = [0] * len(self.groups)
            hit = self._find_hit(request_id, content, limit)
            if hit:
                self._attach(request_id, content, hit)
        self._pending[request_id] = (num_tokens, hit)
        return hit

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _live(group: KVCacheGroup, num_tokens: int, num_computed_tokens: int) -> range:
        return group.spec.live_pages(num_tokens, min(num_computed_tokens, num_tokens))

    def _pool_index(self, pool: int) -> int:
        if pool == 0 and type(pool) is int:
            return 0
        return check_int(pool, "pool index", minimum=0, below=len(self.plan.pools))

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
        if self._flat:
            pages = self._take_runs(num_pages, group)
            group = None  # owners set
        elif self._stacked:
            pages = singles[len(singles) - num_pages :]
            del singles[len(singles) - num_pages :]
        else:
            pop = heapq.heappop
            pages = [pop(singles) for _ in range(num_pages)]
        if group is not None:
            list(map(owner.__setitem__, pages, repeat(group, num_pages)))
        self._num_free -= num_pages
        return pages

    def _take_runs(self, num_pages: int, group: int | None = None) -> list[int]:
        """The ``num_pages`` lowest free ids of the free map, taken run by run, owned by
        ``group`` unless ``None`` (the caller checked they exist and counts them)."""
        free_map, owner, at, last = self._free_map, self._owner, self._low, self.num_blocks
        pages: list[int] = []
        need = num_pages
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
        self._low = at  # every id below it is taken
        return pages

    def _put_back(self, blocks: list[int]) -> None:
        """Return freed ids (owners already cleared) to the free ids: the free map, the stack or
        the heap."""
        if self._flat:
            free_map = self._free_map
            list(map(free_map.__setitem__, blocks, repeat(1, len(blocks))))
            low = min(blocks)
            if low < self._low:
                self._low = low
        elif self._stacked:
            self._singles.extend(blocks)
        else:
            list(map(heapq.heappush, repeat(self._singles, len(blocks)), blocks))

    def _free_groups(self, pages: dict[int, list[int]]) -> None:
        """Free the pages the pool's own tables say each group holds, all at once when it can."""
        if self._caching:
            self._drop(pages)
            return
        if not (self._bulk and not self._runs):
            for index, held in pages.items():
                self._free_own(index, held)
            return
        blocks = list(chain.from_iterable(pages.values()))
        if not blocks:
            return
        list(map(self._owner.__setitem__, blocks, repeat(_FREE, len(blocks))))
        self._num_free += len(blocks)
        self._put_back(blocks)
        if not self._stacked:
            self._compact()

    def _free_own(self, group: int, pages: list[int]) -> None:
        """Free pages the pool's own tables say ``group`` holds (no checks needed)."""
        if self._bulk:
            self._give_back(group, pages)
            return
        self._inside += 1  # a request's pages: free() gives them back without asking allocate()
        try:
            self.free(group, pages)
        finally:
            self._inside -= 1

    def _not_loose(self, group: int, page: int) -> InvalidInputError:
        """The error of :meth:`free` given a page that :meth:`allocate` did not hand out."""
        index = self._index(group)
        holders = [r for r, tables in self._tables.items() if page in tables[index]]
        if holders:
            return InvalidInputError(
                f"cannot free page {page} of group {group}: request {holders[0]!r} holds it in its "
                "block table; free a request's pages with free_request(), truncate() or "
                "release_stale(), which clear its table too"
            )
        return InvalidInputError(
            f"cannot free page {page} of group {group}: allocate() did not hand it out; free() gives "
            "back only pages allocate() took"
        )

    def _give_back(self, group: int, pages: list[int]) -> None:
        """Free ``group``'s ``pages`` at once (checked by the caller)."""
        span = self._spans[group]
        blocks = pages if span == 1 else [b for page in pages for b in range(page * span, (page + 1) * span)]
        if not blocks:
            return
        list(map(self._owner.__setitem__, blocks, repeat(_FREE, len(blocks))))
        self._put_back(blocks)
        self._num_free += len(blocks)
        if self._runs:
            for runs in self._runs.values():
                for block in blocks:
                    runs.released(block)
        self._compact()

    def _check_reserve(self, request_id: Hashable, num_tokens: object) -> None:
        """Refuse a ``num_tokens`` that is not an int from 0 to the plan's ``max_model_len``."""
        check_int(num_tokens, "'num_tokens'", minimum=0)
        if num_tokens > self._max_len:  # type: ignore[operator]
            raise _too_long(request_id, num_tokens, self._max_len, "reserve")  # type: ignore[arg-type]

    def _check_request(self, request_id: Hashable) -> None:
        _check_hashable(request_id)
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
        if self._flat:
            self._free_map[block] = 0
        else:
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

    # -- prefix caching internals -----------------------------------------------------------

    def _init_prefix_cache(self, asked: bool) -> None:
        self._lru: OrderedDict[int, None] = OrderedDict()  # evictable cached blocks, oldest first
        self._content: dict[Hashable, Sequence[int] | PrefixKey] = {}
        self._chains: dict[Hashable, dict[int, list[bytes]]] = {}  # per tokens-per-page
        self._registered: dict[Hashable, list[int]] = {}  # per group: blocks looked at for caching
        self._due: dict[Hashable, float] = {}  # computed tokens before which no block fills
        self._pending: dict[Hashable, tuple[int, int]] = {}  # lookups counted at the first reserve
        self._lookups = self._hits = self._queried = self._hit_tokens = self._evictions = 0
        self._caching = False
        self._cache_reason = "not asked for (BlockPool(plan, prefix_caching=True))"
        if not asked:
            return
        for index, group in enumerate(self.groups):
            if not self._paged[index]:
                state = group.spec.tokens_per_page is None
                what = "a per-request state" if state else "pages of its own rule"
                self._cache_reason = (
                    f"group {index} ({group.spec.kind}) keeps {what}, which is not cached, so no token "
                    "can hit in every group"
                )
                return
        self._caching = True
        self._cache_reason = ""
        self._by_class = False
        self._ref = [0] * self.num_blocks
        self._key: list[Hashable | None] = [None] * self.num_blocks
        self._cache: list[dict[Hashable, int]] = [{} for _ in self.groups]
        self._step = math.lcm(*self._paged) if self._paged else 1

    def _refuse_if_caching(self, what: str) -> None:
        if self._caching:
            raise InvalidInputError(
                f"{what}() is for pools without prefix caching: this pool's request methods "
                "(reserve, release_stale, truncate, free_request) own every block id"
            )

    def _count_lookup(self, request_id: Hashable) -> None:
        counted = self._pending.pop(request_id, None)
        if counted is not None:
            queried, hit = counted
            self._lookups += 1
            self._queried += queried
            self._hit_tokens += hit
            self._hits += hit > 0

    def _block_key(
        self, request_id: Hashable, content: Sequence[int] | PrefixKey, index: int, k: int
    ) -> Hashable:
        per_page = self._paged[index]
        if isinstance(content, PrefixKey):
            return (content.prefix_id, per_page, k)
        chains = self._chains[request_id]
        keys = chains.get(per_page)
        if keys is None:
            keys = chains[per_page] = []
        if len(keys) <= k:
            token_block_keys(content, per_page, keys, k + 1)
        return keys[k]

    def _cacheable_blocks(self, content: Sequence[int] | PrefixKey, index: int, tokens: int) -> int:
        """Blocks of ``index``'s group among the first ``tokens`` that content names."""
        known = content.num_tokens if isinstance(content, PrefixKey) else len(content)
        return min(tokens, known) // self._paged[index]

    def _find_hit(self, request_id: Hashable, content: Sequence[int] | PrefixKey, limit: int) -> int:
        """The most tokens (a multiple of every group's page, at most ``limit``) whose live
        blocks every group has cached."""
        step = self._step
        upper = limit // step * step if limit > 0 else 0
        if not upper:
            return 0
        key = self._block_key
        for index in range(len(self.groups)):
            if not self._keeps_all[index]:
                continue
            cache, per_page = self._cache[index], self._paged[index]
            n = 0
            while n < upper // per_page and key(request_id, content, index, n) in cache:
                n += 1
            upper = min(upper, n * per_page) // step * step
            if not upper:
                return 0
        runs: list[tuple[int, list[int]]] = []  # per freeing group: the cached run ending at k
        for index in range(len(self.groups)):
            if self._keeps_all[index]:
                continue
            cache, run, length = self._cache[index], [], 0
            for k in range(upper // self._paged[index]):
                length = length + 1 if key(request_id, content, index, k) in cache else 0
                run.append(length)
            runs.append((index, run))
        for hit in range(upper, 0, -step):
            for index, run in runs:
                live = self._live(self.groups[index], hit, hit)
                if live.stop > live.start and run[live.stop - 1] < live.stop - live.start:
                    break
            else:
                return hit
        return 0

    def _attach(self, request_id: Hashable, content: Sequence[int] | PrefixKey, hit: int) -> None:
        tables, released, registered = (
            self._tables[request_id],
            self._released[request_id],
            self._registered[request_id],
        )
        ref, lru = self._ref, self._lru
        for index, group in enumerate(self.groups):
            live = self._live(group, hit, hit)
            cache = self._cache[index]
            table = tables[index]
            table.extend(repeat(NULL_PAGE, live.start))
            for k in live:
                block = cache[self._block_key(request_id, content, index, k)]
                if not ref[block]:
                    del lru[block]
                ref[block] += 1
                table.append(block)
            released[index] = live.start
            registered[index] = live.stop
        self._tokens[request_id] = self._computed[request_id] = hit

    def _register(self, request_id: Hashable, computed: int) -> None:
        """Cache the request's full blocks among its first ``computed`` tokens."""
        content = self._content.get(request_id)
        if content is None or computed < self._due.get(request_id, 0):
            return
        registered, tables = self._registered[request_id], self._tables[request_id]
        due = math.inf
        fixed = isinstance(content, PrefixKey)  # knows no more tokens later
        for index in range(len(self.groups)):
            start = registered[index]
            end = self._cacheable_blocks(content, index, computed)
            if end <= start:
                continue
            cache, table, keys = self._cache[index], tables[index], self._key
            for k in range(start, min(end, len(table))):
                block = table[k]
                if block == NULL_PAGE or keys[block] is not None:
                    continue
                key = self._block_key(request_id, content, index, k)
                if key not in cache:  # else another request cached the same tokens first
                    cache[key] = block
                    keys[block] = key
            registered[index] = end
        for index, per_page in enumerate(self._paged):
            if not fixed or registered[index] < self._cacheable_blocks(content, index, MAX_TOKENS):
                due = min(due, (registered[index] + 1) * per_page)
        self._due[request_id] = due

    def _uncache(self, block: int) -> None:
        key = self._key[block]
        if key is not None:
            del self._cache[self._owner[block]][key]
            self._key[block] = None

    def _take_cached(self, grows: list[tuple[int, int]]) -> dict[int, list[int]]:
        """:meth:`_take_for` with prefix caching: free ids first, then evict cached blocks."""
        total = sum(count for _, count in grows)
        if total > self._num_free + len(self._lru):
            index, count = grows[0]
            raise self._exhausted(index, count)
        fresh = min(total, self._num_free)
        ids = self._take_singles(None, fresh)
        if total > fresh:
            lru, keys = self._lru, self._key
            for _ in range(total - fresh):
                block, _ = lru.popitem(last=False)
                del self._cache[self._owner[block]][keys[block]]
                keys[block] = None
                ids.append(block)
            self._evictions += total - fresh
        taken: dict[int, list[int]] = {}
        owner, ref, at = self._owner, self._ref, 0
        for index, count in grows:
            pages = taken[index] = ids[at : at + count]
            for block in pages:
                owner[block] = index
                ref[block] = 1
            at += count
        return taken

    def _drop(self, pages: dict[int, list[int]]) -> None:
        """Drop one reference to each page: a page no request holds becomes evictable if it is
        cached (a request's last blocks first, so they are evicted first), else free."""
        ref, keys, lru, owner = self._ref, self._key, self._lru, self._owner
        freed: list[int] = []
        for held in pages.values():
            for block in reversed(held):
                ref[block] -= 1
                if ref[block]:
                    continue
                if keys[block] is not None:
                    lru[block] = None
                else:
                    owner[block] = _FREE
                    freed.append(block)
        if freed:
            self._num_free += len(freed)
            self._put_back(freed)
            if not self._stacked:
                self._compact()

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


# -- plans of several pools ------------------------------------------------------------------


class MultiPoolBlockPool(BlockPool):
    """The block ids of a plan of several pools, handed to groups and tracked per request.

    Built by ``BlockPool(plan)`` for such a plan (the arguments are :class:`BlockPool`'s,
    passed to each pool's own pool). Every method of :class:`BlockPool` works, with group
    indices of the plan and block ids of the group's pool; the figures without a pool
    (:attr:`num_free_blocks`, :attr:`num_usable_blocks`) count all pools together and the
    ``..._in(pool)`` forms count one.

    :meth:`reserve` checks every pool has room before it takes anything (and gives back what
    it took should an aligned run be missing), :meth:`truncate` checks every pool before it
    cuts any, and the methods that take a bare block id (:meth:`owner`, :meth:`ref_count`,
    :meth:`is_cached`) take its pool too: block ``b`` of pool 0 and of pool 1 are different
    ids, live at once. With prefix caching, each pool is asked for its hit with the others'
    answer as the limit until they agree; a pool that cannot cache turns caching off for all.

    Attributes:
        pools: the plain pool of each of the plan's pools (group ``i`` of ``pools[p].plan``
            is the plan's group ``plan.groups_in(p)[i]``).
    """

    def __init__(self, plan: KVCachePlan, *, lowest_first: bool = True, prefix_caching: bool = False) -> None:
        self.plan = plan
        self.groups = plan.groups
        self.num_blocks = plan.num_blocks
        self._members = [plan.groups_in(p) for p in range(len(plan.pools))]
        self._where = [(0, 0)] * len(plan.groups)
        for p, members in enumerate(self._members):
            for local, index in enumerate(members):
                self._where[index] = (p, local)
        self.pools: tuple[BlockPool, ...] = tuple(
            BlockPool(plan.pool_plan(p), lowest_first=lowest_first, prefix_caching=prefix_caching)
            for p in range(len(plan.pools))
        )
        self._order: dict[Hashable, None] = {}  # requests, in arrival order
        self._attached: set[Hashable] = set()  # attached (attach_prefix), not yet reserved
        self._caching = prefix_caching and all(pool.prefix_caching for pool in self.pools)
        self._cache_reason = ""
        if not self._caching:
            for p, pool in enumerate(self.pools):
                reason = pool.prefix_cache_stats.reason
                if reason:
                    self._cache_reason = reason if not prefix_caching else self._reword(p, reason)
                    break

    # -- figures ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Block ids a request could take now, all pools together (see :meth:`num_free_blocks_in`)."""
        return sum(pool.num_free_blocks for pool in self.pools)

    def num_free_blocks_in(self, pool: int) -> int:
        """Block ids of pool ``pool`` a request could take now.

        Raises:
            InvalidInputError: the plan has no pool ``pool``.
        """
        return self.pools[self._pool_index(pool)].num_free_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no request holds, all pools together."""
        return sum(pool.num_evictable_blocks for pool in self.pools)

    @property
    def num_usable_blocks(self) -> int:
        """Block ids groups may hold, all pools together (each pool's null block excluded)."""
        return sum(pool.num_usable_blocks for pool in self.pools)

    def num_usable_blocks_in(self, pool: int) -> int:
        """Block ids of pool ``pool`` groups may hold.

        Raises:
            InvalidInputError: the plan has no pool ``pool``.
        """
        return self.pools[self._pool_index(pool)].num_usable_blocks

    def num_free_pages(self, group: int) -> int:
        """Pages ``group`` could take now in its pool."""
        pool, local = self._locate(group)
        return pool.num_free_pages(local)

    def blocks_of(self, group: int, page: int) -> range:
        """The block ids (of the group's pool) page ``page`` of ``group`` covers."""
        pool, local = self._locate(group)
        return pool.blocks_of(local, page)

    def owner(self, block: int, pool: int = 0) -> int | None:
        """The group (an index into ``plan.groups``) holding block id ``block`` of pool
        ``pool``, or ``None`` when no group does."""
        p = self._pool_index(pool)
        local = self.pools[p].owner(block)
        return None if local is None else self._members[p][local]

    def allocate(self, group: int, num_pages: int) -> list[int]:
        """Take ``num_pages`` pages of ``group``'s pool for it, all or none (see
        :meth:`BlockPool.allocate`).

        Raises:
            BlockPoolExhaustedError: the group's pool has too few free ids; nothing was taken.
            InvalidInputError: the pool caches prefixes.
        """
        pool, _ = self._locate(group)
        p = self.groups[self._index(group)].pool
        try:
            return pool.allocate(self._where[self._index(group)][1], num_pages)
        except BlockPoolExhaustedError as exc:
            raise BlockPoolExhaustedError(
                self._reword(p, str(exc)),
                requested_blocks=exc.requested_blocks,
                free_blocks=exc.free_blocks,
            ) from None

    def free(self, group: int, pages: Iterable[int]) -> None:
        """Give ``group``'s ``pages`` back to its pool (see :meth:`BlockPool.free`)."""
        pool, local = self._locate(group)
        pool.free(local, pages)

    # -- requests --------------------------------------------------------------------------

    @property
    def requests(self) -> tuple[Hashable, ...]:
        """The requests holding pages, in arrival order."""
        return tuple(self._order)

    def num_tokens(self, request_id: Hashable) -> int:
        """Tokens the request's tables cover."""
        self._check_request(request_id)
        return self.pools[0].num_tokens(request_id)

    def block_table(self, request_id: Hashable, group: int) -> list[int]:
        """A copy of the request's block table for ``group`` (ids of the group's pool)."""
        self._check_request(request_id)
        pool, local = self._locate(group)
        return pool.block_table(request_id, local)

    def table_extent(self, request_id: Hashable, group: int) -> range:
        """See :meth:`BlockPool.table_extent`."""
        self._check_request(request_id)
        pool, local = self._locate(group)
        return pool.table_extent(request_id, local)

    def blocks_needed(self, group: int, num_tokens: int) -> int:
        """Block ids (of its pool) ``group`` holds at most for a request of ``num_tokens`` tokens."""
        pool, local = self._locate(group)
        return pool.blocks_needed(local, num_tokens)

    def new_blocks_needed(self, request_id: Hashable, num_tokens: int) -> int:
        """Block ids :meth:`reserve` would take to cover ``num_tokens`` tokens now, all pools
        together (``pools[p].new_blocks_needed(...)`` for one)."""
        return sum(pool.new_blocks_needed(request_id, num_tokens) for pool in self.pools)

    def reserve(self, request_id: Hashable, num_tokens: int) -> dict[int, list[int]]:
        """Grow the request's tables (every group of every pool) to cover ``num_tokens``
        tokens, all or none (see :meth:`BlockPool.reserve`).

        Returns:
            ``{group index: pages taken}`` (ids of each group's pool).

        Raises:
            InvalidInputError: ``num_tokens`` is negative, or fewer than the request covers.
            BlockPoolExhaustedError: some pool has too few free ids (the message names it);
                nothing was taken in any pool.
        """
        if type(num_tokens) is not int or num_tokens < 0 or num_tokens > self.pools[0]._max_len:
            self.pools[0]._check_reserve(request_id, num_tokens)
        _check_hashable(request_id)
        known = request_id in self._order  # reserved before, or attached
        before = self.pools[0].num_tokens(request_id) if known else 0
        if known and num_tokens < before:
            self.pools[0].reserve(request_id, num_tokens)  # raises its wording
        for p, pool in enumerate(self.pools):
            needed = pool.new_blocks_needed(request_id, num_tokens)
            if needed > pool.num_free_blocks:
                raise self._pool_exhausted(p, request_id, num_tokens, needed)
        taken: dict[int, list[int]] = {}
        done: list[BlockPool] = []
        for p, pool in enumerate(self.pools):
            try:
                grown = pool.reserve(request_id, num_tokens)
            except BlockPoolExhaustedError:  # no aligned run free: give back what the others took
                needed = pool.new_blocks_needed(request_id, num_tokens)
                for other in done:
                    if known:
                        other.truncate(request_id, before)
                    else:
                        other.free_request(request_id)
                raise self._pool_exhausted(p, request_id, num_tokens, needed) from None
            done.append(pool)
            members = self._members[p]
            for local, pages in grown.items():
                taken[members[local]] = pages
        self._order[request_id] = None
        self._attached.discard(request_id)
        return taken

    def release_stale(self, request_id: Hashable, num_computed_tokens: int) -> dict[int, list[int]]:
        """Free the pages no later token reads in every pool (see :meth:`BlockPool.release_stale`).

        Returns:
            ``{group index: pages freed}``.

        Raises:
            InvalidInputError: as :meth:`BlockPool.release_stale`; nothing changed.
        """
        self._check_request(request_id)
        if type(num_computed_tokens) is int and num_computed_tokens > self.pools[0].num_tokens(request_id):
            # computed past what was reserved: every pool must already hold the pages, or none moves
            for pool in self.pools:
                if not pool._covers(request_id, num_computed_tokens):
                    pool.release_stale(request_id, num_computed_tokens)  # raises its wording
        freed: dict[int, list[int]] = {}
        for p, pool in enumerate(self.pools):
            members = self._members[p]
            for local, pages in pool.release_stale(request_id, num_computed_tokens).items():
                freed[members[local]] = pages
        return freed

    def free_request(self, request_id: Hashable) -> None:
        """Free every page the request holds in every pool and forget it.

        Raises:
            InvalidInputError: unknown request.
        """
        self._check_request(request_id)
        for pool in self.pools:
            pool.free_request(request_id)
        self._order.pop(request_id, None)
        self._attached.discard(request_id)

    def truncate(self, request_id: Hashable, num_tokens: int) -> dict[int, list[int]]:
        """Shrink the request to its first ``num_tokens`` tokens in every pool (see
        :meth:`BlockPool.truncate`); every pool is checked before any is cut.

        Returns:
            ``{group index: pages freed}``.

        Raises:
            InvalidInputError: as :meth:`BlockPool.truncate`; nothing changed in any pool.
        """
        self._check_request(request_id)
        for p, pool in enumerate(self.pools):
            try:
                pool._check_truncate(request_id, num_tokens)
            except InvalidInputError as exc:
                raise InvalidInputError(self._reword(p, str(exc))) from None
        freed: dict[int, list[int]] = {}
        for p, pool in enumerate(self.pools):
            members = self._members[p]
            for local, pages in pool.truncate(request_id, num_tokens).items():
                freed[members[local]] = pages
        return freed

    # -- prefix caching --------------------------------------------------------------------

    @property
    def prefix_caching(self) -> bool:
        """Whether the pool caches prefixes (asked for, and every group of every pool can)."""
        return self._caching

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups and hits (one per request, the hit common to every pool) and evictions
        (all pools together)."""
        first = self.pools[0].prefix_cache_stats
        return PrefixCacheStats(
            enabled=self._caching,
            reason=self._cache_reason,
            lookups=first.lookups,
            hits=first.hits,
            queried_tokens=first.queried_tokens,
            hit_tokens=first.hit_tokens,
            evictions=sum(pool.prefix_cache_stats.evictions for pool in self.pools),
        )

    def ref_count(self, block: int, pool: int = 0) -> int:
        """How many requests' tables hold block id ``block`` of pool ``pool``."""
        return self.pools[self._pool_index(pool)].ref_count(block)

    def is_cached(self, block: int, pool: int = 0) -> bool:
        """Whether block id ``block`` of pool ``pool`` is in the prefix cache."""
        return self.pools[self._pool_index(pool)].is_cached(block)

    def attach_prefix(
        self, request_id: Hashable, content: Sequence[int] | PrefixKey, num_tokens: int | None = None
    ) -> int:
        """Start a request with the longest prefix every pool has cached (see
        :meth:`BlockPool.attach_prefix`).

        Returns:
            Tokens found cached in every group of every pool; the request starts from there.

        Raises:
            InvalidInputError: as :meth:`BlockPool.attach_prefix`.
        """
        _check_hashable(request_id)
        num_tokens, known = _checked_prefix(
            request_id, request_id in self._order, content, num_tokens, self.pools[0]._max_len
        )
        limit = min(num_tokens - 1, known)
        if self._caching:  # each pool's hit bounds the others' until they agree
            settled = False
            while not settled and limit > 0:
                settled = True
                for pool in self.pools:
                    hit = pool._probe_hit(request_id, content, limit)
                    if hit != limit:
                        limit, settled = hit, False
        hits = [pool._attach_prefix_within(request_id, content, num_tokens, limit) for pool in self.pools]
        self._attached.add(request_id)
        self._order[request_id] = None
        return min(hits)

    # -- internals -------------------------------------------------------------------------

    def _reword(self, p: int, message: str) -> str:
        """A message of pool ``p``'s own pool, naming the plan's group indices and the pool."""
        members = self._members[p]
        worded = re.sub(r"\bgroup (\d+)", lambda m: f"group {members[int(m.group(1))]}", message)
        return f"pool {p}: {worded}"

    def _locate(self, group: int) -> tuple[BlockPool, int]:
        p, local = self._where[self._index(group)]
        return self.pools[p], local

    def _check_request(self, request_id: Hashable) -> None:
        _check_hashable(request_id)
        if request_id not in self._order:
            raise InvalidInputError(
                f"unknown request {request_id!r}; reserve() it first ({len(self._order)} requests live)"
            )

    def _pool_exhausted(
        self, p: int, request_id: Hashable, num_tokens: int, needed: int
    ) -> BlockPoolExhaustedError:
        pool = self.pools[p]
        free = pool.num_free_blocks
        kinds = ", ".join(sorted({self.groups[i].spec.kind for i in self._members[p]}))
        return BlockPoolExhaustedError(
            f"request {request_id!r} needs {needed} more block ids of pool {p} ({kinds}) to cover "
            f"{num_tokens} tokens but {free} of its {pool.num_blocks} are free (or no aligned run "
            "is); nothing was taken in any pool: free or preempt another request, or plan more blocks",
            requested_blocks=needed,
            free_blocks=free,
        )
