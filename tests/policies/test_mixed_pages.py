"""shared_buffer with mixed-page groups (layers of one retention kind, pages of different
sizes, one block table) and with any block multiple (``PlanOptions.block_multiples``)."""

import pytest

from kvcore import InvalidInputError, PlanOptions, SizingContext, efficiency, plan_kv_cache
from kvcore.planning.invariants import check_plan
from kvcore.planning.planner import plan as plan_request
from kvcore.planning.request import PlanRequest
from kvcore.policies import shared_buffer
from kvcore.testing.mixes import ISSUE_CASES, ISSUE_CONTEXT, three_to_two
from tests.helpers import full, mix, mla, sliding

GIB = 2**30

#: vLLM 0.33's concurrency on the issue's cases, with one group (issue 13).
VLLM = {"OpenELM-like": 31.02, "DeepSeek-V3.2-like": 16.73}


def _shared(registry, specs, budget, context=ISSUE_CONTEXT, **options):
    return plan_kv_cache(
        specs, budget, context, registry=registry, policy="shared_buffer", options=PlanOptions(**options)
    )


@pytest.mark.parametrize("name", list(VLLM))
def test_one_retention_with_several_pages_is_one_group(registry, name):
    specs, budget, context = ISSUE_CASES[name]
    plan = _shared(registry, specs, budget, context)
    (group,) = plan.groups
    assert plan.max_concurrency() >= VLLM[name]
    assert efficiency(plan, specs) >= 0.999
    assert {name: group.spec_of(name) for name in specs} == specs
    check_plan(plan)


def test_mixed_groups_only_where_pages_differ(registry):
    # every retention kind has one spec: the usual layouts, as before
    specs, budget, context = ISSUE_CASES["7 full + 5 sw(2048) + 11 sw(512)"]
    plan = _shared(registry, specs, budget, context)
    assert not any(g.layer_specs for g in plan.groups)


def test_mixed_group_saves_groups_at_equal_capacity(registry, monkeypatch):
    # full attention and MLA (one retention) as one group, the sliding layers cut as usual
    specs = mix((7, full()), (11, sliding(100)), (3, mla()))
    plan = _shared(registry, specs, 4 * GIB)
    mixed = [g for g in plan.groups if g.layer_specs]
    assert len(mixed) == 1 and len(mixed[0].layer_names) == 10
    check_plan(plan)
    # without mixed-page groups: the same capacity takes 11 groups instead of 7
    monkeypatch.setattr(shared_buffer, "_mixed_buckets", lambda *args: None)
    usual = _shared(registry, specs, 4 * GIB)
    assert len(plan.groups) == 7 and len(usual.groups) == 11
    assert plan.max_concurrency() >= usual.max_concurrency()


def test_pipeline_projection_keeps_each_layer_page(registry):
    specs, _, context = ISSUE_CASES["OpenELM-like"]
    names = list(specs)
    stages = [names[:8], names[8:]]
    result = plan_request(
        PlanRequest.for_context(specs, [GIB, GIB], context, policy="shared_buffer", rank_layers=stages),
        registry=registry,
    )
    for plan, layers in zip(result.plans, stages, strict=True):
        (group,) = plan.groups
        assert set(group.layer_names) == set(layers)
        assert all(group.spec_of(name) == specs[name] for name in layers)
        check_plan(plan)
    assert result.plans[0].num_blocks == result.plans[1].num_blocks


def test_any_block_multiple_closes_the_three_to_two_gap(registry):
    specs = three_to_two()
    doubling = _shared(registry, specs, 40 * GIB)
    anything = _shared(registry, specs, 40 * GIB, block_multiples="any")
    assert efficiency(doubling, specs) < 0.92
    assert efficiency(anything, specs) >= 0.99
    assert any(g.spec.block_size & (g.spec.block_size - 1) for g in anything.groups)  # not a power of two
    assert all(g.spec.block_size <= 128 for g in anything.groups)
    check_plan(anything)


def test_any_block_multiple_stays_within_max_block_size(registry):
    specs = three_to_two()
    plan = _shared(registry, specs, 40 * GIB, block_multiples="any", max_block_size=48)
    assert all(g.spec.block_size <= 48 for g in plan.groups)
    check_plan(plan)


def test_any_block_multiple_leaves_uniform_block_size_alone(registry):
    specs = three_to_two()
    plan = _shared(registry, specs, 40 * GIB, block_multiples="any", uniform_block_size=True)
    assert {g.spec.block_size for g in plan.groups} == {16}


def test_default_block_multiples_are_powers_of_two(registry):
    assert PlanOptions().block_multiples == "power_of_two"
    plan = _shared(registry, three_to_two(), 40 * GIB)
    assert all(g.spec.block_size & (g.spec.block_size - 1) == 0 for g in plan.groups)


def test_unknown_block_multiples_is_refused():
    with pytest.raises(InvalidInputError, match="'block_multiples' must be one of 'power_of_two', 'any'"):
        PlanOptions(block_multiples="odd")


def test_small_contexts_plan_with_any_multiple(registry):
    specs = mix((5, sliding(64, heads=3)), (3, full(heads=2)), (2, mla(rank=224, rope=32)))
    plan = _shared(registry, specs, 64 * 2**20, SizingContext(max_model_len=512), block_multiples="any")
    assert efficiency(plan, specs) >= 0.9
    check_plan(plan)
