"""PlanOptions.pool_split: kind_pools' budget split by given fractions, and the split a workload asks for."""

import math

import pytest
from hypothesis import given, strategies as st

from kvcore import InsufficientMemoryError, InvalidInputError, PlanOptions, SizingContext, plan_kv_cache
from kvcore.planning.capacity import split_by_fractions
from kvcore.planning.invariants import check_plan
from kvcore.simulation.workload import Request, Workload
from kvcore.tuning.split import need_split, workload_split
from tests.helpers import full, mix, sliding

GIB = 1 << 30
CTX = SizingContext(max_model_len=8192)
SPECS = mix((2, full()), (10, sliding(1024)))


def _plan(registry, budget=GIB, policy="kind_pools", **options):
    return plan_kv_cache(SPECS, budget, CTX, registry=registry, policy=policy, options=PlanOptions(**options))


def test_the_pools_get_the_shares_asked_for(registry):
    plan = _plan(registry, pool_split=(0.3, 0.7))
    shares = [p.num_blocks * p.bytes_per_block / GIB for p in plan.pools]
    for share, asked, pool in zip(shares, (0.3, 0.7), plan.pools, strict=True):
        assert asked - pool.bytes_per_block / GIB < share <= asked  # rounded down to whole blocks
    assert plan.kv_cache_bytes <= GIB
    check_plan(plan)


def test_a_split_moves_blocks_between_pools(registry):
    low, high = _plan(registry, pool_split=(0.3, 0.7)), _plan(registry, pool_split=(0.6, 0.4))
    assert low.pools[0].num_blocks < high.pools[0].num_blocks
    assert low.pools[1].num_blocks > high.pools[1].num_blocks


@given(
    budget=st.integers(min_value=1, max_value=1 << 40),
    sizes=st.lists(st.integers(min_value=1, max_value=1 << 24), min_size=2, max_size=5),
    weights=st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=5, max_size=5),
)
def test_the_split_never_exceeds_the_budget(budget, sizes, weights):
    fractions = [w / math.fsum(weights[: len(sizes)]) for w in weights[: len(sizes)]]
    counts = split_by_fractions(budget, sizes, fractions)
    assert sum(c * b for c, b in zip(counts, sizes, strict=True)) <= budget
    assert all(c >= 0 for c in counts)


@pytest.mark.parametrize(
    ("split", "words"),
    [
        ((0.5,), "at least 2 pools"),
        ((0.5, 0.6), "sum to 1"),
        ((0.0, 1.0), "in (0, 1)"),
        ((0.5, float("nan")), "in (0, 1)"),
        ("0.5,0.5", "a list of fractions"),
        ((True, 0.5), "in (0, 1)"),
    ],
)
def test_bad_fractions_are_refused_with_the_reason(split, words):
    with pytest.raises(InvalidInputError, match=None) as info:
        PlanOptions(pool_split=split)
    assert words in str(info.value)


def test_a_split_for_the_wrong_number_of_pools_is_refused(registry):
    with pytest.raises(InvalidInputError, match="made 1 block pool"):
        _plan(registry, policy="shared_buffer", pool_split=(0.5, 0.5))
    with pytest.raises(InvalidInputError, match="gives 3 fractions"):
        _plan(registry, pool_split=(0.2, 0.3, 0.5))


def test_a_split_that_starves_a_pool_says_which(registry):
    with pytest.raises(InsufficientMemoryError, match="short in pool"):
        _plan(registry, budget=GIB // 8, pool_split=(0.98, 0.02))


def _workload(prompt, output, count=20):
    return Workload(
        name="w",
        requests=tuple(
            Request(id=i, prompt_tokens=prompt, output_tokens=output, arrival_step=0) for i in range(count)
        ),
    )


def test_a_workload_split_sums_to_one_and_plans(registry):
    plan = _plan(registry)
    split = workload_split(plan, _workload(2000, 200))
    assert math.isclose(sum(split), 1.0) and all(0 < s < 1 for s in split)
    sized = _plan(registry, pool_split=split)
    assert sized.kv_cache_bytes <= GIB and sized.fits()


def test_short_requests_give_the_sliding_pool_more_than_the_worst_case(registry):
    plan = _plan(registry)
    sliding_pool = plan.groups[[g.spec.kind for g in plan.groups].index("sliding_window")].pool
    worst = need_split(plan)[sliding_pool]
    short = workload_split(plan, _workload(256, 64))[sliding_pool]
    long = workload_split(plan, _workload(7000, 64))[sliding_pool]
    # a full-attention pool needs little for short requests; a window's need does not shrink
    assert short > worst and short > long


def test_a_workload_split_needs_several_pools_and_requests(registry):
    one = plan_kv_cache(SPECS, GIB, CTX, registry=registry, policy="shared_buffer")
    with pytest.raises(InvalidInputError, match="several pools"):
        workload_split(one, _workload(100, 10))
    with pytest.raises(InvalidInputError, match="no requests"):
        workload_split(_plan(registry), Workload(name="empty", requests=()))
