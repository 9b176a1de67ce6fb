"""``kvcore simulate``: replay a workload through every candidate plan's block pool.

The candidates are those ``kvcore compare`` builds (policies x ``--block-sizes`` x
``--kv-cache-dtypes``); each is replayed with :func:`kvcore.simulation.simulate` as the
``--scheduler`` profile schedules it (default ``vllm``: vLLM 0.33's v1 scheduler; ``kvcore``:
kvcore's own rules on its :class:`BlockPool`). The figures say
how a plan serves *this* traffic, where ``kvcore compare`` says how it holds the worst case.
Under a vLLM profile each candidate is the plan vLLM would run (kvcore's vLLM plugin re-plans
it: :mod:`kvcore.cli.replayed_plans`); one line says which plans are simulated.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcore.cli import gpu, host_tier, inputs, timing
from kvcore.cli.command import Command
from kvcore.cli.compare import (
    add_candidate_options,
    build_candidates,
    candidate_row,
    exit_status,
    no_plan_reason,
    policy_names,
)
from kvcore.cli.figures import add_picture_option, line_panels
from kvcore.cli.memory_map import check_map_path, say_written
from kvcore.cli.options import PlanningArgs
from kvcore.cli.replay import (
    Simulated,
    kind_hits_line,
    overload_lines,
    plan_label,
    rejected_line,
    served_tokens_per_step,
    simulate_candidates,
    simulation_row,
    variant_cells,
    workload_row,
)
from kvcore.cli.replayed_plans import ReplayedPlans
from kvcore.cli.scheduler_options import (
    add_scheduler_options,
    describe_scheduler,
    scheduler_profile,
    scheduler_row,
)
from kvcore.cli.table import add_output_options, render_table, wants_csv, write_csv
from kvcore.planning.compare import Candidate
from kvcore.planning.registry import Registry
from kvcore.units import format_bytes

if TYPE_CHECKING:
    from kvcore.planning.gpu_budget import GpuBudget
    from kvcore.simulation.simulator import SimulationResult
    from kvcore.simulation.workload import Workload

#: The picture, as error messages name it.
PLOT = "the simulation plot"


COMMAND = Command(
    help="replay a workload (trace or synthetic) through every candidate plan's block pool",
    description="""
        Replay a workload through each plan kvcore compare builds (policies x --block-sizes x
        --kv-cache-dtypes) as --scheduler schedules it (default vllm: vLLM 0.33's v1 scheduler, whole-prompt
        admission, chunked prefill of up to --max-num-batched-tokens per step, preemption of the latest
        admitted request; kvcore: kvcore's own rules). Reports running requests, tokens per step, preemptions,
        queueing delay and pool usage per plan.
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    inputs.add_spec_source(parser)
    inputs.add_sizing_options(parser, auto_length="candidates", gpu_name=True)
    add_candidate_options(parser)
    inputs.add_workload_options(parser, required=True)
    timing.add_timing_options(parser)
    add_scheduler_options(parser)
    host_tier.add_host_memory_option(parser, curve=True)
    add_output_options(parser, "one row per plan")
    drawing = (
        "running requests and pool usage over the steps, one line per plan, into FILE "
        "(with a --host-memory list: the tier curve)"
    )
    add_picture_option(parser, "--plot", drawing)


def run(namespace: argparse.Namespace, registry: Registry) -> int:
    args = PlanningArgs.read(namespace)
    if args.plot:
        check_map_path(args.plot, what=PLOT)  # before simulating, which can take a while
    policy_names(args, registry)  # a misspelt policy fails before the model is read
    wants_csv(args)
    args, specs = inputs.load_layer_specs(args, registry)
    args, budget = gpu.settle_budget(args, registry)
    profile = scheduler_profile(args, registry)
    replayed = ReplayedPlans(profile, registry)
    # auto: one length for every candidate (under vLLM, one vLLM's plan admits)
    args = replayed.settle_auto_length(args, specs)
    step_time = timing.step_time_factory(args, registry)
    request = inputs.plan_request(args, specs)
    workload = inputs.load_workload(args, request.context.max_model_len, per_second=step_time is not None)
    host_tier.check_host_memory(args, profile)
    candidates = build_candidates(request, args, registry, replayed.planner())
    if len(args.host_memories) > 1:
        return run_curve(args, workload, candidates, profile, step_time, replayed)
    if args.host_memories:
        candidates = host_tier.with_tier(candidates, args.host_memories[0])
    simulated = simulate_candidates(
        candidates, workload, prefix_caching=args.prefix_caching, step_time=step_time, scheduler=profile
    )
    results = {id(s.candidate): s.result for s in simulated}
    latencies = {id(s.candidate): timing.latency_of(args, workload, s.result) for s in simulated}
    if wants_csv(args):
        write_csv(
            [
                {**candidate_row(c), **(simulation_row(results[id(c)]) if id(c) in results else {})}
                for c in candidates
            ]
        )
    elif args.json:
        payload = {
            **report_head(args, profile, workload, budget),
            "replayed_plans": replayed.to_dict(candidates),
            "candidates": [
                {
                    **candidate_row(c),
                    **replayed.candidate_row(c),
                    "simulation": (
                        timing.with_latency(simulation_row(results[id(c)], series=True), latencies[id(c)])
                        if id(c) in results
                        else None
                    ),
                }
                for c in candidates
            ],
        }
        print(json.dumps(payload, indent=2))
    else:
        gpu.print_budget(budget)
        print_table(args, workload, candidates, results, profile, replayed)
        for line in host_tier.tier_lines(simulated):
            print(line)
        timing.print_latency_table(
            [
                (variant_cells(s.candidate), report)
                for s in simulated
                if (report := latencies[id(s.candidate)])
            ]
        )
    if args.plot and simulated:
        title = f"{workload.name}: {len(workload.requests):,} requests"
        say_written(render_simulation_plot(simulated, args.plot, title=title), PLOT)
    return exit_status(candidates)


def report_head(
    args: PlanningArgs, profile: Any, workload: Workload, budget: GpuBudget | None = None
) -> dict[str, Any]:
    """What a ``kvcore simulate --json`` object opens with, before its plans' figures: the budget,
    the lengths, the scheduler, the GPU budget where ``--gpu-memory`` gave one, and the workload."""
    return {
        "available_memory_bytes": args.kv_budget,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "scheduler": scheduler_row(profile),
        **({"gpu_budget": budget.to_dict()} if budget is not None else {}),
        "workload": workload_row(workload),
    }


def run_curve(
    args: PlanningArgs,
    workload: Workload,
    candidates: Sequence[Candidate],
    profile: Any,
    step_time: Any,
    replayed: ReplayedPlans,
) -> int:
    """The tier curve: every plan simulated once per ``--host-memory`` size, one table (or one
    JSON object)."""
    points: list[tuple[int, host_tier.CurvePoint]] = []  # (the plan's place, the point)
    for nbytes in args.host_memories:
        simulated = simulate_candidates(
            host_tier.with_tier(candidates, nbytes),
            workload,
            prefix_caching=args.prefix_caching,
            step_time=step_time,
            scheduler=profile,
        )
        points += [
            (place, host_tier.CurvePoint(nbytes, s, timing.latency_of(args, workload, s.result)))
            for place, s in enumerate(simulated)  # in the candidates' order, the same at every size
        ]
    curve = [point for _, point in sorted(points, key=lambda p: (p[0], p[1].nbytes))]
    if wants_csv(args):  # one row per point: its size, the plan's figures, the simulation's
        write_csv(
            [
                {
                    "host_memory_bytes": p.nbytes,
                    **candidate_row(p.simulated.candidate),
                    **host_tier.curve_row(p)["simulation"],
                }
                for p in curve
            ]
        )
    elif args.json:
        payload = {
            **report_head(args, profile, workload),
            "replayed_plans": replayed.to_dict(candidates),
            "tier_curve": [host_tier.curve_row(p) for p in curve],
        }
        print(json.dumps(payload, indent=2))
    else:
        figures = workload_row(workload)
        print(
            f"workload {workload.name}: {figures['num_requests']:,} requests; scheduler "
            f"{describe_scheduler(profile)}; budget {format_bytes(args.kv_budget)}; tier curve over "
            f"{len(args.host_memories)} host-memory sizes"
        )
        print(replayed.line(candidates))
        host_tier.print_curve(curve)
    if args.plot and curve:
        title = f"{workload.name}: {len(workload.requests):,} requests"
        say_written(host_tier.render_curve_plot(curve, args.plot, title=title), host_tier.CURVE_PLOT)
    return exit_status(candidates)


def print_table(
    args: PlanningArgs,
    workload: Workload,
    candidates: Sequence[Candidate],
    results: dict[int, SimulationResult],
    profile: Any = None,
    replayed: ReplayedPlans | None = None,
) -> None:
    """The header lines (with ``replayed``: which plans are simulated), one row per plan, and
    why the others have none."""
    _print_header(args, workload, candidates, profile, replayed)
    rows = []
    failures: dict[str, str] = {}
    for c in candidates:
        result = results.get(id(c))
        if result is None:
            failures.setdefault(c.policy, no_plan_reason(c) or "no plan")
            continue
        rows.append(
            [
                *variant_cells(c),
                f"{result.mean_running:,.1f}",
                f"{result.peak_running:,}",
                f"{served_tokens_per_step(result):,.1f}",
                f"{result.preemptions:,}",
                f"{result.mean_queue_delay:,.1f}",
                f"{result.p99_queue_delay:,.1f}",
                f"{100 * result.mean_pool_usage:.1f}%",
                f"{100 * result.peak_pool_usage:.1f}%",
                f"{result.steps:,}",
                *([f"{100 * result.prefix_hit_rate:.1f}%"] if args.prefix_caching else []),
            ]
        )
    headers = [
        "policy",
        "block",
        "kv dtype",
        "running",
        "peak",
        "tokens/step",
        "preemptions",
        "queue delay",
        "p99",
        "pool",
        "peak",
        "steps",
        *(["prefix hits"] if args.prefix_caching else []),
    ]
    print(render_table(headers, rows, align="lll" + "r" * (len(headers) - 3)))
    for policy, error in failures.items():
        print(f"  {policy}: no plan: {error}")
    for line in overload_lines([(plan_label(c), results[id(c)]) for c in candidates if id(c) in results]):
        print(line)
    hit_lines = [
        f"  {plan_label(c)}: {line}"
        for c in candidates
        if id(c) in results and (line := kind_hits_line(results[id(c)]))
    ]
    if hit_lines:
        print("prefix hits by group kind (lookups whose hit used the kind's cached pages, and the pages):")
        print("\n".join(hit_lines))


def _print_header(
    args: PlanningArgs,
    workload: Workload,
    candidates: Sequence[Candidate],
    profile: Any,
    replayed: ReplayedPlans | None,
) -> None:
    """The lines above the table: the workload, the plans replayed, the budget and the columns."""
    figures = workload_row(workload)
    print(
        f"workload {workload.name}"
        + (f"; scheduler {describe_scheduler(profile)}" if profile is not None else "")
    )
    print(
        f"{figures['num_requests']:,} requests, prompts "
        f"{figures['mean_prompt_tokens']:,.0f} tokens on average (longest {figures['max_prompt_tokens']:,}), "
        f"outputs {figures['mean_output_tokens']:,.0f} (longest {figures['max_output_tokens']:,})"
    )
    assert isinstance(args.max_model_len, int)  # simulate takes a number (sizing_context)
    if rejected := rejected_line(workload, args.max_model_len):
        print(rejected)
    if replayed is not None:
        print(replayed.line(candidates))
    print(
        f"budget {format_bytes(args.kv_budget)}, max_model_len {args.max_model_len:,}, "
        f"max_num_batched_tokens {args.max_num_batched_tokens:,}; "
        "tokens/step = the workload's tokens served per step (recomputation not counted), "
        "delays in steps, pool = share of the blocks in use"
        + (
            "; prefix caching on: prefix hits = prompt tokens found cached (served, not computed)"
            if args.prefix_caching
            else ""
        )
    )


def render_simulation_plot(
    simulated: Sequence[Simulated], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Draw running requests (top) and pool usage (bottom) over the steps, one line per plan.

    Args:
        simulated: the plans and their results.
        path: a ``.png`` or ``.svg`` file in an existing folder.
        title: the figure's title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        InvalidInputError: as :func:`~kvcore.cli.memory_map.check_map_path`, or the file
            cannot be written.
    """
    out = check_map_path(path, what=PLOT)
    with line_panels(out, what=PLOT, title=title, size=(9, 5.5)) as (top, bottom):
        for s in simulated:
            label = plan_label(s.candidate)
            steps = range(1, len(s.result.running) + 1)
            top.plot(steps, s.result.running, label=label, linewidth=1)
            bottom.plot(steps, [100 * u for u in s.result.pool_usage], label=label, linewidth=1)
        top.set_ylabel("running requests", fontsize=8)
        bottom.set_ylabel("pool in use (%)", fontsize=8)
        bottom.set_ylim(0, 105)
        bottom.set_xlabel("step", fontsize=8)
    return out
