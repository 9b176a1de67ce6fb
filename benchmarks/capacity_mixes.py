"""Capacity of each planner on the core issue's seven layer mixes, against the ideal bound.

Setting: 40 GiB, max_model_len 32768, max_num_batched_tokens 2048, block 16, bf16, 8 KV heads x
128. For each mix: the ideal concurrency (no layout can hold more requests of 32768 tokens),
then kvcore's default plan, kvcore with grouping tolerance 0 (capacity above all), and a
vLLM-style grouping (group size = the smallest layer count of a kind, or the largest when it is
below 1.5x the smallest; groups padded to that size), each as concurrency / ideal and groups.

    python benchmarks/capacity_mixes.py
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _mixes import TARGET_MIXES

from kvcore import PlanOptions, Registry, SizingContext, ideal_concurrency, plan_kv_cache
from kvcore.cli.table import render_table
from kvcore.spec import KVCacheSpec, cdiv

GIB = 2**30
BUDGET = 40 * GIB
CONTEXT = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)


def vllm_style(specs: Mapping[str, KVCacheSpec], budget: int, context: SizingContext) -> tuple[float, int]:
    """Concurrency and group count of vLLM's equal-page hybrid grouping (see research notes)."""
    buckets: dict[object, list[KVCacheSpec]] = {}
    for spec in specs.values():
        buckets.setdefault(spec.group_key, []).append(spec)
    counts = [len(b) for b in buckets.values()]
    size = min(counts)
    if max(counts) < 1.5 * min(counts):
        size = max(counts)
    page = next(iter(specs.values())).page_size_bytes
    num_blocks = budget // (page * size)
    groups = [(cdiv(len(b), size), b[0]) for b in buckets.values()]
    per_request = sum(n * cdiv(s.max_memory_usage_bytes(context), page) for n, s in groups)
    return num_blocks / per_request, sum(n for n, _ in groups)


def main() -> None:
    registry = Registry.default(autoload=False)
    rows = []
    worst = 1.0
    for name, specs in TARGET_MIXES.items():
        ideal = ideal_concurrency(specs, BUDGET, CONTEXT)
        default = plan_kv_cache(specs, BUDGET, CONTEXT, registry=registry)
        best = plan_kv_cache(
            specs, BUDGET, CONTEXT, registry=registry, options=PlanOptions(grouping_tolerance=0.0)
        )
        vllm, vllm_groups = vllm_style(specs, BUDGET, CONTEXT)
        ratio = default.max_concurrency() / ideal
        worst = min(worst, ratio)
        rows.append(
            [
                name,
                f"{ideal:.2f}",
                f"{default.max_concurrency():.2f}",
                f"{ratio:.4f}",
                len(default.groups),
                max(g.spec.block_size for g in default.groups),
                f"{best.max_concurrency() / ideal:.4f}",
                len(best.groups),
                f"{vllm / ideal:.4f}",
                vllm_groups,
            ]
        )
    print("40 GiB, max_model_len 32768, max_num_batched_tokens 2048, block 16, bf16, 8 KV heads x 128")
    print(
        render_table(
            [
                "mix",
                "ideal",
                "kvcore",
                "ratio",
                "groups",
                "max block",
                "tol=0 ratio",
                "groups",
                "vLLM-style ratio",
                "groups",
            ],
            rows,
            align="lrrrrrrrrr",
        )
    )
    print(f"\nworst kvcore ratio: {worst:.4f} (target >= 0.99)")


if __name__ == "__main__":
    main()
