"""The plan: how many blocks there are, which layers share a block table, and where bytes live.

A :class:`KVCachePlan` is what a policy produces and what allocation consumes. It is a frozen
value: it can be logged, compared, serialized (:mod:`kvcore.planning.serialization`) and checked
(:mod:`kvcore.planning.invariants`) without any device.

The block model: a plan has one or more *pools* (:class:`KVCachePool`) of block ids; each
group draws its block ids from one pool, and a request needs room in every pool its groups use.
Within a pool a block id belongs to one group at a time, so layers of different groups of one
pool may place their pages on the same bytes; pools never share bytes. A group's page normally
takes one block id; a group whose page is a large fixed state (SSM) may take an aligned run of
``blocks_per_page`` ids instead, so attention keeps its small block size. Most plans have one
pool, and read as they always have (:attr:`KVCachePlan.num_blocks`,
:attr:`KVCachePlan.bytes_per_block`); a policy that gives each retention kind its own pool
(``kind_pools``) makes several.

A group's layers share its block table, and so which pages a request holds; their pages may
still differ in size (a *mixed-page* group, :attr:`KVCacheGroup.layer_specs`): layers whose
specs have one :attr:`~kvcore.spec.KVCacheSpec.retention_key` hold the same entries.

A plan may carry an *offload tier* (:class:`OffloadTier`): host memory, per pool, that holds
pages moved off the device (:mod:`kvcore.runtime.host_tier`), in units of the pool's block ids.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Iterator, Mapping

import attrs

from kvcore.errors import MultiplePoolsError, PlanValidationError
from kvcore.peaks import pool_peaks
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.validators import non_negative_int, positive_int


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _null_block(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (type(value) is not int or value != 0):
        raise PlanValidationError(
            [f"'null_block' must be 0 (block id 0 reserved) or None (got {value!r})"]
        )


def _layer_specs(value: Mapping[str, KVCacheSpec] | None) -> dict[str, KVCacheSpec]:
    return dict(value or {})


def _pools(value: Iterable[KVCachePool]) -> tuple[KVCachePool, ...]:
    return tuple(value)


def _pool_bytes(value: Iterable[int]) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise PlanValidationError(
            [f"'pool_bytes' must be a list of byte counts, one per pool (got {value!r})"]
        )
    return tuple(value)


def _each_non_negative(
    instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]
) -> None:
    if not value:
        raise PlanValidationError(["an offload tier needs 'pool_bytes' for at least one pool (got none)"])
    for index, nbytes in enumerate(value):
        if type(nbytes) is not int or nbytes < 0:
            raise PlanValidationError(
                [f"offload tier: pool {index}'s host bytes must be an int >= 0 (got {nbytes!r})"]
            )


def _offload_tier(
    instance: object, attribute: attrs.Attribute[OffloadTier | None], value: OffloadTier | None
) -> None:
    if value is not None and not isinstance(value, OffloadTier):
        raise PlanValidationError([f"'offload_tier' must be an OffloadTier or None (got {value!r})"])


def _split(value: Iterable[float] | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise PlanValidationError([f"'pool_split' must be a list of fractions, one per pool (got {value!r})"])
    return tuple(value)


def _split_fractions(
    instance: object, attribute: attrs.Attribute[tuple[float, ...] | None], value: tuple[float, ...] | None
) -> None:
    for fraction in value or ():
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise PlanValidationError(
                [f"'pool_split': every fraction must be a number in (0, 1) (got {fraction!r})"]
            )


def _groups(value: Iterable[KVCacheGroup]) -> tuple[KVCacheGroup, ...]:
    return tuple(value)


def _tensors(value: Iterable[KVCacheTensor]) -> tuple[KVCacheTensor, ...]:
    return tuple(value)


def _sharing(value: Mapping[str, str] | None) -> dict[str, str]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class KVCachePool:
    """One pool of block ids: its own count, its own bytes per block id, its own bytes.

    Attributes:
        num_blocks: block ids in the pool (ids ``0 .. num_blocks - 1``; each pool counts
            from 0, and a group's block table holds ids of its own pool).
        bytes_per_block: device bytes each block id of this pool accounts for.
        offset: where the pool's bytes start in the plan's buffer (a single-buffer plan lays
            its pools one after another); ``0`` for a plan of separate allocations.
    """

    num_blocks: int = attrs.field(validator=non_negative_int)
    bytes_per_block: int = attrs.field(validator=non_negative_int)
    offset: int = attrs.field(default=0, validator=non_negative_int)

    @property
    def nbytes(self) -> int:
        """Bytes the pool takes: ``num_blocks * bytes_per_block``."""
        return self.num_blocks * self.bytes_per_block


@attrs.frozen(kw_only=True)
class OffloadTier:
    """Host memory that holds pages moved off the device: a second tier below the pools.

    A block pool that runs out keeps evicted pages here instead of dropping them and brings
    them back on a hit (the pages of kinds whose
    :attr:`~kvcore.spec.KVCacheSpec.offload_unit` allows it). The tier of each pool is counted
    in that pool's block ids: it holds ``pool_bytes[p] // bytes_per_block`` of them
    (:meth:`KVCachePlan.host_blocks_in`), so pages keep their device size on the host.

    Attributes:
        pool_bytes: host bytes for each pool of the plan, in pool order (``0``: that pool
            keeps nothing on the host).
    """

    pool_bytes: tuple[int, ...] = attrs.field(converter=_pool_bytes, validator=_each_non_negative)

    @property
    def nbytes(self) -> int:
        """Host bytes of every pool together."""
        return sum(self.pool_bytes)


def split_host_memory(pools: Iterable[KVCachePool], nbytes: int) -> OffloadTier:
    """Share ``nbytes`` of host memory among ``pools`` as their device bytes are shared, in
    whole block ids of each pool (what a pool cannot use is left out, so the tier may hold a
    little less than ``nbytes``).

    One pool takes all of it (less the remainder of a block); several pools each take bytes in
    proportion to their device bytes, so every pool's tier holds about the same fraction of its
    device capacity, the fraction a pool that runs out at once with the others wants.

    Args:
        pools: the plan's pools.
        nbytes: host bytes for the whole tier (``>= 0``).

    Returns:
        The tier, one entry per pool.

    Raises:
        PlanValidationError: ``nbytes`` is negative or not an int.
    """
    chosen = tuple(pools)
    if type(nbytes) is not int or nbytes < 0:
        raise PlanValidationError([f"host memory must be an int number of bytes >= 0 (got {nbytes!r})"])
    device = sum(p.nbytes for p in chosen)
    shares = []
    for pool in chosen:
        if not pool.bytes_per_block or not device:
            shares.append(0)
            continue
        # floor of nbytes * share, in whole blocks: the integer form keeps huge counts exact
        blocks = nbytes * pool.nbytes // device // pool.bytes_per_block
        shares.append(blocks * pool.bytes_per_block)
    return OffloadTier(pool_bytes=shares)


@attrs.frozen(kw_only=True)
class KVCacheGroup:
    """Layers that share one block table, and so which pages a request holds.

    Attributes:
        layer_names: the layers, in model order.
        spec: the group's spec: its block size and retention are every layer's; a layer not
            in :attr:`layer_specs` has exactly this spec.
        blocks_per_page: pool block ids one page of this group takes (an aligned run).
        pool: the index of the plan's pool the group draws its block ids from.
        layer_specs: ``{layer: spec}`` for the layers whose page differs from :attr:`spec`'s
            (a mixed-page group): each has :attr:`spec`'s block size and
            :attr:`~kvcore.spec.KVCacheSpec.retention_key`, so it holds the same block-table
            entries, and keeps its own page in the group's row. Empty for the usual group of
            one spec.
    """

    layer_names: tuple[str, ...] = attrs.field(converter=_names)
    spec: KVCacheSpec
    blocks_per_page: int = attrs.field(default=1, validator=positive_int)
    pool: int = attrs.field(default=0, validator=non_negative_int)
    layer_specs: Mapping[str, KVCacheSpec] = attrs.field(
        factory=dict, converter=_layer_specs, hash=False
    )

    def __attrs_post_init__(self) -> None:
        if self.layer_specs:
            problems = list(_mixed_page_problems(self))
            if problems:
                raise PlanValidationError(problems)

    def spec_of(self, layer_name: str) -> KVCacheSpec:
        """The spec of one of the group's layers (its own page size in a mixed-page group)."""
        return self.layer_specs.get(layer_name, self.spec)

    @property
    def specs(self) -> tuple[KVCacheSpec, ...]:
        """The distinct specs of the group's layers, :attr:`spec` first."""
        seen = [self.spec]
        for spec in self.layer_specs.values():
            if spec not in seen:
                seen.append(spec)
        return tuple(seen)

    @property
    def largest_page_bytes(self) -> int:
        """Bytes of the largest page any layer of the group has."""
        return max(spec.page_size_bytes for spec in self.specs)

    def pages_per_request(self, context: SizingContext) -> int:
        """Pages one request of ``context.max_model_len`` tokens holds at most in this group
        (the group's own worst case; a plan's figures add its groups at one moment,
        :meth:`KVCachePlan.blocks_per_request_by_pool`)."""
        return self.spec.max_num_blocks(context)

    def blocks_per_request(self, context: SizingContext) -> int:
        """Pool block ids one request of ``context.max_model_len`` tokens holds at most."""
        return self.pages_per_request(context) * self.blocks_per_page


@attrs.frozen(kw_only=True)
class KVCacheTensor:
    """A strided byte region that one or more layers view.

    Page ``j`` of every layer in ``shared_by`` starts at byte ``offset + j * page_stride`` of
    the backing memory (the shared buffer, or this tensor's own allocation). Layers that share
    a tensor belong to different groups; they never use the same page at the same time.

    Attributes:
        size: bytes from ``offset`` to the end of the last page.
        offset: where page 0 starts.
        page_stride: bytes from one page to the next.
        shared_by: the layers that view this region.
    """

    size: int
    offset: int = 0
    page_stride: int
    shared_by: tuple[str, ...] = attrs.field(converter=_names)

    def __attrs_post_init__(self) -> None:
        # one check for the usual case (a plan has a tensor per layer, so this is hot); the
        # validators word the problem otherwise
        size, offset, stride = self.size, self.offset, self.page_stride
        ints = type(size) is type(offset) is type(stride) is int
        if ints and size >= 0 and offset >= 0 and stride >= 1:
            return
        fields = attrs.fields(KVCacheTensor)
        non_negative_int(self, fields.size, size)
        non_negative_int(self, fields.offset, offset)
        positive_int(self, fields.page_stride, stride)


@attrs.frozen(kw_only=True, init=False)
class KVCachePlan:
    """A complete KV-cache plan for one worker.

    A one-pool plan is built as it always was, with ``num_blocks`` and ``bytes_per_block``; a
    plan of several pools is built with ``pools`` (and its groups say which pool each draws
    from).

    Attributes:
        policy: name of the policy that made it.
        pools: the block-id pools (one, usually). :attr:`num_blocks` counts the ids of all
            of them; :attr:`bytes_per_block` is the one pool's.
        single_buffer: ``True`` when every tensor is a view into one buffer of
            ``kv_cache_bytes`` (its pools one after another); ``False`` when each tensor is
            its own allocation of ``size``.
        groups: the block-table groups.
        tensors: the byte regions, each shared by one or more layers of one pool's groups.
        context: the request length (and step size) the plan was sized for.
        available_memory_bytes: the byte budget the plan was made for.
        kv_sharing: ``{layer: target layer}`` for layers that reuse another layer's cache
            (KV sharing across layers). A sharing layer is in no group's ``layer_names`` and
            no tensor's ``shared_by``: it takes no memory, views its target's tensor and reads
            its target's block table (:meth:`group_of`, :meth:`tensor_of` and
            :meth:`block_table_layers` answer for it, as vLLM puts it in its target's group).
        null_block: ``0`` when block id 0 of every pool is reserved as the *null block*: an
            engine pads its block tables with it (vLLM's convention), so it is never handed
            to a request and the capacity figures count :attr:`usable_blocks`, not
            :attr:`num_blocks`. ``None`` (the default): every block id serves requests. The
            null block's pages are still allocated, so :attr:`kv_cache_bytes` is unchanged.
        offload_tier: host memory for pages moved off the device (:class:`OffloadTier`, one
            entry per pool), or ``None`` (the default): no host tier. It is not device memory:
            :attr:`kv_cache_bytes` and the budget do not count it.
        pool_split: the share of the budget each pool was given
            (:attr:`PlanOptions.pool_split <kvcore.policy.PlanOptions.pool_split>`), one
            fraction per pool, so that the figures of what the budget holds
            (:func:`~kvcore.planning.capacity.own_pool_blocks`) split it the same way; ``None``
            (the default): split by what one request of ``max_model_len`` needs of each pool.
    """

    policy: str
    pools: tuple[KVCachePool, ...] = attrs.field(converter=_pools)
    single_buffer: bool
    groups: tuple[KVCacheGroup, ...] = attrs.field(converter=_groups)
    tensors: tuple[KVCacheTensor, ...] = attrs.field(converter=_tensors)
    context: SizingContext
    available_memory_bytes: int = attrs.field(validator=non_negative_int)
    kv_sharing: Mapping[str, str] = attrs.field(factory=dict, converter=_sharing, hash=False)
    null_block: int | None = attrs.field(default=None, validator=_null_block)
    offload_tier: OffloadTier | None = attrs.field(default=None, validator=_offload_tier)
    pool_split: tuple[float, ...] | None = attrs.field(
        default=None, converter=_split, validator=_split_fractions
    )

    def __init__(
        self,
        *,
        policy: str,
        single_buffer: bool,
        groups: Iterable[KVCacheGroup],
        tensors: Iterable[KVCacheTensor],
        context: SizingContext,
        available_memory_bytes: int,
        num_blocks: int | None = None,
        bytes_per_block: int | None = None,
        pools: Iterable[KVCachePool] | None = None,
        kv_sharing: Mapping[str, str] | None = None,
        null_block: int | None = None,
        offload_tier: OffloadTier | None = None,
        pool_split: Iterable[float] | None = None,
    ) -> None:
        """Build and check a plan: give ``num_blocks`` and ``bytes_per_block`` (one pool) or
        ``pools``.

        Raises:
            PlanValidationError: both or neither are given, or the plan breaks a structural
                rule (:func:`structural_problems`).
        """
        if pools is None:
            if num_blocks is None or bytes_per_block is None:
                raise PlanValidationError(
                    ["a plan needs 'num_blocks' and 'bytes_per_block' (one pool) or 'pools'"], policy=policy
                )
            pools = (KVCachePool(num_blocks=num_blocks, bytes_per_block=bytes_per_block),)
        elif num_blocks is not None or bytes_per_block is not None:
            raise PlanValidationError(
                ["give a plan either 'pools' or 'num_blocks' and 'bytes_per_block', not both"], policy=policy
            )
        self.__attrs_init__(
            policy=policy,
            pools=pools,
            single_buffer=single_buffer,
            groups=groups,
            tensors=tensors,
            context=context,
            available_memory_bytes=available_memory_bytes,
            kv_sharing=kv_sharing if kv_sharing is not None else {},
            null_block=null_block,
            offload_tier=offload_tier,
            pool_split=pool_split,
        )

    def __attrs_post_init__(self) -> None:
        problems = list(structural_problems(self))
        if problems:
            raise PlanValidationError(problems, policy=self.policy)

    # -- pools -----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Block ids in all pools together (the one pool's, in the usual plan)."""
        pools = self.pools
        return pools[0].num_blocks if len(pools) == 1 else sum(p.num_blocks for p in pools)

    @property
    def bytes_per_block(self) -> int:
        """Device bytes one block id accounts for.

        Raises:
            MultiplePoolsError: the plan has several pools, whose block ids cost different
                bytes; read ``plan.pools[i].bytes_per_block``.
        """
        if len(self.pools) != 1:
            raise MultiplePoolsError(
                f"this plan has {len(self.pools)} pools of "
                f"{', '.join(str(p.bytes_per_block) for p in self.pools)} bytes per block id; "
                "read plan.pools[i].bytes_per_block"
            )
        return self.pools[0].bytes_per_block

    @property
    def runs_in_one_pool(self) -> bool:
        """Whether an engine with a single pool of block ids (one ``num_blocks``, one block
        size in bytes: vLLM's ``KVCacheManager``, transformers' paged cache) can serve the plan,
        i.e. every group draws from one pool. kvcore's own runtime serves any number of pools."""
        return len(self.pools) == 1

    @property
    def names_pools(self) -> bool:
        """Whether output names each pool and a group's pool: only where the plan has several
        to tell apart. A plan's only pool goes without saying, so its reports give its blocks
        as the plan's."""
        return len(self.pools) > 1

    @property
    def is_multi_pool(self) -> bool:
        """Deprecated since 0.2 (removed in 0.3): ``len(plan.pools) > 1``; an engine asks
        :attr:`runs_in_one_pool`, a report :attr:`names_pools`."""
        warnings.warn(
            "KVCachePlan.is_multi_pool is deprecated: loop over plan.pools, or ask plan.runs_in_one_pool "
            "(an engine of one block pool) or plan.names_pools (output) (removed in kvcore 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )
        return len(self.pools) > 1

    def with_offload_tier(self, tier: OffloadTier | None) -> KVCachePlan:
        """This plan with ``tier`` as its host tier (``None``: without one); checked like any plan.

        Raises:
            PlanValidationError: the tier does not give one entry per pool.
        """
        return attrs.evolve(self, offload_tier=tier)

    def host_blocks_in(self, pool: int) -> int:
        """Block ids of pool ``pool`` its host tier holds: ``pool_bytes[pool] //
        bytes_per_block``; 0 without a tier."""
        tier = self.offload_tier
        per_block = self.pools[pool].bytes_per_block
        if tier is None or not per_block:
            return 0
        return tier.pool_bytes[pool] // per_block

    def pool_of(self, group: KVCacheGroup) -> KVCachePool:
        """The pool ``group`` draws its block ids from."""
        return self.pools[group.pool]

    def groups_in(self, pool: int) -> tuple[int, ...]:
        """The indices of the groups that draw from pool ``pool``."""
        return tuple(i for i, g in enumerate(self.groups) if g.pool == pool)

    def pool_plan(self, pool: int) -> KVCachePlan:
        """Pool ``pool`` as a one-pool plan of its own: its groups (in order, drawing from pool
        0), the tensors of their layers (offsets counted from the pool's start), the sharing
        layers whose targets are among them, the null block. Pools never share bytes, so what
        holds of each pool's plan holds of this one; a runtime drives a multi-pool plan as
        one pool per ``pool_plan``. A one-pool plan's ``pool_plan(0)`` is the plan itself.

        Raises:
            IndexError: there is no pool ``pool``.
        """
        chosen = self.pools[pool]
        if len(self.pools) == 1:
            return self
        groups = [attrs.evolve(g, pool=0) for g in self.groups if g.pool == pool]
        layers = {name for g in groups for name in g.layer_names}
        shift = chosen.offset if self.single_buffer else 0
        tensors = [
            attrs.evolve(t, offset=max(0, t.offset - shift))
            for t in self.tensors
            if any(name in layers for name in t.shared_by)
        ]
        return KVCachePlan(
            policy=self.policy,
            num_blocks=chosen.num_blocks,
            bytes_per_block=chosen.bytes_per_block,
            single_buffer=self.single_buffer,
            groups=groups,
            tensors=tensors,
            context=self.context,
            available_memory_bytes=chosen.nbytes,
            kv_sharing={name: target for name, target in self.kv_sharing.items() if target in layers},
            null_block=self.null_block,
            offload_tier=(
                None
                if self.offload_tier is None
                else OffloadTier(pool_bytes=(self.offload_tier.pool_bytes[pool],))
            ),
        )

    # -- lookups ---------------------------------------------------------------------------

    @property
    def layer_names(self) -> tuple[str, ...]:
        """Every planned layer, group by group."""
        return tuple(name for group in self.groups for name in group.layer_names)

    def group_of(self, layer_name: str) -> KVCacheGroup:
        """The group a layer belongs to, or a sharing layer's target belongs to (``KeyError``
        if it is not planned)."""
        return self._group_index()[self.kv_sharing.get(layer_name, layer_name)]

    def tensor_of(self, layer_name: str) -> KVCacheTensor:
        """The tensor a layer views, or a sharing layer's target views (``KeyError`` if it is
        not planned)."""
        return self._tensor_index()[self.kv_sharing.get(layer_name, layer_name)]

    def block_table_layers(self, group: int | KVCacheGroup) -> tuple[str, ...]:
        """Every layer that reads ``group``'s block table: its own layers, then the layers
        that share their cache (``kv_sharing``), in that order.

        Args:
            group: the group, or its index in :attr:`groups`.

        Returns:
            The layer names; a runner gives each of them the group's block table.
        """
        chosen = self.groups[group] if isinstance(group, int) else group
        if not self.kv_sharing:
            return chosen.layer_names
        own = set(chosen.layer_names)
        return (*chosen.layer_names, *(name for name, target in self.kv_sharing.items() if target in own))

    def with_kv_sharing(self, kv_sharing: Mapping[str, str]) -> KVCachePlan:
        """This plan with ``kv_sharing`` (``{layer: target layer}``) recorded; checked like any plan.

        Raises:
            PlanValidationError: a sharing layer has a cache of its own, or a target has none.
        """
        return attrs.evolve(self, kv_sharing={**self.kv_sharing, **kv_sharing})

    def _group_index(self) -> dict[str, KVCacheGroup]:
        return {name: g for g in self.groups for name in g.layer_names}

    def _tensor_index(self) -> dict[str, KVCacheTensor]:
        return {name: t for t in self.tensors for name in t.shared_by}

    def num_pages(self, group: KVCacheGroup) -> int:
        """Pages a layer of ``group`` has: its pool's block ids divided into runs of
        ``blocks_per_page``."""
        return self.pools[group.pool].num_blocks // group.blocks_per_page

    # -- figures ---------------------------------------------------------------------------

    def reserved_blocks_in(self, pool: int) -> int:
        """Block ids of pool ``pool`` that never serve a request: none, or (with a
        :attr:`null_block`) the aligned run that holds its block 0, one id unless a group's
        page spans several."""
        count = self.pools[pool].num_blocks
        if self.null_block is None or not count:
            return 0
        spans = (g.blocks_per_page for g in self.groups if g.pool == pool)
        return min(count, max(spans, default=1))

    def usable_blocks_in(self, pool: int) -> int:
        """Block ids of pool ``pool`` requests can hold."""
        return self.pools[pool].num_blocks - self.reserved_blocks_in(pool)

    @property
    def reserved_blocks(self) -> int:
        """Block ids that never serve a request, all pools together (see :meth:`reserved_blocks_in`)."""
        return sum(self.reserved_blocks_in(p) for p in range(len(self.pools)))

    @property
    def usable_blocks(self) -> int:
        """Block ids requests can hold: :attr:`num_blocks` less :attr:`reserved_blocks`."""
        return self.num_blocks - self.reserved_blocks

    @property
    def kv_cache_bytes(self) -> int:
        """Device bytes the plan allocates."""
        return sum(p.nbytes for p in self.pools)

    def blocks_per_request(self, max_model_len: int | None = None) -> int:
        """Block ids one request of ``max_model_len`` tokens holds at most: each pool's joint
        peak (:meth:`blocks_per_request_by_pool`), summed over pools."""
        return sum(self.blocks_per_request_by_pool(max_model_len))

    def blocks_per_request_by_pool(self, max_model_len: int | None = None) -> tuple[int, ...]:
        """Block ids one request of ``max_model_len`` tokens holds at most, in each pool: the
        most its groups of that pool hold at one moment together
        (:func:`~kvcore.peaks.pool_peaks`), not the sum of each group's own worst case, which
        comes at different moments (a full-attention group's at the end, a chunked-local
        group's mid-chunk)."""
        return pool_peaks(self.groups, len(self.pools), self._context_for(max_model_len))

    def max_concurrency(self, max_model_len: int | None = None) -> float:
        """Requests of ``max_model_len`` tokens (default: the plan's) the plan holds at once:
        the fewest any pool holds."""
        if len(self.pools) == 1:
            need = self.blocks_per_request(max_model_len)
            return self.usable_blocks / need if need else float("inf")
        needs = self.blocks_per_request_by_pool(max_model_len)
        return min(
            (self.usable_blocks_in(p) / need for p, need in enumerate(needs) if need),
            default=float("inf"),
        )

    def tokens_held(self, group: KVCacheGroup) -> int | None:
        """Tokens ``group``'s pool could hold for its layers, or ``None`` for a state."""
        per_page = group.spec.tokens_per_page
        usable = self.usable_blocks_in(group.pool)
        return None if per_page is None else usable // group.blocks_per_page * per_page

    def fits(self, max_model_len: int | None = None) -> bool:
        """Whether one request of ``max_model_len`` tokens fits in every pool."""
        if len(self.pools) == 1:
            return self.blocks_per_request(max_model_len) <= self.usable_blocks
        needs = self.blocks_per_request_by_pool(max_model_len)
        return all(need <= self.usable_blocks_in(p) for p, need in enumerate(needs))

    def largest_fitting_len(self, upper: int | None = None) -> int:
        """The largest request length (up to ``upper``, default the plan's) that fits; 0 if none."""
        hi = upper if upper is not None else self.context.max_model_len
        if self.fits(hi):
            return hi
        lo = 0  # invariant: lo fits (0 trivially), hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _context_for(self, max_model_len: int | None) -> SizingContext:
        if max_model_len is None or max_model_len == self.context.max_model_len:
            return self.context
        return self.context.with_max_model_len(max_model_len)

    def iter_layers(self) -> Iterator[tuple[str, KVCacheGroup, KVCacheTensor]]:
        """``(layer name, group, tensor)`` for every planned layer, group by group; a sharing
        layer (``kv_sharing``) comes after its group's own layers, with its target's tensor."""
        tensors = self._tensor_index()
        sharing = self.kv_sharing
        for group in self.groups:
            for name in group.layer_names:
                yield name, group, tensors[name]
            if sharing:
                own = set(group.layer_names)
                for name, target in sharing.items():
                    if target in own:
                        yield name, group, tensors[target]


#: vLLM's (and kvcore 0.1's) name for a plan, kept for engine integrators who know it.
KVCacheConfig = KVCachePlan


def structural_problems(plan: KVCachePlan) -> Iterator[str]:
    """Cheap checks that every plan must pass; the byte-overlap check is in kvcore.planning.invariants.

    A plan checks these when it is built; this re-checks a plan however it was obtained.

    Args:
        plan: the plan to check.

    Yields:
        One sentence per broken rule (a layer in two groups or tensors, two layers of one
        group in one tensor, a page outside its tensor, a tensor outside its memory, a
        sharing layer with a cache of its own or a target without one); nothing for a sound
        plan.
    """
    yield from _pool_problems(plan)
    pools = plan.pools
    if plan.pool_split is not None and len(plan.pool_split) != len(pools):
        yield (
            f"'pool_split' gives {len(plan.pool_split)} fractions but the plan has {len(pools)} pool(s); "
            "give one per pool"
        )
    if plan.offload_tier is not None and len(plan.offload_tier.pool_bytes) != len(pools):
        yield (
            f"the offload tier gives host bytes for {len(plan.offload_tier.pool_bytes)} pool(s) but the "
            f"plan has {len(pools)}; give one entry per pool"
        )
    grouped: dict[str, int] = {}
    for index, group in enumerate(plan.groups):
        if group.pool >= len(pools):
            yield f"group {index} draws from pool {group.pool} but the plan has {len(pools)} pool(s)"
            return
        for name in group.layer_names:
            if name in grouped:
                yield f"layer {name!r} is in groups {grouped[name]} and {index}"
            grouped[name] = index
    placed: dict[str, int] = {}
    buffer_bytes = plan.kv_cache_bytes
    multi = len(pools) > 1
    for index, tensor in enumerate(plan.tensors):
        for name in tensor.shared_by:
            if name in placed:
                yield f"layer {name!r} is in tensors {placed[name]} and {index}"
            placed[name] = index
            if name not in grouped:
                yield f"tensor {index} is shared by {name!r}, which is in no group"
        if len(tensor.shared_by) > 1:
            yield from _same_group_sharers(index, tensor, grouped)
        if multi:
            yield from _tensor_pool_problems(plan, index, tensor, grouped)
        if plan.single_buffer:
            if tensor.size and tensor.offset + tensor.size > buffer_bytes:
                yield (
                    f"tensor {index} spans bytes {tensor.offset}..{tensor.offset + tensor.size} "
                    f"but the buffer has {buffer_bytes} bytes"
                )
        elif tensor.offset != 0:
            yield f"tensor {index} is its own allocation but has offset {tensor.offset}"
    # (page bytes, pages) per group, computed once rather than per layer
    figures = [
        (g.spec.page_size_bytes, pools[g.pool].num_blocks // g.blocks_per_page) for g in plan.groups
    ]
    for name, gi in grouped.items():
        if name not in placed:
            yield f"layer {name!r} (group {gi}) is not covered by any tensor"
            continue
        tensor = plan.tensors[placed[name]]
        page, pages = figures[gi]
        group = plan.groups[gi]
        if group.layer_specs:
            page = group.spec_of(name).page_size_bytes
        if pages and page > tensor.page_stride:
            yield (
                f"layer {name!r}: its page of {page} bytes is larger than the tensor's page "
                f"stride of {tensor.page_stride} bytes, so its pages would overlap"
            )
        if pages and (pages - 1) * tensor.page_stride + page > tensor.size:
            yield (
                f"layer {name!r}: {pages} pages of {page} bytes at stride {tensor.page_stride} "
                f"do not fit in the tensor's {tensor.size} bytes"
            )
    if not plan.single_buffer:
        total = sum(t.size for t in plan.tensors)
        if total > buffer_bytes:
            yield f"the tensors take {total} bytes but the plan accounts for {buffer_bytes}"
    for name, target in plan.kv_sharing.items():
        if name in grouped or name in placed:
            yield (
                f"layer {name!r} shares {target!r}'s cache (kv_sharing) but also has a cache of its own; "
                "a sharing layer is in no group and no tensor"
            )
        if target not in grouped:
            why = "itself shares another layer's cache" if target in plan.kv_sharing else "is not planned"
            yield f"layer {name!r} shares the cache of {target!r}, which {why}"


def _same_group_sharers(index: int, tensor: KVCacheTensor, grouped: Mapping[str, int]) -> Iterator[str]:
    """Layers of one group that share ``tensor``: they would write the same bytes at once."""
    first: dict[int, str] = {}
    for name in tensor.shared_by:
        group = grouped.get(name)
        if group is None:
            continue
        other = first.setdefault(group, name)
        if other != name:
            yield (
                f"layers {other!r} and {name!r} are both in group {group} and share tensor {index}; "
                "layers that share a tensor must be in different groups (one block table means "
                "their pages are live at once)"
            )


def _pool_problems(plan: KVCachePlan) -> Iterator[str]:
    """Pools that overlap or leave the buffer (a single-buffer plan lays them end to end)."""
    pools = plan.pools
    if not pools:
        yield "a plan needs at least one pool"
        return
    if len(pools) == 1:
        if pools[0].offset:
            yield f"the plan's one pool starts at byte {pools[0].offset}; it must start at 0"
        return
    if not plan.single_buffer:
        for index, pool in enumerate(pools):
            if pool.offset:
                yield f"pool {index} has offset {pool.offset} but the plan's tensors are separate allocations"
        return
    spans = sorted((pool.offset, pool.offset + pool.nbytes, index) for index, pool in enumerate(pools))
    total = plan.kv_cache_bytes
    for (start, end, index), (next_start, _, other) in itertools.pairwise(spans):
        if end > next_start:
            yield f"pools {index} and {other} overlap: bytes {start}..{end} and {next_start}.."
    last_start, last_end, last = spans[-1]
    if last_end > total:
        yield f"pool {last} spans bytes {last_start}..{last_end} but the buffer has {total} bytes"


def _tensor_pool_problems(
    plan: KVCachePlan, index: int, tensor: KVCacheTensor, grouped: Mapping[str, int]
) -> Iterator[str]:
    """A tensor shared by layers of groups in different pools, or outside its pool's bytes."""
    pools = {plan.groups[grouped[name]].pool for name in tensor.shared_by if name in grouped}
    if len(pools) > 1:
        yield (
            f"tensor {index} is shared by layers of pools {sorted(pools)}; pools never share bytes "
            "(their block ids are live at once)"
        )
        return
    if not pools or not plan.single_buffer or not tensor.size:
        return
    pool = plan.pools[pools.pop()]
    if tensor.offset < pool.offset or tensor.offset + tensor.size > pool.offset + pool.nbytes:
        yield (
            f"tensor {index} spans bytes {tensor.offset}..{tensor.offset + tensor.size}, outside its "
            f"pool's bytes {pool.offset}..{pool.offset + pool.nbytes}"
        )


def _mixed_page_problems(group: KVCacheGroup) -> Iterator[str]:
    """Layer specs of a mixed-page group that would not hold the group's block-table entries."""
    own = set(group.layer_names)
    key = group.spec.retention_key
    for name, spec in group.layer_specs.items():
        if name not in own:
            yield f"'layer_specs' names {name!r}, which is not in the group"
        elif spec.block_size != group.spec.block_size:
            yield (
                f"layer {name!r} has block size {spec.block_size} but its group's is "
                f"{group.spec.block_size}; a block table has one block size"
            )
        elif spec.retention_key != key:
            yield (
                f"layer {name!r} ({spec.kind}) holds other pages than its group's spec ({group.spec.kind}): "
                "layers of one group need one retention_key"
            )
