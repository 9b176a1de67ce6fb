"""``kvcore compare``: every policy side by side, optionally across block sizes and KV dtypes."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.cli import gpu, inputs, replay, timing
from kvcore.cli.command import Command
from kvcore.cli.inputs import FLAG_NAMES
from kvcore.cli.options import PlanningArgs
from kvcore.cli.policy_defaults import default_policies
from kvcore.cli.replay import variant_cells
from kvcore.cli.replayed_plans import replays_vllm_plan
from kvcore.cli.report import plan_report
from kvcore.cli.scheduler_options import add_scheduler_options, scheduler_profile
from kvcore.cli.table import add_output_options, collapse_alike, render_table, wants_csv, write_csv
from kvcore.dtypes import dtype_name, to_dtype
from kvcore.error_messages import render
from kvcore.errors import InvalidInputError, KVCoreError
from kvcore.planning.capacity import finite_or_none, format_figure
from kvcore.planning.compare import Candidate, compare_policies, variant_specs
from kvcore.planning.frontier import FrontierPoint, policy_frontier
from kvcore.planning.gpu_budget import GpuBudget
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest
from kvcore.runtime.one_pool import hit_step_of
from kvcore.spec import KVCacheSpec
from kvcore.units import format_bytes

if TYPE_CHECKING:  # the simulation layer loads only when a workload is given
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.simulator import SimulationResult
    from kvcore.simulation.timing import LatencyReport
    from kvcore.simulation.workload import Workload


#: Said under a vLLM profile's simulation: which plans it ran, and where vLLM's are replayed.
OWN_PLANS_NOTE = (
    "plans: kvcore's own, as the table lists them; vLLM would run plan_for_vllm's (null block, tokens in "
    "flight, its block sizes): `kvcore simulate` replays those"
)

COMMAND = Command(
    help="compare every policy (and block sizes, KV dtypes) on one model and budget",
    description="""
        Plan the same layers with every policy that can, side by side: concurrency, efficiency against the
        ideal bound, groups, padding, tokens per group. Each row is exactly what `kvcore plan --policy NAME`
        reports. With a workload (--trace FILE.jsonl, or --requests N ...), each plan is also simulated as
        `kvcore simulate` does and the rows are ranked by tokens served per step.
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    inputs.add_spec_source(parser)
    inputs.add_sizing_options(parser, auto_length="candidates", gpu_name=True)
    add_candidate_options(parser)
    parser.add_argument(
        "--state-cache-modes",
        type=inputs.state_cache_modes,
        metavar="A,B",
        help=(
            "also compare these state cache modes (none, align, all): what keeping SSM / linear-attention "
            "states for prefix caching costs; adds a 'state cache' column"
        ),
    )
    inputs.add_workload_options(parser, required=False, old_flag="--workload")
    timing.add_timing_options(parser)
    add_scheduler_options(parser)
    parser.add_argument(
        "--engine",
        choices=("kvcore", "vllm", "vllm-cpu", "sglang"),
        default="kvcore",
        help="whose rules the plans run under: kvcore's own pool (default), vLLM's (null block, "
        "async scheduling's tokens in flight, one block id per page; vllm-cpu: vLLM's CPU build, block "
        "128 unless one --block-sizes value asks another, no async scheduling), beside vLLM's own plan, "
        "or SGLang "
        "0.5's (one token pool per kind, one page size, padded first page; one --block-sizes value is its "
        "--page-size), beside SGLang's own sizing; the star marks the best candidate that engine runs",
    )
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="also show each policy's trade of capacity against groups (block tables): its best layout "
        "at each smaller group count, planned with --max-groups k and --grouping-tolerance 0",
    )
    add_output_options(parser, "one row per candidate")


