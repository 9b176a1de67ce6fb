"""kind_pools: one pool and one mixed-page group per retention kind, the budget split by
worst-case need."""

import itertools

import pytest

from kvcore import GroupLimitError, PlanOptions, SizingContext, efficiency, plan_kv_cache
from kvcore.planning.invariants import check_plan
from kvcore.planning.planner import plan as plan_request
from kvcore.planning.request import PlanRequest
from kvcore.testing.mixes import ISSUE_CASES, openelm_like
from tests.helpers import full, mix, mla, sliding
from tests.policies.test_shared_buffer import CTX, GIB, _State


def _plan(registry, specs, budget=40 * GIB, context=CTX, **kwargs):
    return plan_kv_cache(specs, budget, context, registry=registry, policy="kind_pools", **kwargs)


def test_one_group_and_one_pool_per_retention_kind(registry):
    specs = mix((7, full()), (5, sliding(2048)), (11, sliding(512)))
    plan = _plan(registry, specs)
    assert len(plan.groups) == 3 and len(plan.pools) == 3
    assert sorted(g.pool for g in plan.groups) == [0, 1, 2]
    assert sorted(len(g.layer_names) for g in plan.groups) == [5, 7, 11]
    for group in plan.groups:
        assert len({specs[name].retention_key for name in group.layer_names}) == 1
    check_plan(plan)


def test_pools_never_share_bytes(registry):
    plan = _plan(registry, mix((7, full()), (5, sliding(2048)), (11, sliding(512))))
    ends = [(p.offset, p.offset + p.nbytes) for p in plan.pools]
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(ends))
    assert ends[-1][1] <= plan.kv_cache_bytes <= 40 * GIB


def test_mixed_head_counts_share_one_group(registry):
    specs = openelm_like()
    plan = _plan(registry, specs, GIB, SizingContext(max_model_len=2048))
    (group,) = plan.groups
    assert len(plan.pools) == 1
    for name in specs:
        assert group.spec_of(name) == specs[name]
    assert {group.spec_of(n).page_size_bytes for n in specs} == {s.page_size_bytes for s in specs.values()}
    check_plan(plan)


def test_mla_and_full_attention_share_a_group(registry):
    specs = mix((10, full()), (6, mla()))
    plan = _plan(registry, specs, 8 * GIB)
    assert len(plan.groups) == 1
    assert {s.kind for s in plan.groups[0].specs} == {"full_attention", "mla"}
    assert efficiency(plan, specs) >= 0.999
    check_plan(plan)


def test_states_get_a_pool_of_their_own(registry):
    specs = mix((4, full()), (28, _State()))
    plan = _plan(registry, specs, 80 * GIB, SizingContext(max_model_len=131072))
    assert len(plan.groups) == 2 and len(plan.pools) == 2
    state = next(g for g in plan.groups if g.spec.kind == "test.state")
    attention = next(g for g in plan.groups if g.spec.kind == "full_attention")
    assert state.pool != attention.pool
    assert efficiency(plan, specs) >= 0.999
    check_plan(plan)


@pytest.mark.parametrize("name", list(ISSUE_CASES))
def test_issue_cases_reach_the_bound(registry, name):
    specs, budget, context = ISSUE_CASES[name]
    plan = _plan(registry, specs, budget, context)
    assert efficiency(plan, specs) >= 0.999
    kinds = len({spec.retention_key for spec in specs.values()})
    assert len(plan.groups) == kinds
    check_plan(plan)


def test_max_groups_below_the_kind_count_is_refused(registry):
    specs = mix((7, full()), (5, sliding(2048)), (11, sliding(512)))
    with pytest.raises(GroupLimitError) as info:
        _plan(registry, specs, options=PlanOptions(max_groups=2))
    assert info.value.smallest_groups == 3
    assert len(_plan(registry, specs, options=PlanOptions(max_groups=3)).groups) == 3


def test_pipeline_ranks_agree_on_every_pool(registry):
    specs = mix((8, full()), (16, sliding(1024)), (8, mla()))
    names = list(specs)
    stages = [names[: len(names) // 2], names[len(names) // 2 :]]
    result = plan_request(
        PlanRequest.for_context(specs, [20 * GIB, 16 * GIB], CTX, policy="kind_pools", rank_layers=stages),
        registry=registry,
    )
    first, second = result.plans
    assert len(first.pools) == len(second.pools) == 2
    assert [p.num_blocks for p in first.pools] == [p.num_blocks for p in second.pools]
    assert [g.pool for g in first.groups] == [g.pool for g in second.groups]
    for plan, layers in zip(result.plans, stages, strict=True):
        assert sorted(n for g in plan.groups for n in g.layer_names) == sorted(layers)
        assert plan.kv_cache_bytes <= 20 * GIB
        check_plan(plan)


def test_uniform_block_size_is_honoured(registry):
    specs = mix((6, full(block_size=16)), (18, sliding(1024, block_size=32)), (4, mla(block_size=16)))
    plan = _plan(registry, specs, 8 * GIB, options=PlanOptions(uniform_block_size=True))
    assert {s.block_size for g in plan.groups for s in g.specs} == {32}
    check_plan(plan)


def test_pools_laid_end_to_end_start_aligned_for_their_layers(registry):
    # A bf16 state pool of 2-byte blocks before a float32 attention pool: found by the property
    # test, which allocated it. Every pool's block is a multiple of every pool's alignment.
    from kvcore import allocate
    from kvcore.plugins.state import StatePart, StateSpec

    specs = {
        "model.layers.0": StateSpec(
            block_size=1, parts=(StatePart(name="conv", shape=(1,), dtype="bfloat16"),)
        ),
        "model.layers.1": full(block_size=1, heads=1, head_size=8, dtype="float32"),
    }
    plan = _plan(registry, specs, 4160, SizingContext(max_model_len=64, max_num_batched_tokens=16))
    assert [p.offset % 4 for p in plan.pools] == [0, 0]
    assert plan.pools[0].bytes_per_block == 4  # the 2-byte state page padded to the common alignment
    check_plan(plan)
    views = allocate(plan, "cpu", registry=registry)
    assert views["model.layers.1"].data_ptr() % 4 == 0
