"""The ``vllm`` scheduler profile against vLLM 0.33's real v1 ``Scheduler``.

Both replay the same trace on the same plan (planned with ``plan_for_vllm``, converted with
``plan_to_vllm_config``): the profile through :func:`kvcore.simulation.simulate`, vLLM through
:func:`kvcore.integrations.vllm.scheduler.run_vllm_scheduler` (its ``Scheduler`` or
``AsyncScheduler`` with a fake model runner). Every figure must agree: running requests at every
step, pool usage at every step, tokens scheduled, preemptions, recomputed tokens, steps to drain,
queue delays and prefix-cache hits. Both are deterministic, so the agreement is exact.

The budgets are small so that preemption happens (the chat cases preempt 85 to 159 times); the
traces are the first requests of ``examples/traces`` so that each case takes seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcore import Registry, model_layer_specs
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.integrations.vllm.scheduler import run_vllm_scheduler
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.simulator import simulate
from kvcore.simulation.workload import Workload, read_trace

GIB = 2**30
BATCH = 2048
REGISTRY = Registry.default()
TRACES = Path(__file__).resolve().parents[3] / "examples" / "traces"

#: (model, budget, trace, requests, max_model_len): one full-attention model, one sliding
#: hybrid (Gemma-3: five sliding layers to one full, groups of 16-, 32- and 64-token blocks) and
#: one MoE with sliding layers.
CASES = [
    ("meta-llama/Llama-3.1-8B", GIB // 2, "chat", 80, 2048),
    ("meta-llama/Llama-3.1-8B", 3 * GIB, "long-documents", 12, 20480),
    ("google/gemma-3-27b-it", GIB, "chat", 80, 2048),
    ("google/gemma-3-27b-it", 4 * GIB, "long-documents", 12, 20480),
    ("openai/gpt-oss-20b", GIB // 4, "chat", 80, 2048),
    ("openai/gpt-oss-20b", GIB, "long-documents", 12, 20480),
]



def _workload(trace: str, count: int) -> Workload:
    whole = read_trace(TRACES / f"{trace}.jsonl")
    return Workload(whole.requests[:count], name=f"{trace} (first {count})")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
@pytest.mark.parametrize(("model", "budget", "trace", "count", "length"), CASES, ids=lambda v: str(v))
def test_the_profile_is_vllms_scheduler(model, budget, trace, count, length, caching, mode):
    asynchronous = mode == "async"
    rules = VllmRules(max_model_len=length, max_num_batched_tokens=BATCH, async_scheduling=asynchronous)
    plan = plan_for_vllm(rules.request(model_layer_specs(model, REGISTRY), budget), rules, registry=REGISTRY)
    workload = _workload(trace, count)
    profile = VllmProfile(async_scheduling=asynchronous)
    ours = simulate(plan, workload, scheduler=profile, prefix_caching=caching, max_num_batched_tokens=BATCH)
    theirs = run_vllm_scheduler(plan, workload, profile, max_num_batched_tokens=BATCH, prefix_caching=caching)
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
    rules = VllmRules(max_model_len=length, max_num_batched_tokens=BATCH, async_scheduling=False)
    plan = plan_for_vllm(rules.request(model_layer_specs(model, REGISTRY), budget), rules, registry=REGISTRY)
    theirs = run_vllm_scheduler(
        plan, _workload(trace, count), VllmProfile(async_scheduling=False), max_num_batched_tokens=BATCH
    )
    assert theirs.preemptions > 10


def test_the_profiles_settings_reach_vllm():
    """max_num_seqs, the admission gate off and a long-prefill threshold: still the same figures."""
    model, budget, trace, count, length = CASES[1]
    rules = VllmRules(max_model_len=length, max_num_batched_tokens=BATCH, async_scheduling=False)
    plan = plan_for_vllm(rules.request(model_layer_specs(model, REGISTRY), budget), rules, registry=REGISTRY)
    workload = _workload(trace, count)
    profile = VllmProfile(
        async_scheduling=False, max_num_seqs=3, reserve_full_isl=False, long_prefill_token_threshold=512
    )
    ours = simulate(plan, workload, scheduler=profile, max_num_batched_tokens=BATCH)
    theirs = run_vllm_scheduler(plan, workload, profile, max_num_batched_tokens=BATCH)
    assert ours.peak_running <= 3
    assert (ours.steps, ours.running, ours.preemptions, ours.total_tokens) == (
        theirs.steps,
        theirs.running,
        theirs.preemptions,
        theirs.total_tokens,
    )