def add_candidate_options(
    parser: argparse._ActionsContainer,
    *,
    policies: str | None = None,
    block_sizes: str = "also compare these block sizes, e.g. 16,32,64",
    kv_cache_dtypes: str = "also compare these cache dtypes, e.g. auto,fp8 (auto = as the specs say)",
) -> None:
    """Which plans to build, each a comma-separated list: ``--policies``, ``--block-sizes``,
    ``--kv-cache-dtypes`` (shared with ``kvcore simulate``, and ``kvcore tune``'s search space).

    Args:
        parser: where the options go (a parser, or a group of one).
        policies: ``--policies``' help (default: the registered policies named, when shown).
        block_sizes: ``--block-sizes``' help.
        kv_cache_dtypes: ``--kv-cache-dtypes``' help.
    """
    from kvcore.cli.help_text import policies_help

    parser.add_argument("--policies", type=inputs.names, metavar="A,B", help=policies or policies_help())
    parser.add_argument("--block-sizes", type=inputs.positive_ints, metavar="N,M", help=block_sizes)
    parser.add_argument("--kv-cache-dtypes", type=inputs.dtype_names, metavar="D,E", help=kv_cache_dtypes)


def build_candidates(
    request: PlanRequest,
    args: PlanningArgs,
    registry: Registry,
    planner: Callable[[PlanRequest], KVCachePlan] | None = None,
) -> list[Candidate]:
    """Every candidate plan the options ask for (:func:`compare_policies`): ``request`` (the
    command's, :func:`~kvcore.cli.inputs.plan_request`) under each policy x ``--block-sizes`` x
    ``--kv-cache-dtypes``, each made by ``planner`` (default: kvcore's own planner)."""
    dtypes = [None if d == "auto" else to_dtype(d) for d in (args.kv_cache_dtypes or ["auto"])]
    policies = policy_names(args, registry)
    return compare_policies(
        request,
        policies,
        registry=registry,
        block_sizes=args.block_sizes or [None],
        kv_cache_dtypes=dtypes,
        state_cache_modes=args.state_cache_modes or [None],
        planner=planner,
    )


def policy_names(args: PlanningArgs, registry: Registry) -> list[str]:
    """The policies of ``--policies``, each checked; without it every registered one but the
    baselines installed packages register (:func:`~kvcore.cli.policy_defaults.default_policies`).

    Raises:
        UnknownPolicyError: a name no plugin registers, with the closest names; the command
            exits 1 before planning, as ``plan --policy`` does.
    """
    if not args.policies:
        return default_policies(registry)
    for name in args.policies:
        if name != "auto":
            registry.policy(name)  # raises, naming the closest registered policies
    return args.policies


def candidate_row(candidate: Candidate) -> dict[str, Any]:
    """One comparison row as JSON (the plan's figures come from :func:`plan_report`)."""
    plan, capacity = candidate.plan, candidate.capacity
    return {
        "policy": candidate.policy,
        "block_size": candidate.block_size,
        "kv_cache_dtype": dtype_name(candidate.kv_cache_dtype) if candidate.kv_cache_dtype else None,
        **({"state_cache_mode": candidate.state_cache_mode} if candidate.state_cache_mode else {}),
        "ideal_concurrency": finite_or_none(candidate.ideal_concurrency),
        "max_concurrency": finite_or_none(capacity.max_concurrency) if capacity else None,
        "efficiency": capacity.efficiency if capacity else None,
        "groups": len(plan.groups) if plan else None,
        "pools": len(plan.pools) if plan else None,
        "padding_bytes_per_request": capacity.padding_bytes if capacity else None,
        "tokens_per_group": list(capacity.tokens_held) if capacity else None,
        "error": no_plan_reason(candidate),
    }


@attrs.frozen
class Comparison:
    """What ``kvcore compare`` found, ready for any of its outputs (table, JSON, CSV).

    Results are keyed by ``id(candidate)``: candidates are attrs value classes that may compare
    equal across variants, and each needs its own row.
    """

    candidates: list[Candidate]
    simulated: dict[int, SimulationResult]
    latencies: dict[int, LatencyReport | None]
    workload: Workload | None
    frontiers: dict[int, tuple[FrontierPoint, ...]]
    best: Best | None
    vllm_best: Best | None
    auto: str | None
    #: the workload was simulated by a vLLM scheduler profile on kvcore's plans, where vLLM would
    #: run ``plan_for_vllm``'s (``kvcore simulate`` replays those)
    vllm_on_own_plans: bool = False

    def is_best(self, candidate: Candidate) -> bool:
        return self.best is not None and self.best.candidate is candidate

    def is_vllm_best(self, candidate: Candidate) -> bool:
        return self.vllm_best is not None and self.vllm_best.candidate is candidate


