"""The ``vllm`` profile with a host tier: vLLM 0.33's native CPU offloading
(:mod:`kvcore.simulation.profiles.vllm_reference.offloading`).

The agreement with vLLM's real scheduler and its ``OffloadingConnector`` is checked in
``tests/integrations/vllm/test_offloading.py`` (the vLLM environment). Here, without vLLM: the
CPU manager's LRU order and eviction rules, the tier's figures on a trace whose prompts outgrow
the device, the host link's seconds, the plans the profile refuses by name, and two properties
over random plans of one full-attention group and random traces (the drawing of
``test_vllm_reference.py``):

- the fast path (the ``vllm`` profile, whose speed paths step aside for a tier) gives the
  reference's figures, and the tier's counts add up (what it holds is what it stored less what
  it evicted; the tokens it gave are within the chunks it loaded and the tokens found cached);
- synchronous, a run in which the tier served no hit is the run without the tier, figure for
  figure: the connector's waiting queues, reserved blocks and stores change nothing else.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, reject, settings, strategies as st

from kvcore import SizingContext, simulate
from kvcore.errors import InvalidInputError, PolicyNotApplicableError
from kvcore.plan import KVCachePlan
from kvcore.planning.capacity import request_bytes
from kvcore.planning.offload import with_host_memory
from kvcore.simulation.gpus import find_gpu
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.profiles.vllm_reference.offloading import (
    CpuOffloadingManager,
    OffloadStats,
    chunk_bytes,
    host_chunks,
)
from kvcore.simulation.steps import StepRecord
from kvcore.simulation.workload import Request, Workload
from kvcore.testing import strategies as kst
from tests.simulation.test_vllm_reference import REGISTRY, _profiles, _workloads

HEALTH = [HealthCheck.too_slow, HealthCheck.filter_too_much]
FULL = REGISTRY.spec_class("full_attention")
SLIDING = REGISTRY.spec_class("sliding_window")


# -- the CPU manager (CPUOffloadingManager with LRUCachePolicy) ------------------------------------


def _stored(manager: CpuOffloadingManager, r: int, keys: list[str]) -> None:
    """Request ``r`` stores ``keys`` (positions 16, 32, ...) and the stores complete."""
    stored = manager.prepare_store(r, [(key, 16 * (j + 1)) for j, key in enumerate(keys)])
    assert stored == keys
    manager.complete_store(keys)


def test_a_finished_requests_tail_is_evicted_before_its_head():
    manager = CpuOffloadingManager(4, OffloadStats())
    _stored(manager, 0, ["a0", "a1", "a2", "a3"])
    manager.on_request_finished(0)
    # a new request's two chunks evict the two least recent: the tail of request 0
    assert manager.prepare_store(1, [("b0", 16), ("b1", 32)]) == ["b0", "b1"]
    assert set(manager.ref_cnt) == {"a0", "a1", "b0", "b1"}
    assert manager.stats.evicted_chunks == 2


def test_a_running_requests_keys_rank_by_position_and_a_touch_renews_them():
    manager = CpuOffloadingManager(3, OffloadStats())
    _stored(manager, 0, ["a0", "a1", "a2"])  # not finished: its tail ranks lowest
    # request 1 finds a2 (a store offer of a chunk already there touches it): a2 is now recent
    assert manager.prepare_store(1, [("a2", 48)]) == []
    assert manager.prepare_store(2, [("c0", 16)]) == ["c0"]
    assert "a1" not in manager.ref_cnt and "a2" in manager.ref_cnt


def test_chunks_being_loaded_or_stored_or_offered_are_not_evicted():
    manager = CpuOffloadingManager(2, OffloadStats())
    _stored(manager, 0, ["a0", "a1"])
    manager.prepare_load(1, [("a0", 16)])
    # one chunk could go (a1), two are asked: nothing happens, the store waits a step
    assert manager.prepare_store(2, [("c0", 16), ("c1", 32)]) is None
    assert set(manager.ref_cnt) == {"a0", "a1"}
    # an offered key is never evicted for its own offer
    assert manager.prepare_store(2, [("a1", 16), ("c0", 32)]) is None
    manager.complete_load(["a0"])
    assert manager.prepare_store(2, [("c0", 16)]) == ["c0"]
    assert manager.lookup("c0") == "hit_pending"  # stored, not readable until the store completes
    manager.complete_store(["c0"])
    assert manager.lookup("c0") == "hit" and manager.lookup("a0") == "miss"


# -- a trace that outgrows the device ---------------------------------------------------------------


def _plan(num_blocks: int, tier_chunks: int) -> KVCachePlan:
    """One full-attention layer of 16-token blocks, ``num_blocks`` blocks, a tier of
    ``tier_chunks`` chunks."""
    from tests.simulation.test_simulator import ONE_LAYER, _plan as plain

    plan = plain(ONE_LAYER, 320, num_blocks=num_blocks)
    return with_host_memory(plan, tier_chunks * chunk_bytes(plan)) if tier_chunks else plan


def _alternating(rounds: int) -> Workload:
    """Two 256-token system prompts taking turns, one request at a time."""
    requests = tuple(
        Request(i, 300, 2, 20 * i, prefix_id=f"system-{i % 2}", prefix_tokens=256) for i in range(rounds)
    )
    return Workload(requests, name="alternating")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_tier_gives_back_the_prompt_the_device_evicted(asynchronous):
    profile = VllmProfile(async_scheduling=asynchronous)
    workload = _alternating(8)
    # 25 blocks: one request of 302 tokens (19 blocks) at a time; the other prompt cannot stay
    plain = simulate(_plan(25, 0), workload, prefix_caching=True, scheduler=profile)
    result = simulate(_plan(25, 40), workload, prefix_caching=True, scheduler=profile)
    tier = result.host_tier
    assert plain.host_tier is None and tier is not None and tier.enabled and tier.host_blocks == 40
    assert result.cached_tokens > plain.cached_tokens
    # the device keeps the first 6 blocks of the other prompt; every request after the first two
    # loads the other 10 of its 16 back from the tier
    assert (tier.device_hit_tokens, tier.host_hit_tokens, tier.host_hits) == (6 * 96, 6 * 160, 6)
    assert tier.device_hit_tokens + tier.host_hit_tokens == result.cached_tokens
    assert tier.restored_blocks == 6 * 10
    # a prompt is 18 chunks, 16 of them shared: 48 stored in 40 chunks, the least recent evicted
    assert (tier.offloaded_blocks, tier.held_blocks, tier.host_evictions) == (48, 40, 8)
    assert result.total_tokens < plain.total_tokens
    assert result.host_transfer_seconds == 0.0


@attrs.frozen
class _Constant:
    """A step-time model of fixed seconds on a GPU (what a roofline carries)."""

    seconds: float
    gpu: object
    description: str = "constant"

    def __call__(self, record: StepRecord) -> float:
        return self.seconds


def test_the_host_links_seconds_are_added_to_the_steps_that_compute():
    workload = _alternating(8)
    gpu = find_gpu("H100")
    result = simulate(_plan(25, 40), workload, prefix_caching=True, step_time=_Constant(1e-3, gpu))
    assert result.host_tier is not None and result.host_transfer_seconds > 0
    assert result.timeline is not None
    computing = sum(
        1
        for end, before in zip(result.timeline.step_end[1:], result.timeline.step_end[:-1], strict=True)
        if end > before
    )
    assert computing > 0
    untimed = simulate(_plan(25, 40), workload, prefix_caching=True, step_time=_Constant(1e-3, None))
    assert untimed.host_transfer_seconds == 0.0 and untimed.host_tier == result.host_tier
    assert result.timeline.step_end[-1] == pytest.approx(
        untimed.timeline.step_end[-1] + result.host_transfer_seconds
    )


def test_plans_the_profile_does_not_simulate_are_refused_by_name():
    context = SizingContext(max_model_len=256, max_num_batched_tokens=64)
    layers = {
        "model.layers.0": FULL(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16"),
        "model.layers.1": SLIDING(
            block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16", sliding_window=64
        ),
    }
    problem = kst.PlanningProblem(
        specs=layers, context=context, available_bytes=8 * request_bytes(layers, context)
    )
    plan = with_host_memory(problem.plan("shared_buffer", REGISTRY), 1 << 26)
    workload = _alternating(2)
    with pytest.raises(InvalidInputError, match="one full-attention or MLA group"):
        simulate(plan, workload, prefix_caching=True)
    with pytest.raises(InvalidInputError, match="prefix caching"):
        simulate(_plan(25, 40), workload)
    # a block of 512 bytes takes a 4 KiB chunk on vLLM's host: a tier of one block holds none
    small = {"model.layers.0": FULL(block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")}
    tiny = kst.PlanningProblem(specs=small, context=context, available_bytes=1 << 20).plan(
        "uniform", REGISTRY
    )
    assert tiny.pools[0].bytes_per_block == 512
    with pytest.raises(InvalidInputError, match="hold no chunk of 4,096 bytes"):
        simulate(with_host_memory(tiny, 512), workload, prefix_caching=True)


# -- properties over random plans and traces --------------------------------------------------------


@st.composite
def _tiered_plans(draw: st.DrawFn) -> KVCachePlan:
    """A plan of one full-attention (or MLA) group, tight (one to four requests of
    ``max_model_len``), with a tier of a few chunks to several pools' worth."""
    spec = draw(kst.specs(("full_attention", "mla"), registry=REGISTRY))
    layers = {f"model.layers.{i}": spec for i in range(draw(st.integers(1, 4)))}
    context = draw(
        kst.sizing_contexts(
            max_model_len=st.integers(32, 640), max_num_batched_tokens=st.sampled_from([8, 32, 64, 256])
        )
    )
    need = request_bytes(layers, context)
    problem = kst.PlanningProblem(
        specs=layers,
        context=context,
        available_bytes=draw(st.integers(need, draw(st.sampled_from([2, 4])) * need)),
    )
    try:
        plan = problem.plan("uniform", REGISTRY)
    except PolicyNotApplicableError:
        reject()
    group = plan.groups[0]
    if (
        not plan.usable_blocks
        or len(plan.groups) != 1
        or group.blocks_per_page != 1
        or group.spec.block_size < 2
    ):
        reject()
    chunks = draw(st.sampled_from([1, 3, max(1, plan.usable_blocks // 2), 4 * plan.usable_blocks]))
    return with_host_memory(plan, chunks * chunk_bytes(plan))


def _without_tier(plan: KVCachePlan) -> KVCachePlan:
    return attrs.evolve(plan, offload_tier=None)


@settings(deadline=None, suppress_health_check=HEALTH)
@given(data=st.data(), plan=_tiered_plans(), profile=_profiles(), timed=st.booleans())
def test_the_fast_path_gives_the_references_figures_with_a_tier(data, plan, profile, timed):
    workload = data.draw(_workloads(plan.context.max_model_len))
    model = _Constant(1e-3, find_gpu("H100")) if timed else None
    try:
        fast = simulate(plan, workload, scheduler=profile, prefix_caching=True, step_time=model)
    except InvalidInputError as error:  # a request that cannot fit: both refuse alike
        with pytest.raises(InvalidInputError, match=str(error)[:40]):
            simulate(plan, workload, scheduler=attrs.evolve(profile, reference=True), prefix_caching=True)
        return
    reference = simulate(
        plan, workload, scheduler=attrs.evolve(profile, reference=True), prefix_caching=True, step_time=model
    )
    assert fast == reference
    assert tuple(fast.running) == tuple(reference.running) and tuple(fast.pool_usage) == tuple(
        reference.pool_usage
    )
    tier = fast.host_tier
    assert tier is not None and tier.host_blocks == host_chunks(plan)
    assert tier.held_blocks == tier.offloaded_blocks - tier.host_evictions <= tier.host_blocks
    assert (
        0
        <= tier.host_hit_tokens
        <= min(fast.cached_tokens, tier.restored_blocks * plan.groups[0].spec.block_size)
    )
    assert tier.device_hit_tokens + tier.host_hit_tokens == fast.cached_tokens
    assert tier.host_hits <= tier.restored_blocks
    assert (fast.host_transfer_seconds > 0) == (timed and tier.offloaded_blocks > 0)


@settings(deadline=None, suppress_health_check=HEALTH)
@given(data=st.data(), plan=_tiered_plans(), profile=_profiles())
def test_a_synchronous_run_the_tier_never_served_is_the_run_without_it(data, plan, profile):
    profile = attrs.evolve(profile, async_scheduling=False)
    workload = data.draw(_workloads(plan.context.max_model_len))
    try:
        tiered = simulate(plan, workload, scheduler=profile, prefix_caching=True)
    except InvalidInputError:
        reject()
    assert tiered.host_tier is not None
    if tiered.host_tier.host_hits:
        reject()
    plain = simulate(
        _without_tier(plan), workload, scheduler=attrs.evolve(profile, reference=True), prefix_caching=True
    )
    assert attrs.evolve(tiered, host_tier=None) == plain
    assert tuple(tiered.running) == tuple(plain.running)
    assert tuple(tiered.pool_usage) == tuple(plain.pool_usage)
