"""Capacity of each planner on the core issue's seven layer mixes, against the ideal bound.

Setting: 40 GiB, max_model_len 32768, max_num_batched_tokens 2048, block 16, bf16, 8 KV heads x
128. For each mix: the ideal concurrency (no layout can hold more requests of 32768 tokens),
then kvcore's default plan, kvcore with grouping tolerance 0 (capacity above all), and a
vLLM-style grouping (``_vllm_style.py``: group size = the smallest layer count of a kind, or the
largest when it is below 1.5x the smallest; groups padded to that size), each as
concurrency / ideal and groups.

    python benchmarks/capacity_mixes.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _vllm_style import vllm_style

from kvcore import PlanOptions, Registry, SizingContext, ideal_concurrency, plan_kv_cache
from kvcore.cli.table import render_table
from kvcore.testing.mixes import TARGET_MIXES

GIB = 2**30
BUDGET = 40 * GIB
CONTEXT = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)


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
