"""``kvcore tune``: the plan, pools and scheduler settings that serve a workload best, and the
flags that tell vLLM and SGLang to run them.

The search is :func:`kvcore.tuning.search.tune` (a coordinate search over policy, block size,
KV dtype, pool split, ``max_num_seqs`` and ``max_num_batched_tokens``, each candidate replayed
as ``kvcore simulate`` replays it); the flags are :mod:`kvcore.integrations.tuned`'s.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.cli import gpu, inputs, timing
from kvcore.cli.aliases import RemovedOption
from kvcore.cli.command import Command
from kvcore.cli.compare import add_candidate_options
from kvcore.cli.host_tier import add_host_memory_option
from kvcore.cli.options import PlanningArgs
from kvcore.cli.policy_defaults import default_policies
from kvcore.cli.progress import progress
from kvcore.cli.replay import overload_lines, rejected_line
from kvcore.cli.table import render_table
from kvcore.errors import InvalidInputError
from kvcore.planning.registry import Registry
from kvcore.runtime.one_pool import hit_step_of
from kvcore.spec import DEFAULT_MAX_NUM_BATCHED_TOKENS
from kvcore.units import format_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kvcore.cli.timing import StepTimeFactory
    from kvcore.integrations.tuned import EngineSettings
    from kvcore.planning.gpu_budget import GpuBudget
    from kvcore.simulation.workload import Workload
    from kvcore.spec import KVCacheSpec
    from kvcore.tuning.search import Trial, TuneResult

#: The max_num_batched_tokens values searched when --max-num-batched-tokens is not given:
#: vLLM's default step budget and twice it.
DEFAULT_BATCHED_TOKENS = (DEFAULT_MAX_NUM_BATCHED_TOKENS, 2 * DEFAULT_MAX_NUM_BATCHED_TOKENS)

#: What the plot is called in messages.
PLOT = "the tuning plot"


COMMAND = Command(
    help="search the plan and scheduler settings that serve a workload best; print vLLM and SGLang flags",
    description="""
        Search policy, block size, KV dtype, pool split, max_num_seqs and max_num_batched_tokens for the
        candidate that serves the workload best under --scheduler (a coordinate search; each candidate is
        replayed as kvcore simulate replays it). Prints the best candidate, what each knob bought alone, the
        Pareto front (objective against latency) and the flags for vLLM and SGLang.
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    inputs.add_spec_source(parser)
    inputs.add_sizing_options(parser, auto_length="refused", gpu_name=True)
    inputs.add_workload_options(parser, required=True)
    timing.add_timing_options(parser)
    parser.add_argument(
        "--scheduler",
        default="vllm",
        metavar="NAME",
        help="the scheduler to replay the workload as (default vllm: vLLM 0.33's v1 scheduler, "
        "candidates planned "
        "under vLLM's rules; kvcore; or one a plugin registers)",
    )
    add_host_memory_option(parser, curve=False)
    parser.add_argument(
        "--sync-scheduling",
        action="store_true",
        help="replay vLLM without its async scheduling (on by default in vLLM 0.33): a step's output returns "
        "before the next step, as an engine stepped in a loop (LLMEngine.step) runs",
    )
    space = parser.add_argument_group("the search space (the first value of each is the default candidate)")
    add_candidate_options(
        space,
        policies="policies (default: every registered one)",
        block_sizes="block sizes (default: as the specs say)",
        kv_cache_dtypes=(
            "KV dtypes, e.g. auto,fp8 (default: auto, as the specs say; fp8 only when you allow it here)"
        ),
    )
    space.add_argument(
        "--max-num-seqs",
        dest="num_seqs",
        type=inputs.positive_ints,
        metavar="N,M",
        help="max_num_seqs values, as vLLM spells it (SGLang's --max-running-requests; default 128,256)",
    )
    space.add_argument("--num-seqs", dest="num_seqs", action=RemovedOption, new="--max-num-seqs")
    space.add_argument(
        "--batched-tokens", dest="batched_tokens", action=RemovedOption, new="--max-num-batched-tokens"
    )
    space.add_argument(
        "--no-split-search",
        action="store_true",
        help="split several pools by the worst case only (do not size them from the workload)",
    )
    space.add_argument(
        "--passes",
        type=inputs.positive_int,
        default=2,
        metavar="N",
        help="coordinate passes at most (default 2)",
    )
    parser.add_argument(
        "--objective",
        choices=("goodput", "throughput", "tokens_per_step"),
        help="what to maximise (default: goodput with --slo-ttft/--slo-itl, throughput "
        "(output tokens/s) with "
        "--gpu or --step-profile, else served tokens per step)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot", metavar="FILE.svg", help="also draw the candidates and the Pareto front (SVG)"
    )


