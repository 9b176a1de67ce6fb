"""Turn layer specs and a byte budget into a plan, with any registered policy.

The policy decides grouping and layout; this module owns what every policy shares: choosing
``num_blocks`` from the budget (or honouring a forced count), checking what the policy
returned, and admission (one request of ``max_model_len`` must fit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvcore.errors import (
    InsufficientMemoryError,
    InvalidInputError,
    PluginValidationError,
    PolicyNotApplicableError,
)
from kvcore.plan import KVCacheConfig, KVCacheGroup
from kvcore.planning.admission import check_admission
from kvcore.planning.registry import Registry
from kvcore.policy import AllocationPolicy, Layout, PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext, check_layer_specs, spec_differences
from kvcore.units import format_bytes


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
) -> KVCacheConfig:
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

    Returns:
        The plan.

    Raises:
        PolicyNotApplicableError: the policy cannot plan these specs (says why).
        InsufficientMemoryError: the budget (or the forced block count) cannot hold one
            request of ``max_model_len`` tokens, or the forced blocks exceed the budget.
    """
    check_layer_specs(specs)
    check_budget(available_bytes)
    chosen = resolve_policy(specs, policy, registry)
    groups = group_layers(chosen, specs, context, options)
    per_block = layout_for(chosen, groups, 1).bytes_per_block

    if num_blocks is None:
        blocks = available_bytes // per_block if per_block else 0
    else:
        blocks = check_forced_blocks(num_blocks, per_block, available_bytes, context)
    plan = build_plan(chosen, groups, blocks, per_block, context, available_bytes)
    if check_fit:
        check_admission(plan, forced_num_blocks=num_blocks is not None)
    return plan


def check_budget(available_bytes: int, owner: str = "") -> None:
    """Check a byte budget: a non-negative ``int``.

    Args:
        available_bytes: the budget.
        owner: who reported it, for the message (e.g. ``"rank 3: "``).

    Raises:
        InvalidInputError: anything else.
    """
    if isinstance(available_bytes, bool) or not isinstance(available_bytes, int) or available_bytes < 0:
        raise InvalidInputError(
            f"{owner}available memory must be a non-negative int of bytes (got {available_bytes!r})"
        )


def resolve_policy(
    specs: Mapping[str, KVCacheSpec], policy: str | AllocationPolicy, registry: Registry
) -> AllocationPolicy:
    """The policy to plan ``specs`` with: a name (or ``"auto"``) looked up, or an object checked.

    Raises:
        UnknownPolicyError: no policy of that name.
        PolicyNotApplicableError: the policy cannot plan these specs (says why).
    """
    if isinstance(policy, str):
        return registry.select(specs, policy)
    reason = policy.why_not(specs)
    if reason is not None:
        raise PolicyNotApplicableError(f"policy {policy.name!r} cannot plan these layers: {reason}")
    return policy


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
    groups = tuple(policy.group(specs, context, options if options is not None else PlanOptions()))
    check_groups(policy.name, specs, groups)
    return groups


def build_plan(
    policy: AllocationPolicy,
    groups: Sequence[KVCacheGroup],
    num_blocks: int,
    bytes_per_block: int,
    context: SizingContext,
    available_bytes: int,
) -> KVCacheConfig:
    """Lay ``groups`` out for ``num_blocks`` and wrap the result in a plan (no admission check).

    Args:
        policy: the policy that made ``groups``.
        groups: the groups (possibly a projection onto one rank's layers).
        num_blocks: the block count.
        bytes_per_block: what ``policy.layout(groups, 1)`` reported.
        context: the request length the plan is sized for.
        available_bytes: the budget the plan is made for.

    Returns:
        The plan.

    Raises:
        PluginValidationError: the layout's bytes per block depend on the block count.
        PlanValidationError: the layout breaks a structural invariant.
    """
    layout = layout_for(policy, groups, num_blocks)
    if layout.bytes_per_block != bytes_per_block:
        raise PluginValidationError(
            f"policy {policy.name!r} reports {layout.bytes_per_block} bytes per block for {num_blocks} "
            f"blocks but {bytes_per_block} for one; bytes_per_block must not depend on num_blocks"
        )
    return KVCacheConfig(
        policy=policy.name,
        num_blocks=num_blocks,
        bytes_per_block=bytes_per_block,
        single_buffer=layout.single_buffer,
        groups=groups,
        tensors=layout.tensors,
        context=context,
        available_memory_bytes=available_bytes,
    )


