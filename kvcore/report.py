"""What a plan means for capacity, as a JSON object and as a readable summary.

Both are computed from the plan and the specs it was made from; nothing is stored twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.capacity import ideal_concurrency, request_bytes
from kvcore.plan import KVCacheConfig, KVCacheGroup
from kvcore.serialization import plan_to_dict
from kvcore.spec import KVCacheSpec, format_value, is_kv_cache_type_uniform
from kvcore.table import render_table
from kvcore.units import format_bytes

if TYPE_CHECKING:
    from kvcore.registry import Registry


def group_details(group: KVCacheGroup) -> str:
    """The group spec's fields other than ``block_size``, as ``name=value`` pairs."""
    return " ".join(
        f"{a.name}={format_value(getattr(group.spec, a.name))}"
        for a in attrs.fields(type(group.spec))
        if a.name != "block_size"
    )


def plan_report(plan: KVCacheConfig, specs: Mapping[str, KVCacheSpec], registry: Registry) -> dict[str, Any]:
    """The plan as JSON plus its capacity figures.

    Keys beyond the plan's own: ``max_model_len``, ``kv_cache_bytes``, ``blocks_per_request``,
    ``max_concurrency`` (requests of ``max_model_len`` held at once), ``ideal_concurrency``
    (the bound no layout can beat), ``efficiency`` (their ratio), ``kv_cache_tokens``; and per
    group ``blocks_per_request`` and ``tokens_held`` (``null`` for a state group). The result
    reads back as a plan with :func:`kvcore.serialization.plan_from_dict`.
    """
    data = plan_to_dict(plan, registry)
    ideal = ideal_concurrency(specs, plan.available_memory_bytes, plan.context)
    concurrency = plan.max_concurrency()
    for entry, group in zip(data["groups"], plan.groups, strict=True):
        entry["blocks_per_request"] = group.blocks_per_request(plan.context)
        entry["tokens_held"] = plan.tokens_held(group)
    figures = {
        "max_model_len": plan.context.max_model_len,
        "kv_cache_bytes": plan.kv_cache_bytes,
        "blocks_per_request": plan.blocks_per_request(),
        "max_concurrency": concurrency,
        "ideal_concurrency": ideal,
        "efficiency": concurrency / ideal if ideal else 0.0,
        "kv_cache_tokens": int(concurrency * plan.context.max_model_len),
    }
    return {"policy": data.pop("policy"), "num_blocks": data.pop("num_blocks"), **figures, **data}


def policy_reason(specs: Mapping[str, KVCacheSpec], requested: str) -> str:
    """Why this policy was used: ``'named'`` or what ``auto`` saw."""
    if requested != "auto":
        return "named on the command line"
    if is_kv_cache_type_uniform(specs):
        return "auto: every layer has the same spec"
    kinds = len({spec.group_key for spec in specs.values()})
    return f"auto: the layers have {kinds} different specs"


def format_plan(plan: KVCacheConfig, specs: Mapping[str, KVCacheSpec], *, reason: str = "") -> str:
    """A readable summary: one row per group, then totals and capacity."""
    ctx = plan.context
    ideal = ideal_concurrency(specs, plan.available_memory_bytes, ctx)
    concurrency = plan.max_concurrency()
    rows = []
    for index, group in enumerate(plan.groups):
        held = plan.tokens_held(group)
        rows.append(
            [
                index,
                group.spec.kind,
                len(group.layer_names),
                group.spec.block_size if held is not None else "-",
                format_bytes(group.spec.page_size_bytes),
                group.blocks_per_request(ctx),
                f"{held:,}" if held is not None else f"{plan.num_pages(group):,} slots",
                group_details(group),
            ]
        )
    table = render_table(
        ["group", "kind", "layers", "block", "page", "blocks/req", "tokens held", "spec"],
        rows,
        align="rlrrrrrl",
    )
    per_request = plan.blocks_per_request()
    layout = "one shared buffer" if plan.single_buffer else "one tensor per layer"
    lines = [
        f"policy {plan.policy}" + (f" ({reason})" if reason else ""),
        f"budget {format_bytes(plan.available_memory_bytes)}, max_model_len {ctx.max_model_len:,}, "
        f"max_num_batched_tokens {ctx.max_num_batched_tokens:,}",
        "",
        table,
        "",
        f"  blocks           {plan.num_blocks:,} x {format_bytes(plan.bytes_per_block)} = "
        f"{format_bytes(plan.kv_cache_bytes)} ({layout}, {len(plan.groups)} groups, "
        f"{len(plan.tensors)} tensors)",
        f"  one request      {per_request:,} blocks = {format_bytes(per_request * plan.bytes_per_block)} "
        f"(ideal {format_bytes(request_bytes(specs, ctx))}) for {ctx.max_model_len:,} tokens",
        f"  max concurrency  {concurrency:,.2f} requests of {ctx.max_model_len:,} tokens "
        f"(ideal {ideal:,.2f}, efficiency {100 * concurrency / ideal if ideal else 0:.2f}%)",
    ]
    return "\n".join(lines)