def _objective(args: PlanningArgs, asked: str | None) -> str:
    if asked:
        return asked
    if timing.is_timed(args):
        return "goodput" if (args.slo_ttft is not None or args.slo_itl is not None) else "throughput"
    return "tokens_per_step"


def _check_plot(path: str) -> Path:
    out = Path(path)
    if out.suffix.lower() != ".svg":
        raise InvalidInputError(f"--plot writes SVG: give a file ending in .svg (got {path!r})")
    if not out.parent.exists():
        raise InvalidInputError(f"--plot: the folder {str(out.parent)!r} does not exist")
    return out


class _Eta:
    """The progress line's detail: candidates tried of the most the search may try, and an ETA
    from the mean time per simulated candidate."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.simulated = 0
        self.start = time.perf_counter()

    def on_trial(self, trial: Trial) -> None:
        self.done += 1
        self.simulated += 0 if trial.reused or trial.result is None else 1

    def text(self) -> str:
        elapsed = time.perf_counter() - self.start
        left = max(self.total - self.done, 0)
        eta = f", ETA {timing.duration(elapsed / self.done * left)}" if self.done else ""
        return f"{self.done}/{self.total} candidates at most{eta}"


def run(args: argparse.Namespace, registry: Registry) -> int:
    from kvcore.cli.replayed_plans import replays_vllm_plan
    from kvcore.integrations.tuned import vllm_planner
    from kvcore.tuning.search import SearchSpace, estimated_trials, tune

    plot = _check_plot(args.plot) if args.plot else None
    # --max-num-batched-tokens N[,M...]: the values searched; the first is the default candidate's
    batched: list[int] = args.max_num_batched_tokens or list(DEFAULT_BATCHED_TOKENS)
    args.max_num_batched_tokens = batched[0]
    # the options tune shares with plan and simulate, typed and read once; tune's own stay in args
    shared = PlanningArgs.read(args)
    objective = _objective(shared, args.objective)
    shared, specs = inputs.load_layer_specs(shared, registry)
    shared, budget = gpu.settle_budget(shared, registry)
    args = argparse.Namespace(**{**vars(args), "memory": shared.memory})  # --gpu-memory settled it
    step_time = timing.step_time_factory(shared, registry)
    # what every candidate plans (--max-groups, --grouping-tolerance ... among its options)
    request = inputs.plan_request(shared, specs, auto=False)
    workload = inputs.load_workload(shared, request.context.max_model_len, per_second=step_time is not None)
    profile = _scheduler_profile(args, registry)
    names = args.policies or default_policies(registry)
    for name in names:
        registry.policy(name)  # a misspelt policy fails before any plan
    space = SearchSpace(
        policies=names,
        block_sizes=args.block_sizes or (None,),
        kv_cache_dtypes=[None if d == "auto" else d for d in (args.kv_cache_dtypes or ["auto"])],
        split_shifts=(None,) if args.no_split_search else (None, 0.0, 0.05, 0.1, -0.05),
        max_num_seqs=args.num_seqs or (128, 256),
        max_num_batched_tokens=batched,
    )
    async_scheduling = bool(getattr(profile, "async_scheduling", True))
    # under vllm or vllm-reference, each candidate is the plan vLLM would run (replayed_plans)
    planner = (
        vllm_planner(registry, async_scheduling=async_scheduling) if replays_vllm_plan(profile) else None
    )
    eta = _Eta(estimated_trials(space, args.passes))
    label = f"tuning on {len(workload.requests):,} requests"
    with progress(label, detail=eta.text):
        # the search, the replay as the scheduler runs it, the latency targets and the search's pace
        result = tune(
            request,
            workload,
            space,
            registry=registry,
            objective=objective,
            planner=planner,
            scheduler=profile,
            step_time=step_time,
            prefix_caching=args.prefix_caching,
            slo_ttft=args.slo_ttft,
            slo_itl=args.slo_itl,
            max_passes=args.passes,
            on_trial=eta.on_trial,
            host_memory=args.host_memory,
        )
    engines = _engines(shared, specs, result, workload, budget, registry, step_time, async_scheduling)
    if args.json:
        print(json.dumps(_payload(args, result, engines, budget, workload), indent=2))
    else:
        gpu.print_budget(budget)
        _print(args, result, engines, workload)
    if plot is not None:
        write_svg(result, plot)
        print(f"wrote {PLOT} to {plot}")
    return 0


def _scheduler_profile(args: argparse.Namespace, registry: Registry) -> Any:
    """``--scheduler``'s profile, with ``--sync-scheduling`` applied where the profile has it."""
    profile = registry.scheduler_profile(args.scheduler)
    if args.sync_scheduling:
        if "async_scheduling" not in (attrs.fields_dict(type(profile)) if attrs.has(type(profile)) else {}):
            raise InvalidInputError(
                f"--sync-scheduling is a setting of vLLM's scheduler: --scheduler {args.scheduler} has no "
                "async scheduling to turn off"
            )
        profile = attrs.evolve(profile, async_scheduling=False)
    return profile


