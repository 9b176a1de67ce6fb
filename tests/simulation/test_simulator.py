"""The simulator: hand-made cases, the worst case of every bundled model, the pool's invariants
through every step, and the same figures as the plain scheduler in ``_reference.py``."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given, strategies as st

from kvcore import (
    InvalidInputError,
    KVCoreError,
    SizingContext,
    Workload,
    model_layer_specs,
    plan_kv_cache,
    simulate as _simulate,
)
from kvcore.frontends.hf_config import bundled_models
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.runtime.block_pool import BlockPool
from kvcore.simulation.simulator import Simulator, percentile
from kvcore.simulation.workload import Request, parse_length, synthetic
from tests.helpers import chunked, full, mix, sliding
from tests.runtime._kinds import CrossAttentionPlugin, CrossAttentionSpec
from tests.simulation._reference import reference_run


def simulate(*args, **kwargs):
    """These tests state the ``kvcore`` scheduler profile's rules (the default is ``vllm``)."""
    return _simulate(*args, scheduler="kvcore", **kwargs)


REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))


def _plan(specs, max_model_len, *, num_blocks=None, policy="auto", memory=2**36, step=2048):
    context = SizingContext(max_model_len=max_model_len, max_num_batched_tokens=step)
    return plan_kv_cache(specs, memory, context, registry=REGISTRY, policy=policy, num_blocks=num_blocks)


def _same(count, prompt, output, arrival=0):
    return Workload(tuple(Request(i, prompt, output, arrival) for i in range(count)), name="same")


ONE_LAYER = {"model.layers.0": full(block_size=16)}


# -- hand-made cases -------------------------------------------------------------------------


def test_requests_of_twenty_blocks_run_five_at_a_time_in_a_hundred_blocks():
    plan = _plan(ONE_LAYER, 320, num_blocks=100)
    result = simulate(plan, _same(20, 319, 1))
    assert result.running == (5, 5, 5, 5)
    assert (result.peak_running, result.steps, result.preemptions) == (5, 4, 0)
    assert result.total_tokens == 20 * 319 and result.recomputed_tokens == 0
    assert result.peak_pool_usage == 1.0
    assert result.mean_queue_delay == (0 + 1 + 2 + 3) / 4  # five per step
    assert result.p99_queue_delay == 3.0


def test_requests_that_grow_past_the_pool_are_preempted_and_all_finish():
    plan = _plan(ONE_LAYER, 320, num_blocks=100)
    workload = _same(20, 160, 160)
    result = simulate(plan, workload)
    assert result.running[0] == 10  # ten prompts of ten blocks fill the pool
    assert result.preemptions > 0  # their 11th block is not there
    assert result.num_requests == 20 and result.peak_running == 10
    served = sum(
        r.prompt_tokens + r.output_tokens - 1 for r in workload.requests
    )  # the last token is never cached
    assert result.total_tokens - result.recomputed_tokens == served
    assert result.recomputed_tokens > 0
    assert result.steps == len(result.running) == len(result.pool_usage)


def test_decodes_go_first_and_prompts_are_chunked_to_the_budget():
    plan = _plan(ONE_LAYER, 4096, num_blocks=1000)
    workload = Workload((Request(0, 100, 3), Request(1, 250, 2, arrival_step=1)), name="two")
    result = simulate(plan, workload, max_num_batched_tokens=64)
    # step 0: 64 of request 0's prompt; 1: its last 36, then 28 of request 1 (which arrived);
    # 2, 3: request 0 decodes first, request 1's prompt takes the other 63; ...
    assert result.total_tokens == 100 + 2 + 250 + 1
    assert result.running == (1, 2, 2, 2, 1, 1, 1)
    assert result.steps == math.ceil((100 + 250) / 64) + 1
    assert result.mean_queue_delay == 0.0


def test_idle_steps_count_and_arrivals_gate_admission():
    plan = _plan(ONE_LAYER, 320, num_blocks=100)
    workload = Workload((Request(0, 10, 2, 0), Request(1, 10, 2, 10)), name="gap")
    result = simulate(plan, workload)
    assert result.running == (1, 1) + (0,) * 8 + (1, 1)
    assert result.mean_queue_delay == 0.0


def test_on_step_sees_every_step_and_the_finished_count():
    seen = []
    plan = _plan(ONE_LAYER, 320, num_blocks=100)
    simulate(plan, _same(7, 319, 1), on_step=lambda step, done: seen.append((step, done)))
    assert seen == [(1, 5), (2, 7)]


def test_too_long_a_request_is_refused_with_its_id():
    plan = _plan(ONE_LAYER, 320, num_blocks=100)
    with pytest.raises(InvalidInputError, match="request 3 has 300 prompt \\+ 21 output tokens = 321"):
        simulate(plan, Workload((*_same(3, 10, 1).requests, Request(3, 300, 21)), name="x"))


