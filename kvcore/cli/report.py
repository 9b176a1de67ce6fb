"""What a plan means for capacity, as a JSON object and as a readable summary.

Both read the plan's :class:`~kvcore.planning.capacity.Capacity`, computed once from the plan
and the specs it was made from; nothing is computed twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvcore.cli.table import render_table
from kvcore.error_messages import plural
from kvcore.errors import KVCacheBindingError
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.planning.capacity import Capacity, finite_or_none, format_figure, own_pool_blocks
from kvcore.planning.ranks import Parallelism, tightest_rank
from kvcore.planning.serialization import plan_to_dict
from kvcore.policy import PolicyChoice
from kvcore.runtime.binding import layer_index
from kvcore.spec import KVCacheSpec, format_value, shown_fields
from kvcore.units import format_bytes

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry


def page_text(group: KVCacheGroup) -> str:
    """The group's page size, or its page sizes from smallest to largest for a mixed-page
    group (``'48 KiB/64 KiB/80 KiB'``)."""
    if not group.layer_specs:
        return format_bytes(group.spec.page_size_bytes)
    return "/".join(format_bytes(size) for size in sorted({spec.page_size_bytes for spec in group.specs}))


def group_records(plan: KVCachePlan, specs: Mapping[str, KVCacheSpec]) -> list[dict[str, Any]]:
    """One record per group, the columns of :func:`format_plan`'s table unformatted (for
    ``--csv``): ``group``, ``pool``, ``kind``, ``layers``, ``block_size`` (``None`` for a
    state), ``page_bytes`` (the largest page of a mixed-page group), ``blocks_per_request``,
    ``tokens_held`` (``None`` for a state), ``slots`` (a state's pages), then the spec's fields."""
    capacity = Capacity.of(plan, specs)
    return [
        {
            "group": index,
            "pool": group.pool,
            "kind": group.spec.kind,
            "layers": len(group.layer_names),
            "block_size": group.spec.block_size if held is not None else None,
            "page_bytes": max(spec.page_size_bytes for spec in group.specs),
            "blocks_per_request": group.blocks_per_request(plan.context),
            "tokens_held": held,
            "slots": plan.num_pages(group) if held is None else None,
            **{
                a.name: format_value(getattr(group.spec, a.name))
                for a in shown_fields(group.spec)
                if a.name != "block_size"
            },
        }
        for index, (group, held) in enumerate(zip(plan.groups, capacity.tokens_held, strict=True))
    ]


def pool_lines(plan: KVCachePlan, *, indent: str) -> list[str]:
    """One line per pool of a multi-pool plan: ``pool 0: 1,200 x 64 KiB = 75 MiB (groups 0-1)``.

    Args:
        plan: the plan.
        indent: what starts every line after the first (the first line has none, so a
            caller can put it after a label).

    Returns:
        The lines, without newlines.
    """
    lines: list[str] = []
    for index, pool in enumerate(plan.pools):
        members = plan.groups_in(index)
        which = f"group {members[0]}" if len(members) == 1 else f"groups {index_runs(members)}"
        per_block = format_bytes(pool.bytes_per_block)
        lines.append(
            f"{indent if lines else ''}pool {index}: {pool.num_blocks:,} x {per_block} = "
            f"{format_bytes(pool.nbytes)} ({which})"
        )
    return lines


def group_details(group: KVCacheGroup) -> str:
    """The group spec's fields other than ``block_size``, as ``name=value`` pairs."""
    return " ".join(
        f"{a.name}={format_value(getattr(group.spec, a.name))}"
        for a in shown_fields(group.spec)
        if a.name != "block_size"
    )


def plan_report(
    plan: KVCachePlan,
    specs: Mapping[str, KVCacheSpec],
    registry: Registry,
    *,
    capacity: Capacity | None = None,
) -> dict[str, Any]:
    """The plan as JSON plus its capacity figures.

    Keys beyond the plan's own: ``max_model_len``, ``kv_cache_bytes``, ``blocks_per_request``,
    ``max_concurrency`` (requests of ``max_model_len`` held at once), ``ideal_concurrency``
    (the bound no layout can beat), ``efficiency`` (their ratio), ``kv_cache_tokens``; and per
    group ``blocks_per_request`` and ``tokens_held`` (``null`` for a state group). A plan of
    several pools has no top-level ``num_blocks`` (its ``pools`` hold the counts) and adds
    ``blocks_per_request_by_pool`` and ``max_concurrency_by_pool``. The result reads back as a
    plan with :func:`kvcore.planning.serialization.plan_from_dict`.

    Args:
        plan: the plan.
        specs: the layer specs it was made from.
        registry: the kinds, for the JSON.
        capacity: the plan's figures if already computed (default :meth:`Capacity.of` the plan
            and ``specs``).

    Returns:
        The JSON object.
    """
    data = plan_to_dict(plan, registry)
    if capacity is None:
        capacity = Capacity.of(plan, specs)
    for entry, group, held in zip(data["groups"], plan.groups, capacity.tokens_held, strict=True):
        entry["blocks_per_request"] = group.blocks_per_request(plan.context)
        entry["tokens_held"] = held
    figures: dict[str, Any] = {
        "max_model_len": capacity.max_model_len,
        "kv_cache_bytes": plan.kv_cache_bytes,
        "blocks_per_request": capacity.blocks_per_request,
        "max_concurrency": finite_or_none(capacity.max_concurrency),
        "ideal_concurrency": finite_or_none(capacity.ideal_concurrency),
        "efficiency": capacity.efficiency,
        "kv_cache_tokens": capacity.kv_cache_tokens,
    }
    if plan.names_pools:
        # the pools carry the block counts (a top-level num_blocks would not read back as a plan)
        figures["blocks_per_request_by_pool"] = list(plan.blocks_per_request_by_pool())
        figures["max_concurrency_by_pool"] = pool_concurrency(plan)
        return {"policy": data.pop("policy"), **figures, **data}
    head = {"policy": data.pop("policy"), "num_blocks": data.pop("num_blocks", plan.num_blocks)}
    return {**head, **figures, **data}


def pool_concurrency(plan: KVCachePlan) -> list[float | None]:
    """Requests of the plan's ``max_model_len`` each pool holds on its own (``None`` for a
    pool no request needs); the plan's max concurrency is the smallest."""
    needs = plan.blocks_per_request_by_pool()
    return [plan.usable_blocks_in(p) / need if need else None for p, need in enumerate(needs)]


def policy_reason(choice: PolicyChoice) -> str:
    """Why the policy was used, for the first line of :func:`format_plan`: what ``auto`` saw
    (``'auto: the layers have 2 different specs'``), or ``'named on the command line'``.

    Args:
        choice: the choice the plan was made with (:meth:`Registry.select`).

    Returns:
        The reason, as the report words it.
    """
    return f"auto: {choice.reason}" if choice.auto else "named on the command line"


def chosen_length(length: int, cap: int | None, cap_name: str) -> dict[str, Any]:
    """How ``--max-model-len auto`` chose ``length``, as the JSON report's ``max_model_len_auto``.

    Args:
        length: the chosen length.
        cap: the most it could be, or ``None`` when nothing but memory bounded it.
        cap_name: what the cap is (``"max_position_embeddings"``).

    Returns:
        ``{"chosen": length, "limited_by": "cap" | "memory", "cap": cap, "cap_name": ...}``:
        ``"cap"`` when the cap itself was admitted, ``"memory"`` when one more token is not.
    """
    return {
        "chosen": length,
        "limited_by": "cap" if cap is not None and length == cap else "memory",
        "cap": cap,
        "cap_name": cap_name if cap is not None else None,
    }


def chosen_length_line(chosen: Mapping[str, Any]) -> str:
    """The report's line on an automatic length (:func:`chosen_length`), e.g. ``'max_model_len
    7,296 chosen automatically: the longest request the memory admits (below the model's
    max_position_embeddings, 131,072)'``."""
    head = f"max_model_len {chosen['chosen']:,} chosen automatically: "
    if chosen["limited_by"] == "cap":
        return head + f"the model's {chosen['cap_name']}, which the memory admits"
    if chosen["cap"] is None:
        return head + "the longest request the memory admits (no max_position_embeddings caps it)"
    return head + (
        f"the longest request the memory admits (below the model's {chosen['cap_name']}, {chosen['cap']:,})"
    )


def format_plan(
    plan: KVCachePlan, specs: Mapping[str, KVCacheSpec], *, reason: str = "", note: str = ""
) -> str:
    """A readable summary: one row per group, then totals and capacity.

    Args:
        plan: the plan.
        specs: the layer specs it was made from.
        reason: why its policy was used (:func:`policy_reason`), for the first line.
        note: a line to add after the budget line (:func:`chosen_length_line`), or ``""``.

    Returns:
        The summary.
    """
    ctx = plan.context
    capacity = Capacity.of(plan, specs)
    multi = plan.names_pools
    rows = []
    for index, (group, held) in enumerate(zip(plan.groups, capacity.tokens_held, strict=True)):
        rows.append(
            [
                index,
                *([group.pool] if multi else []),
                group.spec.kind,
                len(group.layer_names),
                group.spec.block_size if held is not None else "-",
                page_text(group),
                group.blocks_per_request(ctx),
                f"{held:,}" if held is not None else f"{plan.num_pages(group):,} slots",
                group_details(group),
            ]
        )
    headers = ["group", *(["pool"] if multi else []), "kind", "layers", "block", "page"]
    table = render_table(
        [*headers, "blocks/req", "tokens held", "spec"],
        rows,
        align="rrlrrrrrl" if multi else "rlrrrrrl",
    )
    per_request = capacity.blocks_per_request
    layout = "one shared buffer" if plan.single_buffer else "one tensor per layer"
    shape = f"{plural(len(plan.groups), 'group')}, {plural(len(plan.tensors), 'tensor')}"
    if multi:
        blocks = [
            f"  blocks           {pool_lines(plan, indent=' ' * 19)[0]}",
            *pool_lines(plan, indent=" " * 19)[1:],
            f"{' ' * 19}= {format_bytes(plan.kv_cache_bytes)} in {len(plan.pools)} pools ({layout}, {shape})",
        ]
        null = f"block id 0 of each pool pads block tables; {plan.usable_blocks:,} blocks serve requests"
        needs = " + ".join(f"{need:,}" for need in plan.blocks_per_request_by_pool())
        one = f"{needs} blocks (pools {index_runs(range(len(plan.pools)))})"
    else:
        blocks = [
            f"  blocks           {plan.num_blocks:,} x {format_bytes(plan.bytes_per_block)} = "
            f"{format_bytes(plan.kv_cache_bytes)} ({layout}, {shape})"
        ]
        null = f"block id 0 pads block tables; {plan.usable_blocks:,} blocks serve requests"
        one = plural(per_request, "block", spec=",")
    summed = sum(group.blocks_per_request(ctx) for group in plan.groups)
    if summed > per_request:  # the groups peak at different moments: say what the table adds up to
        one += f" at its worst moment (the groups' own worst cases add up to {summed:,})"
    lines = [
        f"policy {plan.policy}" + (f" ({reason})" if reason else ""),
        f"budget {format_bytes(plan.available_memory_bytes)}, max_model_len {ctx.max_model_len:,}, "
        f"max_num_batched_tokens {ctx.max_num_batched_tokens:,}",
        *([note] if note else []),
        "",
        table,
        "",
        *blocks,
        *([f"  null block       {null}"] if plan.null_block is not None else []),
        f"  one request      {one} = "
        f"{format_bytes(capacity.request_bytes)} "
        f"(ideal {format_bytes(capacity.ideal_request_bytes)}) for {ctx.max_model_len:,} tokens",
        f"  max concurrency  {format_figure(capacity.max_concurrency)} requests of {ctx.max_model_len:,} "
        f"tokens (ideal {format_figure(capacity.ideal_concurrency)}, "
        f"efficiency {100 * capacity.efficiency:.2f}%)",
    ]
    return "\n".join(lines)


# -- several ranks -------------------------------------------------------------------------


def _indices(names: Sequence[str]) -> list[int] | None:
    try:
        return [layer_index(name) for name in names]
    except KVCacheBindingError:
        return None


def model_order(names: Sequence[str]) -> list[str]:
    """``names`` by layer index (``model.layers.12.attn`` -> 12) when every name has one."""
    indices = _indices(names)
    if indices is None:
        return list(names)
    return [name for _, name in sorted(zip(indices, names, strict=True))]


def layer_ranges(names: Sequence[str]) -> str:
    """Layer indices as runs, ``'0-7, 12'``; ``'first .. last'`` for names without an index."""
    indices = _indices(names)
    if not names:
        return "-"
    if indices is None:
        return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
    return index_runs(indices)


def index_runs(indices: Sequence[int]) -> str:
    """Indices as runs, ``'0-7, 12'`` (``'-'`` for none)."""
    runs: list[list[int]] = []
    for index in sorted(set(indices)):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"


def ranks_report(plans: Sequence[KVCachePlan], parallelism: Parallelism) -> list[dict[str, Any]]:
    """One JSON object per rank: its place among the ranks, its layers and its figures.

    Keys: ``rank``, ``pp_rank``, ``tp_rank``, ``layers`` (model order), ``layer_ranges``,
    ``available_memory_bytes``, ``bytes_per_block``, ``num_blocks`` (equal on every rank; a
    plan of several pools has ``pools`` instead, each ``{"num_blocks", "bytes_per_block"}``),
    ``kv_cache_bytes``, ``tensors`` (how many), ``holds_fewest_blocks`` (``true`` for the rank
    whose memory holds the fewest blocks: it sets the common block count unless it was forced).
    """
    tightest = tightest_rank(plans)
    return [
        {
            "rank": rank,
            "pp_rank": parallelism.pp_rank(rank),
            "tp_rank": parallelism.tp_rank(rank),
            "layers": model_order(plan.layer_names),
            "layer_ranges": layer_ranges(plan.layer_names),
            "available_memory_bytes": plan.available_memory_bytes,
            **_rank_blocks(plan),
            "kv_cache_bytes": plan.kv_cache_bytes,
            "tensors": len(plan.tensors),
            "holds_fewest_blocks": rank == tightest,
        }
        for rank, plan in enumerate(plans)
    ]


def _rank_blocks(plan: KVCachePlan) -> dict[str, Any]:
    if not plan.names_pools:
        return {"bytes_per_block": plan.bytes_per_block, "num_blocks": plan.num_blocks}
    return {"pools": [{"num_blocks": p.num_blocks, "bytes_per_block": p.bytes_per_block} for p in plan.pools]}


def _own_blocks(plan: KVCachePlan) -> tuple[int, ...]:
    """The block counts (one per pool) the plan's own memory would hold, split as the plan was."""
    return own_pool_blocks(plan)


#: The widest a line of the ranks table's ``layers`` cell gets; a rank whose layers are not one
#: run (a hybrid model's attention layers every few indices) goes on over more lines
#: (``--json`` / ``--csv`` give it in full).
LAYERS_WIDTH = 40


def format_ranks(plans: Sequence[KVCachePlan], parallelism: Parallelism) -> str:
    """A readable per-rank summary: one row per rank (stage, layers, memory, bytes per block,
    blocks, bytes used), then which rank sets the common block count."""
    tightest = tightest_rank(plans)
    rows = [
        [
            rank,
            parallelism.pp_rank(rank),
            parallelism.tp_rank(rank),
            f"{layer_ranges(plan.layer_names)} ({len(plan.layer_names)})",
            format_bytes(plan.available_memory_bytes),
            "/".join(format_bytes(p.bytes_per_block) for p in plan.pools),
            "/".join(f"{p.num_blocks:,}" for p in plan.pools),
            format_bytes(plan.kv_cache_bytes),
        ]
        for rank, plan in enumerate(plans)
    ]
    table = render_table(
        ["rank", "pp stage", "tp rank", "layers", "memory", "bytes/block", "blocks", "KV cache"],
        rows,
        align="rrrlrrrr",
        wrap={3: LAYERS_WIDTH},
    )
    first = plans[tightest]
    fit = _own_blocks(first)
    counts = tuple(p.num_blocks for p in first.pools)
    why = (
        f"{parallelism.describe(tightest)} holds the fewest blocks and sets the count"
        if fit == counts
        else f"the block count was forced; {parallelism.describe(tightest)} has the least room"
    )
    if first.names_pools:
        pools = f"{len(first.pools)} block pools of {'/'.join(f'{c:,}' for c in counts)} blocks on every rank"
        by = (
            "each pool's need per request"
            if first.pool_split is None
            else "pool_split " + "/".join(f"{100 * f:.1f}%" for f in first.pool_split)
        )
        split = (
            f"{format_bytes(first.available_memory_bytes)} split by {by} = "
            f"{'/'.join(f'{c:,}' for c in fit)} blocks"
        )
    else:
        pools = f"one block pool of {first.num_blocks:,} blocks on every rank"
        split = (
            f"{format_bytes(first.available_memory_bytes)} // "
            f"{format_bytes(first.bytes_per_block)} = {fit[0]:,} blocks"
        )
    return "\n".join(
        [
            f"ranks: tp {parallelism.tp_size} x pp {parallelism.pp_size} = {parallelism.world_size}, {pools}",
            "",
            table,
            "",
            f"  {why}: {split}",
        ]
    )
