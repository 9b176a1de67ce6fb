"""equal_groups: equal-size groups over one page size, one contiguous tensor per layer slot."""

import pytest
from hypothesis import given, strategies as st

from kvcore import PolicyNotApplicableError, SizingContext, efficiency, plan_kv_cache
from kvcore.planning.invariants import check_plan
from kvcore.policies.equal_groups import _sizes_worth_scoring
from kvcore.spec import cdiv
from tests.helpers import full, mix, mla, sliding
from tests.policies.test_shared_buffer import CTX, GIB, TARGET_MIXES


@pytest.mark.parametrize("name", list(TARGET_MIXES))
def test_target_mixes_reach_the_bound_with_more_groups(registry, name):
    specs = TARGET_MIXES[name]
    plan = plan_kv_cache(specs, 40 * GIB, CTX, registry=registry, policy="equal_groups")
    shared = plan_kv_cache(specs, 40 * GIB, CTX, registry=registry, policy="shared_buffer")
    assert efficiency(plan, specs) >= 0.99
    assert len(plan.groups) >= len(shared.groups)
    check_plan(plan)


def test_tensor_i_holds_layer_i_of_every_group_contiguously(registry):
    specs = mix((4, full()), (6, sliding(64)))
    plan = plan_kv_cache(
        specs, GIB, SizingContext(max_model_len=4096), registry=registry, policy="equal_groups"
    )
    page = full().page_size_bytes
    width = max(len(g.layer_names) for g in plan.groups)
    assert plan.bytes_per_block == width * page and not plan.single_buffer
    assert len(plan.tensors) == width
    for i, tensor in enumerate(plan.tensors):
        assert tensor.page_stride == page and tensor.size == plan.num_blocks * page
        assert tensor.shared_by == tuple(g.layer_names[i] for g in plan.groups if len(g.layer_names) > i)


def test_padding_costs_capacity_that_shared_buffer_keeps(registry):
    # Gemma-3's 10 full + 52 sliding in 7 groups: groups of 10 pad the last sliding group (2 + 8
    # empty slots); shared_buffer gives those 2 layers 64-token blocks instead
    from kvcore import PlanOptions

    specs = mix((10, full()), (52, sliding(1024)))
    loose = PlanOptions(grouping_tolerance=0.05)
    padded = plan_kv_cache(specs, 40 * GIB, CTX, registry=registry, policy="equal_groups", options=loose)
    rows = plan_kv_cache(specs, 40 * GIB, CTX, registry=registry, policy="shared_buffer")
    assert len(padded.groups) == len(rows.groups) == 7
    assert round(efficiency(padded, specs), 4) == 0.9518  # (10*2048 + 52*193) / (10 * (2048 + 6*193))
    assert efficiency(rows, specs) > 0.99


def test_refuses_pages_of_different_sizes(registry):
    with pytest.raises(PolicyNotApplicableError, match=r"one size, but 'model\.layers\.0' has pages of"):
        plan_kv_cache(mix((2, full()), (2, mla())), GIB, CTX, registry=registry, policy="equal_groups")


@given(st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=4))
def test_every_group_size_that_can_win_is_scored(layer_counts):
    # a size can win only where some kind's group count drops (the smallest size of each run
    # of equal counts); scoring O(sqrt(n)) sizes must still score all of those
    scored = set(_sizes_worth_scoring(layer_counts))
    largest = max(layer_counts)
    assert scored <= set(range(1, largest + 1))
    for size in range(2, largest + 1):
        if any(cdiv(n, size) != cdiv(n, size - 1) for n in layer_counts):
            assert size in scored
    assert 1 in scored


def test_ten_thousand_layers_score_few_sizes():
    assert len(_sizes_worth_scoring([10_000])) < 250
