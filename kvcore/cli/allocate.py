"""``kvcore allocate``: plan, allocate for real on a device, bind to stand-in layers, and time it."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.cli import inputs
from kvcore.cli.command import Command
from kvcore.cli.options import PlanningArgs
from kvcore.cli.progress import progress
from kvcore.cli.report import chosen_length, chosen_length_line, format_plan, plan_report, policy_reason
from kvcore.cli.table import add_output_options, render_table, wants_csv, write_csv
from kvcore.errors import InvalidInputError
from kvcore.optional_dependencies import require
from kvcore.planning.registry import Registry
from kvcore.planning.request import MaxModelLen
from kvcore.runtime import DEFAULT_UTILIZATION
from kvcore.units import format_bytes

if TYPE_CHECKING:  # the engine (and torch) load only when the command runs
    from kvcore.engine.local import LocalExecutor
    from kvcore.plan import KVCachePlan
    from kvcore.spec import KVCacheSpec

#: The workflow's steps as :func:`~kvcore.initialize_kv_caches` times them, in order.
WORKFLOW_STEPS = ("specs", "memory", "plan", "allocate", "bind", "warmup")

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def device_arg(text: str) -> str:
    """argparse type: ``cpu``, ``cuda`` or ``cuda:N``."""
    if not _DEVICE.match(text.strip()):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text.strip()


COMMAND = Command(
    help="plan, allocate on a device and bind stand-in layers; print sizes and timings",
    description="""
        Plan the KV cache for a spec file, allocate it for real on a device, bind every layer's view to a
        stand-in module, and print the plan, the bytes allocated and the time each step took. Give the budget
        as --memory SIZE, or as --utilization F of the device's memory (profiled). With --plan FILE, allocate
        a saved plan instead (checked first; it fixes its own size, so no --memory, --utilization or
        --max-model-len).
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    inputs.add_spec_source(parser, plan_file=True)
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument(
        "--utilization",
        type=inputs.utilization,
        metavar="F",
        help=(
            "size the KV cache from the device's memory: this share of the GPU's total (CUDA) or of "
            f"the memory available now (cpu), minus what is in use; vLLM's default is {DEFAULT_UTILIZATION}"
        ),
    )
    inputs.add_planning_options(parser, memory_required=False, length_required=False)
    parser.add_argument("--no-zero", action="store_true", help="do not zero-fill the allocated memory")
    json_help = (
        "print one JSON object: the plan and its figures (as kvcore plan --json), the memory "
        "profile, the bytes allocated and each step's time"
    )
    add_output_options(parser, "the steps and their milliseconds", json_help=json_help)


def run(namespace: argparse.Namespace, registry: Registry) -> int:
    require("torch", "kvcore allocate (allocating and binding a KV cache)")
    args = PlanningArgs.read(namespace)
    if args.plan is not None:
        return run_saved_plan(args, args.plan, registry)
    if (args.memory is None) == (args.utilization is None):
        raise InvalidInputError(
            "give the KV-cache budget as --memory SIZE (fixed) or as --utilization F (a share of the "
            "device's memory, profiled); exactly one of the two"
        )
    from kvcore.engine.workflow import initialize_kv_caches

    timings: list[tuple[str, float]] = []
    with timed(timings, "read specs"):
        args, specs = inputs.load_layer_specs(args, registry)
    utilization = args.utilization or DEFAULT_UTILIZATION
    executor = stand_in_executor(args, registry, specs, timings, memory=args.memory, utilization=utilization)
    what = (
        "planning, allocating and binding"
        if args.utilization is None
        else (f"profiling memory on {args.device} (utilization {args.utilization}), allocating and binding")
    )
    context = inputs.sizing_context(args, auto=True)
    length = MaxModelLen(context.max_model_len, auto=args.max_model_len == "auto")
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
    chosen = None
    if length.auto:
        chosen = chosen_length(plan.context.max_model_len, length.cap, inputs.length_cap_name(args))

    def head() -> list[str]:
        note = chosen_length_line(chosen) if chosen is not None else ""
        reason = policy_reason(registry.select(specs, args.policy))
        return [format_plan(plan, specs, reason=reason, note=note), "", str(executor.memory_profile)]

    return report_allocation(args, registry, plan, specs, executor, timings, head=head, auto_length=chosen)