def layout_for(policy: AllocationPolicy, groups: Sequence[KVCacheGroup], num_blocks: int) -> Layout:
    """``policy.layout(groups, num_blocks)``, checked to be a :class:`Layout` with a sane size."""
    layout = policy.layout(groups, num_blocks)
    if not isinstance(layout, Layout):
        raise PluginValidationError(
            f"policy {policy.name!r}: layout() returned {layout!r}, expected a kvcore.Layout"
        )
    if layout.bytes_per_block <= 0 and any(g.layer_names for g in groups):
        raise PluginValidationError(
            f"policy {policy.name!r}: layout() reports {layout.bytes_per_block} bytes per block; "
            "it must be positive"
        )
    return layout


def check_groups(policy_name: str, specs: Mapping[str, KVCacheSpec], groups: Sequence[KVCacheGroup]) -> None:
    """Check a policy's grouping: every layer once, each group spec equal to its layers' specs
    except for an enlarged block size.

    Raises:
        PluginValidationError: naming the policy and the layer at fault.
    """
    seen: set[str] = set()
    for index, group in enumerate(groups):
        if not isinstance(group, KVCacheGroup):
            raise PluginValidationError(
                f"policy {policy_name!r}: group() returned {group!r}, expected KVCacheGroup"
            )
        for name in group.layer_names:
            if name not in specs:
                raise PluginValidationError(
                    f"policy {policy_name!r} put unknown layer {name!r} in group {index}"
                )
            if name in seen:
                raise PluginValidationError(f"policy {policy_name!r} put layer {name!r} in two groups")
            seen.add(name)
            own = specs[name]
            if group.spec.block_size < own.block_size:
                raise PluginValidationError(
                    f"policy {policy_name!r} shrank layer {name!r}'s block size from "
                    f"{own.block_size} to {group.spec.block_size}"
                )
            if own.with_block_size(group.spec.block_size).group_key != group.spec.group_key:
                raise PluginValidationError(
                    f"policy {policy_name!r} put layer {name!r} in group {index} whose spec differs "
                    f"from the layer's in {', '.join(spec_differences(own, group.spec))}"
                )
    missing = [name for name in specs if name not in seen]
    if missing:
        raise PluginValidationError(f"policy {policy_name!r} left layers out of every group: {missing[:5]}")


def check_forced_blocks(num_blocks: int, per_block: int, available_bytes: int, context: SizingContext) -> int:
    """Check a forced block count against a budget; return it.

    Raises:
        InvalidInputError: not an int >= 1.
        InsufficientMemoryError: ``num_blocks * per_block`` exceeds ``available_bytes``.
    """
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise InvalidInputError(f"'num_blocks' must be an int >= 1 (got {num_blocks!r})")
    need = num_blocks * per_block
    if need > available_bytes:
        most = available_bytes // per_block if per_block else 0
        raise InsufficientMemoryError(
            f"--num-blocks {num_blocks} needs {format_bytes(need)} ({num_blocks} blocks of "
            f"{format_bytes(per_block)}) but only {format_bytes(available_bytes)} is available; "
            f"at most {most} blocks fit: lower --num-blocks or give the KV cache more memory",
            required_bytes=need,
            available_bytes=available_bytes,
            max_model_len=context.max_model_len,
            largest_fitting_len=0,
        )
    return num_blocks
