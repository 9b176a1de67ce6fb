"""Moving pages to a host tier and back: batched index copies against the bytes they move.

A Llama-3.1-8B-like cache (32 full-attention layers of 8 KV heads of 128, bfloat16, 2 MiB a
block of 16 tokens; ``--layers`` and ``--heads`` shrink it) is planned and allocated on the
device (the CPU, or ``--device cuda``), given a host tier (pinned on CUDA), and batches of
pages are sent out and brought back with :class:`kvcore.runtime.host_tier.HostTier`. The table
gives, per batch size, the median time of ``offload`` and of ``restore`` and their bandwidth
(block bytes moved / time), and the share of the GPU catalogue's host link that is, where a
``--gpu`` is named (on a real GPU, the link's peak is the bound: PCIe Gen5 x16 63 GB/s each
way). Copies are one ``index_select`` and one ``index_copy_`` per layer part per batch, each
moving the batch's pages through one temporary: beside them, ``copy GB/s`` is one plain copy of
the same bytes from device to host (``torch.Tensor.copy_`` of a contiguous buffer), the most a
copy could reach here; the target is offload and restore within 3x of it at 16 pages and more
(one gather and one scatter each, where the plain copy does neither).

    python benchmarks/host_tier.py [--device cpu|cuda] [--layers 32] [--heads 8] [--gpu H100] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvcore import Registry, SizingContext, allocate, plan_kv_cache
from kvcore.cli.table import render_table
from kvcore.planning.offload import with_host_memory
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.runtime.host_tier import HostTier
from kvcore.simulation.gpus import find_gpu, host_link
from kvcore.units import format_bytes

BATCHES = (1, 16, 256)


def _timed(run, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu", default=None, help="a catalogue GPU whose host link to compare with")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    registry = Registry.default()
    spec = FullAttentionSpec(block_size=16, num_kv_heads=args.heads, head_size=128, dtype="bfloat16")
    specs = {f"layers.{i}": spec for i in range(args.layers)}
    per_block = spec.page_size_bytes * args.layers
    num_blocks = 2 * max(BATCHES) + 8
    context = SizingContext(max_model_len=1024)
    plan = plan_kv_cache(specs, num_blocks * per_block, context, registry=registry, num_blocks=num_blocks)
    plan = with_host_memory(plan, (max(BATCHES) + 8) * per_block)
    views = allocate(plan, device, registry=registry)
    tier = HostTier(plan, views, registry=registry)
    link = host_link(find_gpu(args.gpu)) if args.gpu else None
    rows = []
    for batch in BATCHES:
        pages = list(range(1, 1 + batch))

        def out(pages: list[int] = pages) -> None:
            tier.release(0, tier.offload(0, pages))  # the release only gives rows back

        out()  # warm up
        t_out = _timed(out, device, args.repeats)
        slots = tier.offload(0, pages)
        back = [p + batch for p in pages]

        def restore(slots: list[int] = slots, back: list[int] = back) -> None:
            tier.restore(0, slots, back)

        t_in = _timed(restore, device, args.repeats)
        tier.release(0, slots)
        moved = batch * per_block
        source = torch.empty(moved, dtype=torch.uint8, device=device)
        target = torch.empty(moved, dtype=torch.uint8, pin_memory=tier.pin_memory)

        def plain(target: torch.Tensor = target, source: torch.Tensor = source) -> None:
            target.copy_(source)

        t_copy = _timed(plain, device, args.repeats)
        row = [
            batch,
            format_bytes(moved),
            f"{t_out * 1e3:.2f}",
            f"{moved / t_out / 1e9:.2f}",
            f"{t_in * 1e3:.2f}",
            f"{moved / t_in / 1e9:.2f}",
            f"{moved / t_copy / 1e9:.2f}",
        ]
        if link is not None:
            row.append(f"{moved / max(t_out, t_in) / link.bytes_per_second:.1%}")
        rows.append(row)
    headers = ["pages", "bytes", "offload ms", "out GB/s", "restore ms", "in GB/s", "copy GB/s"]
    if link is not None:
        headers.append(f"of {link.name} ({link.gbps_each_way:.1f} GB/s)")
    print(
        f"{args.layers} layers x {format_bytes(spec.page_size_bytes)} = {format_bytes(per_block)} a block on "
        f"{device}; host memory {'pinned' if tier.pin_memory else 'plain'}, {format_bytes(tier.nbytes)}"
    )
    print(render_table(headers, rows))


if __name__ == "__main__":
    main()
