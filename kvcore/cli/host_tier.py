"""``kvcore simulate --host-memory SIZE[,SIZE...]``: a host tier under each plan, and the tier
curve.

One size gives every candidate plan a host tier of that much host memory
(:func:`~kvcore.planning.offload.with_host_memory`) and adds the tier's figures to the report;
a comma list runs one simulation per size and prints the tier curve: per plan and size, the
hit rate (and the share the host gave), the bytes moved each way, tokens per step and, with a
step-time model, TTFT and tokens per second. The ``vllm`` scheduler profile (the default)
simulates the tier as vLLM's native CPU offloading (``--kv-offloading-size``), the ``kvcore``
one as kvcore's own host tier and the ``sglang`` one as SGLang's HiCache (a profile says so with
``simulates_host_tier``), only with prefix caching (the tier keeps cached blocks): other settings
are refused, never ignored.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from kvcore.cli.figures import line_panels
from kvcore.cli.inputs import comma_list, size
from kvcore.cli.memory_map import check_map_path
from kvcore.cli.options import PlanningArgs
from kvcore.cli.replay import Simulated, plan_label, served_tokens_per_step, simulation_row, variant_cells
from kvcore.cli.table import render_table
from kvcore.errors import InvalidInputError
from kvcore.planning.compare import Candidate
from kvcore.planning.offload import with_host_memory
from kvcore.simulation.timing import LatencyReport
from kvcore.units import format_bytes


def host_sizes(text: str) -> tuple[int, ...]:
    """argparse type: one byte size or a comma list of them (``0,16GiB,64GiB``), each as
    :func:`~kvcore.cli.inputs.size` reads it, no size twice."""
    sizes = tuple(int(value) for value in comma_list(text, size))  # int(): no unit echoed per size
    if len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"a size is given twice in {text!r}")
    return sizes


def add_host_memory_option(parser: argparse.ArgumentParser, *, curve: bool) -> None:
    """``--host-memory``: with ``curve`` (``kvcore simulate``), ``SIZE[,SIZE...]``, the tier to
    simulate under each plan or a curve of them (stored as ``host_memories``); else
    (``kvcore plan``) one ``SIZE``, the tier to plan (``host_memory``, 0 for none)."""
    if not curve:
        help_text = "also plan a host tier of this much host memory (e.g. 64GiB), shared among the pools"
        parser.add_argument("--host-memory", type=size, default=0, metavar="SIZE", help=help_text)
        return
    parser.add_argument(
        "--host-memory",
        dest="host_memories",
        type=host_sizes,
        default=(),
        metavar="SIZE[,SIZE...]",
        help=(
            "give each plan a host tier of this much host memory (e.g. 64GiB) that keeps the cached "
            "pages (blocks, state checkpoints) the device evicts and brings them back on a hit (needs "
            "--prefix-caching; --scheduler vllm simulates vLLM's CPU offloading, --kv-offloading-size); a "
            "comma list (0,16GiB,64GiB) prints the tier curve, one simulation per size"
        ),
    )


def check_host_memory(args: PlanningArgs, profile: Any) -> None:
    """Refuse ``--host-memory`` where it would be ignored.

    Raises:
        InvalidInputError: the scheduler profile does not simulate a host tier (``kvcore`` and
            ``sglang``, SGLang's HiCache, do), or prefix caching is off.
    """
    if not args.host_memories:
        return
    if not getattr(profile, "simulates_host_tier", False):
        raise InvalidInputError(
            "--host-memory is simulated by the vllm, kvcore and sglang scheduler profiles (the "
            f"{profile.name} profile does not model a host tier): add --scheduler vllm (vLLM's CPU "
            "offloading), --scheduler kvcore, or --scheduler sglang (SGLang's HiCache), or drop "
            "--host-memory"
        )
    if not args.prefix_caching:
        raise InvalidInputError(
            "--host-memory keeps the cached blocks the device evicts: add --prefix-caching (and a workload "
            "with shared prefixes: a trace's prefix ids, or --prefix-share)"
        )


def with_tier(candidates: Sequence[Candidate], nbytes: int) -> list[Candidate]:
    """The candidates, each plan with a host tier of ``nbytes`` (``0``: none).

    Raises:
        InvalidInputError: ``nbytes`` cannot hold one page of a plan (the message says the least
            that serves it).
    """
    return [
        c if c.plan is None else attrs.evolve(c, plan=with_host_memory(c.plan, nbytes)) for c in candidates
    ]


def tier_lines(simulated: Sequence[Simulated]) -> list[str]:
    """One line per plan with a host tier: its hits per tier and the bytes moved."""
    lines = []
    for s in simulated:
        tier = s.result.host_tier
        if tier is None:
            continue
        label = " ".join(str(cell) for cell in variant_cells(s.candidate))
        moved = f"{format_bytes(tier.offloaded_bytes)} to the host, {format_bytes(tier.restored_bytes)} back"
        seconds = (
            f", {s.result.host_transfer_seconds:,.3f} s on the host link (an estimate: its peak, no overlap)"
            if s.result.host_transfer_seconds
            else ""
        )
        lines.append(
            f"  host tier {label}: {tier.host_blocks:,} blocks; hit tokens {tier.device_hit_tokens:,} on the "
            f"device, {tier.host_hit_tokens:,} from the host ({tier.host_hits:,} requests); {moved}{seconds}"
        )
    return lines


@attrs.frozen
class CurvePoint:
    """One plan's run at one host-memory size."""

    nbytes: int
    simulated: Simulated
    latency: LatencyReport | None


def curve_row(point: CurvePoint) -> dict[str, Any]:
    """A curve point as JSON: the size, the plan's variant and its simulation's figures."""
    policy, block, dtype = variant_cells(point.simulated.candidate)
    row: dict[str, Any] = {
        "host_memory_bytes": point.nbytes,
        "policy": policy,
        "block_size": block,
        "kv_cache_dtype": dtype,
        # every point names its tier's figures, the point without a tier too
        "simulation": {
            "host_tier": None,
            "host_transfer_seconds": 0.0,
            **simulation_row(point.simulated.result),
        },
    }
    if point.latency is not None:
        row["simulation"]["latency"] = point.latency.to_dict()
    return row


def print_curve(points: Sequence[CurvePoint]) -> None:
    """The tier curve: one row per plan and size."""
    timed = any(p.latency is not None for p in points)
    headers = [
        "policy",
        "block",
        "kv dtype",
        "host memory",
        "prefix hits",
        "from host",
        "to host",
        "back",
        "tokens/step",
        *(["TTFT p50", "p99", "tokens/s", "link s"] if timed else []),
    ]
    rows = []
    for p in points:
        r = p.simulated.result
        tier = r.host_tier
        host_share = tier.host_hit_tokens / max(r.cached_tokens, 1) if tier is not None else 0.0
        row = [
            *variant_cells(p.simulated.candidate),
            format_bytes(p.nbytes) if p.nbytes else "0",
            f"{100 * r.prefix_hit_rate:.1f}%",
            f"{100 * host_share:.1f}%",
            format_bytes(tier.offloaded_bytes) if tier is not None else "0",
            format_bytes(tier.restored_bytes) if tier is not None else "0",
            f"{served_tokens_per_step(r):,.1f}",
        ]
        if timed:
            lat = p.latency
            row += (
                [
                    f"{lat.ttft.p50 * 1e3:,.1f} ms",
                    f"{lat.ttft.p99 * 1e3:,.1f} ms",
                    f"{lat.output_tokens_per_second:,.0f}",
                    f"{r.host_transfer_seconds:,.3f}",
                ]
                if lat is not None
                else ["", "", "", ""]
            )
        rows.append(row)
    print(render_table(headers, rows, align="lll" + "r" * (len(headers) - 3)))
    print(
        "prefix hits = prompt tokens found cached, device or host; from host = the share of them the host "
        "tier gave; to host / back = bytes moved"
        + (
            "; link s = seconds the moves add at the host link's peak after each step's compute "
            "(an estimate, like the roofline)"
            if timed
            else ""
        )
    )


#: The curve's picture, as error messages name it.
CURVE_PLOT = "the tier curve plot"


def render_curve_plot(points: Sequence[CurvePoint], path: str | os.PathLike[str], *, title: str = "") -> Path:
    """Draw the tier curve: prefix hits (top) and TTFT p50 with a step-time model, else
    tokens per step (bottom), against host memory, one line per plan.

    Raises:
        InvalidInputError: as :func:`~kvcore.cli.memory_map.check_map_path`, or the file
            cannot be written.
    """
    out = check_map_path(path, what=CURVE_PLOT)
    timed = all(p.latency is not None for p in points)
    lines: dict[str, list[CurvePoint]] = {}
    for p in points:
        lines.setdefault(plan_label(p.simulated.candidate), []).append(p)
    with line_panels(out, what=CURVE_PLOT, title=title, size=(7, 5)) as (top, bottom):
        for label, line in lines.items():
            sizes = [p.nbytes / 2**30 for p in line]
            top.plot(sizes, [100 * p.simulated.result.prefix_hit_rate for p in line], marker="o", label=label)
            below = [
                p.latency.ttft.p50
                if p.latency is not None and timed
                else served_tokens_per_step(p.simulated.result)
                for p in line
            ]
            bottom.plot(sizes, below, marker="o", label=label)
        top.set_ylabel("prefix hits (%)", fontsize=8)
        bottom.set_ylabel("TTFT p50 (s)" if timed else "tokens/step", fontsize=8)
        bottom.set_xlabel("host memory (GiB)", fontsize=8)
    return out
