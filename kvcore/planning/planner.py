"""Turn layer specs and a byte budget into plans, with any registered policy: the one planning
implementation, for one rank and for many.

The policy decides grouping and layout; this module owns what every policy shares: choosing
the policy (:meth:`Registry.select`), checking what the policy returned, sizing the tensors for
the block count, choosing ``num_blocks`` from the budget (or honouring a forced count), and
admission (one request of ``max_model_len`` must fit; a refusal names the largest length that
planning admits, found by planning: :func:`largest_admitted`). ``max_model_len="auto"`` plans
at that length (:func:`plan_longest`).

:func:`plan_model` is the implementation: it groups the whole model once, asks the policy for
each rank's layout once (the groups projected onto the rank's layers), gives every rank the
same block count and checks admission on the rank with the fewest blocks.
:func:`plan_kv_cache` (one worker) and :func:`kvcore.planning.ranks.plan_for_ranks` (a tensor x
pipeline world) are thin wrappers around it.

Planning works per distinct spec, not per layer, where it can: equal specs are made one object
first (:func:`share_equal_specs`), so group keys, grouping checks and page sizes are computed
once per distinct spec or per group, and what is left per layer is bookkeeping (a name in a
group, a tensor per layer). Planning time grows linearly with the number of layers;
``benchmarks/planning_speed.py`` measures it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Literal

import attrs

from kvcore.error_messages import with_message
from kvcore.errors import (
    InsufficientMemoryError,
    InvalidInputError,
    InvalidSpecError,
    PlanValidationError,
    PluginValidationError,
    PolicyNotApplicableError,
)
from kvcore.limits import MAX_BYTES, check_at_most
from kvcore.plan import KVCacheGroup, KVCachePlan, KVCacheTensor
from kvcore.planning.admission import check_admission
from kvcore.planning.capacity import blocks_that_fit
from kvcore.planning.invariants import plan_problems
from kvcore.planning.max_len import (
    LENGTH_CEILING,
    LengthChoice,
    LengthSearch,
    largest_admitted_len,
    memory_bound,
)
from kvcore.planning.registry import Registry
from kvcore.policy import AllocationPolicy, BlockPlacement, PlanOptions, PolicyChoice
from kvcore.spec import KVCacheSpec, SizingContext, check_layer_specs, sized_specs, spec_differences
from kvcore.validators import check_int


@attrs.frozen(kw_only=True)
class PlanningResult:
    """What :func:`plan_model` made: the policy choice and one plan per rank.

    Attributes:
        choice: the policy and why it was chosen (``auto``'s reason, for a report).
        plans: one plan per rank, in rank order (one for a single worker).
        length: how ``max_model_len="auto"`` chose the length (``None`` for a given length).
    """

    choice: PolicyChoice
    plans: tuple[KVCachePlan, ...]
    length: LengthChoice | None = None


def plan_kv_cache(
    specs: Mapping[str, KVCacheSpec],
    available_bytes: int,
    context: SizingContext,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    options: PlanOptions | None = None,
    num_blocks: int | None = None,
    check_fit: bool = True,
    max_model_len: Literal["auto"] | None = None,
) -> KVCachePlan:
    """Plan the KV cache of one worker.

    Args:
        specs: ``{layer name: spec}`` in model order.
        available_bytes: the KV-cache byte budget.
        context: the request length (and step size) to size for.
        registry: where policies are looked up.
        policy: a policy name, ``"auto"``, or a policy object.
        options: policy knobs; defaults to :class:`PlanOptions`'s defaults.
        num_blocks: force this many block ids instead of filling the budget.
        check_fit: raise unless one request of ``context.max_model_len`` fits.
        max_model_len: ``"auto"``: plan for the longest request the budget admits, at most
            ``context.max_model_len`` (give a model's ``max_position_embeddings`` there, or
            :data:`kvcore.limits.MAX_TOKENS` to let memory alone bound it); the plan's
            ``context.max_model_len`` is the length chosen (:func:`plan_longest`).

    Returns:
        The plan.

    Raises:
        PolicyNotApplicableError: the policy cannot plan these specs (says why).
        InsufficientMemoryError: the budget (or the forced block count) cannot hold one
            request of ``max_model_len`` tokens, or the forced blocks exceed the budget.
    """
    result = plan_model(
        specs,
        [available_bytes],
        context,
        registry=registry,
        policy=policy,
        options=options,
        num_blocks=num_blocks,
        check_fit=check_fit,
        max_model_len=max_model_len,
    )
    return result.plans[0]


def plan_model(
    specs: Mapping[str, KVCacheSpec],
    rank_memory: Sequence[int],
    context: SizingContext,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    options: PlanOptions | None = None,
    num_blocks: int | None = None,
    check_fit: bool = True,
    rank_layers: Sequence[Collection[str]] | None = None,
    rank_names: Sequence[str] | None = None,
    max_model_len: Literal["auto"] | None = None,
) -> PlanningResult:
    """Plan a model's KV cache on one rank or several: the one planning implementation.

    The policy groups the whole model once; each rank's plan holds every group, projected onto
    the rank's own layers (a group may be empty there), laid out by one ``policy.layout`` call;
    every rank gets the same ``num_blocks``: the forced count, else the smallest number of
    blocks any rank's budget holds.

    Args:
        specs: the whole model's ``{layer name: spec}`` in model order.
        rank_memory: one byte budget per rank.
        context: the request length (and step size) to size for.
        registry: where policies are looked up.
        policy: a policy name, ``"auto"``, or a policy object (it plans the whole model).
        options: policy knobs; defaults to :class:`PlanOptions`'s defaults.
        num_blocks: force this many block ids (checked against every rank's budget).
        check_fit: raise unless one request of ``context.max_model_len`` fits.
        rank_layers: the layers each rank holds, in rank order; ``None`` for one rank that
            holds every layer.
        rank_names: how messages name each rank (``'rank 3 (pp stage 1)'``); ``None`` when
            there is one rank and messages name none.
        max_model_len: ``"auto"``: plan for the longest request the budgets admit, at most
            ``context.max_model_len`` (a model's ``max_position_embeddings``; with
            :data:`kvcore.limits.MAX_TOKENS`, memory alone bounds it); see
            :func:`plan_longest`. ``None``: plan for ``context.max_model_len``.

    Returns:
        The policy choice and one plan per rank (and, with ``"auto"``, how the length was
        chosen: :attr:`PlanningResult.length`).

    Raises:
        InvalidSpecError: ``specs`` is not a non-empty mapping of layer names to specs.
        InvalidInputError: a budget is not a non-negative int, or the per-rank lists do not
            match ``rank_memory``.
        UnknownPolicyError: no policy of that name.
        PolicyNotApplicableError: the policy cannot plan the whole model (says why).
        PluginValidationError: the policy's grouping or layout breaks the protocol.
        InsufficientMemoryError: a forced block count exceeds a rank's budget, or one request
            does not fit in the common block count (names the rank with the fewest blocks);
            ``largest_fitting_len`` is the largest length planning admits
            (:func:`largest_admitted`).
    """
    if isinstance(specs, Mapping) and not specs:
        return nothing_to_cache(rank_memory, context, registry=registry, policy=policy)
    if max_model_len is not None:
        return plan_longest(
            specs,
            rank_memory,
            context,
            registry=registry,
            policy=policy,
            options=options,
            num_blocks=num_blocks,
            rank_layers=rank_layers,
            rank_names=rank_names,
        )
    if rank_layers is not None and len(rank_layers) != len(rank_memory):
        raise InvalidInputError(
            f"got the layers of {len(rank_layers)} rank(s) but memory of {len(rank_memory)}; "
            "every rank needs both"
        )
    if rank_names is not None and len(rank_names) != len(rank_memory):
        raise InvalidInputError(f"got {len(rank_names)} rank names for {len(rank_memory)} ranks")
    if not rank_memory:
        raise InvalidInputError("no rank budgets given (got an empty list)")

    def prefix(rank: int) -> str:
        return f"{rank_names[rank]}: " if rank_names is not None else ""

    check_layer_specs(specs)
    for rank, memory in enumerate(rank_memory):
        check_budget(memory, prefix(rank))
    # serving options the block pool must see (speculative slots, state cache mode, encoder
    # length) go into the specs the plan keeps
    specs = share_equal_specs(sized_specs(specs, context))
    choice = resolve_policy(specs, policy, registry)
    chosen = choice.policy
    groups = group_layers(chosen, specs, context, options)
    rank_groups = [groups] if rank_layers is None else [project_groups(groups, own) for own in rank_layers]
    layouts = [layout_for(chosen, own) for own in rank_groups]
    null_block = 0 if options is not None and options.reserve_null_block else None

    if num_blocks is None:
        blocks = min(
            blocks_that_fit(memory, layout.bytes_per_block)
            for memory, layout in zip(rank_memory, layouts, strict=True)
        )
    else:
        for rank, (memory, layout) in enumerate(zip(rank_memory, layouts, strict=True)):
            try:
                check_forced_blocks(num_blocks, layout.bytes_per_block, memory, context)
            except InsufficientMemoryError as exc:
                raise _on_rank(exc, prefix(rank)) from None
        blocks = num_blocks
    built: list[KVCachePlan] = []
    for rank, (own, layout, memory) in enumerate(zip(rank_groups, layouts, rank_memory, strict=True)):
        # the one check every plan passes: structure when built, the rest here
        try:
            plan = build_plan(chosen, own, layout, blocks, context, memory, null_block=null_block)
            problems = plan_problems(plan, structure=False)
        except PlanValidationError as exc:
            problems = exc.problems
        if problems:
            raise PlanValidationError(
                problems, policy=chosen.name, source=prefix(rank) + laid_out_by(chosen, registry)
            )
        built.append(plan)
    plans = tuple(built)
    if check_fit:
        tightest = tightest_rank(plans)
        try:
            check_admission(
                plans[tightest],
                forced_num_blocks=num_blocks is not None,
                largest_admitted=lambda: (
                    largest_admitted(
                        specs,
                        rank_memory,
                        context,
                        registry=registry,
                        policy=chosen,
                        options=options,
                        num_blocks=num_blocks,
                        rank_layers=rank_layers,
                        estimate=plans[tightest].largest_fitting_len(),
                    ).length
                ),
            )
        except InsufficientMemoryError as exc:
            if rank_names is None:
                raise
            who = rank_names[tightest]
            why = f"{who}: " if num_blocks is not None else f"{who} has the fewest blocks: "
            raise _on_rank(exc, why) from None
    return PlanningResult(choice=choice, plans=plans)


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


def check_budget(available_bytes: int, owner: str = "") -> None:
    """Check a byte budget: a non-negative ``int`` of at most :data:`~kvcore.limits.MAX_BYTES`.

    Args:
        available_bytes: the budget.
        owner: who reported it, for the message (e.g. ``"rank 3: "``).

    Raises:
        InvalidInputError: anything else.
    """
    check_int(available_bytes, "available memory in bytes", minimum=0, owner=owner)
    check_at_most(
        available_bytes,
        MAX_BYTES,
        f"{owner}available memory in bytes",
        "1 EiB (kvcore.limits.MAX_BYTES) is the most kvcore plans",
    )


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
        specs = common_block_size(specs, chosen)
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
        attrs.evolve(group, layer_names=tuple(name for name in group.layer_names if name in own))
        for group in groups
    )


def tightest_rank(plans: Sequence[KVCachePlan]) -> int:
    """The rank whose memory bounds the common block count (the first, on a tie).

    Args:
        plans: one plan per rank, as :func:`plan_model` returns them.

    Returns:
        The index of the plan with the fewest blocks its own memory would hold.
    """
    return min(
        range(len(plans)),
        key=lambda r: blocks_that_fit(plans[r].available_memory_bytes, plans[r].bytes_per_block),
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
    if layout.bytes_per_block <= 0 and any(g.layer_names for g in groups):
        raise PluginValidationError(
            f"policy {policy.name!r}: layout() reports {layout.bytes_per_block} bytes per block; "
            "it must be positive"
        )
    return layout


def size_tensors(
    policy_name: str, layout: BlockPlacement, groups: Sequence[KVCacheGroup], num_blocks: int
) -> tuple[KVCacheTensor, ...]:
    """The layout's tensors, sized for ``num_blocks`` block ids.

    A tensor's layers (``shared_by``) each have ``num_blocks // blocks_per_page`` pages of
    their group's page size; the tensor holds the fewest pages any of them has, and ends where
    the last such page of its largest layer ends.

    Raises:
        PluginValidationError: a tensor is shared by no layer or by a layer in no group, or
            has an offset or page stride that is not a non-negative (positive) int.
    """
    # (page bytes, pages) per layer: one pair per group, shared by its layers
    per_layer: dict[str, tuple[int, int]] = {}
    for group in groups:
        if group.layer_names:
            pair = (group.spec.page_size_bytes, num_blocks // group.blocks_per_page)
            per_layer.update(dict.fromkeys(group.layer_names, pair))
    tensors = []
    for index, placement in enumerate(layout.tensors):
        names = placement.shared_by
        try:
            if len(names) == 1:
                largest, pages = per_layer[names[0]]
            else:
                sharers = [per_layer[name] for name in names]
                largest = max(page for page, _ in sharers)
                pages = min(count for _, count in sharers)
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
                    offset=placement.offset,
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
    num_blocks: int,
    context: SizingContext,
    available_bytes: int,
    *,
    null_block: int | None = None,
) -> KVCachePlan:
    """Size ``layout`` for ``num_blocks`` and wrap it in a plan (no admission check).

    Args:
        policy: the policy that made ``groups`` and ``layout``.
        groups: the groups (possibly a projection onto one rank's layers).
        layout: ``policy.layout(groups)``.
        num_blocks: the block count.
        context: the request length the plan is sized for.
        available_bytes: the budget the plan is made for.
        null_block: ``0`` to reserve block id 0 as the null block
            (:attr:`PlanOptions.reserve_null_block`), else ``None``.

    Returns:
        The plan.

    Raises:
        PluginValidationError: the layout places a layer that is in no group.
        PlanValidationError: the layout breaks a structural invariant (naming the policy).
    """
    try:
        return KVCachePlan(
            policy=policy.name,
            num_blocks=num_blocks,
            bytes_per_block=layout.bytes_per_block,
            single_buffer=layout.single_buffer,
            groups=groups,
            tensors=size_tensors(policy.name, layout, groups, num_blocks),
            context=context,
            available_memory_bytes=available_bytes,
            null_block=null_block,
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
        checked_ids: set[int] = set()  # layer spec objects already compared with this group's spec
        checked: set[KVCacheSpec] = set()  # ... and their values, for equal specs in other objects
        for name in group.layer_names:
            own = specs.get(name)
            if own is None:
                raise PluginValidationError(
                    f"policy {policy_name!r} put unknown layer {name!r} in group {index}"
                )
            if name in seen:
                raise PluginValidationError(f"policy {policy_name!r} put layer {name!r} in two groups")
            seen.add(name)
            if id(own) in checked_ids:
                continue
            checked_ids.add(id(own))
            if own in checked:
                continue
            _check_member(policy_name, name, index, own, group.spec)
            checked.add(own)
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
    need = num_blocks * per_block
    if need > available_bytes:
        most = blocks_that_fit(available_bytes, per_block)
        raise with_message(
            InsufficientMemoryError(
                reason="forced_num_blocks",
                required_bytes=need,
                available_bytes=available_bytes,
                max_model_len=context.max_model_len,
                largest_fitting_len=0,
                required_blocks=num_blocks,
                available_blocks=most,
                bytes_per_block=per_block,
            )
        )
    return num_blocks


# -- the longest admitted request ----------------------------------------------------------


def largest_admitted(
    specs: Mapping[str, KVCacheSpec],
    rank_memory: Sequence[int],
    context: SizingContext,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    options: PlanOptions | None = None,
    num_blocks: int | None = None,
    rank_layers: Sequence[Collection[str]] | None = None,
    estimate: int | None = None,
) -> LengthSearch:
    """The largest request length, up to ``context.max_model_len``, that :func:`plan_model`
    admits with these inputs, and how many plans finding it took.

    Planning at the length succeeds (one request fits in the common block count); planning at
    one more token is refused (unless the length is ``context.max_model_len``). Each length is
    planned for itself, so a grouping that changes with the length is accounted for; see
    :func:`kvcore.planning.max_len.largest_admitted_len` for the search.

    Args:
        specs, rank_memory, context, registry, policy, options, num_blocks, rank_layers: as
            for :func:`plan_model`.
        estimate: a guess below ``context.max_model_len`` when that length is known to be
            refused (the refused plan's :meth:`~kvcore.plan.KVCachePlan.largest_fitting_len`);
            ``None`` to plan at ``context.max_model_len`` first.

    Returns:
        The length (0 if not even one token is admitted) and the plans made.
    """

    def plans_at(length: int) -> tuple[KVCachePlan, ...]:
        return plan_model(
            specs,
            rank_memory,
            context.with_max_model_len(length),
            registry=registry,
            policy=policy,
            options=options,
            num_blocks=num_blocks,
            check_fit=False,
            rank_layers=rank_layers,
        ).plans

    return largest_admitted_len(plans_at, context.max_model_len, estimate=estimate)


def plan_longest(
    specs: Mapping[str, KVCacheSpec],
    rank_memory: Sequence[int],
    context: SizingContext,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    options: PlanOptions | None = None,
    num_blocks: int | None = None,
    rank_layers: Sequence[Collection[str]] | None = None,
    rank_names: Sequence[str] | None = None,
) -> PlanningResult:
    """Plan for the longest request the budgets admit (``max_model_len="auto"``).

    The length is the largest one :func:`plan_model` admits (:func:`largest_admitted`), at
    most ``context.max_model_len`` (the cap: a model's ``max_position_embeddings``) and at
    most the longest request whose ideal need fits every rank's budget
    (:func:`~kvcore.planning.max_len.memory_bound`; no layout admits more). A cap of
    :data:`kvcore.limits.MAX_TOKENS` means no cap: memory alone bounds the length.

    Args:
        specs, rank_memory, context, registry, policy, options, num_blocks, rank_layers,
            rank_names: as for :func:`plan_model`; ``context.max_model_len`` is the cap.

    Returns:
        The plans at the chosen length (their ``context.max_model_len``), with
        :attr:`PlanningResult.length` saying how it was chosen.

    Raises:
        InvalidInputError: there is no cap and the layers' need stops growing with the length
            (sliding windows or states only), so memory bounds nothing: give a length.
        InsufficientMemoryError: not even one token is admitted (as planning at length 1
            reports it).
        The errors of :func:`plan_model`.
    """
    cap = context.max_model_len
    capped = cap < LENGTH_CEILING
    own = [specs] if rank_layers is None else [_layers_of(specs, layers) for layers in rank_layers]
    bound = memory_bound(own, rank_memory, context)
    if bound is None and not capped:
        raise InvalidInputError(
            "cannot choose max_model_len automatically: these layers' need stops growing with the "
            "request length (sliding windows or states only) and no max_position_embeddings caps "
            "it; give max_model_len a number"
        )
    upper = min(cap, bound) if bound is not None else cap
    search = largest_admitted(
        specs,
        rank_memory,
        context.with_max_model_len(max(upper, 1)),
        registry=registry,
        policy=policy,
        options=options,
        num_blocks=num_blocks,
        rank_layers=rank_layers,
    )
    length = max(search.length, 1)  # not even one token: planning at 1 says why
    result = plan_model(
        specs,
        rank_memory,
        context.with_max_model_len(length),
        registry=registry,
        policy=policy,
        options=options,
        num_blocks=num_blocks,
        rank_layers=rank_layers,
        rank_names=rank_names,
    )
    choice = LengthChoice(
        max_model_len=length,
        cap=cap if capped else None,
        limited_by="cap" if capped and length == cap else "memory",
        plans=search.plans + 1,
    )
    return attrs.evolve(result, length=choice)


def _layers_of(specs: Mapping[str, KVCacheSpec], layers: Collection[str]) -> dict[str, KVCacheSpec]:
    wanted = layers if isinstance(layers, (set, frozenset, Mapping)) else set(layers)
    return {name: spec for name, spec in specs.items() if name in wanted}
