"""How planning time grows with the number of layers, per layer mix and per built-in policy.

Three mixes, each repeated to 1,000, 2,000, 5,000 and 10,000 layers:

- ``all full``: every layer full attention (``uniform`` applies);
- ``gemma 5sw:1full``: the Gemma pattern, 5 sliding(1024) layers then 1 full;
- ``3 windows + full``: sliding(512), sliding(1024), sliding(4096) and full in turn;
- ``1 full : 7 state``: a Mamba-like hybrid, seven state layers (311,296-byte states) then
  one full (its state group's page spans several block ids; target: within 2x the Gemma
  mix's time at 10,000 layers, printed below the table).

Each row is one mix and one policy (``uniform`` only where every layer has one spec): the
median of several :func:`kvcore.plan_kv_cache` calls at each depth (CPU time of this process,
``time.process_time``: planning is single-threaded, and a busy machine does not inflate it),
then the time per layer at each depth, so planning that is linear in the layers shows as a flat
run of per-layer figures.
The target (issue 11): 10,000 layers in under 50 ms on one core, e.g.

    taskset -c 0 python benchmarks/planning_speed.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from kvcore import Registry, SizingContext, plan_kv_cache
from kvcore.cli.table import render_table
from kvcore.spec import KVCacheSpec
from kvcore.testing.mixes import full, sliding, state

CONTEXT = SizingContext(max_model_len=32768)
DEPTHS = (1_000, 2_000, 5_000, 10_000)
TARGET_MS = 50.0


#: ``--distinct-specs``: one spec object per layer (equal, not identical) instead of one per
#: kind as the config front ends make them; planning then hashes each layer's spec once.
DISTINCT = False


def _repeat(pattern: list[KVCacheSpec]) -> Callable[[int], dict[str, KVCacheSpec]]:
    def build(num_layers: int) -> dict[str, KVCacheSpec]:
        def spec(i: int) -> KVCacheSpec:
            kind = pattern[i % len(pattern)]
            return kind.with_block_size(kind.block_size) if DISTINCT else kind

        return {f"model.layers.{i}": spec(i) for i in range(num_layers)}

    return build


MIXES: dict[str, tuple[Callable[[int], dict[str, KVCacheSpec]], tuple[str, ...]]] = {
    "all full": (_repeat([full()]), ("uniform", "shared_buffer", "equal_groups")),
    "gemma 5sw:1full": (_repeat([*[sliding(1024)] * 5, full()]), ("shared_buffer", "equal_groups")),
    "3 windows + full": (
        _repeat([sliding(512), sliding(1024), sliding(4096), full()]),
        ("shared_buffer", "equal_groups"),
    ),
    "1 full : 7 state": (_repeat([*[state()] * 7, full()]), ("shared_buffer", "kind_pools")),
}


def budget(num_layers: int) -> int:
    """80 GiB per 64 layers: about ten requests of 32,768 tokens in every mix."""
    return 80 * 2**30 * max(1, num_layers // 64)


def time_plan(
    specs: dict[str, KVCacheSpec], policy: str, registry: Registry, repeat: int
) -> tuple[float, int]:
    """Median seconds of ``repeat`` plans, and the plan's group count."""
    times = []
    groups = 0
    for _ in range(repeat):
        start = time.process_time()
        plan = plan_kv_cache(specs, budget(len(specs)), CONTEXT, registry=registry, policy=policy)
        times.append(time.process_time() - start)
        groups = len(plan.groups)
    return statistics.median(times), groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="plans per cell; the median is shown")
    parser.add_argument(
        "--distinct-specs", action="store_true", help="one spec object per layer instead of one per kind"
    )
    args = parser.parse_args()
    global DISTINCT
    DISTINCT = args.distinct_specs
    registry = Registry.default(autoload=False)
    rows = []
    at_10k: dict[tuple[str, str], float] = {}
    for mix, (build, policies) in MIXES.items():
        models = {depth: build(depth) for depth in DEPTHS}
        for policy in policies:
            seconds = []
            groups = 0
            for depth in DEPTHS:
                median, groups = time_plan(models[depth], policy, registry, args.repeat)
                seconds.append(median)
            at_10k[mix, policy] = seconds[-1]
            rows.append(
                [
                    mix,
                    policy,
                    groups,
                    *(f"{s * 1e3:.1f}" for s in seconds),
                    *(f"{s / d * 1e6:.2f}" for s, d in zip(seconds, DEPTHS, strict=True)),
                    "yes" if seconds[-1] * 1e3 < TARGET_MS else "NO",
                ]
            )
    labels = [f"{d // 1000}k" for d in DEPTHS]
    print(
        render_table(
            [
                "mix",
                "policy",
                "groups",
                *(f"{label} ms" for label in labels),
                *(f"us/layer {label}" for label in labels),
                f"10k < {TARGET_MS:.0f} ms",
            ],
            rows,
            align="llr" + "r" * (2 * len(DEPTHS)) + "r",
        )
    )
    print(
        f"median CPU time of {args.repeat} plans per cell; max_model_len {CONTEXT.max_model_len:,}, "
        f"80 GiB per 64 layers; {'one spec object per layer' if DISTINCT else 'one spec object per kind'}"
    )
    ratio = at_10k["1 full : 7 state", "shared_buffer"] / at_10k["gemma 5sw:1full", "shared_buffer"]
    print(
        f"shared_buffer at {DEPTHS[-1]:,} layers: the state hybrid takes {ratio:.2f}x the Gemma mix's time "
        f"(target <= 2x): {'yes' if ratio <= 2 else 'NO'}"
    )


if __name__ == "__main__":
    main()