def run(namespace: argparse.Namespace, registry: Registry) -> int:
    args = PlanningArgs.read(namespace)
    policy_names(args, registry)  # a misspelt policy fails before the model is read
    wants_csv(args)
    args, specs = inputs.load_layer_specs(args, registry)
    args, budget = gpu.settle_budget(args, registry)
    args = inputs.settle_auto_length(args, registry, specs)  # auto: one length for every candidate
    if args.engine in ("vllm", "vllm-cpu"):
        from kvcore.cli import vllm_compare

        return vllm_compare.run(args, registry, specs)
    if args.engine == "sglang":
        from kvcore.cli import sglang_compare

        return sglang_compare.run(args, registry, specs, budget)
    comparison = compare(args, registry, inputs.plan_request(args, specs))
    if wants_csv(args):
        write_csv([csv_row(comparison, c) for c in comparison.candidates])
    elif args.json:
        print(json.dumps(json_payload(args, registry, specs, budget, comparison), indent=2))
    else:
        print_comparison(args, budget, comparison)
    return exit_status(comparison.candidates)


def compare(args: PlanningArgs, registry: Registry, request: PlanRequest) -> Comparison:
    """Plan every candidate of ``request`` and, with a workload, simulate each and rank them by
    tokens per step."""
    simulated: dict[int, SimulationResult] = {}
    latencies: dict[int, LatencyReport | None] = {}
    workload: Workload | None = None
    own_plans = False  # a vLLM profile simulating kvcore's plans
    step_time = timing.step_time_factory(args, registry)
    if step_time is not None and not inputs.wants_workload(args):
        raise InvalidInputError(
            "--gpu and --step-profile time a simulation: give a workload (--trace FILE or --requests N)"
        )
    if inputs.wants_workload(args):
        # the workload is read (and checked) before any plan is made
        workload = inputs.load_workload(args, request.context.max_model_len, per_second=step_time is not None)
        profile = scheduler_profile(args, registry)
        own_plans = replays_vllm_plan(profile)
        candidates = build_candidates(request, args, registry)
        runs = replay.simulate_candidates(
            candidates,
            workload,
            prefix_caching=args.prefix_caching,
            step_time=step_time,
            scheduler=profile,
        )
        simulated = {id(s.candidate): s.result for s in runs}
        latencies = {id(s.candidate): timing.latency_of(args, workload, s.result) for s in runs}

        def rank(c: Candidate) -> float:
            result = simulated.get(id(c))
            return -replay.served_tokens_per_step(result) if result is not None else math.inf

        # the best plan for this traffic first; those without a plan keep their place at the end
        candidates = sorted(candidates, key=rank)
    else:
        candidates = build_candidates(request, args, registry)
    return Comparison(
        candidates=candidates,
        simulated=simulated,
        latencies=latencies,
        workload=workload,
        frontiers=candidate_frontiers(request, candidates, registry) if args.frontier else {},
        best=best_candidate(candidates, simulated),
        # the best one vLLM runs too, beside the best for kvcore's runtime (which runs every plan)
        vllm_best=best_candidate([c for c in candidates if vllm_runs(c)], simulated),
        auto=auto_choice(registry, request.specs),
        vllm_on_own_plans=own_plans,
    )


def csv_row(comparison: Comparison, c: Candidate) -> dict[str, Any]:
    return {
        **candidate_row(c),
        "best": comparison.is_best(c),
        "best_vllm_runs": comparison.is_vllm_best(c),
        **(replay.simulation_row(comparison.simulated[id(c)]) if id(c) in comparison.simulated else {}),
    }


