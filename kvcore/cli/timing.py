"""``--gpu`` / ``--step-profile`` and the latency targets of ``kvcore simulate``: the step-time
model that turns the simulated steps into seconds (:mod:`kvcore.simulation.timing`), and the
latency table and JSON it yields."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvcore.cli.table import render_table
from kvcore.errors import InvalidInputError, UnknownModelError
from kvcore.planning.registry import Registry

if TYPE_CHECKING:  # the simulation layer loads only when a command simulates
    from kvcore.cli.options import PlanningArgs
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.simulator import SimulationResult
    from kvcore.simulation.steps import StepTimeModel
    from kvcore.simulation.timing import LatencyReport
    from kvcore.simulation.workload import Workload

#: Makes a plan's step-time model (a roofline depends on the plan's page sizes).
StepTimeFactory = Callable[["KVCachePlan"], "StepTimeModel"]


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, a number > 0 (``0.2``, or ``200ms``)."""
    raw = text.strip().lower()
    scale = 1e-3 if raw.endswith("ms") else 1.0
    try:
        value = float(raw.removesuffix("ms").removesuffix("s")) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds such as 0.5 or 200ms, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a duration > 0, got {text.strip()}")
    return value


def add_timing_options(parser: argparse.ArgumentParser) -> None:
    """``--gpu NAME`` or ``--step-profile FILE`` (the step-time model), ``--slo-ttft`` and
    ``--slo-itl`` (the latency targets goodput counts)."""
    model = parser.add_mutually_exclusive_group()
    model.add_argument(
        "--gpu",
        metavar="NAME",
        help=(
            "with --model: time the steps by a roofline of the model on this GPU (H100, H100-PCIe, H200, "
            "B200, A100-40GB, A100-80GB, L40S, MI300X, GH200: kvcore/data/gpus.json), with --tp ranks; "
            "a lower bound. Then --rate is requests per second and "
            "latencies (TTFT, inter-token, end-to-end) and tokens per second are reported"
        ),
    )
    model.add_argument(
        "--step-profile",
        metavar="FILE.jsonl",
        help=(
            'time the steps by measured samples, one a line: {"prefill_tokens": P, "decode_requests": D, '
            '"context_tokens": C, "seconds": S}, fitted by least squares (docs/reference/json-formats.md)'
        ),
    )
    parser.add_argument(
        "--slo-ttft",
        type=seconds,
        metavar="SECONDS",
        help="with --gpu or --step-profile: the time-to-first-token target goodput counts (0.5, 500ms)",
    )
    parser.add_argument(
        "--slo-itl",
        type=seconds,
        metavar="SECONDS",
        help="with --gpu or --step-profile: the inter-token latency target goodput counts (0.05, 50ms)",
    )


def is_timed(args: PlanningArgs) -> bool:
    """Whether the options ask for seconds (``--gpu`` or ``--step-profile``)."""
    return args.gpu is not None or args.step_profile is not None


def step_time_factory(args: PlanningArgs, registry: Registry) -> StepTimeFactory | None:
    """The step-time model the options ask for, per plan; ``None`` without ``--gpu`` or
    ``--step-profile``. Everything is checked here, before any plan is simulated.

    Raises:
        InvalidInputError: a latency target without a step-time model, ``--gpu`` without
            ``--model``, or a bad profile file.
        UnknownGpuError: a GPU the catalogue does not have (the message says the closest).
    """
    if not is_timed(args):
        targets = (("--slo-ttft", args.slo_ttft), ("--slo-itl", args.slo_itl))
        given = [flag for flag, value in targets if value is not None]
        if given:
            raise InvalidInputError(
                f"{' and '.join(given)} need seconds: give --gpu NAME (a roofline) or --step-profile FILE"
            )
        return None
    if args.step_profile is not None:
        from kvcore.simulation.timing import read_profile

        profile = read_profile(args.step_profile)
        return lambda _plan: profile
    from kvcore.cli.inputs import load_model
    from kvcore.planning.gpu_budget import count_parameters
    from kvcore.simulation.gpus import find_gpu
    from kvcore.simulation.timing import roofline

    assert args.gpu is not None  # timed, and not by a profile
    gpu = find_gpu(args.gpu)
    if args.model is None:
        raise InvalidInputError(
            "--gpu needs --model: the roofline counts the model's weights and FLOPs from its config; "
            "with a spec file, give a measured --step-profile FILE instead"
        )
    if args.pp_size > 1:
        raise InvalidInputError("--gpu's roofline models tensor parallelism (--tp) only: drop --pp")
    loaded = load_model(args, registry).model_config  # loaded once: by load_layer_specs, before this
    assert loaded is not None  # --model is given
    config, source = loaded.config, loaded.source
    tp = args.tp_size
    try:  # counted now, so that a model no plugin counts fails before any simulation
        count_parameters(config, registry, source)
    except UnknownModelError as exc:
        reason = str(exc).split(";")[0]
        raise UnknownModelError(
            f"{reason}; --gpu's roofline needs the count: give a measured --step-profile FILE instead"
        ) from None
    return lambda plan: roofline(config, registry, plan, gpu, tp=tp, source=source)