def _engines(
    shared: PlanningArgs,
    specs: Mapping[str, KVCacheSpec],
    result: TuneResult,
    workload: Workload,
    budget: GpuBudget | None,
    registry: Registry,
    step_time: StepTimeFactory | None,
    async_scheduling: bool,
) -> Engines:
    """The best candidate's flags for vLLM and SGLang, and its replay under SGLang's profile."""
    from kvcore.cli.sglang_compare import model_of
    from kvcore.integrations.tuned import sglang_profile, sglang_settings, vllm_settings

    best = result.best
    weights = budget.weights if budget is not None else None
    gpu_bytes = budget.gpu_memory if budget is not None else None
    vllm = vllm_settings(best, specs, shared.kv_budget, registry=registry, async_scheduling=async_scheduling)
    try:
        # what SGLang runs for the model: the answer compare --engine sglang reads too
        model = model_of(shared, specs, "its vLLM settings above still apply")
        sglang: EngineSettings | None = sglang_settings(
            best, model, shared.kv_budget, registry=registry, gpu_memory=gpu_bytes, weights=weights
        )
        sglang_error = ""
    except Exception as exc:  # any refusal of SGLang's rules is reported, not raised
        from kvcore.errors import KVCoreError

        if not isinstance(exc, KVCoreError):
            raise
        from kvcore.cli.inputs import FLAG_NAMES
        from kvcore.error_messages import render

        sglang, sglang_error = None, render(exc, FLAG_NAMES)
    tier = best.plan.offload_tier if best.plan is not None else None
    if sglang is not None and tier is not None and tier.nbytes:
        why = (
            "tune sizes the host tier as vLLM's CPU offloading; SGLang's HiCache takes "
            "--enable-hierarchical-cache --hicache-size (kvcore plan --host-memory gives its value)"
        )
        sglang = attrs.evolve(sglang, cannot_express=(*sglang.cannot_express, ("host tier", why)))
    sglang_run = _simulate_sglang(sglang, workload, best, sglang_profile(registry), shared, step_time)
    return Engines(vllm=vllm, sglang=sglang, sglang_error=sglang_error, sglang_run=sglang_run)


