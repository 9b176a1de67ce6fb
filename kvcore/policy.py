"""What an allocation policy is: the protocol plugins implement, and the options they get.

A policy turns layer specs into a plan in two steps, so that the core (not each policy) owns
the byte budget, forced block counts, admission checks and multi-rank agreement:

1. :meth:`AllocationPolicy.group` decides which layers share a block table (memory does not
   enter: grouping is judged by the *ratio* of useful bytes to allocated bytes);
2. :meth:`AllocationPolicy.layout` places the pages of one block id: where each layer's page
   starts, the stride from one page to the next, and the bytes one block id costs. None of it
   depends on the block count.

The core calls ``layout`` once per plan, picks ``num_blocks`` from the budget and the layout's
``bytes_per_block``, and sizes every tensor for that many blocks.

When a plan is asked for with ``policy="auto"``, the registry tries the policies by their
:attr:`AllocationPolicy.auto_priority` and records what it chose, and why, in a
:class:`PolicyChoice`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from kvcore.error_messages import with_message
from kvcore.errors import GroupLimitError, InvalidInputError
from kvcore.plan import KVCacheGroup
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.validators import boolean, check_int, is_number, positive_int


def _optional_count(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None:
        check_int(value, f"'{attribute.name}'", minimum=1)


#: The values of :attr:`PlanOptions.block_multiples`.
BLOCK_MULTIPLES = ("power_of_two", "any")


def _block_multiples(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in BLOCK_MULTIPLES:
        raise InvalidInputError(
            f"'{attribute.name}' must be one of {', '.join(map(repr, BLOCK_MULTIPLES))} (got {value!r})"
        )


#: How far the fractions of :attr:`PlanOptions.pool_split` may sum from 1 (float rounding).
SPLIT_SUM_TOLERANCE = 1e-6


def _pool_split(value: Any) -> tuple[float, ...] | None:
    """The fractions as a tuple (a list or tuple of numbers), or ``None``; checked by
    :func:`_check_pool_split`."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidInputError(
            f"'pool_split' must be a list of fractions of the budget, one per pool (got {value!r})"
        )
    return tuple(value)


def _check_pool_split(
    instance: object, attribute: attrs.Attribute[tuple[float, ...] | None], value: tuple[float, ...] | None
) -> None:
    if value is None:
        return
    if len(value) < 2:
        raise InvalidInputError(
            f"'pool_split' needs a fraction for each of at least 2 pools (got {len(value)}: {list(value)!r})"
        )
    for fraction in value:
        if not is_number(fraction) or not math.isfinite(fraction) or not 0 < fraction < 1:
            raise InvalidInputError(
                "'pool_split': every fraction must be a number in (0, 1) "
                f"(got {fraction!r} in {list(value)!r})"
            )
    total = math.fsum(value)
    if abs(total - 1) > SPLIT_SUM_TOLERANCE:
        raise InvalidInputError(
            f"'pool_split': the fractions must sum to 1 (got {list(value)!r}, which sum to {total:.6g}); "
            "divide each by their sum"
        )


