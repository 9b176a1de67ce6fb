"""``kvcore allocate``: plan, allocate for real on a device, bind to stand-in layers, and time it."""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

import attrs

from kvcore.cli import inputs
from kvcore.cli.options import PlanningArgs
from kvcore.cli.progress import progress
from kvcore.cli.report import chosen_length, chosen_length_line, format_plan, plan_report, policy_reason
from kvcore.cli.table import add_csv_option, render_table, wants_csv, write_csv
from kvcore.errors import InvalidInputError
from kvcore.planning.registry import Registry
from kvcore.runtime import DEFAULT_UTILIZATION
from kvcore.units import format_bytes

#: The workflow's steps as :func:`~kvcore.initialize_kv_caches` times them, in order.
WORKFLOW_STEPS = ("specs", "memory", "plan", "allocate", "bind", "warmup")

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def device_arg(text: str) -> str:
    """argparse type: ``cpu``, ``cuda`` or ``cuda:N``."""
    if not _DEVICE.match(text.strip()):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text.strip()


def utilization_arg(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "allocate",
        help="plan, allocate on a device and bind stand-in layers; print sizes and timings",
        description=(
            "Plan the KV cache for a spec file, allocate it for real on a device, bind every layer's "
            "view to a stand-in module, and print the plan, the bytes allocated and the time each "
            "step took. Give the budget as --memory SIZE, or as --utilization F of the device's "
            "memory (profiled). With --plan FILE, allocate a saved plan instead (checked first; it "
            "fixes its own size, so no --memory, --utilization or --max-model-len)."
        ),
    )
    inputs.add_spec_source(parser, plan_file=True)
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument(
        "--utilization",
        type=utilization_arg,
        metavar="F",
        help=(
            "size the KV cache from the device's memory: this share of the GPU's total (CUDA) or of "
            f"the memory available now (cpu), minus what is in use; vLLM's default is {DEFAULT_UTILIZATION}"
        ),
    )
    inputs.add_planning_options(parser, memory_required=False, length_required=False)
    parser.add_argument("--no-zero", action="store_true", help="do not zero-fill the allocated memory")
    parser.add_argument(
        "--json",
        action="store_true",
        help=(
            "print one JSON object: the plan and its figures (as kvcore plan --json), the memory "
            "profile, the bytes allocated and each step's time"
        ),
    )
    add_csv_option(parser, "the steps and their milliseconds")
    parser.set_defaults(run=run)


def run(namespace: argparse.Namespace, registry: Registry) -> int:
    args = PlanningArgs.read(namespace)
    if args.plan is not None:
        return run_saved_plan(args, args.plan, registry)
    if (args.memory is None) == (args.utilization is None):
        raise InvalidInputError(
            "give the KV-cache budget as --memory SIZE (fixed) or as --utilization F (a share of the "
            "device's memory, profiled); exactly one of the two"
        )
    from kvcore.engine.local import LocalExecutor
    from kvcore.engine.stand_in import stand_in_model
    from kvcore.engine.workflow import initialize_kv_caches

    timings: list[tuple[str, float]] = []
    start = time.perf_counter()
    args, specs = inputs.load_layer_specs(args, registry)
    timings.append(("read specs", time.perf_counter() - start))

    start = time.perf_counter()
    model = stand_in_model(specs)
    timings.append(("stand-in layers", time.perf_counter() - start))
    executor = LocalExecutor(
        model,
        args.device,
        registry=registry,
        specs=specs,
        utilization=args.utilization or DEFAULT_UTILIZATION,
        kv_cache_bytes=args.memory,
        zero=not args.no_zero,
    )
    what = (
        "planning, allocating and binding"
        if args.utilization is None
        else (f"profiling memory on {args.device} (utilization {args.utilization}), allocating and binding")
    )
    context = inputs.sizing_context(args, auto=True)
    length = inputs.request_length(args)
    with progress(what):
        plan = initialize_kv_caches(
            executor,
            registry=registry,
            policy=args.policy,
            context=context,
            max_model_len=length,
            options=inputs.plan_options(args),
            num_blocks=args.num_blocks,
        )
    timings += [(step, executor.timings[step]) for step in WORKFLOW_STEPS if step in executor.timings]

    from kvcore.runtime.allocation import allocation_sizes

    sizes = allocation_sizes(plan)
    chosen = None
    if length.auto:
        chosen = chosen_length(plan.context.max_model_len, length.cap, inputs.length_cap_name(args))
    if wants_csv(args):
        write_csv(timing_records(timings))
        return 0
    if args.json:
        report = plan_report(plan, specs, registry)
        if chosen is not None:
            report["max_model_len_auto"] = chosen
        print(
            json.dumps(allocation_report(report, executor, sizes, timings, zeroed=not args.no_zero), indent=2)
        )
        return 0
    note = chosen_length_line(chosen) if chosen is not None else ""
    print(format_plan(plan, specs, reason=policy_reason(registry.select(specs, args.policy)), note=note))
    print()
    print(executor.memory_profile)
    print(
        f"allocated {format_bytes(sum(sizes))} ({sum(sizes):,} bytes) on {executor.device} in "
        f"{len(sizes)} tensor(s){'' if args.no_zero else ', zero-filled'}; bound {len(executor.bound)} "
        "layers to stand-in modules"
    )
    print()
    rows = [[step, f"{seconds * 1e3:.1f}"] for step, seconds in timings]
    print(render_table(["step", "ms"], rows, align="lr"))
    return 0


