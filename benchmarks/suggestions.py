"""Do the planner's suggested max_model_len values hold? A grid of full + sliding mixes.

When one request of ``max_model_len`` tokens does not fit, ``InsufficientMemoryError`` says the
largest length that does (``largest_fitting_len``). The promise (issue 12): planning with the
same inputs at the suggestion succeeds, and at the suggestion + 1 fails. This runs a grid of
4,032 configurations: full-attention layers (1 to 20) interleaved with sliding-window layers
(4 to 52; windows 128, 512, 1024, 4096), bf16 8 KV heads x 128, block 16, budgets from 7 % to
93 % of one request's ideal need (plus an odd 12,345 bytes), max_model_len 32,768 and 131,072,
policy auto. For every configuration that is refused it plans at the suggestion and at the
suggestion + 1, and prints how many suggestions are admitted and how many successors are
refused (target: all / all), what the old estimate (the refused plan's own largest fitting
length, blind to the grouping changing with the length) would have got, how many plans a
search took, and the time.

``--exhaustive N`` also checks, for N refused configurations, that no length between the
suggestion and the request (up to the ideal bound, which no layout beats) is admitted:
the suggestion is the largest. It plans every length there, so keep N small.

    python benchmarks/suggestions.py
    python benchmarks/suggestions.py --policy shared_buffer --exhaustive 20
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from kvcore import InsufficientMemoryError, Registry, SizingContext, plan_kv_cache, request_bytes
from kvcore.planning.max_len import memory_bound
from kvcore.planning.planner import longest_admitted
from kvcore.planning.request import PlanRequest
from kvcore.spec import KVCacheSpec
from kvcore.testing.mixes import full, interleave, sliding

FULL_LAYERS = (1, 2, 3, 4, 6, 8, 12, 16, 20)
SLIDING_LAYERS = (4, 7, 12, 18, 24, 30, 36, 52)
WINDOWS = (128, 512, 1024, 4096)
BUDGET_SHARES = (0.07, 0.13, 0.22, 0.37, 0.55, 0.78, 0.93)
LENGTHS = (32768, 131072)


def admitted(
    registry: Registry, specs: dict[str, KVCacheSpec], budget: int, length: int, policy: str
) -> bool:
    try:
        plan_kv_cache(specs, budget, SizingContext(max_model_len=length), registry=registry, policy=policy)
    except InsufficientMemoryError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", default="auto")
    parser.add_argument("--exhaustive", type=int, default=0, metavar="N")
    args = parser.parse_args()
    registry = Registry.default(autoload=False)

    configs = 0
    refused = admissible = successor_refused = old_admissible = 0
    plans: list[int] = []
    search_time = 0.0
    failures: list[str] = []
    exhaustive_checked = exhaustive_wrong = 0
    start = time.perf_counter()
    for n_full, n_sliding, window, share, length in itertools.product(
        FULL_LAYERS, SLIDING_LAYERS, WINDOWS, BUDGET_SHARES, LENGTHS
    ):
        configs += 1
        specs = interleave((n_full, full()), (n_sliding, sliding(window)))
        context = SizingContext(max_model_len=length)
        budget = int(share * request_bytes(specs, context)) + 12_345
        try:
            plan_kv_cache(specs, budget, context, registry=registry, policy=args.policy)
            continue
        except InsufficientMemoryError as exc:
            suggestion = exc.largest_fitting_len
        refused += 1
        # what the search costs (the error above ran it once already; this counts its plans)
        loose = plan_kv_cache(specs, budget, context, registry=registry, policy=args.policy, check_fit=False)
        t0 = time.perf_counter()
        search = longest_admitted(
            PlanRequest.for_context(specs, [budget], context, check_fit=False, policy=args.policy),
            registry=registry,
            estimate=loose.largest_fitting_len(),
        )
        search_time += time.perf_counter() - t0
        plans.append(search.plans)
        assert search.length == suggestion
        old = loose.largest_fitting_len()
        if old == 0 or admitted(registry, specs, budget, old, args.policy):
            old_admissible += 1
        ok = suggestion == 0 or admitted(registry, specs, budget, suggestion, args.policy)
        next_refused = not admitted(registry, specs, budget, suggestion + 1, args.policy)
        admissible += ok
        successor_refused += next_refused
        name = f"{n_full} full + {n_sliding} sw({window}), {budget:,} B, max_model_len {length:,}"
        if not (ok and next_refused):
            failures.append(f"{name}: suggestion {suggestion:,} admitted={ok} next refused={next_refused}")
        if exhaustive_checked < args.exhaustive and refused % 37 == 1:
            exhaustive_checked += 1
            bound = memory_bound([specs], [budget], context) or length
            top = min(length - 1, bound)
            better = next(
                (
                    n
                    for n in range(suggestion + 1, top + 1)
                    if admitted(registry, specs, budget, n, args.policy)
                ),
                None,
            )
            if better is not None:
                exhaustive_wrong += 1
                failures.append(f"{name}: suggestion {suggestion:,} but {better:,} is admitted")
    elapsed = time.perf_counter() - start

    print(
        f"{configs:,} full + sliding configurations (policy {args.policy}), {refused:,} refused at their "
        "max_model_len"
    )
    print(f"  suggestion admitted:         {admissible:,} / {refused:,}")
    print(f"  suggestion + 1 refused:      {successor_refused:,} / {refused:,}")
    print(f"  old estimate admitted:       {old_admissible:,} / {refused:,} (the refused plan's grouping)")
    print(
        f"  plans per search:            median {statistics.median(plans):.0f}, mean "
        f"{statistics.mean(plans):.1f}, max {max(plans)}; {1000 * search_time / len(plans):.1f} ms per search"
    )
    if args.exhaustive:
        print(
            f"  exhaustive check:            {exhaustive_checked - exhaustive_wrong} / {exhaustive_checked} "
            "suggestions are the largest admitted length"
        )
    print(f"  time:                        {elapsed:.1f} s in all")
    for line in failures[:20]:
        print("  FAIL", line)


if __name__ == "__main__":
    main()
