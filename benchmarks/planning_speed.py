"""How planning time grows with the number of layers.

Each model repeats a hybrid pattern (5 sliding(1024) : 1 full, plus one chunked(8192) layer in
every 12) to the given depth; the table shows the median of several plans and the time per
layer, so linear growth shows as a flat last column.

    python benchmarks/planning_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _mixes import chunked, full, sliding

from kvcore import Registry, SizingContext, plan_kv_cache
from kvcore.cli.table import render_table
from kvcore.spec import KVCacheSpec

CONTEXT = SizingContext(max_model_len=32768)


def model(num_layers: int) -> dict[str, KVCacheSpec]:
    kinds = [sliding(1024), full(), chunked(8192)]
    pattern = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 2]
    return {f"model.layers.{i}": kinds[pattern[i % len(pattern)]] for i in range(num_layers)}


def main() -> None:
    registry = Registry.default(autoload=False)
    rows = []
    for layers in (32, 100, 1_000, 10_000):
        specs = model(layers)
        budget = 80 * 2**30 * max(1, layers // 64)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            plan = plan_kv_cache(specs, budget, CONTEXT, registry=registry)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        rows.append(
            [layers, len(plan.groups), f"{median * 1e3:.1f}", f"{median / layers * 1e6:.1f}"]
        )
    print(render_table(["layers", "groups", "plan ms (median of 5)", "us per layer"], rows, align="rrrr"))


if __name__ == "__main__":
    main()