def test_a_request_that_cannot_fit_even_alone_is_refused_before_simulating():
    plan = plan_kv_cache(
        ONE_LAYER, 2**30, SizingContext(max_model_len=320), registry=REGISTRY, num_blocks=10, check_fit=False
    )
    with pytest.raises(
        InvalidInputError, match=r"request 1 .* needs more block ids than the pool has \(10\)"
    ):
        simulate(plan, Workload((Request(0, 100, 1), Request(1, 300, 1)), name="x"))


@pytest.mark.parametrize("budget", [0, -1, True, 1.5, 2**33])
def test_the_budget_is_checked(budget):
    plan = _plan(ONE_LAYER, 320, num_blocks=100)
    with pytest.raises(InvalidInputError, match="max_num_batched_tokens"):
        simulate(plan, _same(1, 10, 1), max_num_batched_tokens=budget)


def test_the_caching_switch_is_checked():
    """The vllm profile's simulator (compiled in the KVCORE_MYPYC=1 build) is given a bool."""
    plan = _plan(ONE_LAYER, 320, num_blocks=100)
    with pytest.raises(InvalidInputError, match="'prefix_caching' is True or False, not 1"):
        _simulate(plan, _same(1, 10, 1), prefix_caching=1)


def test_percentile_is_the_nearest_rank():
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5], 99) == 5
    assert percentile([1, 2], 50) == 1


# -- the worst case of every bundled model ---------------------------------------------------


def _model_plans():
    for model in bundled_models():
        specs = model_layer_specs(model.name, REGISTRY)
        for policy in REGISTRY.policies:
            try:
                _plan(specs, 2048, policy=policy, step=2048)
            except KVCoreError:  # the policy does not plan this model
                continue
            yield pytest.param(specs, policy, id=f"{model.name}-{policy}")


@pytest.mark.parametrize(("specs", "policy"), list(_model_plans()))
def test_requests_of_max_model_len_run_max_concurrency_at_a_time(specs, policy):
    length = 2048
    sized = _plan(specs, length, policy=policy)
    # room for 4.6 requests in every pool (a plan of several pools is forced one count per pool)
    counts = tuple(int(4.6 * need) for need in sized.blocks_per_request_by_pool())
    plan = _plan(specs, length, policy=policy, num_blocks=counts[0] if len(counts) == 1 else counts)
    expected = math.floor(plan.max_concurrency())
    assert expected == 4
    count = 3 * expected + 1
    result = simulate(plan, _same(count, length - 1, 1), max_num_batched_tokens=count * length)
    assert result.running == (expected,) * 3 + (1,)
    assert result.preemptions == 0


# -- the same figures as the plain scheduler -------------------------------------------------


def _equivalence_plans():
    yield "full", _plan(ONE_LAYER, 512, num_blocks=60, step=64)
    yield "gemma-like", _plan(mix((2, full()), (6, sliding(64))), 512, num_blocks=120, step=64)
    yield "chunked", _plan(mix((1, full()), (3, chunked(64))), 512, num_blocks=120, step=64)
    jamba = model_layer_specs("ai21labs/AI21-Jamba-1.5-Mini", REGISTRY)
    sized = _plan(jamba, 512, step=64)
    yield "jamba (aligned runs)", _plan(jamba, 512, num_blocks=3 * sized.blocks_per_request(), step=64)
    # a kind whose live_pages is its own: the simulator asks the pool at every step
    registry = Registry.from_plugin_manager(
        get_plugin_manager(autoload=False, plugins=[CrossAttentionPlugin()])
    )
    cross = CrossAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", encoder_len=100)
    specs = {**mix((2, full()), (2, sliding(64))), "model.cross.0": cross}
    context = SizingContext(max_model_len=512, max_num_batched_tokens=64)
    sized = plan_kv_cache(specs, 2**36, context, registry=registry)
    blocks = 3 * sized.blocks_per_request()
    yield "cross attention", plan_kv_cache(specs, 2**36, context, registry=registry, num_blocks=blocks)


PLANS = dict(_equivalence_plans())
#: the same plans with block id 0 held back as the null block (the plain scheduler knows none)
NULL_PLANS = {f"{name}, null block": attrs.evolve(plan, null_block=0) for name, plan in PLANS.items()}

requests_strategy = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 150), st.integers(0, 40)), min_size=1, max_size=14
)


