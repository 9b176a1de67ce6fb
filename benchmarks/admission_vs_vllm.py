"""The longest request kvcore admits beside vLLM's, over a grid of full + sliding mixes.

A grouping tolerance (``PlanOptions.grouping_tolerance``, 0.5 % by default) may cost a little
concurrency for fewer groups; it must never make the longest admitted request shorter. This
runs 4,212 configurations: full-attention layers (9 counts, 1 to 20) interleaved with
sliding-window layers (13 counts, 1 to 52; windows 128, 512, 1024, 4096), bf16 8 KV heads x 128,
block 16, max_model_len 8,192, 32,768 and 131,072 (the cap of the search), budgets of 35 %,
60 % and 85 % of one request's ideal need at that length plus an odd 12,345 bytes (so the
longest admitted request is usually below the cap); steps of 2,048 tokens.

For each it finds:

- kvcore: the longest request ``plan_kv_cache`` admits with the default options (policy
  ``auto``; :func:`kvcore.planning.planner.longest_admitted`), and with
  ``grouping_tolerance=0``;
- vLLM: the longest request vLLM 0.33's rule admits (no vLLM needed): its grouping of the
  layers (``_vllm_style.vllm_groups``: one page size, group size from the smallest kind),
  ``budget // bytes per block id`` block ids less the null block, and a request admitted when
  every group's own worst case (``max_admission_blocks_per_request``, synchronous scheduling)
  fits, summed over the groups
  (:func:`kvcore.integrations.vllm.rules.vllm_pages_per_request`).

It prints how many configurations kvcore admits a shorter request than vLLM (target 0), how
many the default admits shorter than tolerance 0 (target 0), the issue's example (1 full + 36
sliding(4096) at 938,292,019 bytes) and the time; exits 1 when a target is missed.

    python benchmarks/admission_vs_vllm.py
"""

from __future__ import annotations

import itertools
import sys
import time

from _vllm_style import vllm_groups, vllm_pages

from kvcore import Registry, SizingContext, request_bytes
from kvcore.planning.max_len import longest_between
from kvcore.planning.planner import longest_admitted
from kvcore.planning.request import PlanRequest
from kvcore.policy import PlanOptions
from kvcore.spec import KVCacheSpec
from kvcore.testing.mixes import full, interleave, sliding

FULL_LAYERS = (1, 2, 3, 4, 6, 8, 12, 16, 20)
SLIDING_LAYERS = (1, 4, 5, 7, 10, 12, 18, 24, 30, 36, 40, 46, 52)
WINDOWS = (128, 512, 1024, 4096)
BUDGET_SHARES = (0.35, 0.6, 0.85)
LENGTHS = (8192, 32768, 131072)
STEP = 2048
EXACT = PlanOptions(grouping_tolerance=0.0)


def kvcore_longest(
    registry: Registry, specs: dict[str, KVCacheSpec], budget: int, cap: int, options: PlanOptions | None
) -> int:
    """The longest request up to ``cap`` kvcore's planner admits."""
    context = SizingContext(max_model_len=cap, max_num_batched_tokens=STEP)
    return longest_admitted(
        PlanRequest.for_context(specs, [budget], context, check_fit=False, options=options), registry=registry
    ).length


def vllm_longest(specs: dict[str, KVCacheSpec], budget: int, cap: int) -> int:
    """The longest request up to ``cap`` vLLM's rule admits (0: none, or vLLM refuses the layers)."""
    grouping = vllm_groups(specs)
    if grouping is None:
        return 0
    usable = budget // grouping.row_bytes - 1  # block 0 is vLLM's null block

    def admits(length: int) -> bool:
        context = SizingContext(max_model_len=length, max_num_batched_tokens=STEP)
        return vllm_pages(grouping, context) <= usable

    # the need grows with the length: bisect between 0 (trivially admitted) and a refused cap
    return cap if admits(cap) else longest_between(admits, 0, cap)


def main() -> int:
    registry = Registry.default(autoload=False)
    configs = shorter = shorter_exact = traded = 0
    worst: list[tuple[int, str]] = []
    start = time.perf_counter()
    for n_full, n_sliding, window, share, length in itertools.product(
        FULL_LAYERS, SLIDING_LAYERS, WINDOWS, BUDGET_SHARES, LENGTHS
    ):
        configs += 1
        specs = interleave((n_full, full()), (n_sliding, sliding(window)))
        context = SizingContext(max_model_len=length, max_num_batched_tokens=STEP)
        budget = int(share * request_bytes(specs, context)) + 12_345
        vllm = vllm_longest(specs, budget, length)
        kvcore = kvcore_longest(registry, specs, budget, length, None)
        exact = kvcore_longest(registry, specs, budget, length, EXACT)
        if kvcore < vllm:
            shorter += 1
            what = f"{n_full} full + {n_sliding} sliding({window}), {budget:,} B, cap {length:,}"
            worst.append((vllm - kvcore, what))
        shorter_exact += exact < vllm
        traded += kvcore < exact
    elapsed = time.perf_counter() - start
    example = interleave((1, full()), (36, sliding(4096)))
    budget = 938_292_019
    print(f"{configs:,} full + sliding configurations, steps of {STEP:,} tokens ({elapsed:.1f} s)")
    print(f"  kvcore (default options) admits a shorter request than vLLM: {shorter:,} (target 0)")
    print(f"  kvcore (grouping_tolerance=0) admits a shorter request than vLLM: {shorter_exact:,}")
    print(f"  the default admits a shorter request than tolerance 0: {traded:,} (target 0)")
    for gap, what in sorted(worst, reverse=True)[:5]:
        print(f"    {what}: {gap:,} tokens shorter")
    print(
        f"1 full + 36 sliding(4096) at {budget:,} bytes, cap 131,072: vLLM admits "
        f"{vllm_longest(example, budget, 131072):,} tokens, kvcore "
        f"{kvcore_longest(registry, example, budget, 131072, None):,} "
        f"(tolerance 0: {kvcore_longest(registry, example, budget, 131072, EXACT):,})"
    )
    return 1 if shorter or traded else 0


if __name__ == "__main__":
    sys.exit(main())
