"""``kvcore plan``: plan a KV cache for a memory budget and show what fits."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from kvcore.cli import gpu, inputs
from kvcore.cli.command import Command
from kvcore.cli.figures import add_picture_option
from kvcore.cli.host_tier import add_host_memory_option
from kvcore.cli.memory_map import check_map_path, render_memory_map, say_written
from kvcore.cli.options import PlanningArgs
from kvcore.cli.report import (
    chosen_length,
    chosen_length_line,
    format_plan,
    format_ranks,
    group_records,
    plan_report,
    policy_reason,
    ranks_report,
)
from kvcore.cli.table import add_output_options, wants_csv, write_csv
from kvcore.plan import KVCachePlan
from kvcore.planning import planner
from kvcore.planning.gpu_budget import GpuBudget
from kvcore.planning.offload import with_host_memory
from kvcore.planning.planner import PlanningResult
from kvcore.planning.ranks import Parallelism, simulate_rank_specs, tightest_rank
from kvcore.planning.registry import Registry
from kvcore.spec import KVCacheSpec
from kvcore.units import format_bytes

COMMAND = Command(
    help="plan a KV cache for a memory budget and show capacity",
    description="""
        Plan the KV cache for a set of layer specs and a byte budget: groups, block count, tensors, and how
        many requests of max-model-len tokens fit. No GPU needed.
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    inputs.add_spec_source(parser)
    inputs.add_pipeline_option(parser)
    inputs.add_planning_options(parser, gpu_name=True)
    parser.add_argument(
        "--gpu",
        metavar="NAME",
        help="with --model: the GPU the engine runs on (H100, H200, B200, A100-80GB, ...: "
        "kvcore/data/gpus.json); its memory is --gpu-memory when no budget is given, and bounds "
        "--memory or --gpu-memory when one is",
    )
    add_output_options(
        parser,
        "the groups table (the ranks table with --tp/--pp)",
        json_help="print the plan and its figures as one JSON object",
    )
    add_host_memory_option(parser, curve=False)
    add_picture_option(parser, "--map", "the plan's memory map into FILE")


def run(namespace: argparse.Namespace, registry: Registry) -> int:
    args = PlanningArgs.read(namespace)
    wants_csv(args)  # --json with --csv is refused before planning
    if args.map:
        check_map_path(args.map)  # before planning, which can take a while
    args, specs = inputs.load_layer_specs(args, registry)
    args, budget = gpu.settle_budget(args, registry)
    if not specs:
        return run_nothing_to_cache(args, registry)
    parallelism = inputs.parallelism(args)
    if parallelism.world_size > 1:
        return run_ranks(args, registry, specs, parallelism, budget)
    result = planner.plan(inputs.plan_request(args, specs), registry=registry)
    (plan,) = result.plans
    plan = with_host_memory(plan, args.host_memory)
    chosen = auto_length(result, inputs.length_cap_name(args))
    if args.map:
        say_written(render_memory_map(plan, args.map), "the memory map")
    if wants_csv(args):
        write_csv(group_records(plan, specs))
    elif args.json:
        print_json_report(plan_report(plan, specs, registry), args, plan, chosen, budget)
    else:
        if budget is not None:
            gpu.print_budget(budget)
            print(gpu.answer_line(plan, budget))
            print()
        note = chosen_length_line(chosen) if chosen is not None else ""
        print(format_plan(plan, specs, reason=policy_reason(result.choice), note=note))
        for line in host_tier_lines(plan):
            print(line)
    return 0


def host_tier_lines(plan: KVCachePlan) -> list[str]:
    """The host tier under the plan's figures: its bytes and the block ids each pool keeps there
    (nothing without a tier)."""
    tier = plan.offload_tier
    if tier is None:
        return []
    pools = [
        f"{plan.host_blocks_in(p):,} x {format_bytes(pool.bytes_per_block)}"
        for p, pool in enumerate(plan.pools)
    ]
    device = plan.usable_blocks
    held = sum(plan.host_blocks_in(p) for p in range(len(plan.pools)))
    return [
        f"  host tier        {' + '.join(pools)} blocks = {format_bytes(tier.nbytes)} of host memory "
        f"({held / device:.2f}x the device's {device:,} usable blocks)"
    ]