@given(
    name=st.sampled_from(sorted(PLANS)),
    shapes=requests_strategy,
    budget=st.sampled_from([1, 7, 64, 512, 4096]),
)
def test_the_simulator_gives_the_plain_schedulers_figures(name, shapes, budget):
    plan = PLANS[name]
    workload = Workload(tuple(Request(i, p, o, a) for i, (p, o, a) in enumerate(shapes)), name="random")
    result = simulate(plan, workload, max_num_batched_tokens=budget)
    expected = reference_run(plan, workload, budget)
    assert result.steps == expected["steps"]
    assert result.running == expected["running"]
    assert result.pool_usage == pytest.approx(expected["pool_usage"])
    assert (result.total_tokens, result.recomputed_tokens, result.preemptions) == (
        expected["total_tokens"],
        expected["recomputed_tokens"],
        expected["preemptions"],
    )
    delays = expected["delays"]
    assert result.mean_queue_delay == pytest.approx(sum(delays) / len(delays))
    assert result.p99_queue_delay == percentile(delays, 99)
    served = sum(r.prompt_tokens + r.output_tokens - 1 for r in workload.requests)
    assert result.total_tokens - result.recomputed_tokens == served


# -- the pool's invariants through every step ------------------------------------------------


def _check_pool(simulator: Simulator, arrived: int) -> None:
    pool: BlockPool = simulator.pool
    held: dict[int, tuple[object, int]] = {}
    for request in pool.requests:
        for group in range(len(pool.groups)):
            for page in pool.live_pages(request, group):
                for block in pool.blocks_of(group, page):
                    assert block not in held, f"block {block} held by {held[block]} and {(request, group)}"
                    assert pool.owner(block) == group
                    held[block] = (request, group)
    assert pool.num_free_blocks == pool.num_usable_blocks - len(held)
    null = pool.plan.null_block
    assert null is None or null not in held
    assert sum(pool.owner(b) is None for b in range(pool.num_blocks)) == pool.num_free_blocks + (
        null is not None
    )
    assert set(simulator.running) == set(pool.requests)
    assert len(simulator.running) <= arrived


@given(
    name=st.sampled_from(sorted({**PLANS, **NULL_PLANS})),
    shapes=requests_strategy,
    budget=st.sampled_from([5, 64, 4096]),
)
def test_the_pool_invariants_hold_through_every_step(name, shapes, budget):
    plan = {**PLANS, **NULL_PLANS}[name]
    workload = Workload(tuple(Request(i, p, o, a) for i, (p, o, a) in enumerate(shapes)), name="random")
    simulator = Simulator(plan, workload, max_num_batched_tokens=budget)
    while not simulator.done:
        simulator.step()
        arrived = sum(r.arrival_step < simulator.steps for r in workload.requests)
        _check_pool(simulator, arrived)
    assert simulator.pool.num_free_blocks == simulator.pool.num_usable_blocks and not simulator.pool.requests
    assert simulator.finished == len(workload.requests)


# -- one pool for every kind ------------------------------------------------------------------


def test_short_requests_run_more_at_once_in_one_shared_pool_than_in_pools_split_by_kind():
    """A short request never fills a sliding window, so per-kind pools split at the worst case
    (window pages for the sliding layers) leave sliding pages idle while the full-attention pool
    runs out; one pool of block ids lets every group use what the others do not need."""
    length, memory = 8192, 2**31
    specs = mix((2, full()), (10, sliding(512)))
    shared = _plan(specs, length, policy="shared_buffer", memory=memory)
    workload = synthetic(
        600, parse_length("uniform:100:400"), parse_length("uniform:20:100"), max_model_len=length
    )
    together = simulate(shared, workload)
    full_specs = {k: v for k, v in specs.items() if v.kind == "full_attention"}
    window_specs = {k: v for k, v in specs.items() if v.kind == "sliding_window"}
    per_request = {
        "full": sum(s.max_memory_usage_bytes(shared.context) for s in full_specs.values()),
        "window": sum(s.max_memory_usage_bytes(shared.context) for s in window_specs.values()),
    }
    share = per_request["full"] / (per_request["full"] + per_request["window"])
    apart = [
        simulate(_plan(part, length, memory=int(memory * fraction)), workload)
        for part, fraction in ((full_specs, share), (window_specs, 1 - share))
    ]
    # each split pool alone bounds what the two together could run
    assert together.mean_running > 1.2 * min(r.mean_running for r in apart)
    assert together.steps < max(r.steps for r in apart)


def test_equal_groups_share_one_pool_too_so_short_requests_run_alike():
    """kvcore's equal_groups also hands every group ids from one pool: with short requests it runs
    as many at once as shared_buffer (its smaller pages waste less of each last block)."""
    specs = model_layer_specs("google/gemma-3-27b-it", REGISTRY)
    workload = synthetic(
        300, parse_length("uniform:100:300"), parse_length("uniform:20:60"), max_model_len=8192
    )
    results = {
        policy: simulate(_plan(specs, 8192, policy=policy, memory=2 * 2**30), workload)
        for policy in ("shared_buffer", "equal_groups")
    }
    shared, equal = results["shared_buffer"].mean_running, results["equal_groups"].mean_running
    assert shared == pytest.approx(equal, rel=0.05)
