"""The reserved null block (``PlanOptions.reserve_null_block``): block id 0 pads block tables,
is never handed to a request, still takes its bytes, and costs the capacity figures one block
(or, with state pages spanning an aligned run, the run that holds it). The simulations state
the ``kvcore`` scheduler profile's rules (the default is ``vllm``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from kvcore import (
    InsufficientMemoryError,
    InvalidInputError,
    PlanOptions,
    PlanValidationError,
    SizingContext,
    model_layer_specs,
    plan_kv_cache,
    simulate,
)
from kvcore.planning.admission import check_admission
from kvcore.planning.invariants import check_plan
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.planning.serialization import plan_from_dict, plan_to_dict
from kvcore.runtime.block_pool import BlockPool
from kvcore.simulation.workload import Request, Workload
from tests.helpers import full, mix, sliding

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
NULL = PlanOptions(reserve_null_block=True)


def _plan(specs, length=320, *, num_blocks=None, options=NULL, policy="auto", step=2048):
    context = SizingContext(max_model_len=length, max_num_batched_tokens=step)
    return plan_kv_cache(
        specs, 2**36, context, registry=REGISTRY, policy=policy, options=options, num_blocks=num_blocks
    )


ONE_LAYER = {"model.layers.0": full(block_size=16)}


def test_off_by_default_and_every_block_serves():
    plan = _plan(ONE_LAYER, num_blocks=100, options=None)
    assert plan.null_block is None
    assert (plan.reserved_blocks, plan.usable_blocks) == (0, 100)
    assert "null_block" not in plan_to_dict(plan, REGISTRY)  # plans without one read as before


def test_a_hundred_blocks_less_the_null_block_hold_four_requests_of_twenty_blocks():
    plan = _plan(ONE_LAYER, num_blocks=100)
    assert (plan.null_block, plan.num_blocks, plan.usable_blocks) == (0, 100, 99)
    assert plan.kv_cache_bytes == 100 * plan.bytes_per_block  # its pages are still allocated
    assert plan.max_concurrency() == 99 / 20
    assert plan.tokens_held(plan.groups[0]) == 99 * 16
    workload = Workload(tuple(Request(i, 319, 1, 0) for i in range(8)), name="same")
    result = simulate(plan, workload, scheduler="kvcore")
    assert result.peak_running == 4  # five without the null block


def test_admission_counts_the_usable_blocks():
    plan = _plan(ONE_LAYER, num_blocks=20, options=None)
    check_admission(plan)  # 20 blocks hold one request of 20 blocks
    with pytest.raises(InsufficientMemoryError) as caught:
        _plan(ONE_LAYER, num_blocks=20)
    assert caught.value.required_blocks == 20 and caught.value.available_blocks == 19


def test_the_pool_never_hands_out_the_null_block():
    plan = _plan(ONE_LAYER, num_blocks=100)
    pool = BlockPool(plan)
    assert (pool.num_free_blocks, pool.num_usable_blocks, pool.owner(0)) == (99, 99, None)
    taken = pool.allocate(0, 99)
    assert 0 not in taken and sorted(taken) == list(range(1, 100))
    with pytest.raises(InvalidInputError, match="null block"):
        pool.free(0, [0])
    pool.free(0, taken)
    assert pool.num_free_blocks == 99


def test_with_aligned_state_runs_the_run_holding_block_0_is_lost():
    jamba = model_layer_specs("ai21labs/AI21-Jamba-1.5-Mini", REGISTRY)
    sized = _plan(jamba, 512, options=None)
    blocks = 3 * sized.blocks_per_request()
    plan = _plan(jamba, 512, num_blocks=blocks)
    span = max(g.blocks_per_page for g in plan.groups)
    assert span > 1 and plan.reserved_blocks == span
    assert plan.usable_blocks == blocks - span
    assert math.floor(plan.max_concurrency()) == 2
    # two requests of max_model_len still run together: the pool keeps what the figure promises
    workload = Workload(tuple(Request(i, 511, 1, 0) for i in range(5)), name="same")
    result = simulate(plan, workload, scheduler="kvcore", max_num_batched_tokens=5 * 512)
    assert result.peak_running == 2 and result.preemptions == 0


@pytest.mark.parametrize("policy", ["shared_buffer", "equal_groups"])
def test_a_hybrid_plan_with_a_null_block_runs_its_max_concurrency(policy):
    specs = mix((2, full()), (6, sliding(64)))
    sized = _plan(specs, 512, options=None, policy=policy)
    plan = _plan(specs, 512, num_blocks=int(4.6 * sized.blocks_per_request()) + 1, policy=policy)
    assert math.floor(plan.max_concurrency()) == 4
    workload = Workload(tuple(Request(i, 511, 1, 0) for i in range(13)), name="same")
    result = simulate(plan, workload, scheduler="kvcore", max_num_batched_tokens=13 * 512)
    assert result.running == (4, 4, 4, 1) and result.preemptions == 0


def test_json_round_trip_and_the_plan_check():
    plan = _plan(ONE_LAYER, num_blocks=100)
    data = plan_to_dict(plan, REGISTRY)
    assert data["null_block"] == 0
    assert plan_from_dict(data, REGISTRY) == plan
    check_plan(plan)
    with pytest.raises(PlanValidationError, match="'null_block' must be 0"):
        plan_from_dict({**data, "null_block": 7}, REGISTRY)


@given(st.sampled_from([1, "yes", None, 0]))
def test_the_option_takes_only_a_bool(value):
    with pytest.raises(InvalidInputError, match="reserve_null_block"):
        PlanOptions(reserve_null_block=value)
