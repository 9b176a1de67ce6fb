"""Planning for vLLM when a state page spans several block ids: the (state groups, block factor)
shapes :func:`~kvcore.integrations.vllm.rules.plan_for_vllm` tries (no vLLM needed)."""

from __future__ import annotations

from kvcore.errors import KVCoreError
from kvcore.integrations.vllm import rules
from kvcore.integrations.vllm.rules import VllmRules, page_span, plan_for_vllm, split_states
from kvcore.planning.planner import plan_kv_cache
from kvcore.testing.mixes import state_hybrid

GiB = 2**30


def _every_shape(specs, memory, vllm, registry, most_factor):
    """The best concurrency over every (k, f), k = 1 .. the state layers, f = 1 .. most_factor:
    the exhaustive search the shapes stand in for."""
    states = [name for name, spec in specs.items() if not spec.page_scales_with_block_size]
    best = 0.0
    for count in range(1, len(states) + 1):
        tagged = split_states(specs, states, count)
        for factor in range(1, most_factor + 1):
            try:
                plan = plan_kv_cache(
                    rules.scale_blocks(tagged, factor) if factor > 1 else tagged,
                    memory,
                    vllm.context(),
                    registry=registry,
                    policy="shared_buffer",
                    options=vllm.options(),
                )
            except KVCoreError:
                continue
            if page_span(plan) == 1:
                best = max(best, plan.max_concurrency())
    return best


def test_the_shapes_tried_hold_as_many_requests_as_every_shape(registry):
    # 14 state layers (hidden 2,048) and 2 full: a state group's page spans several block ids
    specs = state_hybrid(16, hidden=2048)
    vllm = VllmRules(max_model_len=8192)
    plan = plan_for_vllm(vllm.request(specs, 4 * GiB, policy="shared_buffer"), vllm, registry=registry)
    every = _every_shape(specs, 4 * GiB, vllm, registry, most_factor=32)
    assert page_span(plan) == 1 and every > 0
    assert plan.max_concurrency() >= every


def test_a_few_shapes_per_state_group_width(registry):
    # 112 state layers: the widths ceil(112 / k) take about 2 sqrt(112) values, a few factors each
    shapes = rules._shapes(state_hybrid(128))
    assert len({k for k, _ in shapes}) == len({-(-112 // m) for m in range(1, 113)})
    assert len(shapes) < 20 * 21
