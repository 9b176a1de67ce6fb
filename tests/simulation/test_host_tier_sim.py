"""The simulator with a host tier: hits per tier, bytes each way, the host link's seconds on the
steps, and the profiles and settings that refuse a tier."""

from __future__ import annotations

import attrs
import pytest

from kvcore import InvalidInputError, Request, Workload, simulate
from kvcore.planning.offload import with_host_memory
from kvcore.simulation.gpus import find_gpu, host_link
from kvcore.simulation.steps import StepRecord
from tests.runtime.test_host_checkpoints import _plan as _hybrid_plan
from tests.runtime.test_state_checkpoints import _jamba_like
from tests.simulation.test_simulator import ONE_LAYER, _plan


def _alternating(rounds: int) -> Workload:
    """Two 256-token system prompts taking turns, one request at a time (each arrives after the
    one before has finished)."""
    requests = tuple(
        Request(i, 300, 2, 10 * i, prefix_id=f"system-{i % 2}", prefix_tokens=256) for i in range(rounds)
    )
    return Workload(requests, name="alternating")


def _plans():
    # 25 blocks of 16 tokens: one request of 302 tokens (19 blocks) at a time, and the other
    # prompt's 16 cached blocks cannot stay
    plan = _plan(ONE_LAYER, 320, num_blocks=25)
    return plan, with_host_memory(plan, 40 * plan.pools[0].bytes_per_block)


def test_a_tier_keeps_the_prompt_the_device_evicts_and_counts_each_tier():
    plan, tiered = _plans()
    workload = _alternating(8)
    plain = simulate(plan, workload, prefix_caching=True, scheduler="kvcore")
    result = simulate(tiered, workload, prefix_caching=True, scheduler="kvcore")
    # the device keeps the first 6 blocks of the other prompt (a request's last blocks go first)
    assert plain.host_tier is None and plain.cached_tokens == 6 * 96
    tier = result.host_tier
    assert tier is not None and tier.enabled and tier.host_blocks == 40
    assert result.cached_tokens == 6 * 256  # every request after the first two, in full
    assert tier.device_hit_tokens + tier.host_hit_tokens == result.cached_tokens
    assert (tier.device_hit_tokens, tier.host_hit_tokens, tier.host_hits) == (6 * 96, 6 * 160, 6)
    per_block = tiered.pools[0].bytes_per_block
    assert tier.offloaded_bytes == tier.offloaded_blocks * per_block > 0
    assert tier.restored_bytes == tier.restored_blocks * per_block > 0
    assert result.total_tokens < plain.total_tokens  # the host hits were not computed
    assert result.host_transfer_seconds == 0.0  # no step-time model: no seconds


def test_a_hybrids_evicted_checkpoints_come_back_from_the_tier():
    """Jamba-like layers (state and full attention, align checkpoints) on a device of one
    request: each request evicts the other prompt's checkpoint, so without a tier nothing hits;
    with one, every request after the first two brings the checkpoint at 256 back."""
    plain = _hybrid_plan(_jamba_like(16), "align", requests=1, host_rows=0)
    tiered = _hybrid_plan(_jamba_like(16), "align", requests=1, host_rows=2000)
    workload = _alternating(8)
    before = simulate(plain, workload, prefix_caching=True, scheduler="kvcore")
    result = simulate(tiered, workload, prefix_caching=True, scheduler="kvcore")
    assert before.cached_tokens == 0 and before.host_tier is None
    tier = result.host_tier
    assert tier is not None and result.cached_tokens == 6 * 256
    assert (tier.host_hits, tier.host_hit_tokens, tier.host_evictions) == (6, 6 * 256, 0)
    span = next(g.blocks_per_page for g in tiered.groups if g.spec.kind == "state")
    assert tier.restored_blocks >= 6 * span  # each hit brought a checkpoint's whole run back
    per_block = tiered.pools[0].bytes_per_block
    assert tier.restored_bytes == tier.restored_blocks * per_block
    assert tier.offloaded_bytes == tier.offloaded_blocks * per_block == tier.held_blocks * per_block
    assert result.total_tokens < before.total_tokens  # the host hits were not computed


@attrs.frozen
class _Constant:
    """A step-time model of fixed seconds on a GPU (what the roofline carries)."""

    seconds: float
    gpu: object

    @property
    def description(self) -> str:
        return "constant"

    def __call__(self, record: StepRecord) -> float:
        return self.seconds


def test_the_host_links_seconds_are_added_to_the_steps():
    _, tiered = _plans()
    workload = _alternating(8)
    gpu = find_gpu("H100")
    model = _Constant(1e-3, gpu)
    result = simulate(tiered, workload, prefix_caching=True, scheduler="kvcore", step_time=model)
    tier = result.host_tier
    assert tier is not None
    rate = host_link(gpu).bytes_per_second
    # each step's moves take max(to host, back) at the link's rate: between the larger total
    # and both totals together
    assert max(tier.offloaded_bytes, tier.restored_bytes) / rate <= result.host_transfer_seconds
    assert result.host_transfer_seconds <= (tier.offloaded_bytes + tier.restored_bytes) / rate
    busy = sum(1 for running in result.running if running)
    assert result.timeline is not None
    assert result.timeline.step_end[-1] == pytest.approx(busy * 1e-3 + result.host_transfer_seconds)
    # a model without a GPU adds nothing
    untimed = simulate(
        tiered, workload, prefix_caching=True, scheduler="kvcore", step_time=_Constant(1e-3, None)
    )
    assert untimed.host_transfer_seconds == 0.0 and untimed.host_tier == tier


@attrs.frozen
class _NoTier:
    """A scheduler profile that does not say it simulates a host tier (``simulates_host_tier``)."""

    name: str = "no-tier"
    description: str = "a profile without a host tier"

    def simulator(self, plan, workload, **options):
        raise AssertionError("a profile without a tier never runs a plan with one")


def test_profiles_that_do_not_model_a_tier_refuse_it():
    """A profile that does not model a tier refuses one (vllm simulates vLLM's CPU offloading,
    kvcore its own tier, sglang HiCache)."""
    _, tiered = _plans()
    with pytest.raises(InvalidInputError, match=r"'no-tier' does not simulate one .* the 'vllm' profile"):
        simulate(tiered, _alternating(2), prefix_caching=True, scheduler=_NoTier())


@pytest.mark.parametrize("scheduler", ["vllm", "vllm-reference"])
def test_vllms_profiles_simulate_its_cpu_offloading(scheduler):
    """The vllm profiles run the tier as vLLM's native CPU offloading (the figures are held to
    vLLM's scheduler in tests/integrations/vllm/test_offloading.py)."""
    _, tiered = _plans()
    result = simulate(tiered, _alternating(8), prefix_caching=True, scheduler=scheduler)
    assert result.host_tier is not None and result.host_tier.host_hits > 0


def test_a_tier_without_prefix_caching_is_refused():
    _, tiered = _plans()
    with pytest.raises(InvalidInputError, match="prefix caching"):
        simulate(tiered, _alternating(2), scheduler="kvcore")
