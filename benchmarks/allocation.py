"""Plan + allocate + bind on the CPU, against a bare torch allocation of the same bytes.

For each depth the model repeats Gemma's pattern (5 sliding(1024) : 1 full attention) and the
KV cache gets the same byte budget. Two tables:

- **time**: the median of several runs of kvcore's path (``plan_kv_cache`` + ``allocate`` +
  ``bind_to_modules`` on stand-in modules) next to ``torch.empty`` of the same total bytes, in
  the same process, alternating. With zero-fill (kvcore's default) the baseline fills its
  tensor too; the target is a ratio <= 1.2x. Without fill ``torch.empty`` only maps memory
  (microseconds), so that row shows kvcore's fixed cost in milliseconds rather than a ratio
  that means anything.
- **peak memory**: in a fresh subprocess per depth (so peaks do not mix), how far the resident
  set grew at its peak during kvcore's path with zero-fill, against the KV bytes; the target is
  <= KV bytes + 5 % (no hidden copies).

    python benchmarks/allocation.py [--kv-bytes 1GiB] [--layers 32 100 320 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

import torch

from kvcore import Registry, SizingContext, allocate, bind_to_modules, parse_size, plan_kv_cache
from kvcore.cli.table import render_table
from kvcore.engine.stand_in import stand_in_model
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.runtime.allocation import allocation_sizes
from kvcore.runtime.memory import HostMemory
from kvcore.spec import KVCacheSpec
from kvcore.units import format_bytes

CONTEXT = SizingContext(max_model_len=2048, max_num_batched_tokens=512)
ATTN = {"block_size": 16, "num_kv_heads": 1, "head_size": 64, "dtype": "bfloat16"}


def model_specs(num_layers: int) -> dict[str, KVCacheSpec]:
    """Gemma's pattern to ``num_layers``: every sixth layer full attention, the rest sliding(1024)."""
    full = FullAttentionSpec(**ATTN)
    window = SlidingWindowSpec(**ATTN, sliding_window=1024)
    return {f"model.layers.{i}.self_attn": full if i % 6 == 5 else window for i in range(num_layers)}


def kvcore_path(
    specs: dict[str, KVCacheSpec], kv_bytes: int, registry: Registry, model: torch.nn.Module, zero: bool
) -> int:
    """Plan, allocate and bind; return the bytes allocated (the views stay bound on ``model``)."""
    plan = plan_kv_cache(specs, kv_bytes, CONTEXT, registry=registry)
    views = allocate(plan, "cpu", registry=registry, zero=zero)
    bind_to_modules(model, views)
    return sum(allocation_sizes(plan))


def bare(nbytes: int, zero: bool) -> torch.Tensor:
    tensor = torch.empty(nbytes, dtype=torch.uint8)
    if zero:
        tensor.zero_()
    return tensor


def unbind(model: torch.nn.Module) -> None:
    for module in model.modules():
        if "kv_cache" in module.__dict__:
            del module.kv_cache


def time_depth(
    num_layers: int, kv_bytes: int, repeats: int, zero: bool, registry: Registry
) -> tuple[float, float, int]:
    """Median seconds of kvcore's path and of the bare allocation, and the bytes allocated."""
    specs = model_specs(num_layers)
    model = stand_in_model(specs)
    ours, theirs = [], []
    allocated = 0
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        allocated = kvcore_path(specs, kv_bytes, registry, model, zero)
        ours.append(time.perf_counter() - start)
        unbind(model)
        gc.collect()
        start = time.perf_counter()
        tensor = bare(allocated, zero)
        theirs.append(time.perf_counter() - start)
        del tensor
    return statistics.median(ours), statistics.median(theirs), allocated


def child(num_layers: int, kv_bytes: int) -> None:
    """Run kvcore's path once with zero-fill; print the resident-set growth at its peak."""
    registry = Registry.default(autoload=False)
    specs = model_specs(num_layers)
    model = stand_in_model(specs)
    plan_kv_cache(specs, kv_bytes, CONTEXT, registry=registry)  # warm caches (imports, layout hooks)
    gc.collect()
    probe = HostMemory()
    before = probe.rss_bytes()
    probe.reset_peak()
    allocated = kvcore_path(specs, kv_bytes, registry, model, zero=True)
    print(json.dumps({"growth": probe.peak_bytes() - before, "allocated": allocated}))


def peak_growth(num_layers: int, kv_bytes: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(num_layers), "--kv-bytes", str(kv_bytes)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kv-bytes", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--layers", type=int, nargs="+", default=[32, 100, 320, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.kv_bytes)
        return

    registry = Registry.default(autoload=False)
    print(
        f"KV cache {format_bytes(args.kv_bytes)} per depth, torch {torch.__version__}, "
        f"median of {args.repeats} runs\n"
    )
    rows = []
    for layers in args.layers:
        for zero in (True, False):
            ours, theirs, allocated = time_depth(layers, args.kv_bytes, args.repeats, zero, registry)
            ratio = ours / theirs
            rows.append(
                [
                    layers,
                    "zero-fill" if zero else "no fill",
                    format_bytes(allocated),
                    f"{ours * 1e3:.1f}",
                    f"{theirs * 1e3:.2f}",
                    f"{(ours - theirs) * 1e3:.1f}",
                    f"{ratio:.2f}x" + ("  ok" if ratio <= 1.2 else "  over") if zero else f"{ratio:.0f}x",
                ]
            )
    print("time (median)")
    print(
        render_table(
            [
                "layers",
                "fill",
                "bytes",
                "kvcore ms",
                "torch.empty ms",
                "overhead ms",
                "ratio (target <= 1.2x)",
            ],
            rows,
            align="rlrrrrl",
        )
    )
    peaks = []
    for layers in args.layers:
        seen = peak_growth(layers, args.kv_bytes)
        ratio = seen["growth"] / seen["allocated"]
        peaks.append(
            [
                layers,
                format_bytes(seen["allocated"]),
                format_bytes(seen["growth"]),
                f"{ratio:.4f}" + ("  ok" if ratio <= 1.05 else "  over"),
            ]
        )
    print("\npeak resident-set growth, zero-fill, fresh process per depth")
    print(
        render_table(
            ["layers", "KV bytes", "peak RSS growth", "growth / KV (target <= 1.05)"], peaks, align="rrrl"
        )
    )


if __name__ == "__main__":
    main()
