"""Turn layer specs and a byte budget into plans, with any registered policy: the one planning
implementation, for one rank and for many.

The policy decides grouping and layout; this module owns what every policy shares: choosing
the policy (:meth:`Registry.select`), checking what the policy returned, sizing the tensors for
the block count, choosing ``num_blocks`` from the budget (or honouring a forced count), and
admission (one request of ``max_model_len`` must fit; a refusal names the largest length that
planning admits, found by planning: :func:`longest_admitted`). ``max_model_len`` ``auto`` plans
at that length.

:func:`plan` is the implementation; it takes a :class:`~kvcore.planning.request.PlanRequest`
(everything one call needs, checked when the request is made). It sizes the specs and chooses
the policy once, then plans at a length with one function (``_Planner.plans_at``: group the
whole model once, ask the policy for each rank's layout, give every rank the same block count);
admission, the longest admitted length and ``auto`` are searches over that function
(:func:`~kvcore.planning.max_len.largest_admitted_len`), never calls back into :func:`plan`.
:func:`plan_kv_cache` (one worker) and :func:`kvcore.planning.ranks.plan_for_ranks` (a tensor x
pipeline world) are the keyword forms: each builds a request and calls :func:`plan`. With
:func:`longest_admitted` they are the public doors (``kvcore.plan_kv_cache``,
``kvcore.plan_for_ranks``, ``kvcore.longest_admitted``): a plan, a plan per rank, the longest
length admitted. 0.1's ``plan_model``, ``plan_longest`` and ``largest_admitted`` were removed in
0.3 (asking for one names its replacement).

Planning works per distinct spec, not per layer, where it can: equal specs are made one object
first (:func:`share_equal_specs`), so group keys, grouping checks and page sizes are computed
once per distinct spec or per group, and what is left per layer is bookkeeping (a name in a
group, a tensor per layer). Planning time grows linearly with the number of layers;
``benchmarks/planning_speed.py`` measures it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from kvcore.error_messages import with_message
from kvcore.errors import (
    InsufficientMemoryError,
    InvalidInputError,
    InvalidSpecError,
    MultiplePoolsError,
    PlanValidationError,
    PluginValidationError,
    PolicyNotApplicableError,
)
from kvcore.peaks import pool_peaks
from kvcore.plan import KVCacheGroup, KVCachePlan, KVCachePool, KVCacheTensor
from kvcore.planning.admission import check_admission
from kvcore.planning.capacity import blocks_that_fit, own_pool_blocks, split_budget, split_by_fractions
from kvcore.planning.invariants import plan_problems
from kvcore.planning.max_len import (
    LENGTH_CEILING,
    LengthChoice,
    LengthSearch,
    largest_admitted_len,
    memory_bound,
)
from kvcore.planning.registry import Registry
from kvcore.planning.request import (
    KeywordFields,
    PlanRequest,
    check_budget as check_budget,
    request_from_keywords,
)
from kvcore.policy import AllocationPolicy, BlockPlacement, PlanOptions, PolicyChoice
from kvcore.removed import names_removed_from
from kvcore.spec import KVCacheSpec, SizingContext, sized_specs, spec_differences
from kvcore.validators import check_int

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


@attrs.frozen(kw_only=True)
class PlanningResult:
    """What :func:`plan` made: the policy choice and one plan per rank.

    Attributes:
        choice: the policy and why it was chosen (``auto``'s reason, for a report).
        plans: one plan per rank, in rank order (one for a single worker).
        length: how ``max_model_len="auto"`` chose the length (``None`` for a given length).
    """

    choice: PolicyChoice
    plans: tuple[KVCachePlan, ...]
    length: LengthChoice | None = None


def plan(request: PlanRequest, *, registry: Registry) -> PlanningResult:
    """Plan a model's KV cache on one rank or several: the one planning implementation.

    The policy groups the whole model once; each rank's plan holds every group, projected onto
    the rank's own layers (a group may be empty there), laid out by one ``policy.layout`` call;
    every rank gets the same ``num_blocks``: the forced count, else the smallest number of
    blocks any rank's budget holds. A fixed length is admitted on the rank with the fewest
    blocks; ``auto`` plans at the longest length admitted (:func:`longest_admitted`), at most
    its cap and at most what memory bounds (:func:`~kvcore.planning.max_len.memory_bound`).

    Args:
        request: the layers, budgets, length, policy, options, forced count and ranks.
        registry: where policies are looked up.

    Returns:
        The policy choice and one plan per rank (and, for ``auto``, how the length was
        chosen: :attr:`PlanningResult.length`).

    Raises:
        UnknownPolicyError: no policy of that name.
        PolicyNotApplicableError: the policy cannot plan the whole model (says why).
        PluginValidationError: the policy's grouping or layout breaks the protocol.
        InvalidInputError: ``auto`` with no cap where the layers' need stops growing with the
            length (sliding windows or states only), so memory bounds nothing.
        InsufficientMemoryError: a forced block count exceeds a rank's budget, or one request
            does not fit in the common block count (names the rank with the fewest blocks);
            ``largest_fitting_len`` is the largest length planning admits.
    """
    if not request.specs:
        return nothing_to_cache(request.budgets, request.context, registry=registry, policy=request.policy)
    planner = _Planner.prepare(request, registry)
    if request.max_model_len.auto:
        return planner.plan_auto_length()
    return planner.plan_admitted(request.context)


def longest_admitted(
    request: PlanRequest, *, registry: Registry, estimate: int | None = None
) -> LengthSearch:
    """The largest request length, up to ``request.max_model_len.tokens``, that :func:`plan`
    admits with the request's other inputs, and how many plans finding it took.

    Planning at the length succeeds (one request fits in the common block count); planning at
    one more token is refused (unless the length is the upper bound). Each length is planned for
    itself, so a grouping that changes with the length is accounted for; see
    :func:`kvcore.planning.max_len.largest_admitted_len` for the search.

    Args:
        request: what to plan (its length is the upper bound; ``auto`` or not).
        registry: where policies are looked up.
        estimate: a guess below the upper bound when that length is known to be refused (the
            refused plan's :meth:`~kvcore.plan.KVCachePlan.largest_fitting_len`); ``None`` to
            plan at the upper bound first.

    Returns:
        The length (0 if not even one token is admitted) and the plans made.
    """
    return _Planner.prepare(request, registry).longest(request.max_model_len.tokens, estimate)


@attrs.frozen
class _Planner:
    """What planning a request at any length shares: the request, the specs as served (equal
    ones one object) and the chosen policy. Planning at a length is :meth:`plans_at`; the
    admission check and the length searches call it, never :func:`plan` again."""

    request: PlanRequest
    registry: Registry
    specs: dict[str, KVCacheSpec]
    choice: PolicyChoice

    @classmethod
    def prepare(cls, request: PlanRequest, registry: Registry) -> _Planner:
        """Size the specs for the request's serving options and choose the policy.

        Raises:
            UnknownPolicyError, PolicyNotApplicableError: as :func:`resolve_policy`.
        """
        # serving options the block pool must see (speculative slots, state cache mode, encoder
        # length) go into the specs the plan keeps; they do not depend on the request length
        specs = share_equal_specs(sized_specs(request.specs, request.context))
        return cls(request, registry, specs, resolve_policy(specs, request.policy, registry))

    def plans_at(self, context: SizingContext) -> tuple[KVCachePlan, ...]:
        """Every rank's plan sized for ``context`` (its length), without the admission check.

        Where the options' grouping tolerance gives a grouping that holds no request of the
        length, the exact grouping's plans are taken if they do: a tolerance may cost
        concurrency, never the request length.

        Raises:
            InsufficientMemoryError: a forced block count exceeds a rank's budget.
            PluginValidationError, PlanValidationError: the policy broke the protocol.
        """
        options = self.request.options
        plans = self.laid_out(context, options)
        strict = _strict_options(options)
        if strict is not None and not all(plan.fits() for plan in plans):
            try:
                exact = self.laid_out(context, strict)
            except InsufficientMemoryError:  # a forced block count the exact grouping's pools exceed
                exact = ()
            if exact and all(plan.fits() for plan in exact):
                return exact
        return plans

    def laid_out(self, context: SizingContext, options: PlanOptions) -> tuple[KVCachePlan, ...]:
        """Every rank's plan with ``options``: group, lay out per rank, count the blocks, build
        and check each plan's structure."""
        request, chosen = self.request, self.choice.policy
        groups = group_layers(chosen, self.specs, context, options)
        rank_layers = request.rank_layers
        rank_groups = (
            [groups] if rank_layers is None else [project_groups(groups, own) for own in rank_layers]
        )
        layouts = [layout_for(chosen, own) for own in rank_groups]
        null_block = 0 if options.reserve_null_block else None
        need = pool_needs(groups, len(layouts[0].pool_bytes), context)
        budgets = request.budgets
        split: tuple[float, ...] | None = None  # recorded in the plans: their figures split alike
        if request.num_blocks is None:
            # every rank's own split of its budget; the common count of each pool is the least
            split = pool_split_of(options, len(need), chosen.name)
            splits = [
                split_budget(memory, layout.pool_bytes, need)
                if split is None
                else split_by_fractions(memory, layout.pool_bytes, split)
                for memory, layout in zip(budgets, layouts, strict=True)
            ]
            blocks = tuple(min(counts) for counts in zip(*splits, strict=True))
        else:
            blocks = forced_counts(request.num_blocks, len(need), chosen.name)
            for rank, (memory, layout) in enumerate(zip(budgets, layouts, strict=True)):
                try:
                    check_forced_pools(blocks, layout.pool_bytes, memory, context)
                except InsufficientMemoryError as exc:
                    raise _on_rank(exc, self.prefix(rank)) from None
        built: list[KVCachePlan] = []
        for rank, (own, layout, memory) in enumerate(zip(rank_groups, layouts, budgets, strict=True)):
            # the one check every plan passes: structure when built, the rest here
            try:
                plan = build_plan(
                    chosen,
                    own,
                    layout,
                    blocks,
                    context,
                    memory,
                    null_block=null_block,
                    pool_split=split,
                )
                problems = plan_problems(plan, structure=False, capacity=False)  # admission follows
            except PlanValidationError as exc:
                problems = exc.problems
            if problems:
                raise PlanValidationError(
                    problems,
                    policy=chosen.name,
                    source=self.prefix(rank) + laid_out_by(chosen, self.registry),
                )
            built.append(plan)
        return tuple(built)

    def prefix(self, rank: int) -> str:
        """How a planning error about ``rank`` starts: its name, or nothing for unnamed ranks."""
        names = self.request.rank_names
        return f"{names[rank]}: " if names is not None else ""

    def plan_admitted(self, context: SizingContext) -> PlanningResult:
        """The plans at ``context``'s length, refused (with the longest length admitted) unless
        one request fits on every rank (where the request asks for the check)."""
        plans = self.plans_at(context)
        request = self.request
        if request.check_fit or request.max_model_len.auto:
            tightest = tightest_rank(plans)
            forced = request.num_blocks is not None
            try:
                check_admission(
                    plans[tightest],
                    forced_num_blocks=forced,
                    largest_admitted=lambda: (
                        self.longest(context.max_model_len, plans[tightest].largest_fitting_len()).length
                    ),
                )
            except InsufficientMemoryError as exc:
                if request.rank_names is None:
                    raise
                who = request.rank_names[tightest]
                why = f"{who}: " if forced else f"{who} has the fewest blocks: "
                raise _on_rank(exc, why) from None
        return PlanningResult(choice=self.choice, plans=plans)

    def longest(self, upper: int, estimate: int | None = None) -> LengthSearch:
        """The largest length up to ``upper`` whose plans admit one request
        (:func:`~kvcore.planning.max_len.largest_admitted_len` over :meth:`plans_at`)."""
        context = self.request.context
        return largest_admitted_len(
            lambda length: self.plans_at(context.with_max_model_len(length)), upper, estimate=estimate
        )

    def plan_auto_length(self) -> PlanningResult:
        """``auto``: the plans at the longest length admitted, at most the cap and at most the
        longest request whose ideal need fits every rank's budget (no layout admits more).

        Raises:
            InvalidInputError: no cap, and the layers' need stops growing with the length.
            InsufficientMemoryError: not even one token is admitted (as planning at length 1
                reports it).
        """
        request = self.request
        cap = request.max_model_len.tokens
        capped = cap < LENGTH_CEILING
        rank_layers = request.rank_layers
        own = (
            [request.specs]
            if rank_layers is None
            else [_layers_of(request.specs, layers) for layers in rank_layers]
        )
        bound = memory_bound(own, request.budgets, request.context)
        if bound is None and not capped:
            raise InvalidInputError(
                "cannot choose max_model_len automatically: these layers' need stops growing with the "
                "request length (sliding windows or states only) and no max_position_embeddings caps "
                "it; give max_model_len a number"
            )
        upper = min(cap, bound) if bound is not None else cap
        search = self.longest(max(upper, 1))
        length = max(search.length, 1)  # not even one token: planning at 1 says why
        result = self.plan_admitted(request.context.with_max_model_len(length))
        choice = LengthChoice(
            max_model_len=length,
            cap=cap if capped else None,
            limited_by="cap" if capped and length == cap else "memory",
            plans=search.plans + 1,
        )
        return attrs.evolve(result, length=choice)


def plan_kv_cache(
    specs: Mapping[str, KVCacheSpec],
    available_bytes: int,
    context: SizingContext,
    *,
    registry: Registry,
    **fields: Unpack[KeywordFields],
) -> KVCachePlan:
    """Plan the KV cache of one worker: :func:`plan` of a :class:`~kvcore.planning.request.PlanRequest`
    of one rank.

    Args:
        specs: ``{layer name: spec}`` in model order.
        available_bytes: the KV-cache byte budget.
        context: the request length (and step size) to size for.
        registry: where policies are looked up.
        fields: the request's other fields
            (:class:`~kvcore.planning.request.KeywordFields`): ``policy`` (a policy name,
            ``"auto"`` (the default), or a policy object), ``options`` (policy knobs),
            ``num_blocks`` (force this many block ids instead of filling the budget),
            ``check_fit`` (raise unless one request of ``context.max_model_len`` fits; on by
            default), ``max_model_len`` (``"auto"``: plan for the longest request the budget
            admits, at most ``context.max_model_len``, a model's ``max_position_embeddings``
            or :data:`kvcore.limits.MAX_TOKENS` to let memory alone bound it; the plan's
            ``context.max_model_len`` is the length chosen).

    Returns:
        The plan.

    Raises:
        PolicyNotApplicableError: the policy cannot plan these specs (says why).
        InsufficientMemoryError: the budget (or the forced block count) cannot hold one
            request of ``max_model_len`` tokens, or the forced blocks exceed the budget.
    """
    request = request_from_keywords(specs, [available_bytes], context, fields)
    return plan(request, registry=registry).plans[0]


def _strict_options(options: PlanOptions) -> PlanOptions | None:
    """``options`` without their grouping tolerance, or ``None`` when they have none."""
    return attrs.evolve(options, grouping_tolerance=0.0) if options.grouping_tolerance else None


def nothing_to_cache(
    rank_memory: Sequence[int],
    context: SizingContext,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
) -> PlanningResult:
    """The plans of a model with no cache-holding layer (attention-free, encoder-only): no
    groups, no tensors, no blocks, one per rank.

    Args:
        rank_memory: one byte budget per rank (checked like any budget).
        context: the request length asked for (recorded; nothing needs to fit).
        registry: where the policy is looked up.
        policy: a policy name, ``"auto"`` or a policy object (its name is recorded).

    Returns:
        The choice and one empty plan per rank.

    Raises:
        InvalidInputError: no budgets, or a budget that is not a non-negative int.
        UnknownPolicyError: no policy of that name.
    """
    if not rank_memory:
        raise InvalidInputError("no rank budgets given (got an empty list)")
    for rank, memory in enumerate(rank_memory):
        check_budget(memory, f"rank {rank}: " if len(rank_memory) > 1 else "")
    choice = resolve_policy({}, policy, registry)
    plans = tuple(
        KVCachePlan(
            policy=choice.policy.name,
            num_blocks=0,
            bytes_per_block=0,
            single_buffer=True,
            groups=(),
            tensors=(),
            context=context,
            available_memory_bytes=memory,
        )
        for memory in rank_memory
    )
    reason = "the model has no layer that holds a KV cache"
    return PlanningResult(choice=attrs.evolve(choice, reason=reason), plans=plans)


def laid_out_by(policy: AllocationPolicy, registry: Registry) -> str:
    """Where a policy's plan came from, for a message: ``'laid out by the policy from acme-kv 1.2
    (entry point acme)'``, or ``'... given as an object'`` for an unregistered policy."""
    for entry in registry.policy_entries():
        if entry.obj is policy:
            return f"laid out by the policy from {entry.origin.describe()}"
    return "laid out by the policy, given as an object"


def share_equal_specs(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """``specs`` with every set of equal specs replaced by one object (the first layer's).

    A front end usually makes one spec object per layer. Once equal specs are one object, the
    per-spec work of policies and checks (group keys, page sizes, comparisons) is done once per
    distinct spec, keyed by object, instead of hashing and comparing a spec per layer each time.

    Args:
        specs: ``{layer name: spec}``.

    Returns:
        The same layers, in the same order, with equal specs.
    """
    canonical: dict[KVCacheSpec, KVCacheSpec] = {}
    by_id: dict[int, KVCacheSpec] = {}
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        shared = by_id.get(id(spec))
        if shared is None:
            shared = by_id[id(spec)] = canonical.setdefault(spec, spec)
        out[name] = shared
    return out


def _on_rank(exc: InsufficientMemoryError, prefix: str) -> InsufficientMemoryError:
    """``exc`` said of the rank ``prefix`` names (``"rank 2 (...): "``; empty: ``exc`` itself)."""
    where = prefix.removesuffix(": ")
    return exc.on_rank(where) if where else exc


def resolve_policy(
    specs: Mapping[str, KVCacheSpec], policy: str | AllocationPolicy, registry: Registry
) -> PolicyChoice:
    """The policy to plan ``specs`` with, and why: a name (or ``"auto"``) looked up with
    :meth:`Registry.select`, or an object checked.

    Raises:
        UnknownPolicyError: no policy of that name.
        PolicyNotApplicableError: the policy cannot plan these specs (says why).
    """
    if isinstance(policy, str):
        return registry.select(specs, policy)
    reason = policy.why_not(specs)
    if reason is not None:
        raise PolicyNotApplicableError(f"policy {policy.name!r} cannot plan these layers: {reason}")
    return PolicyChoice(policy=policy, auto=False, reason="given as an object")


def group_layers(
    policy: AllocationPolicy,
    specs: Mapping[str, KVCacheSpec],
    context: SizingContext,
    options: PlanOptions | None = None,
) -> tuple[KVCacheGroup, ...]:
    """``policy.group(...)``, checked with :func:`check_groups`.

    Raises:
        PluginValidationError: the grouping leaves out, repeats or changes a layer.
    """
    chosen = options if options is not None else PlanOptions()
    if chosen.uniform_block_size:
        resized = common_block_size(specs, chosen)
        if resized is not specs:
            # one block size may change the pages a policy accepted (equal_groups: one page size)
            reason = policy.why_not(resized)
            if reason is not None:
                raise PolicyNotApplicableError(
                    f"policy {policy.name!r} cannot plan these layers with one block size for every "
                    f"group (uniform_block_size): {reason}"
                )
        specs = resized
    groups = tuple(policy.group(specs, context, chosen))
    check_groups(policy.name, specs, groups)
    check_options_honoured(policy.name, groups, chosen)
    return groups


def common_block_size(specs: Mapping[str, KVCacheSpec], options: PlanOptions) -> Mapping[str, KVCacheSpec]:
    """``specs`` with one block size for every spec whose page grows with its block size
    (``PlanOptions.uniform_block_size``): the least common multiple of theirs. States keep theirs.

    Args:
        specs: ``{layer: spec}``, equal specs one object (:func:`share_equal_specs`).
        options: the options (``max_block_size`` bounds an lcm above the largest block size).

    Returns:
        ``specs`` itself when they already agree, else the resized specs (equal ones shared).

    Raises:
        InvalidInputError: the block sizes have no common multiple within ``max_block_size``.
    """
    distinct = {id(spec): spec for spec in specs.values()}.values()
    sizes = sorted({spec.block_size for spec in distinct if spec.page_scales_with_block_size})
    if len(sizes) <= 1:
        return specs
    common = math.lcm(*sizes)
    if common > max(sizes[-1], options.max_block_size):
        raise InvalidInputError(
            f"one block size for every group (uniform_block_size) needs a multiple of the layers' block "
            f"sizes {sizes}, and the least is {common}, above max_block_size={options.max_block_size}; "
            "give every layer one block size or raise max_block_size"
        )
    resized: dict[int, KVCacheSpec] = {}
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        new = resized.get(id(spec))
        if new is None:
            scales = spec.page_scales_with_block_size and spec.block_size != common
            new = resized[id(spec)] = spec.with_block_size(common) if scales else spec
        out[name] = new
    return share_equal_specs(out)


def check_options_honoured(policy_name: str, groups: Sequence[KVCacheGroup], options: PlanOptions) -> None:
    """Check that a policy's grouping keeps ``options.uniform_block_size`` and ``options.max_groups``
    (the built-in policies do; a third-party one may not).

    Raises:
        PolicyNotApplicableError: the groups have several block sizes, or more groups than
            ``max_groups``, naming the policy.
    """
    if options.uniform_block_size:
        sizes = sorted({g.spec.block_size for g in groups if g.spec.page_scales_with_block_size})
        if len(sizes) > 1:
            raise PolicyNotApplicableError(
                f"policy {policy_name!r} gave its groups block sizes {sizes}, but one block size was asked "
                "for (uniform_block_size); this policy does not honour it"
            )
    if not options.mixed_pages and any(g.layer_specs for g in groups):
        raise PolicyNotApplicableError(
            f"policy {policy_name!r} made a group of layers with different page sizes, but one spec per "
            "group was asked for (mixed_pages=False); this policy does not honour it"
        )
    if options.max_groups is not None and len(groups) > options.max_groups:
        raise PolicyNotApplicableError(
            f"policy {policy_name!r} made {len(groups)} groups, but at most {options.max_groups} were asked "
            "for (max_groups); this policy does not honour it"
        )


def project_groups(groups: Sequence[KVCacheGroup], layers: Collection[str]) -> tuple[KVCacheGroup, ...]:
    """``groups`` with only ``layers`` left in them; every group is kept, possibly empty, so
    group indices (and a request's blocks) are the same on every rank."""
    own = layers if isinstance(layers, (set, frozenset, Mapping)) else set(layers)
    return tuple(
        attrs.evolve(
            group,
            layer_names=tuple(name for name in group.layer_names if name in own),
            # a mixed-page group keeps the own specs of the layers it keeps
            layer_specs={name: spec for name, spec in group.layer_specs.items() if name in own},
        )
        for group in groups
    )


def tightest_rank(plans: Sequence[KVCachePlan]) -> int:
    """The rank whose memory bounds the common block count (the first, on a tie).

    Args:
        plans: one plan per rank, as :func:`plan` returns them.

    Returns:
        The index of the plan whose own memory would hold the fewest requests (the fewest
        blocks, for plans of one pool).
    """

    def own(rank: int) -> float:
        plan = plans[rank]
        need = plan.blocks_per_request_by_pool()
        counts = own_pool_blocks(plan)
        if len(counts) == 1:
            return counts[0]
        return min((c / n for c, n in zip(counts, need, strict=True) if n), default=float("inf"))

    return min(range(len(plans)), key=own)


def pool_needs(groups: Sequence[KVCacheGroup], num_pools: int, context: SizingContext) -> tuple[int, ...]:
    """Block ids one request of ``context.max_model_len`` tokens needs in each pool, its groups
    at their worst moment together (:func:`~kvcore.peaks.pool_peaks`; the whole model's groups:
    every rank splits its budget by the same needs).

    Args:
        groups: the policy's groups (not a projection).
        num_pools: pools of the layout.
        context: the sizing context.

    Returns:
        One count per pool.
    """
    return pool_peaks(groups, num_pools, context)


def pool_split_of(options: PlanOptions | None, num_pools: int, policy_name: str) -> tuple[float, ...] | None:
    """The fractions :attr:`~kvcore.policy.PlanOptions.pool_split` asks for, checked against the
    pools the policy made (``None``: split by need).

    Raises:
        InvalidInputError: a split given for a layout of another number of pools.
    """
    split = options.pool_split if options is not None else None
    if split is None:
        return None
    if len(split) != num_pools:
        made = f"{num_pools} block pool" + ("s" if num_pools != 1 else "")
        raise InvalidInputError(
            f"'pool_split' gives {len(split)} fractions but policy {policy_name!r} made {made} for these "
            "layers; give one fraction per pool"
            + (", or plan with a policy of several pools (kind_pools)" if num_pools == 1 else "")
        )
    return split


def forced_counts(num_blocks: int | Sequence[int], num_pools: int, policy_name: str) -> tuple[int, ...]:
    """A forced block count as one count per pool, checked.

    Args:
        num_blocks: an int (one pool) or one count per pool.
        num_pools: the pools the policy made.
        policy_name: for messages.

    Returns:
        The counts.

    Raises:
        InvalidInputError: a count is not an int >= 1.
        MultiplePoolsError: the number of counts is not the number of pools.
    """
    counts = (num_blocks,) if isinstance(num_blocks, int) else tuple(num_blocks)
    for count in counts:
        check_int(count, "'num_blocks'", minimum=1)
    if len(counts) != num_pools:
        raise with_message(
            MultiplePoolsError(num_pools=num_pools, forced_counts=len(counts), policy=policy_name)
        )
    return counts


def check_forced_pools(
    counts: Sequence[int], pool_bytes: Sequence[int], available_bytes: int, context: SizingContext
) -> None:
    """Check forced block counts (one per pool) against a budget.

    Raises:
        InsufficientMemoryError: the pools take more than ``available_bytes``.
    """
    need = sum(c * b for c, b in zip(counts, pool_bytes, strict=True))
    if need <= available_bytes:
        return
    one_pool = len(counts) == 1
    if one_pool:
        fit: tuple[int, ...] = (blocks_that_fit(available_bytes, pool_bytes[0]),)
    else:
        fit = split_budget(available_bytes, pool_bytes, counts)
    raise with_message(
        InsufficientMemoryError(
            reason="forced_num_blocks",
            required_bytes=need,
            available_bytes=available_bytes,
            max_model_len=context.max_model_len,
            largest_fitting_len=0,
            required_blocks=sum(counts),
            available_blocks=sum(fit),
            bytes_per_block=pool_bytes[0] if one_pool else None,
            required_pool_blocks=None if one_pool else tuple(counts),
            available_pool_blocks=None if one_pool else fit,
        )
    )


def layout_for(policy: AllocationPolicy, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
    """``policy.layout(groups)``, checked to be a :class:`BlockPlacement` with a sane size.

    Raises:
        PluginValidationError: not a :class:`BlockPlacement`, or no bytes per block for groups that
            have layers.
    """
    layout = policy.layout(groups)
    if not isinstance(layout, BlockPlacement):
        raise PluginValidationError(
            f"policy {policy.name!r}: layout() returned {layout!r}, expected a kvcore.BlockPlacement"
        )
    pools = max((g.pool for g in groups), default=0) + 1
    if layout.pool_bytes_per_block:
        if layout.bytes_per_block:
            raise PluginValidationError(
                f"policy {policy.name!r}: layout() gives both bytes_per_block and pool_bytes_per_block; "
                "a layout of several pools leaves bytes_per_block at 0"
            )
        if len(layout.pool_bytes_per_block) != pools:
            raise PluginValidationError(
                f"policy {policy.name!r}: layout() gives bytes per block of "
                f"{len(layout.pool_bytes_per_block)} pool(s) but its groups draw from {pools}"
            )
    elif pools > 1:
        raise PluginValidationError(
            f"policy {policy.name!r}: its groups draw from {pools} pools but layout() gives one "
            "bytes_per_block; give pool_bytes_per_block, one per pool"
        )
    for pool, per_block in enumerate(layout.pool_bytes):
        if type(per_block) is not int or per_block < 0:
            raise PluginValidationError(
                f"policy {policy.name!r}: layout() reports {per_block!r} bytes per block of pool {pool}; "
                "it must be a non-negative int"
            )
        if per_block == 0 and any(g.layer_names for g in groups if g.pool == pool):
            raise PluginValidationError(
                f"policy {policy.name!r}: layout() reports 0 bytes per block"
                + (f" of pool {pool}" if pools > 1 else "")
                + "; it must be positive"
            )
    return layout


def size_tensors(
    policy_name: str,
    layout: BlockPlacement,
    groups: Sequence[KVCacheGroup],
    num_blocks: int | Sequence[int],
    pool_offsets: Sequence[int] = (0,),
) -> tuple[KVCacheTensor, ...]:
    """The layout's tensors, sized for ``num_blocks`` block ids (of each pool).

    A tensor's layers (``shared_by``) each have ``num_blocks // blocks_per_page`` pages (of
    their group's pool) of their own page size; the tensor holds the fewest pages any of them
    has, and ends where the last such page of its largest layer ends. A tensor of pool ``p``
    starts ``pool_offsets[p]`` bytes further than the layout says (the layout counts from the
    start of its pool).

    Raises:
        PluginValidationError: a tensor is shared by no layer or by a layer in no group, or
            has an offset or page stride that is not a non-negative (positive) int.
    """
    counts = (num_blocks,) if isinstance(num_blocks, int) else tuple(num_blocks)
    # (page bytes, pages, pool) per layer: one triple per group (and layer spec)
    per_layer: dict[str, tuple[int, int, int]] = {}
    for group in groups:
        if group.layer_names:
            pages_of = counts[group.pool] // group.blocks_per_page
            triple = (group.spec.page_size_bytes, pages_of, group.pool)
            per_layer.update(dict.fromkeys(group.layer_names, triple))
            for name, spec in group.layer_specs.items():
                per_layer[name] = (spec.page_size_bytes, pages_of, group.pool)
    tensors = []
    for index, placement in enumerate(layout.tensors):
        names = placement.shared_by
        try:
            if len(names) == 1:
                largest, pages, pool = per_layer[names[0]]
            else:
                sharers = [per_layer[name] for name in names]
                largest = max(page for page, _, _ in sharers)
                pages = min(count for _, count, _ in sharers)
                pool = sharers[0][2]
        except KeyError as exc:
            raise PluginValidationError(
                f"policy {policy_name!r}: layout() places layer {exc.args[0]!r} (tensor {index}), "
                "which is in no group"
            ) from None
        except ValueError:
            raise PluginValidationError(
                f"policy {policy_name!r}: layout() returned tensor {index} shared by no layer"
            ) from None
        stride = placement.page_stride
        try:
            tensors.append(
                KVCacheTensor(
                    size=(pages - 1) * stride + largest if pages else 0,
                    offset=placement.offset + (pool_offsets[pool] if pool < len(pool_offsets) else 0),
                    page_stride=stride,
                    shared_by=names,
                )
            )
        except (InvalidSpecError, TypeError) as exc:  # a bad offset or stride
            raise PluginValidationError(
                f"policy {policy_name!r}: layout() returned tensor {index} with {placement!r}: {exc}"
            ) from None
    return tuple(tensors)


def build_plan(
    policy: AllocationPolicy,
    groups: Sequence[KVCacheGroup],
    layout: BlockPlacement,
    num_blocks: int | Sequence[int],
    context: SizingContext,
    available_bytes: int,
    *,
    null_block: int | None = None,
    pool_split: Sequence[float] | None = None,
) -> KVCachePlan:
    """Size ``layout`` for ``num_blocks`` (one count per pool, or an int for one pool) and
    wrap it in a plan (no admission check). A single-buffer plan lays its pools end to end.

    Args:
        policy: the policy that made ``groups`` and ``layout``.
        groups: the groups (possibly a projection onto one rank's layers).
        layout: ``policy.layout(groups)``.
        num_blocks: the block count.
        context: the request length the plan is sized for.
        available_bytes: the budget the plan is made for.
        null_block: ``0`` to reserve block id 0 as the null block
            (:attr:`PlanOptions.reserve_null_block`), else ``None``.
        pool_split: the fractions the block counts were split by
            (:attr:`PlanOptions.pool_split`), recorded in the plan; ``None``: by need.

    Returns:
        The plan.

    Raises:
        PluginValidationError: the layout places a layer that is in no group.
        PlanValidationError: the layout breaks a structural invariant (naming the policy).
    """
    counts = (num_blocks,) if isinstance(num_blocks, int) else tuple(num_blocks)
    pools = []
    start = 0
    for count, per_block in zip(counts, layout.pool_bytes, strict=True):
        pools.append(KVCachePool(num_blocks=count, bytes_per_block=per_block, offset=start))
        if layout.single_buffer:
            start += count * per_block
    offsets = [pool.offset for pool in pools]
    try:
        return KVCachePlan(
            policy=policy.name,
            pools=pools,
            single_buffer=layout.single_buffer,
            groups=groups,
            tensors=size_tensors(policy.name, layout, groups, counts, offsets),
            context=context,
            available_memory_bytes=available_bytes,
            null_block=null_block,
            pool_split=pool_split,
        )
    except PlanValidationError as exc:
        raise exc.about(policy=policy.name, source="laid out by the policy") from None


def check_groups(policy_name: str, specs: Mapping[str, KVCacheSpec], groups: Sequence[KVCacheGroup]) -> None:
    """Check a policy's grouping: every layer once, each group spec equal to its layers' specs
    except for an enlarged block size.

    Each distinct pair of a layer's spec and its group's spec is compared once, however many
    layers share it.

    Raises:
        PluginValidationError: naming the policy and the layer at fault.
    """
    seen: set[str] = set()
    for index, group in enumerate(groups):
        if not isinstance(group, KVCacheGroup):
            raise PluginValidationError(
                f"policy {policy_name!r}: group() returned {group!r}, expected KVCacheGroup"
            )
        checked_ids: set[tuple[int, int]] = set()  # (layer spec, group spec) objects already compared
        checked: set[tuple[KVCacheSpec, KVCacheSpec]] = set()  # ... and their values
        for name in group.layer_names:
            own = specs.get(name)
            if own is None:
                raise PluginValidationError(
                    f"policy {policy_name!r} put unknown layer {name!r} in group {index}"
                )
            if name in seen:
                raise PluginValidationError(f"policy {policy_name!r} put layer {name!r} in two groups")
            seen.add(name)
            target = group.spec_of(name)
            if (id(own), id(target)) in checked_ids:
                continue
            checked_ids.add((id(own), id(target)))
            if (own, target) in checked:
                continue
            _check_member(policy_name, name, index, own, target)
            checked.add((own, target))
    used = sorted({g.pool for g in groups})
    if used and used != list(range(len(used))):
        raise PluginValidationError(
            f"policy {policy_name!r}: its groups draw from pools {used}; "
            "number the pools 0, 1, ... without a gap"
        )
    if len(seen) != len(specs):
        missing = [name for name in specs if name not in seen]
        raise PluginValidationError(f"policy {policy_name!r} left layers out of every group: {missing[:5]}")


def _check_member(policy_name: str, name: str, index: int, own: KVCacheSpec, spec: KVCacheSpec) -> None:
    if spec.block_size < own.block_size:
        raise PluginValidationError(
            f"policy {policy_name!r} shrank layer {name!r}'s block size from "
            f"{own.block_size} to {spec.block_size}"
        )
    resized = own if spec.block_size == own.block_size else own.with_block_size(spec.block_size)
    if resized.group_key != spec.group_key:
        raise PluginValidationError(
            f"policy {policy_name!r} put layer {name!r} in group {index} whose spec differs "
            f"from the layer's in {', '.join(spec_differences(own, spec))}"
        )


def check_forced_blocks(num_blocks: int, per_block: int, available_bytes: int, context: SizingContext) -> int:
    """Check a forced block count against a budget; return it.

    Raises:
        InvalidInputError: not an int >= 1.
        InsufficientMemoryError: ``num_blocks * per_block`` exceeds ``available_bytes``.
    """
    check_int(num_blocks, "'num_blocks'", minimum=1)
    check_forced_pools((num_blocks,), (per_block,), available_bytes, context)
    return num_blocks


def _layers_of(specs: Mapping[str, KVCacheSpec], layers: Collection[str]) -> dict[str, KVCacheSpec]:
    wanted = layers if isinstance(layers, (set, frozenset, Mapping)) else set(layers)
    return {name: spec for name, spec in specs.items() if name in wanted}


if not TYPE_CHECKING:  # type checkers keep refusing names the module does not define
    __getattr__ = names_removed_from(
        __name__,
        {
            "plan_model": "plan(PlanRequest(...), registry=...)",
            "plan_longest": "plan(PlanRequest(..., max_model_len=MaxModelLen.up_to(cap)), registry=...)",
            "largest_admitted": "longest_admitted(PlanRequest(..., check_fit=False), registry=...)",
        },
    )
