"""The block pool of a plan of several pools: one :class:`~kvcore.runtime.block_pool.BlockPool`
per pool, behind the same methods.

``BlockPool(plan)`` returns a :class:`MultiPoolBlockPool` when ``plan`` has more than one pool
(:attr:`~kvcore.KVCachePlan.pools`); a one-pool plan keeps the plain pool and its speed. Each
pool of the plan is driven by a plain pool over :meth:`~kvcore.KVCachePlan.pool_plan`: pools
never share bytes, so they never share block ids either, and each keeps its own free list.

What the caller sees is the plan's: group indices are indices into ``plan.groups`` (the pool
maps them to its pools' own), and a group's pages and block-table entries are ids of the
group's pool (``0 .. pool.num_blocks - 1``, as a block table holds them). A request lives in
every pool: :meth:`MultiPoolBlockPool.reserve` takes its pages in every pool or in none (it
checks every pool has room first, and gives back what it took if an aligned run was missing);
:meth:`MultiPoolBlockPool.truncate` checks every pool before it cuts any. Methods that take a
bare block id (:meth:`MultiPoolBlockPool.owner`, ``ref_count``, ``is_cached``) take its pool
too, since block ``b`` of pool 0 and block ``b`` of pool 1 are different ids.

Prefix caching: a request hits the longest prefix every pool has cached (each pool is asked
with the others' answer until they agree), so a hit is a prefix of the request in every
group of every pool; a pool that cannot cache (a per-request state) turns caching off for all
(:attr:`MultiPoolBlockPool.prefix_cache_stats` says why).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Sequence

from kvcore.errors import BlockPoolExhaustedError, InvalidInputError
from kvcore.plan import KVCachePlan
from kvcore.runtime.block_pool import BlockPool
from kvcore.runtime.prefix_cache import PrefixCacheStats, PrefixKey
from kvcore.validators import check_int


class MultiPoolBlockPool(BlockPool):
    """The block ids of a plan of several pools, handed to groups and tracked per request.

    Built by ``BlockPool(plan)`` for such a plan (the arguments are :class:`BlockPool`'s,
    passed to each pool's own pool). Every method of :class:`BlockPool` works, with group
    indices of the plan and block ids of the group's pool; the figures without a pool
    (:attr:`num_free_blocks`, :attr:`num_usable_blocks`) count all pools together and the
    ``..._in(pool)`` forms count one.

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
                    self._cache_reason = reason if not prefix_caching else f"pool {p}: {reason}"
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
        together (:meth:`new_blocks_needed_in` for one)."""
        return sum(pool.new_blocks_needed(request_id, num_tokens) for pool in self.pools)

    def new_blocks_needed_in(self, pool: int, request_id: Hashable, num_tokens: int) -> int:
        """Block ids of pool ``pool`` :meth:`reserve` would take to cover ``num_tokens`` tokens now."""
        return self.pools[self._pool_index(pool)].new_blocks_needed(request_id, num_tokens)

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
        known = request_id in self._order  # reserved before, or attached
        if type(num_tokens) is not int or num_tokens < 0:
            check_int(num_tokens, "'num_tokens'", minimum=0)
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
        if request_id in self._order:
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
