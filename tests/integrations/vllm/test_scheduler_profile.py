"""The ``vllm`` scheduler profile against vLLM 0.33's real v1 ``Scheduler``.

Both replay the same trace on the same plan (planned with ``plan_for_vllm``, converted with
``plan_to_vllm_config``): the profile through :func:`kvcore.simulation.simulate`, vLLM through
:func:`kvcore.integrations.vllm.scheduler.run_vllm_scheduler` (its ``Scheduler`` or
``AsyncScheduler`` with a fake model runner). Every figure must agree: running requests at every
step, pool usage at every step, tokens scheduled, preemptions, recomputed tokens, steps to drain,
queue delays and prefix-cache hits. Both are deterministic, so the agreement is exact.

The budgets are small so that preemption happens (the chat cases preempt 70 to 120 times); the
traces are the first requests of ``examples/traces`` so that each case takes seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest

from kvcore import Registry
from kvcore.frontends.hf_config import layer_specs_from_config
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.integrations.vllm.scheduler import run_vllm_scheduler
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.simulator import simulate
from tests.integrations.vllm.scheduler_cases import BATCH, CASES, GIB, align_mode_differs, vllm_plan, workload
from tests.zoo import NEMOTRON_H_LIKE, synthetic

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.result import SimulationResult
    from kvcore.simulation.workload import Workload

REGISTRY = Registry.default()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
@pytest.mark.parametrize(("model", "budget", "trace", "count", "length"), CASES, ids=lambda v: str(v))
def test_the_profile_is_vllms_scheduler(model, budget, trace, count, length, caching, mode):
    asynchronous = mode == "async"
    plan = vllm_plan(model, budget, length, asynchronous=asynchronous, registry=REGISTRY)
    requests = workload(trace, count)
    profile = VllmProfile(async_scheduling=asynchronous)
    ours = simulate(plan, requests, scheduler=profile, prefix_caching=caching, max_num_batched_tokens=BATCH)
    theirs = run_vllm_scheduler(plan, requests, profile, max_num_batched_tokens=BATCH, prefix_caching=caching)
    assert ours.scheduler == "vllm"
    assert ours.steps == theirs.steps
    assert ours.running == theirs.running
    assert ours.pool_usage == pytest.approx(theirs.pool_usage, abs=1e-12)
    assert ours.preemptions == theirs.preemptions
    assert ours.mean_queue_delay == theirs.mean_queue_delay
    assert ours.p99_queue_delay == theirs.p99_queue_delay
    assert ours.total_tokens == theirs.total_tokens
    assert ours.recomputed_tokens == theirs.recomputed_tokens
    assert ours.cached_tokens == theirs.cached_tokens
    assert ours.prefix_hit_rate == theirs.prefix_hit_rate


def test_the_chat_cases_preempt():
    """The budgets are small enough that vLLM preempts (else the comparison proves less)."""
    model, budget, trace, count, length = CASES[0]
    plan = vllm_plan(model, budget, length, asynchronous=False, registry=REGISTRY)
    theirs = run_vllm_scheduler(
        plan, workload(trace, count), VllmProfile(async_scheduling=False), max_num_batched_tokens=BATCH
    )
    assert theirs.preemptions > 10


def test_the_profiles_settings_reach_vllm():
    """max_num_seqs, the admission gate off and a long-prefill threshold: still the same figures."""
    model, budget, trace, count, length = CASES[1]
    plan = vllm_plan(model, budget, length, asynchronous=False, registry=REGISTRY)
    requests = workload(trace, count)
    profile = VllmProfile(
        async_scheduling=False, max_num_seqs=3, reserve_full_isl=False, long_prefill_token_threshold=512
    )
    ours = simulate(plan, requests, scheduler=profile, max_num_batched_tokens=BATCH)
    theirs = run_vllm_scheduler(plan, requests, profile, max_num_batched_tokens=BATCH)
    assert ours.peak_running <= 3
    assert (ours.steps, ours.running, ours.preemptions, ours.total_tokens) == (
        theirs.steps,
        theirs.running,
        theirs.preemptions,
        theirs.total_tokens,
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_readmitted_long_prompts_hit_chunked_local_groups_from_their_chunk_as_vllm_does(mode):
    """Llama 4 Scout (chunked local layers, chunks of 8,192 tokens) on long documents with the
    admission gate off: requests of 10k-20k tokens are preempted mid-prompt and, admitted again,
    hit their own blocks, the chunked groups from the start of the chunk the hit ends in (the
    blocks before it count as hit, null). Every figure as vLLM's."""
    asynchronous = mode == "async"
    # 3.4 GiB: blocks before a request's chunk are evicted while its chunk's stay cached, so a hit
    # from the chunk's start is longer than one from the first block (16,640 tokens more, sync)
    plan = vllm_plan(
        "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        34 * 2**30 // 10,
        20480,
        asynchronous=asynchronous,
        registry=REGISTRY,
    )
    requests = workload("long-documents", 12)
    profile = VllmProfile(async_scheduling=asynchronous, reserve_full_isl=False)
    ours = simulate(plan, requests, scheduler=profile, prefix_caching=True, max_num_batched_tokens=BATCH)
    theirs = run_vllm_scheduler(plan, requests, profile, max_num_batched_tokens=BATCH, prefix_caching=True)
    assert ours.preemptions > 0 and ours.cached_tokens > 8192  # the case's premise: hits past a chunk
    _assert_vllms_figures(ours, theirs)


