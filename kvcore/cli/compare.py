"""``kvcore compare``: every policy side by side, optionally across block sizes and KV dtypes."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvcore.cli import gpu, inputs, replay
from kvcore.cli.inputs import FLAG_NAMES
from kvcore.cli.replay import variant_cells
from kvcore.cli.report import plan_report
from kvcore.cli.scheduler_options import add_scheduler_options, scheduler_profile
from kvcore.cli.table import render_table
from kvcore.dtypes import dtype_name, to_dtype
from kvcore.error_messages import render
from kvcore.errors import InvalidSpecError
from kvcore.planning.compare import Candidate, compare_policies, variant_specs
from kvcore.planning.frontier import FrontierPoint, policy_frontier
from kvcore.planning.registry import Registry
from kvcore.spec import STATE_CACHE_MODES, KVCacheSpec
from kvcore.units import format_bytes

if TYPE_CHECKING:  # the simulation layer loads only when a workload is given
    from kvcore.simulation.simulator import SimulationResult
    from kvcore.simulation.workload import Workload


def _int_list(text: str) -> list[int]:
    try:
        values = [inputs.positive_int(part) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers >= 1, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def _dtype_list(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    for value in values:
        if value != "auto":
            try:
                to_dtype(value)
            except InvalidSpecError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one dtype")
    return values


def _mode_list(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    bad = [v for v in values if v not in STATE_CACHE_MODES]
    if bad or not values:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated state cache modes from {', '.join(STATE_CACHE_MODES)}, got {text!r}"
        )
    return values


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare every policy (and block sizes, KV dtypes) on one model and budget",
        description=(
            "Plan the same layers with every policy that can, side by side: concurrency, "
            "efficiency against the ideal bound, groups, padding, tokens per group. Each row is "
            "exactly what `kvcore plan --policy NAME` reports. With a workload (--workload FILE.jsonl, "
            "or --requests N ...), each plan is also simulated as `kvcore simulate` does and the rows "
            "are ranked by tokens served per step."
        ),
    )
    inputs.add_spec_source(parser)
    inputs.add_sizing_options(parser)
    add_candidate_options(parser)
    parser.add_argument(
        "--state-cache-modes",
        type=_mode_list,
        metavar="A,B",
        help=(
            "also compare these state cache modes (none, align, all): what keeping SSM / linear-attention "
            "states for prefix caching costs; adds a 'state cache' column"
        ),
    )
    inputs.add_workload_options(parser, trace_flag="--workload", required=False)
    add_scheduler_options(parser)
    parser.add_argument(
        "--engine",
        choices=("kvcore", "vllm"),
        default="kvcore",
        help="whose rules the plans run under: kvcore's own pool (default), or vLLM 0.33's (null block, "
        "async scheduling's tokens in flight, one block id per page), beside vLLM's own plan",
    )
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="also show each policy's trade of capacity against groups (block tables): its best layout "
        "at each smaller group count, planned with --max-groups k and --grouping-tolerance 0",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def add_candidate_options(parser: argparse.ArgumentParser) -> None:
    """Which plans to build: ``--policies``, ``--block-sizes``, ``--kv-cache-dtypes`` (shared
    with ``kvcore simulate``)."""
    from kvcore.cli.help_text import policies_help

    parser.add_argument("--policies", metavar="A,B", help=policies_help())
    parser.add_argument(
        "--block-sizes", type=_int_list, metavar="N,M", help="also compare these block sizes, e.g. 16,32,64"
    )
    parser.add_argument(
        "--kv-cache-dtypes",
        type=_dtype_list,
        metavar="D,E",
        help="also compare these cache dtypes, e.g. auto,fp8 (auto = as the specs say)",
    )


def build_candidates(
    args: argparse.Namespace, registry: Registry, specs: Mapping[str, KVCacheSpec]
) -> list[Candidate]:
    """Every candidate plan the options ask for (:func:`compare_policies`): policies x
    ``--block-sizes`` x ``--kv-cache-dtypes``."""
    dtypes = [None if d == "auto" else to_dtype(d) for d in (args.kv_cache_dtypes or ["auto"])]
    policies = [p.strip() for p in args.policies.split(",")] if args.policies else None
    return compare_policies(
        specs,
        args.memory,
        inputs.sizing_context(args),
        registry=registry,
        policies=policies,
        block_sizes=args.block_sizes or [None],
        kv_cache_dtypes=dtypes,
        options=inputs.plan_options(args),
        state_cache_modes=getattr(args, "state_cache_modes", None) or [None],
    )


def candidate_row(candidate: Candidate) -> dict[str, Any]:
    """One comparison row as JSON (the plan's figures come from :func:`plan_report`)."""
    plan, capacity = candidate.plan, candidate.capacity
    return {
        "policy": candidate.policy,
        "block_size": candidate.block_size,
        "kv_cache_dtype": dtype_name(candidate.kv_cache_dtype) if candidate.kv_cache_dtype else None,
        **({"state_cache_mode": candidate.state_cache_mode} if candidate.state_cache_mode else {}),
        "ideal_concurrency": candidate.ideal_concurrency,
        "max_concurrency": capacity.max_concurrency if capacity else None,
        "efficiency": capacity.efficiency if capacity else None,
        "groups": len(plan.groups) if plan else None,
        "pools": len(plan.pools) if plan else None,
        "padding_bytes_per_request": capacity.padding_bytes if capacity else None,
        "tokens_per_group": list(capacity.tokens_held) if capacity else None,
        "error": no_plan_reason(candidate),
    }


def run(args: argparse.Namespace, registry: Registry) -> int:
    specs = inputs.load_layer_specs(args, registry)
    budget = gpu.settle_budget(args, registry)
    if args.engine == "vllm":
        from kvcore.cli import vllm_compare

        return vllm_compare.run(args, registry, specs)
    simulated: dict[int, SimulationResult] = {}
    workload: Workload | None = None
    if inputs.wants_workload(args):
        # the workload is read (and checked) before any plan is made
        workload = inputs.load_workload(args, inputs.sizing_context(args).max_model_len)
        candidates = build_candidates(args, registry, specs)
        simulated = {
            id(s.candidate): s.result
            for s in replay.simulate_candidates(
                candidates,
                workload,
                prefix_caching=args.prefix_caching,
                scheduler=scheduler_profile(args, registry),
            )
        }
        # the best plan for this traffic first; those without a plan keep their place at the end

        def rank(c: Candidate) -> float:
            result = simulated.get(id(c))
            return -replay.served_tokens_per_step(result) if result is not None else math.inf

        candidates = sorted(candidates, key=rank)
    else:
        candidates = build_candidates(args, registry, specs)
    frontiers = (
        candidate_frontiers(args, registry, specs, candidates) if getattr(args, "frontier", False) else {}
    )
    if args.json:
        payload: dict[str, Any] = {
            "available_memory_bytes": args.memory,
            "max_model_len": args.max_model_len,
        }
        if budget is not None:
            payload["gpu_budget"] = budget.to_dict()
        if workload is not None:
            payload["workload"] = replay.workload_row(workload)
        payload["candidates"] = [
            {
                **candidate_row(c),
                **(
                    {"simulation": replay.simulation_row(simulated[id(c)]) if id(c) in simulated else None}
                    if workload is not None
                    else {}
                ),
                **({"frontier": [p.to_dict() for p in frontiers[id(c)]]} if frontiers else {}),
                "plan": plan_report(c.plan, specs, registry, capacity=c.capacity) if c.plan else None,
            }
            for c in candidates
        ]
        print(json.dumps(payload, indent=2))
        return exit_status(candidates)
    modes = bool(getattr(args, "state_cache_modes", None))
    # a pools column only where some plan has several block pools
    pools = any(c.plan is not None and c.plan.is_multi_pool for c in candidates)
    rows = []
    failures: dict[str, str] = {}  # first reason per policy; variants usually fail alike
    for c in candidates:
        plan, capacity = c.plan, c.capacity
        if plan is None or capacity is None:
            failures.setdefault(c.policy, no_plan_reason(c) or "no plan")
            continue
        row = [
            *variant_cells(c),
            *([c.state_cache_mode] if modes else []),
            len(plan.groups),
            *([len(plan.pools)] if pools else []),
            f"{capacity.max_concurrency:,.2f}",
            f"{capacity.ideal_concurrency:,.2f}",
            f"{100 * capacity.efficiency:.2f}%",
            format_bytes(capacity.padding_bytes),
            f"{capacity.kv_cache_tokens:,}",
        ]
        if workload is not None:
            result = simulated[id(c)]
            row += [
                f"{replay.served_tokens_per_step(result):,.1f}",
                f"{result.mean_running:,.1f}",
                f"{result.preemptions:,}",
            ]
        rows.append(row)
    gpu.print_budget(budget)
    print(
        f"budget {format_bytes(args.memory)}, max_model_len {args.max_model_len:,}; "
        "concurrency = requests of max_model_len held at once"
    )
    headers = [
        "policy",
        "block",
        "kv dtype",
        *(["state cache"] if modes else []),
        "groups",
        *(["pools"] if pools else []),
        "concurrency",
        "ideal",
        "efficiency",
        "padding/request",
        "KV tokens",
    ]
    if workload is not None:
        print(
            f"simulated on workload {workload.name} by the {args.scheduler} scheduler, "
            f"max_num_batched_tokens {args.max_num_batched_tokens:,}; ranked by tokens per step "
            "(the workload's tokens served per step, recomputation not counted)"
        )
        headers += ["tokens/step", "mean running", "preemptions"]
    lead = 4 if modes else 3
    print(render_table(headers, rows, align="l" * lead + "r" * (len(headers) - lead)))
    for policy, error in failures.items():
        print(f"  {policy}: no plan: {error}")
    if frontiers:
        print()
        print(format_frontiers(candidates, frontiers))
    return exit_status(candidates)


def candidate_frontiers(
    args: argparse.Namespace,
    registry: Registry,
    specs: Mapping[str, KVCacheSpec],
    candidates: Sequence[Candidate],
) -> dict[int, tuple[FrontierPoint, ...]]:
    """``{id(candidate): its policy's frontier}`` (:func:`~kvcore.planning.frontier.policy_frontier`)
    for every candidate that has a plan, on the candidate's own variant of the specs."""
    out: dict[int, tuple[FrontierPoint, ...]] = {}
    options = inputs.plan_options(args)
    for c in candidates:
        if c.plan is None:
            out[id(c)] = ()
            continue
        variant = variant_specs(specs, block_size=c.block_size, kv_cache_dtype=c.kv_cache_dtype)
        out[id(c)] = policy_frontier(
            variant, args.memory, c.plan.context, registry=registry, policy=c.policy, options=options
        )
    return out


def format_frontiers(
    candidates: Sequence[Candidate], frontiers: Mapping[int, Sequence[FrontierPoint]]
) -> str:
    """One line per candidate with a plan: ``groups: concurrency (efficiency)`` for each point
    of its frontier, most groups first."""
    variants = len({(c.block_size, c.kv_cache_dtype, c.state_cache_mode) for c in candidates}) > 1
    rows = []
    for c in candidates:
        points = frontiers.get(id(c), ())
        if c.plan is None or not points:
            continue
        label = " ".join(str(cell) for cell in variant_cells(c)) if variants else c.policy
        if c.state_cache_mode and variants:
            label += f" {c.state_cache_mode}"
        cells = "  ".join(f"{p.groups}: {p.max_concurrency:,.2f} ({100 * p.efficiency:.2f}%)" for p in points)
        rows.append([label, cells])
    table = render_table(
        ["policy", "groups: concurrency (efficiency), best layout at each group count"], rows, align="ll"
    )
    return (
        "frontier: fewer groups (block tables per request) for less capacity; each point is the policy's "
        "best layout with at most that many groups (--max-groups N --grouping-tolerance 0)\n" + table
    )


def exit_status(candidates: Sequence[Candidate]) -> int:
    """0 when some candidate planned; else 1, with a one-line error (the reasons are above)."""
    if any(c.plan is not None for c in candidates):
        return 0
    print(
        "kvcore: error: no policy could plan these specs with these options; the reasons are listed above",
        file=sys.stderr,
    )
    return 1


def no_plan_reason(candidate: Candidate) -> str | None:
    """Why a candidate has no plan, naming this command's flags rather than Python parameters."""
    if candidate.failure is None:
        return candidate.error
    return render(candidate.failure, FLAG_NAMES)