def host_tier_report(plan: KVCachePlan) -> dict[str, Any]:
    """``{"host_tier": {...}}`` for a JSON report: the tier's bytes and block ids per pool; ``{}``
    without a tier (the plan's own ``offload_tier`` is in the report already)."""
    tier = plan.offload_tier
    if tier is None:
        return {}
    return {
        "host_tier": {
            "bytes": tier.nbytes,
            "blocks_by_pool": [plan.host_blocks_in(p) for p in range(len(plan.pools))],
        }
    }


def auto_length(result: PlanningResult, cap_name: str) -> dict[str, Any] | None:
    """How ``--max-model-len auto`` chose the length (:func:`~kvcore.cli.report.chosen_length`);
    ``None`` for a length given as a number. ``cap_name`` says what the cap is."""
    if result.length is None:
        return None
    return chosen_length(result.length.max_model_len, result.length.cap, cap_name)


def print_json_report(
    report: dict[str, Any],
    args: PlanningArgs,
    plan: KVCachePlan,
    chosen: dict[str, Any] | None,
    budget: GpuBudget | None,
) -> None:
    """Print ``report`` (a plan's) as ``--json`` does, with what every plan's JSON adds: the
    length ``--max-model-len auto`` chose, the options, the GPU budget and the host tier."""
    if chosen is not None:
        report["max_model_len_auto"] = chosen
    report.update(inputs.options_report(args))
    if budget is not None:
        report["gpu_budget"] = budget.to_dict()
    report.update(host_tier_report(plan))
    print(json.dumps(report, indent=2))


def run_ranks(
    args: PlanningArgs,
    registry: Registry,
    specs: Mapping[str, KVCacheSpec],
    parallelism: Parallelism,
    budget: GpuBudget | None = None,
) -> int:
    """``--tp`` x ``--pp`` > 1: plan every simulated rank, show the ranks, then the plan of the
    rank with the fewest blocks (its groups are every rank's; its layers its own).

    The simulated ranks report ``specs`` split into stages, so the whole model they make up is
    ``specs`` itself: it is planned as :func:`~kvcore.plan_for_ranks` plans merged ranks.
    """
    rank_specs = simulate_rank_specs(specs, parallelism)
    request = inputs.plan_request(
        args,
        specs,
        rank_layers=rank_specs,
        rank_names=[parallelism.describe(rank) for rank in range(parallelism.world_size)],
    )
    result = planner.plan(request, registry=registry)
    plans = [with_host_memory(plan, args.host_memory) for plan in result.plans]
    chosen = auto_length(result, inputs.length_cap_name(args))
    rank = tightest_rank(plans)
    plan, own = plans[rank], rank_specs[rank]
    if args.map:
        say_written(render_memory_map(plan, args.map), "the memory map")
    if wants_csv(args):
        write_csv(ranks_report(plans, parallelism))
        return 0
    if args.json:
        report = plan_report(plan, own, registry)
        report.update(
            tp=parallelism.tp_size, pp=parallelism.pp_size, rank=rank, ranks=ranks_report(plans, parallelism)
        )
        print_json_report(report, args, plan, chosen, budget)
        return 0
    if budget is not None:
        gpu.print_budget(budget)
        print(gpu.answer_line(plan, budget))
        print()
    print(format_ranks(plans, parallelism))
    print()
    print(f"plan of {parallelism.describe(rank)}: every rank has these groups; 'layers' counts this rank's")
    note = chosen_length_line(chosen) if chosen is not None else ""
    print(format_plan(plan, own, reason=policy_reason(result.choice), note=note))
    for line in host_tier_lines(plan):
        print(line)
    return 0


def run_nothing_to_cache(args: PlanningArgs, registry: Registry) -> int:
    """A model with no cache-holding layer (attention-free, encoder-only): say so, and with
    ``--json`` print its plan (no groups, no tensors, no blocks) and its figures, the
    unbounded ones ``null``."""
    result = planner.plan(inputs.plan_request(args, {}), registry=registry)
    (plan,) = result.plans
    if wants_csv(args):
        write_csv(group_records(plan, {}))
    elif args.json:
        print(json.dumps(plan_report(plan, {}, registry), indent=2))
    else:
        print(
            "nothing to cache: the model has no layer that holds a KV cache (attention-free or "
            "encoder-only), so it needs no blocks and no memory; max concurrency unbounded"
        )
    return 0
