"""``kvcore allocate``: plan, allocate for real on a device, bind to stand-in layers, and time it."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterable
from typing import Any

import torch

from kvcore.cli import inputs
from kvcore.cli.progress import progress
from kvcore.cli.report import format_plan, policy_reason
from kvcore.cli.table import render_table
from kvcore.engine.local import LocalExecutor
from kvcore.errors import InvalidInputError
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.runtime.allocation import allocation_sizes
from kvcore.runtime.memory import DEFAULT_UTILIZATION
from kvcore.units import format_bytes

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
            "memory (profiled)."
        ),
    )
    inputs.add_spec_source(parser)
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
    inputs.add_planning_options(parser, memory_required=False)
    parser.add_argument("--no-zero", action="store_true", help="do not zero-fill the allocated memory")
    parser.set_defaults(run=run)


class StandIn(torch.nn.Module):
    """A module with no parameters that only receives a bound view (``kv_cache``)."""


def stand_in_model(layer_names: Iterable[str]) -> torch.nn.Module:
    """A tree of :class:`StandIn` modules in which every layer name is a qualified module name."""
    root = StandIn()
    nodes: dict[str, torch.nn.Module] = {"": root}
    for name in layer_names:
        path = ""
        for part in name.split("."):
            parent, path = nodes[path], f"{path}.{part}" if path else part
            if path not in nodes:
                nodes[path] = StandIn()
                parent.add_module(part, nodes[path])
    return root


def run(args: argparse.Namespace, registry: Registry) -> int:
    if (args.memory is None) == (args.utilization is None):
        raise InvalidInputError(
            "give the KV-cache budget as --memory SIZE (fixed) or as --utilization F (a share of the "
            "device's memory, profiled); exactly one of the two"
        )
    timings: list[tuple[str, float]] = []
    start = time.perf_counter()
    specs = inputs.load_layer_specs(args, registry)
    timings.append(("read specs", time.perf_counter() - start))

    start = time.perf_counter()
    model = stand_in_model(specs)
    executor = LocalExecutor(
        model,
        args.device,
        registry=registry,
        specs=specs,
        utilization=args.utilization or DEFAULT_UTILIZATION,
        kv_cache_bytes=args.memory,
        zero=not args.no_zero,
    )
    executor.get_kv_cache_spec()
    timings.append(("stand-in layers", time.perf_counter() - start))

    start = time.perf_counter()
    if args.utilization is None:  # a fixed budget: nothing to profile
        memory = executor.determine_available_memory()
    else:
        with progress(f"profiling memory on {args.device} (utilization {args.utilization})"):
            memory = executor.determine_available_memory()
    timings.append(("memory", time.perf_counter() - start))

    start = time.perf_counter()
    plan = plan_kv_cache(
        specs,
        memory,
        inputs.sizing_context(args),
        registry=registry,
        policy=args.policy,
        options=inputs.plan_options(args),
        num_blocks=args.num_blocks,
    )
    timings.append(("plan", time.perf_counter() - start))

    with progress(f"allocating and binding {format_bytes(plan.kv_cache_bytes)} on {args.device}"):
        executor.initialize(plan)
    timings += [(step, executor.timings[step]) for step in ("allocate", "bind")]

    sizes = allocation_sizes(plan)
    print(format_plan(plan, specs, reason=policy_reason(specs, args.policy)))
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
