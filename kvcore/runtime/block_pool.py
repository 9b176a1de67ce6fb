"""The block-id pool a scheduler drives with a plan: every pool of the plan, every group.

A plan has a tuple of pools (:attr:`~kvcore.KVCachePlan.pools`; most plans have one). Each
pool has ``num_blocks`` block ids of its own, and a block id of a pool belongs to at most one
of its groups at a time, which is what lets groups share bytes (see :mod:`kvcore.plan`). A
group's *page* is what its block-table entries name and what a layer's view indexes along
its block dimension:

- a group with ``blocks_per_page == 1`` (attention) takes single block ids; page ``j`` is block
  id ``j``;
- a group with ``blocks_per_page == s > 1`` (a large per-request state) takes aligned runs:
  page ``j`` is block ids ``[j*s, (j+1)*s)``.

:class:`BlockPool` keeps one :class:`~kvcore.runtime.one_pool.OnePool` per plan pool (a
one-pool plan: a tuple of one) and loops over them: each holds its pool's free ids
(:mod:`kvcore.runtime.free_blocks`) and, with prefix caching, its cache
(:class:`~kvcore.runtime.prefix_cache.PrefixCache`). Group indices are the plan's and block ids
are the group's pool's; a request takes its pages in every pool or in none, and a prefix hit is
the prefix every pool has cached.

On top of that the pool keeps one record per request
(:class:`~kvcore.runtime.request_tables.RequestRecord`): a block table per group
(:meth:`BlockPool.reserve`, :meth:`BlockPool.release_stale`, :meth:`BlockPool.free_request`).
What a request holds comes from its group's spec, :meth:`~kvcore.KVCacheSpec.live_pages`, the
same method the planner's worst case (:meth:`~kvcore.KVCacheSpec.max_num_blocks`) reads:
``reserve`` grows a table to ``live_pages(...).stop`` entries and ``release_stale`` frees the
entries before ``live_pages(...).start``. For a token-paged kind, entry ``k`` is the page
holding the request's tokens ``[k*B, (k+1)*B)`` (``B`` the group's block size), or
:data:`NULL_PAGE` once those tokens fell out of a sliding window or chunk and the page was
freed; a state group's table has one entry; a kind with a fixed per-request size (cross
attention over an encoder output) has all its entries from the first token on. A simulator
drives the pool millions of times (:mod:`kvcore.simulation`), so the request methods take and
free every group's pages in bulk.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from kvcore.errors import BlockPoolExhaustedError, InvalidInputError
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.removed import names_removed_from
from kvcore.runtime.free_blocks import FreeBlocksFactory, free_blocks_for, holder
from kvcore.runtime.host_cache import HostTierStats
from kvcore.runtime.one_pool import OnePool, hit_step_of, hit_unit, uncacheable
from kvcore.runtime.prefix_cache import EvictionHook, KindHits, PrefixCacheStats, PrefixKey
from kvcore.runtime.request_tables import (
    NULL_PAGE,
    RequestRecord,
    check_hashable,
    check_reserve,
    shrinking,
    too_long,
    unknown,
)
from kvcore.validators import check_int

__all__ = ["NULL_PAGE", "BlockPool"]

_NOT_ASKED = "not asked for (BlockPool(plan, prefix_caching=True))"


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
        raise too_long(request_id, num_tokens, max_model_len, "attach")
    return num_tokens, known


class BlockPool:
    """Block ids of a plan, handed to groups and tracked per request.

    Args:
        plan: the plan whose pools and groups the pool serves.
        lowest_first: hand out the lowest free block ids first (the default). ``False`` hands
            out the ids freed last first (a stack, several times faster), for callers that only
            count pages, such as the simulator; a pool with aligned runs always takes single
            ids lowest first, which keeps runs free at the high end.
        prefix_caching: share full blocks of equal leading tokens across requests
            (:meth:`attach_prefix`), keep freed ones cached until their ids are needed, and count
            hits (:attr:`prefix_cache_stats`). Off by default; off, the pool behaves and runs as
            it always did. A state group (SSM, linear attention) caches checkpoints as its
            ``cache_mode`` says (``align``: the state at each block boundary a request's step
            ends on; ``all``: at every block boundary), and a hit needs the checkpoint at
            exactly its length. A plan with a group that cannot cache (a state in cache mode
            ``none``, or a kind with its own ``live_pages``) gets a pool that caches nothing
            (the stats say why).
        free_blocks: how each pool keeps its free ids, ``(num_blocks, {group: blocks_per_page})
            -> FreeBlocks`` (default: the fastest, :func:`~kvcore.runtime.free_blocks.free_blocks_for`).
            A :class:`~kvcore.runtime.free_blocks.FreeBlocks` subclass that overrides ``take``
            or ``release`` sees every id taken and released through them, one at a time: how
            tests break a pool on purpose.
        on_evict: with prefix caching, called with ``(pool, block id, key)`` for each cached
            block evicted to hand its id out again (where a second memory tier keeps it).
        host_tier: with prefix caching and a plan with an
            :attr:`~kvcore.plan.KVCachePlan.offload_tier`, keep evicted cached pages of the
            kinds whose ``offload_unit`` lets them go (``"block"``: token blocks one at a
            time; ``"checkpoint"``: a state checkpoint, its whole page) in the plan's host
            rows (:class:`~kvcore.runtime.host_cache.HostCache`, one per pool) and bring them
            back when a lookup needs them (:attr:`host_tier_stats`): a hit is the longest
            prefix every group serves from the device or the host. On by default; ``False``
            drops evicted pages as a plan without a tier does.

    Attributes:
        plan: the plan.
        groups: the plan's groups.
        num_blocks: block ids of all pools together.
        pools: one :class:`~kvcore.runtime.one_pool.OnePool` per plan pool.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        *,
        lowest_first: bool = True,
        prefix_caching: bool = False,
        free_blocks: FreeBlocksFactory | None = None,
        on_evict: EvictionHook | None = None,
        host_tier: bool = True,
    ) -> None:
        self.plan = plan
        self.groups: tuple[KVCacheGroup, ...] = plan.groups
        self.num_blocks: int = plan.num_blocks
        self._max_len = plan.context.max_model_len
        count = len(plan.pools)
        labels = [
            f"pool {p}: " if count > 1 else "" for p in range(count)
        ]  # messages name a pool among several
        reasons = [uncacheable(plan, p, labels[p]) for p in range(count)] if prefix_caching else []
        self._caching = prefix_caching and not any(reasons)
        self._cache_reason = "" if self._caching else next((r for r in reasons if r), _NOT_ASKED)
        pools = []
        for p in range(count):
            spans = {i: plan.groups[i].blocks_per_page for i in plan.groups_in(p)}
            num_blocks = plan.pools[p].num_blocks
            free = (
                free_blocks(num_blocks, spans)
                if free_blocks is not None
                else free_blocks_for(num_blocks, spans, lowest_first=lowest_first)
            )
            pools.append(
                OnePool(
                    plan,
                    p,
                    free,
                    prefix_caching=self._caching,
                    on_evict=on_evict,
                    label=labels[p],
                    host_tier=host_tier,
                )
            )
        self.pools: tuple[OnePool, ...] = tuple(pools)
        #: per group, the tokens its hits come in multiples of (tokens per page, or a state's block size)
        self._paged = [hit_unit(g.spec) for g in plan.groups]
        self._step = hit_step_of(plan) if self._caching and self._paged else 1
        self._records: dict[Hashable, RequestRecord] = {}
        self._lookups = self._hits = self._queried = self._hit_tokens = 0
        self._group_hits = [0] * len(self.groups)  # per group: lookups its cached pages served
        self._group_pages = [0] * len(self.groups)  # per group: the cached pages they used
        self._host = any(pool.cache is not None and pool.cache.host is not None for pool in self.pools)
        self._host_hits = self._host_hit_tokens = 0

    # -- figures -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Block ids a request could take now, all pools together: those no group holds and,
        with prefix caching, the cached blocks no request holds (:attr:`num_evictable_blocks`),
        which are evicted least recently used first when needed. The null block is never free."""
        return sum([pool.num_free_blocks for pool in self.pools])

    def num_free_blocks_in(self, pool: int) -> int:
        """:attr:`num_free_blocks` of pool ``pool`` of the plan (a one-pool plan has pool 0 only).

        Raises:
            InvalidInputError: the plan has no pool ``pool``.
        """
        return self.pools[self._pool_index(pool)].num_free_blocks

    def num_usable_blocks_in(self, pool: int) -> int:
        """:attr:`num_usable_blocks` of pool ``pool`` of the plan.

        Raises:
            InvalidInputError: the plan has no pool ``pool``.
        """
        return self.pools[self._pool_index(pool)].num_usable_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no request holds, all pools together: counted free, kept until their
        ids are needed (always 0 without prefix caching)."""
        return sum(pool.cache.num_evictable for pool in self.pools if pool.cache is not None)

    @property
    def num_usable_blocks(self) -> int:
        """Block ids groups may hold, all pools together: all of them but each pool's null
        block, if the plan has one. The pool is empty again when :attr:`num_free_blocks`
        equals this."""
        return sum(pool.num_usable_blocks for pool in self.pools)

    def num_free_pages(self, group: int) -> int:
        """Pages ``group`` could take now in its pool: free ids (cached ones no request holds
        included), or fully free aligned runs."""
        chosen = self._group(group)
        pool = self.pools[chosen.pool]
        span = chosen.blocks_per_page
        return pool.num_free_blocks if span == 1 else pool.free.runs[span].full

    def blocks_of(self, group: int, page: int) -> range:
        """The block ids (of the group's pool) page ``page`` of ``group`` covers."""
        span = self._group(group).blocks_per_page
        return range(page * span, (page + 1) * span)

    def owner(self, block: int, pool: int = 0) -> int | None:
        """The group holding block id ``block`` of pool ``pool``, or ``None`` when no group
        does (a free id, or the plan's null block, which is never free)."""
        group = self.pools[self._pool_index(pool)].free.owner[block]
        return None if group < 0 else group

    # -- pages outside requests ----------------------------------------------------------------

    def allocate(self, group: int, num_pages: int) -> list[int]:
        """Take ``num_pages`` pages of ``group``'s pool for it, all or none.

        Args:
            group: index of the group in the plan.
            num_pages: pages to take.

        Returns:
            The pages (block-table entries): block ids for single-block pages (lowest first),
            aligned-run indices for larger pages (highest first; in a pool of runs of several
            lengths and no single ids, the shortest lowest first).

        Raises:
            BlockPoolExhaustedError: too few free ids (or free aligned runs); nothing was taken.
            InvalidInputError: the pool caches prefixes (its request methods own every id).
        """
        self._refuse_if_caching("allocate")
        index = self._index(group)
        return self.pools[self.groups[index].pool].allocate(index, num_pages)

    def free(self, group: int, pages: Iterable[int]) -> None:
        """Give ``group``'s ``pages`` back to its pool.

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
        chosen = self._group(group)
        pool = self.pools[chosen.pool]
        owner = pool.free.owner
        num_pages = self.plan.num_pages(chosen)
        for page in pages:
            if not 0 <= page < num_pages:
                raise InvalidInputError(
                    f"page {page} is out of range for group {group}, which has {num_pages} pages"
                )
            for block in self.blocks_of(group, page):
                if owner[block] != group:
                    raise InvalidInputError(
                        f"cannot free page {page} of group {group}: block id {block} is "
                        f"{holder(owner[block])}, not held by that group (freed twice?)"
                    )
        if len(set(pages)) != len(pages):
            raise InvalidInputError(f"cannot free the same page twice in one call (got {pages})")
        loose = pool.loose[group]
        for page in pages:
            if page not in loose:
                raise self._not_loose(group, page)
        loose.difference_update(pages)
        pool.free.give_back_pages({group: pages})

    # -- requests --------------------------------------------------------------------------------

    @property
    def requests(self) -> tuple[Hashable, ...]:
        """The requests holding pages, in arrival order."""
        return tuple(self._records)

    def num_tokens(self, request_id: Hashable) -> int:
        """Tokens the request's tables cover (the largest ``num_tokens`` reserved)."""
        return self._record(request_id).tokens

    def block_table(self, request_id: Hashable, group: int) -> list[int]:
        """A copy of the request's block table for ``group`` (ids of the group's pool,
        ``NULL_PAGE`` where freed)."""
        return list(self._record(request_id).tables[self._index(group)])

    def table_extent(self, request_id: Hashable, group: int) -> range:
        """``range(first entry not released, table length)`` of the request's table for
        ``group``, in O(1): the entries before it are :data:`NULL_PAGE`, those in it may hold
        pages. :class:`~kvcore.runtime.block_tables.BlockTables` reads it to apply a change in
        place."""
        record = self._record(request_id)
        index = group if type(group) is int and 0 <= group < len(self.groups) else self._index(group)
        length = len(record.tables[index])
        return range(min(record.released[index], length), length)

    def live_pages(self, request_id: Hashable, group: int) -> list[int]:
        """The pages the request holds in ``group`` now (its table without freed entries)."""
        return [page for page in self.block_table(request_id, group) if page != NULL_PAGE]

    def blocks_needed(self, group: int, num_tokens: int) -> int:
        """Block ids (of its pool) ``group`` holds at most for a request of ``num_tokens`` tokens.

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
        """Block ids :meth:`reserve` would take to cover ``num_tokens`` tokens now, all pools
        together (``pools[p].new_blocks_needed(...)`` for one)."""
        check_hashable(request_id)
        record = self._records.get(request_id)
        return sum(pool.new_blocks_needed(record, num_tokens) for pool in self.pools)

    def reserve(self, request_id: Hashable, num_tokens: int) -> dict[int, list[int]]:
        """Grow the request's tables (every group of every pool) to cover ``num_tokens`` tokens,
        all or none.

        Call it before a step that computes tokens up to position ``num_tokens - 1``. A new
        request starts empty. Each group's table grows to ``spec.live_pages(num_tokens,
        computed).stop`` entries (``computed`` the last :meth:`release_stale` count), never
        more; entries already released stay :data:`NULL_PAGE`. Reserving the tokens a request
        already covers changes nothing; fewer is an error (:meth:`truncate` shrinks a request).

        Returns:
            ``{group index: pages taken}`` for the groups that grew (the new pages are the
            tables' last entries; ids of each group's pool).

        Raises:
            InvalidInputError: ``num_tokens`` is negative, above the plan's ``max_model_len``, or
                fewer than the request covers; the request id is not hashable.
            BlockPoolExhaustedError: some pool has too few free ids (a plan of several pools:
                the message names it); nothing was taken in any pool.
        """
        if type(num_tokens) is not int or num_tokens < 0 or num_tokens > self._max_len:
            check_reserve(request_id, num_tokens, self._max_len)
        try:
            record = self._records.get(request_id)
        except TypeError:  # a list or dict: refused before any table is touched
            check_hashable(request_id)
            raise
        new = record is None
        if record is None:
            record = RequestRecord(len(self.groups))
        elif num_tokens < record.tokens:
            raise shrinking(request_id, num_tokens, record.tokens)
        pools = self.pools
        if len(pools) > 1:  # every pool has room before any takes (an evicted block stays evicted)
            self._check_room(request_id, record, num_tokens)
            lengths = [len(table) for table in record.tables]
        taken: dict[int, list[int]] | None = None
        for pool in pools:
            grown = pool.grow(record, num_tokens)
            if grown is None:  # no aligned run free (the pool took nothing)
                needed = pool.new_blocks_needed(record, num_tokens)
                for done in pools[: pool.index]:  # give back what the pools before it took
                    done.truncate(record, [lengths[i] for i in done.members], [])
                raise self._exhausted(request_id, num_tokens, pool.index, needed)
            if taken is None:
                taken = grown
            else:
                taken.update(grown)
        if new:
            self._records[request_id] = record
            record.tokens = num_tokens
        elif num_tokens > record.tokens:
            record.tokens = num_tokens
        if record.pending is not None:
            self._count_lookup(record)
        return taken if taken is not None else {}

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
            held; an ``align`` state group that reached a block boundary is named with the
            checkpoint it let go of, its table rewritten: the running state's page moved to
            entry 0 as the new checkpoint, and the next ``reserve`` takes a running page).

        Raises:
            InvalidInputError: unknown request, a negative token count, or more tokens than the
                request's tables cover (tokens not reserved cannot be computed); nothing changed.
        """
        try:
            record = self._records[request_id]
        except (KeyError, TypeError):
            record = self._record(request_id)  # raises naming the request
        if type(num_computed_tokens) is not int or num_computed_tokens < 0:
            check_int(num_computed_tokens, "'num_computed_tokens'", minimum=0)
        if num_computed_tokens > record.tokens:  # a caller may skip a reserve that would take nothing
            if not all(pool.covers(record, num_computed_tokens) for pool in self.pools):
                raise InvalidInputError(
                    f"request {request_id!r} cannot have {num_computed_tokens} computed tokens: its "
                    f"tables cover {record.tokens}; reserve() the tokens before computing them"
                )
            record.tokens = num_computed_tokens
        if num_computed_tokens > record.computed:
            record.computed = num_computed_tokens
        content = record.content
        let_go: dict[int, list[int]] = {}  # state checkpoints an align table moved on from
        if content is not None and record.computed >= record.due:  # cache the full blocks first
            record.due = min(
                pool.cache.register(record, content, record.computed, let_go)  # type: ignore[union-attr]
                for pool in self.pools
            )
        freed: dict[int, list[int]] | None = None
        for pool in self.pools:
            shrunk = pool.release(record)
            if freed is None:
                freed = shrunk
            else:
                freed.update(shrunk)
        if let_go:
            freed = {**(freed or {}), **let_go}
        return freed if freed is not None else {}

    def free_request(self, request_id: Hashable) -> None:
        """Free every page the request holds in every pool and forget it.

        Raises:
            InvalidInputError: unknown request.
        """
        record = self._record(request_id)
        for pool in self.pools:
            pool.free_tables(record)
        del self._records[request_id]

    def truncate(self, request_id: Hashable, num_tokens: int) -> dict[int, list[int]]:
        """Shrink the request to its first ``num_tokens`` tokens, freeing the pages past them.

        For rollback: speculative decoding reserves and computes draft tokens, then keeps only
        the accepted ones. Each group's table is cut to ``spec.live_pages(num_tokens,
        computed).stop`` entries (``computed`` = ``min(num_computed_tokens, num_tokens)``, which
        becomes the request's computed count); the pages cut off are freed. With prefix
        caching, a cut-off page another request shares is only dropped from this table, and
        a kept page that is cached but will be written again (``num_tokens`` ends inside it)
        leaves the cache. Truncating to the tokens the request covers changes nothing. Every
        pool is checked before any is cut.

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
                tokens would be overwritten). Nothing changed in any pool.
        """
        record = self._record(request_id)
        check_int(num_tokens, "'num_tokens'", minimum=0)
        if num_tokens > record.tokens:
            raise InvalidInputError(
                f"cannot truncate request {request_id!r} to {num_tokens} tokens: it covers {record.tokens}; "
                "reserve() grows a request"
            )
        if num_tokens == record.tokens:
            return {}
        cuts = [pool.check_truncate(request_id, record, num_tokens) for pool in self.pools]
        freed: dict[int, list[int]] = {}
        for pool, (stops, rewritten) in zip(self.pools, cuts, strict=True):
            freed.update(pool.truncate(record, stops, rewritten))
        registered = record.registered
        if registered is not None:  # blocks past the cut are cached again once recomputed
            for index, per_page in enumerate(self._paged):
                registered[index] = min(registered[index], num_tokens // per_page)
            record.due = 0
            for per_page, keys in record.chains.items():
                del keys[num_tokens // per_page :]
        record.tokens = num_tokens
        record.computed = min(record.computed, num_tokens)
        return freed

    # -- prefix caching --------------------------------------------------------------------------

    @property
    def prefix_caching(self) -> bool:
        """Whether the pool caches prefixes (asked for, and every group of every pool can)."""
        return self._caching

    @property
    def hit_step(self) -> int:
        """Tokens every prefix hit is a multiple of (the least common multiple of every group's
        tokens per page, and of a state group's block size); 1 without prefix caching."""
        return self._step

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups and hits (one per request, the hit common to every pool), evictions (all
        pools together) and what each group kind's pages served; see
        :class:`~kvcore.runtime.prefix_cache.PrefixCacheStats`."""
        kinds: dict[str, list[int]] = {}
        if self._caching:
            for index, group in enumerate(self.groups):
                counts = kinds.setdefault(group.spec.kind, [0, 0])
                counts[0] = max(counts[0], self._group_hits[index])  # a hit of the kind, not of each group
                counts[1] += self._group_pages[index]
        return PrefixCacheStats(
            enabled=self._caching,
            reason=self._cache_reason,
            lookups=self._lookups,
            hits=self._hits,
            queried_tokens=self._queried,
            hit_tokens=self._hit_tokens,
            evictions=sum(pool.cache.evictions for pool in self.pools if pool.cache is not None),
            by_kind=tuple(KindHits(kind, hits, pages) for kind, (hits, pages) in kinds.items()),
        )

    @property
    def host_tier_stats(self) -> HostTierStats:
        """What the host tier kept and gave back (all pools together); see
        :class:`~kvcore.runtime.host_cache.HostTierStats`. Hits are counted as
        :attr:`prefix_cache_stats` counts them (when a looked-up request's first ``reserve``
        succeeds); bytes when they move."""
        hosts = [(pool, pool.cache.host) for pool in self.pools if pool.cache is not None and pool.cache.host]
        return HostTierStats(
            enabled=self._host,
            host_blocks=sum(host.rows.rows for _, host in hosts),
            held_blocks=sum(host.held_blocks for _, host in hosts),
            device_hit_tokens=self._hit_tokens - self._host_hit_tokens,
            host_hits=self._host_hits,
            host_hit_tokens=self._host_hit_tokens,
            offloaded_blocks=sum(host.offloaded_blocks for _, host in hosts),
            offloaded_bytes=sum(host.offloaded_blocks * host.bytes_per_block for _, host in hosts),
            restored_blocks=sum(host.restored_blocks for _, host in hosts),
            restored_bytes=sum(host.restored_blocks * host.bytes_per_block for _, host in hosts),
            host_evictions=sum(host.host_evictions for _, host in hosts),
        )

    def ref_count(self, block: int, pool: int = 0) -> int:
        """How many requests' tables hold block id ``block`` of pool ``pool`` (with prefix
        caching; without it, 1 for a block a request's table holds, else 0 — pages taken
        with :meth:`allocate` are not counted)."""
        chosen = self.pools[self._pool_index(pool)]
        if chosen.cache is not None:
            return chosen.cache.ref[self._first_id(chosen, block)]
        return sum(block in record.tables[i] for record in self._records.values() for i in chosen.members)

    def is_cached(self, block: int, pool: int = 0) -> bool:
        """Whether block id ``block`` of pool ``pool`` is in the prefix cache (held by requests
        or evictable)."""
        chosen = self.pools[self._pool_index(pool)]
        cache = chosen.cache
        return cache is not None and cache.key[self._first_id(chosen, block)] is not None

    def attach_prefix(
        self, request_id: Hashable, content: Sequence[int] | PrefixKey, num_tokens: int | None = None
    ) -> int:
        """Start a request with its cached prefix: the longest run of leading tokens whose
        blocks every group of every pool has cached.

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
        check_hashable(request_id)
        num_tokens, known = _checked_prefix(
            request_id, request_id in self._records, content, num_tokens, self._max_len
        )
        record = RequestRecord(len(self.groups))
        hit = from_host = 0
        pages: tuple[int, ...] = ()
        if self._caching:
            record.content = content
            record.registered = [0] * len(self.groups)
            limit = min(num_tokens - 1, known)
            hit = self._agreed_hit(record, content, limit, with_host=False)
            if self._host and hit < limit:  # the tokens beyond the device's hit may be on the host
                tiered = self._agreed_hit(record, content, limit, known=hit)
                if tiered > hit and self._restores_fit(record, content, tiered):
                    from_host, hit = tiered - hit, tiered
            if hit:
                for pool in self.pools:
                    pool.cache.attach(record, content, hit)  # type: ignore[union-attr]
                record.tokens = record.computed = hit
                pages = tuple(len(table) - table.count(NULL_PAGE) for table in record.tables)
        record.pending = (num_tokens, hit, from_host, pages)
        self._records[request_id] = record
        return hit

    # -- internals -------------------------------------------------------------------------------

    def _agreed_hit(
        self,
        record: RequestRecord,
        content: Sequence[int] | PrefixKey,
        limit: int,
        with_host: bool = True,
        known: int = 0,
    ) -> int:
        """The most tokens, at most ``limit``, every pool has cached (on the device, or in its
        host tier too with ``with_host``; ``known`` tokens every pool has, found before): each
        pool's hit bounds the next pool's until every pool in a row agrees (a pool's hit within
        its own hit is that hit, so the pool that lowered the bound agrees with it)."""
        pools, step = self.pools, self._step
        agreed, at = 0, 0
        while agreed < len(pools) and limit > 0:
            hit = pools[at].cache.find_hit(record, content, limit, step, with_host, known)  # type: ignore[union-attr]
            agreed = agreed + 1 if hit == limit else 1
            limit = hit
            at = (at + 1) % len(pools)
        return max(limit, 0)

    def _restores_fit(self, record: RequestRecord, content: Sequence[int] | PrefixKey, hit: int) -> bool:
        """Whether every pool has device pages for the host-held pages of a hit of ``hit``
        tokens, blocks and checkpoints (if not, the hit is the device's alone: a device that
        cannot take the pages back is too full to admit the request anyway, and walking down
        to a partial restore would cost a lookup per block)."""
        return all(
            pool.cache.restores_fit(record, content, hit)  # type: ignore[union-attr]
            for pool in self.pools
        )

    def _first_id(self, pool: OnePool, block: int) -> int:
        """The first id of the page holding ``block`` (a page of an aligned run is counted by it)."""
        group = pool.free.owner[block]
        span = self.groups[group].blocks_per_page if group >= 0 else 1
        return block - block % span

    def _count_lookup(self, record: RequestRecord) -> None:
        queried, hit, from_host, pages = record.pending  # type: ignore[misc]
        record.pending = None
        for index, count in enumerate(pages):
            if count:
                self._group_hits[index] += 1
                self._group_pages[index] += count
        self._lookups += 1
        self._queried += queried
        self._hit_tokens += hit
        self._hits += hit > 0
        self._host_hit_tokens += from_host
        self._host_hits += from_host > 0

    def _check_room(self, request_id: Hashable, record: RequestRecord, num_tokens: int) -> None:
        """Refuse a reserve some pool has too few free ids for (nothing taken)."""
        for p, pool in enumerate(self.pools):
            needed = pool.new_blocks_needed(record, num_tokens)
            if needed > pool.num_free_blocks:
                raise self._exhausted(request_id, num_tokens, p, needed)

    def _exhausted(
        self, request_id: Hashable, num_tokens: int, p: int, needed: int
    ) -> BlockPoolExhaustedError:
        """The error of a :meth:`reserve` pool ``p`` has too few ids for (nothing was taken)."""
        if len(self.pools) == 1:
            free = self.num_free_blocks
            return BlockPoolExhaustedError(
                f"request {request_id!r} needs {needed} more block ids to cover {num_tokens} tokens "
                f"but {free} of {self.num_blocks} are free (or no aligned run is); nothing "
                "was taken: free or preempt another request, or plan more blocks",
                requested_blocks=needed,
                free_blocks=free,
            )
        pool = self.pools[p]
        free = pool.num_free_blocks
        kinds = ", ".join(sorted({self.groups[i].spec.kind for i in pool.members}))
        return BlockPoolExhaustedError(
            f"request {request_id!r} needs {needed} more block ids of pool {p} ({kinds}) to cover "
            f"{num_tokens} tokens but {free} of its {pool.num_blocks} are free (or no aligned run "
            "is); nothing was taken in any pool: free or preempt another request, or plan more blocks",
            requested_blocks=needed,
            free_blocks=free,
        )

    def _not_loose(self, group: int, page: int) -> InvalidInputError:
        """The error of :meth:`free` given a page that :meth:`allocate` did not hand out."""
        index = self._index(group)
        holders = [r for r, record in self._records.items() if page in record.tables[index]]
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

    def _refuse_if_caching(self, what: str) -> None:
        if self._caching:
            raise InvalidInputError(
                f"{what}() is for pools without prefix caching: this pool's request methods "
                "(reserve, release_stale, truncate, free_request) own every block id"
            )

    def _record(self, request_id: Hashable) -> RequestRecord:
        """The request's record (refusing an unhashable or unknown request)."""
        try:
            record = self._records.get(request_id)
        except TypeError:
            check_hashable(request_id)
            raise
        if record is None:
            raise unknown(request_id, len(self._records))
        return record

    def _pool_index(self, pool: int) -> int:
        if pool == 0 and type(pool) is int:
            return 0
        return check_int(pool, "pool index", minimum=0, below=len(self.pools))

    def _group(self, group: int) -> KVCacheGroup:
        return self.groups[self._index(group)]

    def _index(self, group: int) -> int:
        if type(group) is int and 0 <= group < len(self.groups):
            return group
        return check_int(group, "group index", minimum=0, below=len(self.groups))


if not TYPE_CHECKING:  # type checkers keep refusing names the module does not define
    __getattr__ = names_removed_from(
        __name__, {"MultiPoolBlockPool": "BlockPool, which serves a plan of any number of pools"}
    )
