"""A policy's frontier of capacity against group count: Pareto points, each the policy's own best
layout within the bound, at bounded cost."""

from __future__ import annotations

import itertools

import pytest

from kvcore import PlanOptions, SizingContext, plan_kv_cache
from kvcore.errors import InvalidInputError, KVCoreError
from kvcore.planning import frontier as frontier_module
from kvcore.planning.frontier import DENSE_GROUPS, policy_frontier
from kvcore.planning.request import PlanRequest
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec

GiB = 2**30
CONTEXT = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)


def _three_kinds(layers: int) -> dict:
    """Full attention every sixth layer, sliding windows of 1024 and 4096 between: a layout of
    thousands of groups at grouping tolerance 0."""
    specs = _gemma(layers)
    wide = SlidingWindowSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=4096
    )
    return {name: wide if i % 6 != 5 and i % 2 == 0 else spec for i, (name, spec) in enumerate(specs.items())}


def _gemma(layers: int) -> dict:
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    sliding = SlidingWindowSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=1024
    )
    return {f"model.layers.{i}.attn": full if i % 6 == 5 else sliding for i in range(layers)}


@pytest.mark.parametrize("policy", ["shared_buffer", "equal_groups", "kind_pools"])
def test_points_are_pareto_and_each_is_the_policys_best_within_its_bound(registry, policy):
    specs = _gemma(32)
    points = policy_frontier(
        PlanRequest.for_context(specs, 40 * GiB, CONTEXT, policy=policy), registry=registry
    )
    assert points
    for first, second in itertools.pairwise(points):
        assert second.groups < first.groups
        assert second.max_concurrency < first.max_concurrency
    best = plan_kv_cache(
        specs, 40 * GiB, CONTEXT, registry=registry, policy=policy, options=PlanOptions(grouping_tolerance=0)
    )
    assert points[0].max_concurrency == pytest.approx(best.max_concurrency())
    for point in points:
        plan = plan_kv_cache(
            specs,
            40 * GiB,
            CONTEXT,
            registry=registry,
            policy=policy,
            options=PlanOptions(grouping_tolerance=0, max_groups=point.groups),
        )
        assert len(plan.groups) == point.groups and len(plan.pools) == point.pools
        assert plan.max_concurrency() == pytest.approx(point.max_concurrency)
        assert 0 < point.efficiency <= 1 + 1e-9
    # below the last point the policy has no layout (or the frontier reached one group)
    if points[-1].groups > 1:
        with pytest.raises(KVCoreError):
            plan_kv_cache(
                specs,
                40 * GiB,
                CONTEXT,
                registry=registry,
                policy=policy,
                options=PlanOptions(grouping_tolerance=0, max_groups=points[-1].groups - 1),
            )


def test_a_policy_that_cannot_plan_has_no_frontier(registry):
    assert (
        policy_frontier(
            PlanRequest.for_context(_gemma(12), 40 * GiB, CONTEXT, policy="uniform"), registry=registry
        )
        == ()
    )


def test_the_work_is_bounded_on_a_model_of_thousands_of_groups(registry, monkeypatch):
    calls: list[int | None] = []
    real = frontier_module.plan_request

    def counting(request, **kwargs):
        calls.append(request.options.max_groups)
        return real(request, **kwargs)

    monkeypatch.setattr(frontier_module, "plan_request", counting)
    points = policy_frontier(
        PlanRequest.for_context(_three_kinds(3001), 400 * GiB, CONTEXT, policy="equal_groups"),
        registry=registry,
    )
    assert points[0].groups > 1000
    # the bound halves above DENSE_GROUPS groups, then steps down one at a time
    assert len(calls) <= 12 + DENSE_GROUPS
    assert calls[0] is None and all(b is not None for b in calls[1:])
    calls.clear()
    policy_frontier(
        PlanRequest.for_context(_three_kinds(3001), 400 * GiB, CONTEXT, policy="equal_groups"),
        registry=registry,
        max_plans=3,
    )
    assert len(calls) == 3
    with pytest.raises(InvalidInputError):
        policy_frontier(
            PlanRequest.for_context(_gemma(6), GiB, CONTEXT, policy="shared_buffer"),
            registry=registry,
            max_plans=0,
        )


def test_frontier_point_json(registry):
    (point,) = policy_frontier(
        PlanRequest.for_context(_gemma(12), 40 * GiB, CONTEXT, policy="kind_pools"), registry=registry
    )
    assert point.to_dict() == {
        "groups": 2,
        "pools": 2,
        "max_concurrency": point.max_concurrency,
        "efficiency": point.efficiency,
    }
