"""The longest request kvcore admits is never shorter than the one vLLM 0.33 admits.

vLLM's figure is its own: its planner (``get_kv_cache_configs``, synchronous scheduling) at
a length either makes a config or raises because one request does not fit; the longest
length it makes one for is found by bisection. kvcore's is its planner's longest admitted
length with the default options (a grouping tolerance of 0.5 %, which may cost concurrency
but never length). The sample is drawn from the grid of ``benchmarks/admission_vs_vllm.py``,
which counts the whole grid with vLLM's rule modelled.
"""

from __future__ import annotations

import pytest

from kvcore import Registry, SizingContext, request_bytes
from kvcore.integrations.vllm import admission
from kvcore.integrations.vllm.rules import VllmRules
from kvcore.planning.max_len import longest_between
from kvcore.planning.planner import longest_admitted
from kvcore.planning.request import PlanRequest
from kvcore.policy import PlanOptions
from kvcore.testing.mixes import full, interleave, sliding

REGISTRY = Registry.default(autoload=False)
STEP = 2048


def vllm_longest(specs, budget, cap):
    """The longest request up to ``cap`` vLLM's own planner admits (0: none)."""

    def admits(length):
        rules = VllmRules(max_model_len=length, max_num_batched_tokens=STEP, async_scheduling=False)
        try:
            admission.vllm_own_config(admission.vllm_layer_specs(specs, rules), budget, rules)
        except ValueError:
            return False
        return True

    return cap if admits(cap) else longest_between(admits, 0, cap)


def kvcore_longest(specs, budget, cap, options=None):
    context = SizingContext(max_model_len=cap, max_num_batched_tokens=STEP)
    return longest_admitted(
        PlanRequest.for_context(specs, [budget], context, check_fit=False, options=options), registry=REGISTRY
    ).length


def test_the_tolerance_no_longer_trades_admission_where_vllm_admits_more():
    # 1 full + 36 sliding(4096) layers: the tolerant grouping admitted 6,400 tokens here
    specs = interleave((1, full()), (36, sliding(4096)))
    budget = 938_292_019
    assert vllm_longest(specs, budget, 131072) == 7296
    exact = kvcore_longest(specs, budget, 131072, PlanOptions(grouping_tolerance=0.0))
    assert kvcore_longest(specs, budget, 131072) == exact >= 7296


@pytest.mark.parametrize(
    ("n_full", "n_sliding", "window", "share", "cap"),
    [
        (1, 4, 128, 0.35, 32768),
        (2, 10, 512, 0.6, 8192),
        (3, 36, 4096, 0.85, 32768),
        (4, 24, 1024, 0.35, 131072),
        (6, 5, 4096, 0.6, 131072),
        (12, 46, 512, 0.85, 32768),
        (16, 1, 1024, 0.35, 8192),
        (20, 52, 128, 0.6, 131072),
    ],
)
def test_kvcore_admits_at_least_vllms_longest_request(n_full, n_sliding, window, share, cap):
    specs = interleave((n_full, full()), (n_sliding, sliding(window)))
    budget = int(share * request_bytes(specs, SizingContext(max_model_len=cap, max_num_batched_tokens=STEP)))
    budget += 12_345
    assert kvcore_longest(specs, budget, cap) >= vllm_longest(specs, budget, cap)
