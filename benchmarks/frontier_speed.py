"""What ``kvcore compare --frontier`` costs: plans made and time per policy, up to 10,000 layers.

:func:`kvcore.planning.frontier.policy_frontier` plans one policy under tighter and tighter
group bounds. Its work is bounded: the bound halves above 16 groups and steps down one group at
a time below, and it makes at most 32 plans. For four mixes at 1,000 and 10,000 layers, each
row gives the policy's own plan time, the frontier's time, the plans it made, the points it
kept (groups: efficiency), and the frontier's time in units of one plan (target: at most 32,
whatever the depth; on the Mamba-like ``1 full : 7 state`` hybrid, seconds at 10,000 layers), e.g.

    taskset -c 0 python benchmarks/frontier_speed.py
"""

from __future__ import annotations

import time

from kvcore import PlanOptions, Registry, SizingContext, plan_kv_cache
from kvcore.cli.table import render_table
from kvcore.errors import KVCoreError
from kvcore.planning import frontier as frontier_module
from kvcore.planning.frontier import MAX_PLANS, policy_frontier
from kvcore.planning.request import PlanRequest
from kvcore.spec import KVCacheSpec
from kvcore.testing.mixes import full, sliding, state

CONTEXT = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)
GiB = 2**30
DEPTHS = (1_000, 10_000)
MIXES = {
    "gemma 5sw:1full": [sliding(1024)] * 5 + [full()],
    "sw1024 / sw4096 / full": [
        sliding(1024),
        sliding(4096),
        sliding(1024),
        sliding(4096),
        sliding(1024),
        full(),
    ],
    "7 full : 5 sw2048 : 11 sw512": [full()] * 7 + [sliding(2048)] * 5 + [sliding(512)] * 11,
    # a Mamba-like hybrid: its state group's page spans several block ids (target: seconds)
    "1 full : 7 state": [state()] * 7 + [full()],
}
POLICIES = ("shared_buffer", "equal_groups", "kind_pools")


def _layers(pattern: list[KVCacheSpec], depth: int) -> dict[str, KVCacheSpec]:
    # one layer short of a whole number of patterns, so that equal groups cannot divide evenly
    return {f"model.layers.{i}": pattern[i % len(pattern)] for i in range(depth - 1)}


def main() -> None:
    registry = Registry.default(autoload=False)
    real = frontier_module.plan_request
    rows = []
    for mix, pattern in MIXES.items():
        for depth in DEPTHS:
            specs = _layers(pattern, depth)
            memory = 40 * GiB * depth // 100
            for policy in POLICIES:
                start = time.perf_counter()
                try:
                    plan_kv_cache(
                        specs,
                        memory,
                        CONTEXT,
                        registry=registry,
                        policy=policy,
                        options=PlanOptions(grouping_tolerance=0),
                    )
                except KVCoreError as exc:
                    rows.append([mix, depth, policy, "-", "-", "-", f"no plan: {type(exc).__name__}", "-"])
                    continue
                one = time.perf_counter() - start
                calls = 0

                def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
                    nonlocal calls
                    calls += 1
                    return real(*args, **kwargs)

                frontier_module.plan_request = counting  # type: ignore[assignment]
                try:
                    start = time.perf_counter()
                    points = policy_frontier(
                        PlanRequest.for_context(specs, memory, CONTEXT, policy=policy), registry=registry
                    )
                    took = time.perf_counter() - start
                finally:
                    frontier_module.plan_request = real
                shown = ", ".join(f"{p.groups}: {p.efficiency:.4f}" for p in points)
                rows.append(
                    [
                        mix,
                        f"{depth:,}",
                        policy,
                        f"{one * 1e3:.1f}",
                        f"{took * 1e3:.1f}",
                        calls,
                        shown,
                        f"{took / one:.1f}" if one else "-",
                    ]
                )
    print(
        render_table(
            [
                "mix",
                "layers",
                "policy",
                "plan ms",
                "frontier ms",
                "plans",
                "points (groups: efficiency)",
                "x plan",
            ],
            rows,
            align="lrlrrrlr",
        )
    )
    print(f"\nat most {MAX_PLANS} plans per frontier; the 'x plan' column stays below that at every depth")


if __name__ == "__main__":
    main()