def _simulate_sglang(
    sglang: EngineSettings | None,
    workload: Any,
    best: Trial,
    profile: Any,
    args: PlanningArgs,
    step_time: Any = None,
) -> dict[str, Any]:
    """SGLang's candidate replayed under the ``sglang`` profile when one is registered; else why not.
    With a step-time model it runs on the same clock as the search and reports tokens per second."""
    if profile is None:
        return {
            "simulated": False,
            "why": "no 'sglang' scheduler profile is registered: SGLang's settings are "
            "not simulated (no other profile stands in for it)",
        }
    if sglang is None or sglang.plan is None:
        return {"simulated": False, "why": "not simulated: SGLang has no plan for this candidate"}
    from kvcore.simulation.simulator import simulate

    fields = attrs.fields_dict(type(profile)) if attrs.has(type(profile)) else {}
    for name in ("max_running_requests", "max_num_seqs"):
        if name in fields:
            profile = attrs.evolve(profile, **{name: best.knobs.max_num_seqs})
            break
    from kvcore.errors import KVCoreError

    try:
        result = simulate(
            sglang.plan,
            workload,
            max_num_batched_tokens=best.knobs.max_num_batched_tokens,
            prefix_caching=args.prefix_caching,
            scheduler=profile,
            step_time=step_time(sglang.plan) if step_time is not None else None,  # a factory, per plan
        )
    except KVCoreError as exc:  # a plan the profile does not model (a state group): say so, keep the rest
        return {"simulated": False, "why": str(exc)}
    run: dict[str, Any] = {
        "simulated": True,
        "served_tokens_per_step": result.served_tokens_per_step,
        "preemptions": result.preemptions,
    }
    report = timing.latency_of(args, workload, result)
    if report is not None:
        run["output_tokens_per_second"] = report.output_tokens_per_second
    return run


def _score(result: TuneResult, value: float) -> str:
    if result.objective == "goodput":
        return f"{value:,.2f} req/s"
    if result.objective == "throughput":
        return f"{value:,.0f} tok/s"
    return f"{value:,.1f} tok/step"


def _latency(result: TuneResult, value: float) -> str:
    if math.isinf(value):
        return "-"
    return timing.duration(value) if result.latency_unit == "s" else f"{value:,.0f} steps"


def _knob_cells(trial: Trial) -> list[str]:
    from kvcore.tuning.search import KNOBS

    return [trial.knobs.describe(k) for k in KNOBS]


KNOB_HEADERS = ["policy", "block", "kv dtype", "pool split", "max_num_seqs", "batched tokens"]


@attrs.frozen(kw_only=True)
class Engines:
    """What the best candidate comes to in the engines, as the report and the JSON show it.

    Attributes:
        vllm: vLLM's settings.
        sglang: SGLang's settings; ``None`` where SGLang cannot run the layers.
        sglang_error: why it cannot (``""`` where it can).
        sglang_run: SGLang's candidate replayed under the ``sglang`` profile, or why it was not
            (:func:`_simulate_sglang`).
    """

    vllm: EngineSettings
    sglang: EngineSettings | None
    sglang_error: str
    sglang_run: dict[str, Any]


