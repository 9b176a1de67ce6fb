"""A request's blocks are its groups' joint peak, and a grouping tolerance never costs length.

12 full + 36 chunked-local(8192) layers at 16k tokens: the chunked groups hold the most in the
middle of a chunk and the full group at the end, so the plan counts the most they hold at one
moment (1,280 blocks), not the sum of each group's worst case (1,472); a block pool driven
through the worst chunking holds exactly that. 1 full + 36 sliding(4096) layers at 938,292,019
bytes: the default grouping tolerance admitted 6,400 tokens where tolerance 0 admits 7,312.
"""

from __future__ import annotations

import itertools

import pytest

from kvcore import BlockPool, InsufficientMemoryError, Registry, SizingContext, plan_kv_cache
from kvcore.peaks import joint_peak, pool_peaks, worst_step
from kvcore.planning.capacity import Capacity
from kvcore.planning.planner import longest_admitted
from kvcore.planning.request import PlanRequest
from kvcore.policy import PlanOptions
from kvcore.runtime.block_pool import NULL_PAGE
from kvcore.testing.mixes import TARGET_MIXES, full, interleave, sliding

GIB = 2**30
REGISTRY = Registry.default(autoload=False)
CHUNKED = dict(TARGET_MIXES["g 12 full + 36 chunked(8192)"])
CONTEXT = SizingContext(max_model_len=16384, max_num_batched_tokens=2048)


def _chunked_plan():
    return plan_kv_cache(CHUNKED, 10 * GIB, CONTEXT, registry=REGISTRY, policy="shared_buffer")


def test_the_plan_counts_the_groups_at_one_moment():
    plan = _chunked_plan()
    summed = sum(g.blocks_per_request(plan.context) for g in plan.groups)
    assert (plan.blocks_per_request(), summed) == (1280, 1472)
    assert plan.blocks_per_request_by_pool() == pool_peaks(plan.groups, 1, plan.context) == (1280,)
    assert plan.max_concurrency() == plan.usable_blocks / 1280
    capacity = Capacity.of(plan, CHUNKED)
    assert capacity.blocks_per_request == 1280
    # the ideal is the layers' joint peak too: no layout holds more requests than it says
    assert capacity.efficiency <= 1.0


def test_a_pool_driven_through_the_worst_chunking_holds_the_joint_peak():
    plan = _chunked_plan()
    length, step = CONTEXT.max_model_len, CONTEXT.max_tokens_per_step
    worst = worst_step([(g.spec, g.blocks_per_page) for g in plan.groups], plan.context)
    pool = BlockPool(plan)
    assert pool.request_blocks_needed(length) == (1280,)
    bounds = [0, *range(worst % step or step, length, step), length]
    pool.reserve("r", 0)
    most = 0
    for start, end in itertools.pairwise(bounds):
        pool.release_stale("r", start)
        pool.reserve("r", end)
        held = sum(page != NULL_PAGE for g in range(len(plan.groups)) for page in pool.block_table("r", g))
        most = max(most, held)
    assert most == plan.blocks_per_request() == 1280


def test_equal_specs_count_once_times_their_weight():
    spec = full()
    context = SizingContext(max_model_len=1000)
    assert joint_peak([(spec, 3), (spec, 4)], context) == 7 * spec.max_num_blocks(context)
    assert joint_peak([], context) == 0


def test_the_default_tolerance_admits_as_long_a_request_as_tolerance_zero():
    specs = interleave((1, full()), (36, sliding(4096)))
    budget = 938_292_019
    context = SizingContext(max_model_len=131072)
    exact = longest_admitted(
        PlanRequest.for_context(
            specs, [budget], context, check_fit=False, options=PlanOptions(grouping_tolerance=0)
        ),
        registry=REGISTRY,
    )
    default = longest_admitted(
        PlanRequest.for_context(specs, [budget], context, check_fit=False), registry=REGISTRY
    )
    assert default.length == exact.length == 7312
    plan = plan_kv_cache(specs, budget, context.with_max_model_len(7312), registry=REGISTRY)
    assert plan.fits()
    with pytest.raises(InsufficientMemoryError) as caught:
        plan_kv_cache(specs, budget, context.with_max_model_len(7313), registry=REGISTRY)
    assert caught.value.largest_fitting_len == 7312


@pytest.mark.parametrize(
    ("n_full", "n_sliding", "window", "share"),
    [(1, 36, 4096, 0.35), (2, 30, 1024, 0.6), (4, 46, 512, 0.85), (8, 12, 4096, 0.6), (20, 52, 128, 0.35)],
)
def test_a_tolerance_never_shortens_the_longest_request(n_full, n_sliding, window, share):
    specs = interleave((n_full, full()), (n_sliding, sliding(window)))
    context = SizingContext(max_model_len=32768)
    probe = plan_kv_cache(specs, 2**40, context, registry=REGISTRY)
    budget = int(share * probe.blocks_per_request() * probe.bytes_per_block) + 12_345
    lengths = [
        longest_admitted(
            PlanRequest.for_context(
                specs, [budget], context, check_fit=False, options=PlanOptions(grouping_tolerance=t)
            ),
            registry=REGISTRY,
        )
        for t in (0.0, 0.005, 0.05)
    ]
    assert lengths[1].length >= lengths[0].length and lengths[2].length >= lengths[0].length