def _tolerance(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if not is_number(value) or not 0 <= value < 1:
        raise InvalidInputError(f"'{attribute.name}' must be a number in [0, 1) (got {value!r})")


@attrs.frozen(kw_only=True)
class PlanOptions:
    """Knobs a policy may honour.

    Attributes:
        grouping_tolerance: the fraction of capacity a policy may give up, relative to the best
            layout it found, in exchange for fewer groups (block tables). ``0`` asks for the
            highest capacity whatever the number of groups; the default ``0.005`` (0.5 %)
            usually halves the group count or better at no visible cost. It never costs
            request length: where the tolerant layout holds no request of ``max_model_len``
            and the layout of tolerance ``0`` does, the planner takes the latter, so the
            longest request admitted is never shorter than with tolerance ``0``.
        max_block_size: the largest block size a policy may give a group when it enlarges
            blocks to even out page sizes (by the factors :attr:`block_multiples` allows).
            The block size of the specs themselves is never changed otherwise.
        reserve_null_block: keep block id 0 out of the pool as the *null block* that pads
            block tables (vLLM's convention). The plan's ``num_blocks`` still counts it; its
            capacity figures count one block fewer (:attr:`KVCachePlan.usable_blocks`). The
            planner applies it to every policy's plan; policies need not read it.
        uniform_block_size: give every group whose page grows with its block size (every
            attention-like group; per-request states keep theirs) one block size, for kernels
            compiled for one size: the least common multiple of the layers' block sizes
            (their largest, for powers of two). No group's block size is raised beyond it, so
            a row a group cannot fill is left part empty. ``False`` (the default) lets a
            policy enlarge blocks to fill rows.
        max_groups: at most this many groups (block tables); the policy picks its best layout
            among those with that many groups or fewer, and raises
            :class:`~kvcore.errors.GroupLimitError` naming the fewest it can do otherwise. A
            bound the default choice keeps changes nothing; when it cuts off every layout
            within ``grouping_tolerance`` of the best, the tolerance counts from the best layout
            within the bound. ``None`` (the default): no bound beyond ``grouping_tolerance``.
        block_multiples: the factors a policy may enlarge a block size by (up to
            ``max_block_size``): ``"power_of_two"`` (the default; the block sizes kernels
            usually take) or ``"any"`` integer, which evens out page ratios such as 3:2 that
            doubling cannot (the built-in ``shared_buffer`` honours it).
        mixed_pages: let a policy put layers of one retention kind whose pages differ in one
            group (a mixed-page group, :attr:`~kvcore.plan.KVCacheGroup.layer_specs`), as the
            built-in ``shared_buffer`` and ``kind_pools`` do where it saves groups. ``False``
            for an engine whose groups take one page size each (vLLM, through
            :mod:`kvcore.integrations.vllm`): every group then has one spec (``kind_pools``
            gives each spec its own pool).
        pool_split: for a policy that makes several block pools (``kind_pools``), the share of
            the budget each pool gets, pool by pool (fractions in (0, 1) that sum to 1), in
            place of the default split by what one request of ``max_model_len`` needs of each
            (:func:`~kvcore.planning.capacity.split_budget`). A workload whose requests are
            shorter than ``max_model_len`` holds fewer full-attention pages per sliding page
            than the worst case; :func:`kvcore.tuning.split.workload_split` derives the
            fractions from one. Pool ``p`` gets ``floor(budget x fraction / bytes per block)``
            block ids, so the pools never take more than the budget. ``None`` (the default):
            the worst-case split. A plan of one pool refuses it.
    """

    grouping_tolerance: float = attrs.field(default=0.005, validator=_tolerance)
    max_block_size: int = attrs.field(default=128, validator=positive_int)
    reserve_null_block: bool = attrs.field(default=False, validator=boolean)
    uniform_block_size: bool = attrs.field(default=False, validator=boolean)
    max_groups: int | None = attrs.field(default=None, validator=_optional_count)
    block_multiples: str = attrs.field(default="power_of_two", validator=_block_multiples)
    mixed_pages: bool = attrs.field(default=True, validator=boolean)
    pool_split: tuple[float, ...] | None = attrs.field(
        default=None, converter=_pool_split, validator=_check_pool_split
    )

    def check_group_count(self, policy: str, smallest: int) -> None:
        """Raise unless ``smallest`` groups, the fewest ``policy`` can plan the layers in, are
        within :attr:`max_groups`; a policy calls it before it picks a layout.

        Args:
            policy: the policy's name (for the message).
            smallest: the fewest groups any layout of the policy has for these layers.

        Raises:
            GroupLimitError: ``smallest`` exceeds :attr:`max_groups`.
        """
        if self.max_groups is not None and smallest > self.max_groups:
            raise with_message(
                GroupLimitError(policy=policy, max_groups=self.max_groups, smallest_groups=smallest)
            )


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class TensorPlacement:
    """Where the pages of the layers sharing one tensor go, whatever the block count.

    Page ``j`` of every layer in ``shared_by`` starts at byte ``offset + j * page_stride`` of
    the backing memory (the shared buffer, or the tensor's own allocation). kvcore sizes the
    tensor for the plan's block count: it ends where the last page of its largest layer ends.
    The fields are checked then, when the plan's :class:`~kvcore.plan.KVCacheTensor` is made.
    A layout has one per tensor, often one per layer, so it is cheap to make and may be made
    positionally: ``TensorPlacement(offset, page_stride, shared_by)``.

    Attributes:
        offset: where page 0 starts.
        page_stride: bytes from one page to the next.
        shared_by: the layers that view this region (layers of different groups, never the
            same page at the same time).
    """

    offset: int
    page_stride: int
    shared_by: tuple[str, ...] = attrs.field(converter=_names)


def _placements(value: Iterable[TensorPlacement]) -> tuple[TensorPlacement, ...]:
    return tuple(value)


def _pool_bytes(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class BlockPlacement:
    """Where a policy puts the pages of a set of groups: one block id's worth (of each pool).

    Attributes:
        bytes_per_block: device bytes each block id accounts for (a layout of one pool).
        single_buffer: whether the tensors are views into one buffer (of
            ``num_blocks * bytes_per_block`` bytes, or of every pool's bytes end to end) or
            separate allocations.
        tensors: the byte regions and the layers that view them, in the order the plan lists
            them. A tensor's layers belong to groups of one pool; its offset counts from the
            start of that pool's bytes.
        pool_bytes_per_block: for a layout of several pools (its groups say which pool each
            draws from, :attr:`~kvcore.plan.KVCacheGroup.pool`), the bytes each block id of
            each pool accounts for, pool by pool; leave ``bytes_per_block`` at 0 then. Empty
            (the default): one pool of ``bytes_per_block``. kvcore splits the budget between
            the pools in proportion to what one request needs of each
            (:func:`~kvcore.planning.capacity.split_budget`).
    """

    bytes_per_block: int = 0
    single_buffer: bool
    tensors: tuple[TensorPlacement, ...] = attrs.field(converter=_placements)
    pool_bytes_per_block: tuple[int, ...] = attrs.field(default=(), converter=_pool_bytes)

    @property
    def pool_bytes(self) -> tuple[int, ...]:
        """Bytes per block id of each pool (one pool: ``(bytes_per_block,)``)."""
        return self.pool_bytes_per_block or (self.bytes_per_block,)


#: The 0.1 name of :class:`BlockPlacement`, kept so that existing policies keep importing it.
Layout = BlockPlacement


@runtime_checkable
class AllocationPolicy(Protocol):
    """The protocol of an allocation policy (register instances from ``kvcore_register_policies``).

    Attributes:
        name: unique name used to select the policy (``--policy NAME``).
        description: one line for ``kvcore plugins``.
        auto_priority: how eagerly ``auto`` picks this policy. ``auto`` asks the registered
            policies from the highest priority down (equal priorities in registration order)
            and takes the first whose :meth:`why_not` is ``None``; ``None`` means ``auto``
            never picks it (it must be named). The built-ins: ``uniform`` 200 (it refuses
            unless every layer has one spec), ``shared_buffer`` 100 (plans any mix),
            ``equal_groups`` 0 (a last resort). A policy that should win for the layers it
            accepts declares a priority above the one it should beat.
    """

    name: str
    description: str

    @property
    def auto_priority(self) -> int | None:
        """How eagerly ``auto`` picks this policy (see above); a class attribute will do."""
        ...

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        """``None`` if this policy can plan ``specs``, else one sentence saying why not."""
        ...

    def group(
        self,
        specs: Mapping[str, KVCacheSpec],
        context: SizingContext,
        options: PlanOptions,
    ) -> Sequence[KVCacheGroup]:
        """Partition the layers (in model order) into block-table groups.

        Every layer must appear in exactly one group. A group's spec may differ from its
        layers' specs only in ``block_size`` (a policy may enlarge blocks, up to
        ``options.max_block_size``); a mixed-page group
        (:attr:`~kvcore.plan.KVCacheGroup.layer_specs`) may hold layers of one
        ``retention_key`` whose pages differ. A group draws from pool
        :attr:`~kvcore.plan.KVCacheGroup.pool` (0 unless the policy makes several pools;
        the pools used must be numbered 0, 1, ... without a gap).
        """
        ...

    def layout(self, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
        """Place the pages of ``groups``: offsets and strides, and the bytes one block id costs
        (in each pool, for groups of several pools).

        kvcore calls it once per plan (per rank) and sizes the tensors for the block count
        itself. The groups may be a projection of the policy's own grouping onto one worker's
        layers (layers removed, possibly empty groups); an empty group gets no tensor.
        """
        ...


@attrs.frozen(kw_only=True)
class PolicyChoice:
    """The policy a plan is made with, and why it was chosen.

    Attributes:
        policy: the chosen policy.
        auto: whether ``auto`` chose it (``False``: it was named, or given as an object).
        reason: why: for ``auto``, what it saw in the layers (``'the layers have 2
            different specs'``); otherwise how it was given (``'named'``, ``'given as an
            object'``).
        passed_over: the policies ``auto`` asked first, each with the reason it gave for not
            planning these layers (its ``why_not``).
    """

    policy: AllocationPolicy
    auto: bool
    reason: str
    passed_over: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        """The chosen policy's name."""
        return self.policy.name