def _print(args: argparse.Namespace, result: TuneResult, engines: Engines, workload: Any) -> None:
    latency_name = "E2E p90" if result.latency_unit == "s" else "queue p99"
    print(
        f"workload {workload.name}: {len(workload.requests):,} requests; budget {format_bytes(args.memory)}, "
        f"max_model_len {args.max_model_len:,}; scheduler {args.scheduler}; objective {result.objective}"
    )
    if rejected := rejected_line(workload, args.max_model_len):
        print(rejected)
    print(_defaults_line(args, result))
    print(
        f"searched {len(result.trials)} candidates of a grid of {result.grid_size:,}: "
        f"{result.simulations} simulated, "
        f"{result.plans} plans made (the rest reused an equal run or were pruned)"
    )
    best, default = result.best, result.default
    gain = (
        f" ({best.score / default.score - 1:+.1%} over the default)"
        if default.ok and default.score > 0
        else ""
    )
    print()
    ran, plan = best.result, best.plan
    hits = (  # a larger block holds more but hits in coarser steps; the score counts cached tokens
        f", prefix hits {100 * ran.prefix_hit_rate:.1f}% (hit unit {hit_step_of(plan)})"
        if ran is not None and plan is not None and ran.prefix_caching
        else ""
    )
    latency = _latency(result, best.latency_figure)
    print(f"best: {_score(result, best.score)}{gain}, {latency_name} {latency}{hits}")
    print(render_table(KNOB_HEADERS, [_knob_cells(best)], align="l" * len(KNOB_HEADERS)))
    if ran is not None:  # arrivals the best candidate cannot keep up with: no knob here can
        for line in overload_lines([("even the best candidate", ran)]):
            print(line)
    said = set()
    for name, trial in (("the best candidate", best), ("the default", default)):
        beyond = timing.reach_line(trial.latency) if trial.latency is not None else None
        if beyond and beyond not in said:  # a pick timed by an extrapolated line is a guess: say so
            print(f"  {name}: {beyond}")
            said.add(beyond)
    if best.pool_split:
        print("  pool split: " + ", ".join(f"pool {p} {100 * s:.1f}%" for p, s in enumerate(best.pool_split)))
    if result.knob_effects:
        print()
        print("what each knob bought alone (the default with only that knob changed):")
        rows = [
            [
                e.knob,
                e.default,
                e.best,
                _score(result, e.score),
                f"{e.gain:+.1%}" if e.gain is not None else "-",
            ]
            for e in result.knob_effects
        ]
        print(render_table(["knob", "default", "best", "score", "gain"], rows, align="lllrr"))
    print()
    print(f"Pareto front ({result.objective} against {latency_name}):")
    rows = [
        [*_knob_cells(t), _score(result, t.score), _latency(result, t.latency_figure)] for t in result.front
    ]
    print(render_table([*KNOB_HEADERS, "score", latency_name], rows, align="l" * 6 + "rr"))
    _print_engines(engines, args.max_model_len)


def _print_engines(engines: Engines, max_model_len: int) -> None:
    """The best candidate's flags for each engine, what they cannot say, and the capacity."""
    for settings, name in ((engines.vllm, "vLLM 0.33"), (engines.sglang, "SGLang 0.5")):
        print()
        if settings is None:
            print(f"{name}: no plan for this candidate: {engines.sglang_error}")
            continue
        print(f"{name}: {settings.command_line()}")
        for flag in settings.flags:
            if flag.why:
                print(f"  {flag.name}: {flag.why}")
        for setting, why in settings.cannot_express:
            print(f"  cannot express {setting}: {why}")
        fmt = "{:,.2f}" if settings.unit == "requests" else "{:,.0f}"
        what = f"requests of {max_model_len:,} tokens held" if settings.unit == "requests" else "KV tokens"
        engine = (
            f"{settings.engine_detail}: {fmt.format(settings.engine_tokens)}"
            if settings.engine_tokens is not None
            else settings.engine_detail
        )
        print(f"  {what}: kvcore's layout {fmt.format(settings.kvcore_tokens)}; {engine}")
    if engines.sglang_run.get("simulated"):
        per_second = engines.sglang_run.get("output_tokens_per_second")
        served = f"{per_second:,.0f} tok/s" if per_second is not None else ""
        served = served or f"{engines.sglang_run['served_tokens_per_step']:,.1f} tok/step"
        print(f"  under the sglang profile: {served}")
    else:
        print(f"  {engines.sglang_run['why']}")


def _trial_row(result: TuneResult, trial: Trial) -> dict[str, Any]:
    return {
        "knobs": attrs.asdict(trial.knobs),
        "pool_split": list(trial.pool_split) if trial.pool_split else None,
        "score": trial.score if trial.ok else None,
        "latency": trial.latency_figure if trial.ok else None,
        "reused": trial.reused,
        "error": trial.error,
        "latency_report": trial.latency.to_dict() if trial.latency is not None else None,
        "load": trial.result.load.to_dict() if trial.result is not None and trial.result.load else None,
    }


def _vllm_defaults(args: argparse.Namespace) -> Any:
    """vLLM's own batch defaults on the device tune plans for (``--gpu``; else a CPU)."""
    from kvcore.simulation.gpus import find_gpu
    from kvcore.simulation.profiles.vllm_batch_defaults import serve_defaults

    name = getattr(args, "gpu", None)
    return serve_defaults(find_gpu(name) if name else None)