def json_payload(
    args: PlanningArgs,
    registry: Registry,
    specs: Mapping[str, KVCacheSpec],
    budget: GpuBudget | None,
    comparison: Comparison,
) -> dict[str, Any]:
    best, vllm_best, workload = comparison.best, comparison.vllm_best, comparison.workload
    payload: dict[str, Any] = {
        "available_memory_bytes": args.kv_budget,
        "max_model_len": args.max_model_len,
        "judged_for": "kvcore",
        "best_reason": best.reason if best is not None else None,
        "best_vllm_runs_reason": vllm_best.reason if vllm_best is not None else None,
        "auto_policy": comparison.auto,
    }
    if budget is not None:
        payload["gpu_budget"] = budget.to_dict()
    if workload is not None:
        payload["workload"] = replay.workload_row(workload)
        payload["simulated_plans"] = "kvcore" if comparison.vllm_on_own_plans else "as planned"

    def simulation(c: Candidate) -> dict[str, Any]:
        if workload is None:
            return {}
        if id(c) not in comparison.simulated:
            return {"simulation": None}
        row = replay.simulation_row(comparison.simulated[id(c)])
        return {"simulation": timing.with_latency(row, comparison.latencies.get(id(c)))}

    frontiers = comparison.frontiers
    payload["candidates"] = [
        {
            **candidate_row(c),
            "best": comparison.is_best(c),
            "best_vllm_runs": comparison.is_vllm_best(c),
            **simulation(c),
            **({"frontier": [p.to_dict() for p in frontiers[id(c)]]} if frontiers else {}),
            "plan": plan_report(c.plan, specs, registry, capacity=c.capacity) if c.plan else None,
        }
        for c in comparison.candidates
    ]
    return payload


def table_row(
    args: PlanningArgs, comparison: Comparison, c: Candidate, *, modes: bool, pools: bool
) -> list[Any]:
    """One candidate's row of the text table (a candidate with a plan)."""
    plan, capacity = c.plan, c.capacity
    assert plan is not None and capacity is not None  # the caller lists the ones without apart
    cells = variant_cells(c)
    if comparison.is_best(c):
        cells[0] = f"{cells[0]}*"  # the best candidate, explained under the table
    elif comparison.is_vllm_best(c):
        cells[0] = f"{cells[0]}+"  # the best one vLLM runs, where the best is not
    row = [
        *cells,
        *([c.state_cache_mode] if modes else []),
        len(plan.groups),
        *([len(plan.pools)] if pools else []),
        format_figure(capacity.max_concurrency),
        format_figure(capacity.ideal_concurrency),
        f"{100 * capacity.efficiency:.2f}%",
        format_bytes(capacity.padding_bytes),
        format_figure(capacity.kv_cache_tokens, ","),
    ]
    if comparison.workload is not None:
        result = comparison.simulated[id(c)]
        row += [
            f"{replay.served_tokens_per_step(result):,.1f}",
            f"{result.mean_running:,.1f}",
            f"{result.preemptions:,}",
        ]
        if args.prefix_caching:  # the block size's trade: hit granularity against capacity
            row += [f"{hit_step_of(plan) or '-'}", f"{100 * result.prefix_hit_rate:.1f}%"]
        report = comparison.latencies.get(id(c))
        if report is not None:
            row += timing.summary_cells(report)
    return row


def table_headers(args: PlanningArgs, comparison: Comparison, *, modes: bool, pools: bool) -> list[str]:
    """The text table's headers; with a workload, prints the lines that explain its columns."""
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
    workload = comparison.workload
    if workload is None:
        return headers
    print(
        f"simulated on workload {workload.name} by the {args.scheduler} scheduler, "
        f"max_num_batched_tokens {args.max_num_batched_tokens:,}; ranked by tokens per step "
        "(the workload's tokens served per step, recomputation not counted)"
    )
    if comparison.vllm_on_own_plans:
        print(OWN_PLANS_NOTE)
    assert isinstance(args.max_model_len, int)  # compare takes a number (sizing_context)
    if rejected := replay.rejected_line(workload, args.max_model_len):
        print(rejected)
    headers += ["tokens/step", "mean running", "preemptions"]
    if args.prefix_caching:
        print(
            "prefix caching on: hit unit = tokens every hit is a multiple of (every group's block, "
            "a state's checkpoint), prefix hits = prompt tokens found cached"
        )
        headers += ["hit unit", "prefix hits"]
    timed = next((r for r in comparison.latencies.values() if r is not None), None)
    if timed is not None:
        print(f"time: {timed.model}")
        headers += timing.summary_headers(timed)
    return headers