def timing_records(timings: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """The steps table as records for ``--csv``: ``{"step", "ms"}`` in order."""
    return [{"step": step, "ms": seconds * 1e3} for step, seconds in timings]


def allocation_report(
    report: dict[str, Any], executor: Any, sizes: list[int], timings: list[tuple[str, float]], *, zeroed: bool
) -> dict[str, Any]:
    """``kvcore allocate --json``: the plan's report (:func:`~kvcore.cli.report.plan_report`) with
    what allocation did: ``device``, ``memory_profile`` (every field of
    :class:`~kvcore.runtime.memory.MemoryProfile`, or ``null`` for a saved plan),
    ``allocated_bytes``, ``allocated_tensors``, ``zero_filled``, ``bound_layers`` and
    ``timings_ms`` (step -> milliseconds, in order)."""
    profile: Any = getattr(executor, "memory_profile", None)
    return {
        **report,
        "device": str(executor.device),
        "memory_profile": attrs.asdict(profile) if attrs.has(type(profile)) else None,
        "allocated_bytes": sum(sizes),
        "allocated_tensors": len(sizes),
        "zero_filled": zeroed and bool(sizes),
        "bound_layers": len(executor.bound),
        "timings_ms": {step: seconds * 1e3 for step, seconds in timings},
    }


#: Options that a saved plan already fixed; giving one with ``--plan`` is an error.
_PLAN_FIXES = (
    ("memory", "--memory"),
    ("utilization", "--utilization"),
    ("max_model_len", "--max-model-len"),
    ("num_blocks", "--num-blocks"),
    ("block_size", "--block-size"),
    ("tp", "--tp"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("state_dtype", "--state-dtype"),
    ("max_groups", "--max-groups"),
    ("pool_split", "--pool-split"),
)


def run_saved_plan(args: PlanningArgs, path: str, registry: Registry) -> int:
    """``--plan FILE`` (``path``): read and check a saved plan, allocate it, bind stand-in layers."""
    options = attrs.asdict(args, recurse=False)
    given = [flag for dest, flag in _PLAN_FIXES if options[dest] is not None]
    if args.policy != "auto":
        given.append("--policy")
    if args.uniform_block_size:
        given.append("--uniform-block-size")
    if args.block_multiples != "power_of_two":
        given.append("--block-multiples")
    if given:
        raise InvalidInputError(
            f"{', '.join(given)} cannot be combined with --plan: a saved plan fixes its own size and layout"
        )
    from kvcore.cli.check import read_plan_file, summary
    from kvcore.engine.local import LocalExecutor
    from kvcore.engine.stand_in import stand_in_model
    from kvcore.runtime.allocation import allocation_sizes

    timings: list[tuple[str, float]] = []
    start = time.perf_counter()
    plan = read_plan_file(path, registry)
    timings.append(("read and check plan", time.perf_counter() - start))
    specs = {name: group.spec for group in plan.groups for name in group.layer_names}
    start = time.perf_counter()
    model = stand_in_model([*specs, *plan.kv_sharing])
    timings.append(("stand-in layers", time.perf_counter() - start))
    executor = LocalExecutor(
        model,
        args.device,
        registry=registry,
        specs=specs,
        kv_sharing=plan.kv_sharing,
        kv_cache_bytes=plan.available_memory_bytes,
        zero=not args.no_zero,
    )
    with progress(f"allocating and binding {args.plan}"):
        executor.get_kv_cache_spec()
        executor.initialize(plan)
    timings += [(step, executor.timings[step]) for step in WORKFLOW_STEPS if step in executor.timings]
    sizes = allocation_sizes(plan)
    if wants_csv(args):
        write_csv(timing_records(timings))
        return 0
    if args.json:
        report = plan_report(plan, specs, registry)
        print(
            json.dumps(allocation_report(report, executor, sizes, timings, zeroed=not args.no_zero), indent=2)
        )
        return 0
    print(f"{args.plan}: {summary(plan)}")
    print(
        f"allocated {format_bytes(sum(sizes))} ({sum(sizes):,} bytes) on {executor.device} in "
        f"{len(sizes)} tensor(s){'' if args.no_zero or not sizes else ', zero-filled'}; bound "
        f"{len(executor.bound)} layers to stand-in modules"
    )
    print()
    rows = [[step, f"{seconds * 1e3:.1f}"] for step, seconds in timings]
    print(render_table(["step", "ms"], rows, align="lr"))
    return 0