def _defaults_line(args: argparse.Namespace, result: TuneResult) -> str:
    """Where the default candidate's max_num_seqs and max_num_batched_tokens come from, and
    what vLLM itself starts with on the device."""
    knobs = result.default.knobs
    defaults = _vllm_defaults(args)
    line = (
        f"default candidate: max_num_seqs {knobs.max_num_seqs:,}, max_num_batched_tokens "
        f"{knobs.max_num_batched_tokens:,}; {defaults.line()}"
    )
    if (knobs.max_num_seqs, knobs.max_num_batched_tokens) != (
        defaults.max_num_seqs,
        defaults.max_num_batched_tokens,
    ):
        line += (
            f"; to start from vLLM's, give --max-num-seqs {defaults.max_num_seqs} "
            f"--max-num-batched-tokens {defaults.max_num_batched_tokens}"
        )
    return line


def _payload(
    args: argparse.Namespace, result: TuneResult, engines: Engines, budget: Any, workload: Any
) -> dict[str, Any]:
    from kvcore.cli.replay import workload_row

    sglang = engines.sglang
    return {
        "available_memory_bytes": args.memory,
        "max_model_len": args.max_model_len,
        "workload": workload_row(workload),
        "scheduler": args.scheduler,
        "objective": result.objective,
        "latency_unit": result.latency_unit,
        **({"gpu_budget": budget.to_dict()} if budget is not None else {}),
        "simulations": result.simulations,
        "plans": result.plans,
        "grid_size": result.grid_size,
        "best": _trial_row(result, result.best),
        "default": _trial_row(result, result.default),
        "vllm_defaults": attrs.asdict(_vllm_defaults(args)),
        "knob_effects": [
            {"knob": e.knob, "default": e.default, "best": e.best, "score": e.score, "gain": e.gain}
            for e in result.knob_effects
        ],
        "front": [_trial_row(result, t) for t in result.front],
        "trials": [_trial_row(result, t) for t in result.trials],
        "engines": {
            "vllm": engines.vllm.to_dict(),
            "sglang": (
                {**sglang.to_dict(), "simulation": engines.sglang_run}
                if sglang is not None
                else {"error": engines.sglang_error}
            ),
        },
    }


def write_svg(result: TuneResult, path: Path) -> None:
    """Every candidate that ran as a dot (score against latency), the Pareto front as a line.

    Raises:
        InvalidInputError: the file cannot be written.
    """
    ran = [t for t in result.trials if t.ok and math.isfinite(t.latency_figure)]
    width, height, pad = 640, 400, 60
    xs = [t.latency_figure for t in ran] or [0.0]
    ys = [t.score for t in ran] or [0.0]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1

    def at(trial: Trial) -> tuple[float, float]:
        x = pad + (trial.latency_figure - x0) / (x1 - x0) * (width - 2 * pad)
        y = height - pad - (trial.score - y0) / (y1 - y0) * (height - 2 * pad)
        return x, y

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 20}" text-anchor="middle">latency ({result.latency_unit}): '
        f"{_latency(result, x0)} to {_latency(result, x1)}</text>",
        f'<text x="15" y="{height / 2}" transform="rotate(-90 15 {height / 2})" text-anchor="middle">'
        f"{result.objective}: {_score(result, y0)} to {_score(result, y1)}</text>",
    ]
    for trial in ran:
        x, y = at(trial)
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#999"><title>{trial.knobs}</title></circle>'
        )
    front = [at(t) for t in result.front if t in ran]
    if front:
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in front)
        parts.append(f'<polyline points="{points}" fill="none" stroke="#c00" stroke-width="1.5"/>')
    bx, by = at(result.best)
    parts.append(f'<circle cx="{bx:.1f}" cy="{by:.1f}" r="6" fill="none" stroke="#c00" stroke-width="2"/>')
    parts.append("</svg>")
    try:
        path.write_text("\n".join(parts) + "\n")
    except OSError as exc:
        raise InvalidInputError(f"cannot write {PLOT} to {path}: {exc.strerror or exc}") from None