def print_comparison(args: PlanningArgs, budget: GpuBudget | None, comparison: Comparison) -> None:
    candidates = comparison.candidates
    modes = bool(args.state_cache_modes)
    # a pools column only where some plan has several block pools
    pools = any(c.plan is not None and c.plan.names_pools for c in candidates)
    rows = []
    failures: dict[str, str] = {}  # first reason per policy; variants usually fail alike
    for c in candidates:
        if c.plan is None or c.capacity is None:
            failures.setdefault(c.policy, no_plan_reason(c) or "no plan")
            continue
        rows.append(table_row(args, comparison, c, modes=modes, pools=pools))
    gpu.print_budget(budget)
    print(
        f"budget {format_bytes(args.kv_budget)}, max_model_len {args.max_model_len:,}; "
        "concurrency = requests of max_model_len held at once"
    )
    headers = table_headers(args, comparison, modes=modes, pools=pools)
    lead = 4 if modes else 3
    rows, alike = collapse_alike(rows)  # one row for the policies that plan this model alike
    print(render_table(headers, rows, align="l" * lead + "r" * (len(headers) - lead)))
    for note in alike:
        print(f"  {note}")
    for line in best_lines(comparison.best, comparison.vllm_best, comparison.auto):
        print(f"  {line}")
    for policy, error in failures.items():
        print(f"  {policy}: no plan: {error}")
    if comparison.frontiers:
        print()
        print(format_frontiers(candidates, comparison.frontiers))