@pytest.mark.parametrize("retention", [0, None])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_jamba_plan_hits_its_mamba_states_as_vllm_does(mode, retention):
    """Jamba 1.5 Mini (Mamba layers beside attention) on chat traffic with shared system prompts,
    prefix caching on: vLLM runs its Mamba layers in ``mamba_cache_mode='align'``, caching a state
    per block boundary (every one under dense retention, ``None``; under its default, 0, only
    one token before a prompt's end and at a shared prefix's junction), and a request hits a
    shared prompt's state. The fast path and the reference find the same hits (cached tokens >
    0) and every other figure as vLLM's."""
    if why := align_mode_differs():
        pytest.skip(why)
    asynchronous = mode == "async"
    plan = vllm_plan("ai21labs/AI21-Jamba-1.5-Mini", GIB, 4096, asynchronous=asynchronous, registry=REGISTRY)
    requests = workload("chat-system-prompts", 40)
    profile = VllmProfile(async_scheduling=asynchronous, prefix_cache_retention_interval=retention)
    _assert_both_paths_hit_as_vllm(plan, requests, profile)


def test_the_profiles_retention_default_is_the_installed_vllms():
    """vLLM's ``prefix_cache_retention_interval`` default (a ``CacheConfig`` field, the same on
    every platform) is what ``versions.py`` records for the installed release and what the
    ``vllm`` profile takes by default."""
    from vllm.config import CacheConfig

    from kvcore.integrations.vllm.versions import PREFIX_CACHE_RETENTION_INTERVAL, installed_minor

    installed = CacheConfig().prefix_cache_retention_interval
    assert installed == PREFIX_CACHE_RETENTION_INTERVAL[installed_minor()]
    assert installed == VllmProfile().prefix_cache_retention_interval


@pytest.mark.parametrize("retention", [0, None])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_nemotron_h_like_plan_takes_its_prefill_checkpoints_as_vllm_does(mode, retention):
    """A Nemotron-H-like hybrid (Mamba-2 layers beside attention, ``tests/configs``) on chat
    traffic with shared system prompts, prefix caching on: vLLM 0.33 gives each Mamba-2 layer one
    prefill checkpoint block (``MambaMixer2.get_kv_cache_spec``), so a prompt's last chunk writes
    its last block boundary's state into a block of its own rather than stopping there, under
    vLLM's default retention (0: states kept only where a later request can resume) and dense
    retention (``None``). The fast path and the reference give every figure vLLM's scheduler
    gives, hits included."""
    if why := align_mode_differs():
        pytest.skip(why)
    asynchronous = mode == "async"
    specs = layer_specs_from_config(synthetic(NEMOTRON_H_LIKE), REGISTRY)
    states = [spec for spec in specs.values() if spec.kind == "state"]
    # the case's premise: Mamba-2 states with one checkpoint block each, alignment 1
    assert states and all((s.checkpoint_slots, s.checkpoint_alignment) == (1, 1) for s in states)
    rules = VllmRules(max_model_len=4096, max_num_batched_tokens=BATCH, async_scheduling=asynchronous)
    plan = plan_for_vllm(rules.request(specs, 8 * GIB), rules, registry=REGISTRY)
    requests = workload("chat-system-prompts", 40)
    profile = VllmProfile(async_scheduling=asynchronous, prefix_cache_retention_interval=retention)
    _assert_both_paths_hit_as_vllm(plan, requests, profile)


def _assert_vllms_figures(ours: SimulationResult, theirs: SimulationResult) -> None:
    """Steps, running requests, preemptions, tokens computed, recomputed and hit, pool usage and
    queue delay: the profile's run is vLLM's."""
    assert (ours.steps, ours.running, ours.preemptions, ours.total_tokens, ours.recomputed_tokens) == (
        theirs.steps,
        theirs.running,
        theirs.preemptions,
        theirs.total_tokens,
        theirs.recomputed_tokens,
    )
    assert ours.pool_usage == pytest.approx(theirs.pool_usage, abs=1e-12)
    assert (ours.cached_tokens, ours.mean_queue_delay) == (theirs.cached_tokens, theirs.mean_queue_delay)


def _assert_both_paths_hit_as_vllm(plan: KVCachePlan, requests: Workload, profile: VllmProfile) -> None:
    """The fast path and the reference, prefix caching on, each hit (the case's premise: the
    states hit) and give vLLM's scheduler's figures."""
    theirs = run_vllm_scheduler(plan, requests, profile, max_num_batched_tokens=BATCH, prefix_caching=True)
    for reference in (False, True):
        ours = simulate(
            plan,
            requests,
            scheduler=attrs.evolve(profile, reference=reference),
            prefix_caching=True,
            max_num_batched_tokens=BATCH,
        )
        assert ours.cached_tokens > 0
        _assert_vllms_figures(ours, theirs)