def duration(value: float) -> str:
    """``850 us``, ``12.5 ms``, ``1.04 s``, ``2.3 min``: seconds in a readable unit."""
    if value < 1e-3:
        return f"{value * 1e6:,.0f} us"
    if value < 1:
        return f"{value * 1e3:,.1f} ms"
    if value < 120:
        return f"{value:,.2f} s"
    return f"{value / 60:,.1f} min"


def latency_headers(report: LatencyReport) -> list[str]:
    """The latency table's headers after the variant's cells."""
    slo = report.slo_ttft is not None or report.slo_itl is not None
    return [
        "TTFT p50",
        "p90",
        "p99",
        "ITL p50",
        "p90",
        "p99",
        "E2E p50",
        "p90",
        "p99",
        "out tok/s",
        *(["goodput req/s", "met"] if slo else []),
    ]


def latency_cells(report: LatencyReport) -> list[str]:
    """One row's latency cells (see :func:`latency_headers`)."""
    cells = [duration(v) for s in (report.ttft, report.itl, report.e2e) for v in (s.p50, s.p90, s.p99)]
    cells.append(f"{report.output_tokens_per_second:,.0f}")
    if report.slo_ttft is not None or report.slo_itl is not None:
        total = report.requests_per_second * report.seconds
        share = report.good_requests / total if total else 0.0
        cells += [f"{report.goodput_requests_per_second:,.2f}", f"{100 * share:.1f}%"]
    return cells


def summary_headers(report: LatencyReport) -> list[str]:
    """The few latency columns ``kvcore compare --trace`` adds (see :func:`summary_cells`)."""
    slo = report.slo_ttft is not None or report.slo_itl is not None
    return ["TTFT p99", "ITL p99", "out tok/s", *(["goodput req/s"] if slo else [])]


def summary_cells(report: LatencyReport) -> list[str]:
    """TTFT and ITL at p99, output tokens per second, and goodput with a target."""
    cells = [duration(report.ttft.p99), duration(report.itl.p99), f"{report.output_tokens_per_second:,.0f}"]
    if report.slo_ttft is not None or report.slo_itl is not None:
        cells.append(f"{report.goodput_requests_per_second:,.2f}")
    return cells


def print_latency_table(rows: Sequence[tuple[Sequence[object], LatencyReport]]) -> None:
    """The seconds of each simulated plan: which model made them, then one row per plan."""
    if not rows:
        return
    first = rows[0][1]
    targets = [
        f"{name} {duration(value)}"
        for name, value in (("TTFT", first.slo_ttft), ("ITL", first.slo_itl))
        if value is not None
    ]
    print()
    print(
        f"time: {first.model} (docs/explanation/steps-to-seconds.md); ITL = a request's mean time between "
        "output tokens" + (f"; goodput = requests meeting {' and '.join(targets)}" if targets else "")
    )
    headers = ["policy", "block", "kv dtype", *latency_headers(first)]
    body = [[*cells, *latency_cells(report)] for cells, report in rows]
    print(render_table(headers, body, align="lll" + "r" * (len(headers) - 3)))
    for cells, report in rows:
        beyond = reach_line(report)
        if beyond:
            print(f"  {' '.join(str(c) for c in cells if c != 'as specs')}: {beyond}")


def reach_line(report: LatencyReport) -> str | None:
    """What a run timed by a measured profile did beyond the steps the profile measured, in a
    line (``None`` when every step lay inside, or the model measured nothing)."""
    return report.reach.summary if report.reach is not None else None


def latency_of(args: PlanningArgs, workload: Workload, result: SimulationResult) -> LatencyReport | None:
    """The latencies of a timed run under the options' targets (``None`` when the steps were
    not timed)."""
    if result.timeline is None:
        return None
    from kvcore.simulation.timing import latency_report

    return latency_report(
        result.timeline,
        [r.output_tokens for r in workload.requests],
        slo_ttft=args.slo_ttft,
        slo_itl=args.slo_itl,
    )


def with_latency(row: dict[str, Any], report: LatencyReport | None) -> dict[str, Any]:
    """A simulation's JSON row with its ``latency`` object (with a step-time model)."""
    if report is not None:
        row["latency"] = report.to_dict()
    return row