def candidate_frontiers(
    request: PlanRequest, candidates: Sequence[Candidate], registry: Registry
) -> dict[int, tuple[FrontierPoint, ...]]:
    """``{id(candidate): its policy's frontier}`` (:func:`~kvcore.planning.frontier.policy_frontier`)
    for every candidate that has a plan: ``request`` with the candidate's policy, its variant of
    the specs and its plan's context."""
    out: dict[int, tuple[FrontierPoint, ...]] = {}
    for c in candidates:
        if c.plan is None:
            out[id(c)] = ()
            continue
        variant = variant_specs(request.specs, block_size=c.block_size, kv_cache_dtype=c.kv_cache_dtype)
        at = request.at_length(c.plan.context.max_model_len)
        out[id(c)] = policy_frontier(
            attrs.evolve(at, specs=variant, policy=c.policy, context=c.plan.context), registry=registry
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
        cells = "  ".join(
            f"{p.groups}: {format_figure(p.max_concurrency)} ({100 * p.efficiency:.2f}%)" for p in points
        )
        rows.append([label, cells])
    table = render_table(
        ["policy", "groups: concurrency (efficiency), best layout at each group count"], rows, align="ll"
    )
    return (
        "frontier: fewer groups (block tables per request) for less capacity; each point is the policy's "
        "best layout with at most that many groups (--max-groups N --grouping-tolerance 0)\n" + table
    )


@attrs.frozen(kw_only=True)
class Best:
    """The candidate ``kvcore compare`` recommends, and why, in one sentence.

    Attributes:
        candidate: the candidate (one with a plan).
        reason: why it wins, with its figures (``'the highest max concurrency: 8.70 requests
            of 8,192 tokens (99.99% of the ideal)'``).
    """

    candidate: Candidate
    reason: str


def best_candidate(
    candidates: Sequence[Candidate], simulated: Mapping[int, SimulationResult] | None = None
) -> Best | None:
    """The candidate to use: with a workload, the one that serves the most of its tokens per
    step (:func:`~kvcore.cli.replay.served_tokens_per_step`); else the one holding the most
    requests of ``max_model_len`` at once. Ties go to the fewest groups (block tables per
    request), then to the earlier candidate; the reason says so. ``None`` when none planned."""
    planned = [c for c in candidates if c.plan is not None and c.capacity is not None]
    if not planned:
        return None
    if simulated:
        served = {
            id(c): replay.served_tokens_per_step(simulated[id(c)]) for c in planned if id(c) in simulated
        }
        if served:
            top = max(served.values())
            tied = [c for c in planned if id(c) in served and math.isclose(served[id(c)], top, rel_tol=1e-9)]
            best = min(tied, key=lambda c: len(c.plan.groups) if c.plan else 0)
            return Best(
                candidate=best,
                reason=f"the most tokens served per step on the workload ({top:,.1f})" + _tie_note(tied),
            )
    top_concurrency = max(c.max_concurrency for c in planned)
    tied = [c for c in planned if math.isclose(c.max_concurrency, top_concurrency, rel_tol=1e-9)]
    best = min(tied, key=lambda c: len(c.plan.groups) if c.plan else 0)
    assert best.capacity is not None and best.plan is not None  # planned only
    figures = (
        f"{format_figure(best.capacity.max_concurrency)} requests of {best.capacity.max_model_len:,} tokens "
        f"({100 * best.efficiency:.2f}% of the ideal)"
    )
    reason = f"the highest max concurrency: {figures}" + _tie_note(tied)
    # a near second with fewer block tables may be the better buy: say what it gives up
    fewer = [c for c in planned if c.plan and best.plan and len(c.plan.groups) < len(best.plan.groups)]
    close = max(fewer, key=lambda c: c.max_concurrency, default=None)
    near = close is not None and 0 < best.max_concurrency <= close.max_concurrency / 0.99
    if close is not None and close.plan is not None and near:
        short = 100 * (1 - close.max_concurrency / best.max_concurrency)
        reason += (
            f"; {best_label(Best(candidate=close, reason=''))} holds {format_figure(close.max_concurrency)} "
            f"({short:.2g}% fewer) with {len(close.plan.groups)} groups instead of {len(best.plan.groups)}"
        )
    return Best(candidate=best, reason=reason)


def vllm_runs(candidate: Candidate) -> bool:
    """Whether vLLM 0.33 runs the candidate's layout (with kvcore's plugin): one block pool,
    one block id per page, groups its managers take
    (:func:`~kvcore.integrations.vllm.rules.check_runnable`). Its figures under vLLM's own
    rules are ``kvcore compare --engine vllm``'s."""
    from kvcore.integrations.vllm.rules import VllmIntegrationError, check_runnable, page_span

    if candidate.plan is None:
        return False
    try:
        check_runnable(candidate.plan)
    except VllmIntegrationError:
        return False
    return page_span(candidate.plan) == 1


def auto_choice(registry: Registry, specs: Mapping[str, KVCacheSpec]) -> str | None:
    """The policy ``kvcore plan --policy auto`` (the default) picks for ``specs``; ``None``
    when no policy it may pick plans them."""
    try:
        return registry.select(specs, "auto").policy.name
    except KVCoreError:
        return None


def best_lines(best: Best | None, vllm_best: Best | None, auto: str | None) -> list[str]:
    """The lines under the table that name the picks: the best for kvcore's runtime (``*``), the
    best vLLM runs where that is another candidate (``+``), and how ``kvcore plan``'s ``auto``
    relates to them."""
    if best is None:
        return []
    lines = [f"* best for kvcore's runtime (judged for --engine kvcore): {best_label(best)}: {best.reason}"]
    if vllm_best is not None and vllm_best.candidate is best.candidate:
        lines[0] += "; vLLM 0.33 runs it too"
    elif vllm_best is not None:
        lines.append(
            f"+ best vLLM 0.33 runs: {best_label(vllm_best)}: {vllm_best.reason} "
            "(--engine vllm: as vLLM's own rules size it)"
        )
    else:
        lines.append(
            "+ vLLM 0.33 runs none of these layouts as planned here (--engine vllm plans each policy "
            "under vLLM's rules)"
        )
    if auto is None:
        return lines
    if auto == best.candidate.policy:
        lines.append(f"kvcore plan's default (--policy auto) picks {auto}, as starred")
    else:
        lines.append(
            f"kvcore plan's default (--policy auto) picks {auto}: auto asks only the policies that declare "
            f"an auto priority, by priority, not by these figures; to plan the starred layout: kvcore plan "
            f"--policy {best.candidate.policy}"
        )
    return lines


def _tie_note(tied: Sequence[Candidate]) -> str:
    if len(tied) < 2:
        return ""
    # several candidates hold as much: the one with the fewest block tables costs least per step
    groups = {len(c.plan.groups) for c in tied if c.plan is not None}
    if len(groups) == 1:
        return f"; {len(tied)} candidates tie, with as many groups: the first listed"
    return f"; {len(tied)} candidates tie, this one has the fewest groups"


def best_label(best: Best) -> str:
    """The best candidate as the table names it: ``'shared_buffer, block 32, kv fp8'``."""
    c = best.candidate
    parts = [c.policy]
    if c.block_size:
        parts.append(f"block {c.block_size}")
    if c.kv_cache_dtype:
        parts.append(f"kv {dtype_name(c.kv_cache_dtype)}")
    if c.state_cache_mode:
        parts.append(f"state cache {c.state_cache_mode}")
    return ", ".join(parts)


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