@contextmanager
def timed(timings: list[tuple[str, float]], step: str) -> Iterator[None]:
    """Time the ``with`` block as ``step``: appended to ``timings`` when it ends."""
    start = time.perf_counter()
    yield
    timings.append((step, time.perf_counter() - start))


def stand_in_executor(
    args: PlanningArgs,
    registry: Registry,
    specs: Mapping[str, KVCacheSpec],
    timings: list[tuple[str, float]],
    *,
    memory: int | None,
    utilization: float = DEFAULT_UTILIZATION,
    kv_sharing: Mapping[str, str] | None = None,
) -> LocalExecutor:
    """A :class:`~kvcore.engine.local.LocalExecutor` on ``--device`` over stand-in modules for
    ``specs`` and the ``kv_sharing`` layers, zero-filling unless ``--no-zero``; building the
    modules is timed as ``stand-in layers``.

    Args:
        memory: the KV-cache budget (``None``: ``utilization`` of the device's memory, profiled).
        utilization: the share of the device's memory a profiled budget takes.
        kv_sharing: ``{layer: layer whose cache it reads}`` of a saved plan.
    """
    from kvcore.engine.local import LocalExecutor
    from kvcore.engine.stand_in import stand_in_model

    with timed(timings, "stand-in layers"):
        model = stand_in_model([*specs, *(kv_sharing or {})])
    return LocalExecutor(
        model,
        args.device,
        registry=registry,
        specs=specs,
        kv_sharing=kv_sharing,
        utilization=utilization,
        kv_cache_bytes=memory,
        zero=not args.no_zero,
    )


def report_allocation(
    args: PlanningArgs,
    registry: Registry,
    plan: KVCachePlan,
    specs: Mapping[str, KVCacheSpec],
    executor: LocalExecutor,
    timings: Sequence[tuple[str, float]],
    *,
    head: Callable[[], list[str]],
    auto_length: dict[str, Any] | None = None,
) -> int:
    """Print what allocation did, as ``--csv`` (the steps), ``--json``
    (:func:`allocation_report`; ``max_model_len_auto`` is ``auto_length``, how
    ``--max-model-len auto`` chose, where it did) or the report: the lines ``head()`` gives (made
    only for the report), the bytes allocated and the layers bound, and the steps table.

    Returns:
        The exit status, 0.
    """
    from kvcore.runtime.allocation import allocation_sizes

    # the steps timed here, then those the executor timed itself, in the workflow's order
    own = executor.timings
    timings = [*timings, *((step, own[step]) for step in WORKFLOW_STEPS if step in own)]
    sizes = allocation_sizes(plan)
    zeroed = not args.no_zero and bool(sizes)
    if wants_csv(args):
        write_csv(timing_records(timings))
        return 0
    if args.json:
        report = plan_report(plan, specs, registry)
        if auto_length is not None:
            report["max_model_len_auto"] = auto_length
        print(json.dumps(allocation_report(report, executor, sizes, timings, zeroed=zeroed), indent=2))
        return 0
    for line in head():
        print(line)
    print(
        f"allocated {format_bytes(sum(sizes))} ({sum(sizes):,} bytes) on {executor.device} in "
        f"{len(sizes)} tensor(s){', zero-filled' if zeroed else ''}; bound {len(executor.bound)} "
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

    timings: list[tuple[str, float]] = []
    with timed(timings, "read and check plan"):
        plan = read_plan_file(path, registry)
    specs = {name: group.spec for group in plan.groups for name in group.layer_names}
    memory = plan.available_memory_bytes
    executor = stand_in_executor(args, registry, specs, timings, memory=memory, kv_sharing=plan.kv_sharing)
    with progress(f"allocating and binding {args.plan}"):
        executor.get_kv_cache_spec()
        executor.initialize(plan)
    head = [f"{args.plan}: {summary(plan)}"]
    return report_allocation(args, registry, plan, specs, executor, timings, head=lambda: head)
