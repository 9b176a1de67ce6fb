"""Scheduler profiles: the hook, the registry, and what the ``vllm`` profile does that kvcore's
own rules do not. (``tests/integrations/vllm/test_scheduler_profile.py`` checks the ``vllm`` profile figure
for figure against vLLM's real scheduler.)"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from kvcore import (
    DuplicateRegistrationError,
    SizingContext,
    Workload,
    hookimpl,
    model_layer_specs,
    plan_kv_cache,
    read_trace,
    simulate,
)
from kvcore.errors import InvalidInputError, UnknownSchedulerError
from kvcore.frontends.hf_config import load_model_config
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.simulation.gpus import find_gpu
from kvcore.simulation.profiles.kvcore_rules import KvcoreProfile
from kvcore.simulation.profiles.vllm import VllmProfile, VllmSimulator
from kvcore.simulation.timing import roofline
from kvcore.simulation.workload import Request, parse_length, synthetic

GIB = 2**30
REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"


def _plan(model, memory, length, step=2048):
    context = SizingContext(max_model_len=length, max_num_batched_tokens=step)
    return plan_kv_cache(model_layer_specs(model, REGISTRY), memory, context, registry=REGISTRY)


def _trace(name, count):
    return Workload(read_trace(TRACES / f"{name}.jsonl").requests[:count], name=name)


def test_the_builtin_profiles_are_registered_and_vllm_is_the_default():
    assert list(REGISTRY.scheduler_profiles) == ["vllm", "kvcore", "sglang", "vllm-reference"]
    plan = _plan("meta-llama/Llama-3.2-1B", GIB // 4, 2048)
    workload = _trace("chat", 20)
    result = simulate(plan, workload, registry=REGISTRY)
    assert result.scheduler == "vllm"
    assert dict(result.scheduler_settings)["async_scheduling"] is True
    assert simulate(plan, workload, scheduler="kvcore", registry=REGISTRY).scheduler == "kvcore"


def test_an_unknown_profile_names_the_registered_ones():
    plan = _plan("meta-llama/Llama-3.2-1B", GIB // 4, 2048)
    with pytest.raises(UnknownSchedulerError, match=r"'trtllm'.*vllm, kvcore, sglang"):
        simulate(plan, _trace("chat", 2), scheduler="trtllm", registry=REGISTRY)


@attrs.frozen
class _EveryStepOne(KvcoreProfile):
    """A third party's engine: kvcore's rules one token a step (what a plugin can register)."""

    name: str = "one-token"

    def simulator(self, plan, workload, *, max_num_batched_tokens, prefix_caching):
        return super().simulator(plan, workload, max_num_batched_tokens=1, prefix_caching=prefix_caching)


class _Plugin:
    @hookimpl
    def kvcore_register_scheduler_profiles(self, register):
        register(_EveryStepOne())


def test_a_plugin_registers_a_profile_that_simulate_runs_by_name():
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=[_Plugin()]))
    plan = _plan("meta-llama/Llama-3.2-1B", GIB // 4, 2048)
    workload = Workload((Request(0, 10, 3),), name="one")
    result = simulate(plan, workload, scheduler="one-token", registry=registry)
    assert result.total_tokens == 12 and result.steps == 12  # 10 prompt + 2 decode tokens, one a step


class _Twice:
    @hookimpl
    def kvcore_register_scheduler_profiles(self, register):
        register(KvcoreProfile())


def test_a_profile_name_registered_twice_is_refused():
    with pytest.raises(DuplicateRegistrationError, match="scheduler profile 'kvcore' is registered twice"):
        Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=[_Twice()]))


def test_vllms_gate_admits_whole_prompts_so_long_documents_do_not_preempt():
    """vLLM admits a request only when its whole prompt fits: the long prompts that kvcore's
    first-chunk admission lets outgrow the pool mid-prefill wait instead."""
    plan = _plan("meta-llama/Llama-3.1-8B", 3 * GIB, 20480)
    workload = _trace("long-documents", 20)
    ours = simulate(plan, workload, scheduler="kvcore", registry=REGISTRY)
    vllm = simulate(plan, workload, scheduler=VllmProfile(async_scheduling=False), registry=REGISTRY)
    gateless = simulate(
        plan,
        workload,
        scheduler=VllmProfile(async_scheduling=False, reserve_full_isl=False),
        registry=REGISTRY,
    )
    assert ours.preemptions > 50
    assert vllm.preemptions < ours.preemptions / 10
    assert gateless.preemptions > vllm.preemptions


def test_max_num_seqs_caps_the_running_requests():
    plan = _plan("meta-llama/Llama-3.2-1B", 2 * GIB, 2048)
    workload = _trace("chat", 200)
    free = simulate(plan, workload, scheduler=VllmProfile(), registry=REGISTRY)
    capped = simulate(plan, workload, scheduler=VllmProfile(max_num_seqs=8), registry=REGISTRY)
    assert free.peak_running > 8
    assert capped.peak_running == 8
    assert capped.steps > free.steps


def test_vllms_prefix_cache_gives_a_preempted_request_its_own_blocks_back():
    """Without a shared prefix kvcore's cache finds nothing; vLLM's caches every full block, so
    a request admitted again after a preemption finds what it had computed."""
    plan = _plan("meta-llama/Llama-3.1-8B", GIB // 2, 2048)
    workload = _trace("chat", 80)
    vllm = simulate(plan, workload, scheduler=VllmProfile(), prefix_caching=True, registry=REGISTRY)
    ours = simulate(plan, workload, scheduler="kvcore", prefix_caching=True, registry=REGISTRY)
    assert vllm.preemptions > 0
    assert vllm.cached_tokens > 0 and 0 < vllm.prefix_hit_rate < 1
    assert ours.cached_tokens == 0


def test_async_scheduling_takes_no_fewer_steps():
    """A step's output returns a step later: a request's next token waits one more step at the
    end of its prefill, and finishing requests free their blocks later."""
    plan = _plan("meta-llama/Llama-3.2-1B", GIB // 4, 2048)
    workload = _trace("chat", 60)
    sync = simulate(plan, workload, scheduler=VllmProfile(async_scheduling=False), registry=REGISTRY)
    lagged = simulate(plan, workload, scheduler=VllmProfile(async_scheduling=True), registry=REGISTRY)
    assert lagged.steps >= sync.steps


def test_a_request_the_gate_never_admits_is_an_error_not_an_endless_run():
    """gpt-oss-20b's kind_pools plan at 1/4 GiB, async scheduling: the sliding group's admission
    cap counts two steps in flight (128 + 2 x 2,048 tokens, 264 blocks) and its pool has 238, so
    a 4,050-token request is never admitted. The last (empty) step's output is always in flight;
    the run must still stop and say so (it looped without end)."""
    context = SizingContext(max_model_len=4096, max_num_batched_tokens=2048)
    specs = model_layer_specs("openai/gpt-oss-20b", REGISTRY)
    plan = plan_kv_cache(specs, GIB // 4, context, registry=REGISTRY, policy="kind_pools")
    workload = Workload([Request(0, 3900, 150)], name="one long request")
    stepper = VllmProfile().simulator(plan, workload, max_num_batched_tokens=None, prefix_caching=False)
    with pytest.raises(
        InvalidInputError, match=r"request 0 .* cannot be admitted even with the pool to itself"
    ):
        for _ in range(100):  # it must stop at once, not after any number of steps
            stepper.step()
    # synchronous, the cap is one step in flight (136 blocks): the same request runs
    assert simulate(plan, workload, scheduler=VllmProfile(async_scheduling=False)).steps > 0


def test_a_request_that_cannot_grow_alone_without_the_gate_is_an_error_not_an_endless_run():
    """Gemma-3-27B's kind_pools plan at 4 GiB, the admission gate off: a long document is admitted
    when its first chunk fits, cannot take its second chunk even with the pool to itself, is
    preempted, and admitted again: it looped without end (200,000 preemptions in 400,000 steps).
    The run must stop and say so; with the gate on the same request is refused at once. With
    prefix caching on and dense retention it finds its own blocks when admitted again and the run
    ends; under vLLM's default ``prefix_cache_retention_interval`` (0) the sliding windows keep
    no block where it was preempted (only before its prompt's end), so it loops as without
    caching and is refused the same way."""
    context = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)
    specs = model_layer_specs("google/gemma-3-27b-it", REGISTRY)
    plan = plan_kv_cache(specs, 4 * GIB, context, registry=REGISTRY, policy="kind_pools")
    workload = _trace("long-documents", 12)
    gateless = VllmProfile(reserve_full_isl=False)
    stepper = gateless.simulator(plan, workload, max_num_batched_tokens=None, prefix_caching=False)
    with pytest.raises(InvalidInputError, match=r"cannot grow past 2,048 computed tokens even with the pool"):
        for _ in range(100):  # it must stop within a few steps
            stepper.step()
    dense = attrs.evolve(gateless, prefix_cache_retention_interval=None)
    assert simulate(plan, workload, scheduler=dense, prefix_caching=True, registry=REGISTRY).steps > 0
    with pytest.raises(InvalidInputError, match=r"cannot grow past 2,048 computed tokens even with the pool"):
        simulate(plan, workload, scheduler=gateless, prefix_caching=True, registry=REGISTRY)
    with pytest.raises(InvalidInputError, match="cannot be admitted even with the pool to itself"):
        simulate(plan, workload, scheduler=VllmProfile(), registry=REGISTRY)


@pytest.mark.parametrize("policy", ["shared_buffer", "equal_groups", "kind_pools"])
@pytest.mark.parametrize("seed", [0, 1])
def test_vllms_prefix_cache_changes_nothing_when_nothing_can_hit(policy, seed):
    """No shared prefix and no preemption: no request can hit a cached block, and a cached free
    block counts as free, so caching on must give every figure of caching off. On Gemma-3's
    plans (sliding windows, equal groups: ``equal_groups`` makes 31 groups of two specs) at 40 GiB
    the pool runs out of uncached blocks and evicts thousands of times, so this holds the free
    queue's accounting to account: blocks freed before their window and at a request's end queue
    as runs, allocations evict from them, and a class of equal groups shares a table."""
    context = SizingContext(max_model_len=8192, max_num_batched_tokens=2048)
    specs = model_layer_specs("google/gemma-3-27b-it", REGISTRY)
    plan = plan_kv_cache(specs, 40 * GIB, context, registry=REGISTRY, policy=policy)
    prompt, output = parse_length("lognormal:1024:1.0"), parse_length("lognormal:200:1.0")
    workload = synthetic(150, prompt, output, rate=0.6, seed=seed, max_model_len=8192)
    off = simulate(plan, workload, registry=REGISTRY)
    on = simulate(plan, workload, prefix_caching=True, registry=REGISTRY)
    assert off.preemptions == 0  # the case's premise: nobody comes back to hit its own blocks
    assert on.cached_tokens == 0
    assert (on.steps, on.running, on.pool_usage, on.total_tokens, on.mean_queue_delay) == (
        off.steps,
        off.running,
        off.pool_usage,
        off.total_tokens,
        off.mean_queue_delay,
    )


class _FullPathSimulator(VllmSimulator):
    """The ``vllm`` profile with every speed path off (``speed_paths=()``): every running request
    is visited every step, every decode's boundary call takes the full ``_allocate``, a refused
    admission is gated again each step, and a finished request's pages are freed group by
    group. A class (not a partial) so that a test can subclass it as it subclasses the fast one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, speed_paths=(), **kwargs)


@pytest.mark.parametrize("policy", ["shared_buffer", "equal_groups", "kind_pools"])
@pytest.mark.parametrize("prefix_share", [0.0, 0.7])
@pytest.mark.parametrize("memory", [12, 40])
def test_vllms_lean_paths_give_the_full_paths_figures(policy, prefix_share, memory):
    """The ``vllm`` profile's lean paths (a decode's boundary call on compact tables, a refused
    admission not retried while the pools fall short of the same need, a finished request freed
    per class) change no figure: every field of the result, per-step series included, matches
    the full path's on Gemma-3's plans, with and without a shared prefix (tables that stop being
    compact), at a budget that preempts (12 GiB) and one that evicts without preempting."""
    context = SizingContext(max_model_len=8192, max_num_batched_tokens=2048)
    specs = model_layer_specs("google/gemma-3-27b-it", REGISTRY)
    plan = plan_kv_cache(specs, memory * GIB, context, registry=REGISTRY, policy=policy)
    prompt, output = parse_length("lognormal:1024:1.0"), parse_length("lognormal:200:1.0")
    workload = synthetic(
        150,
        prompt,
        output,
        rate=0.6,
        seed=1,
        max_model_len=8192,
        prefix_share=prefix_share,
        prefix_tokens=1024,
    )
    results = []
    for simulator in (VllmSimulator, _FullPathSimulator):
        stepper = simulator(plan, workload, VllmProfile(), prefix_caching=True)
        while not stepper.done:
            stepper.step()
        results.append(stepper.result())
    lean, full = results
    if memory == 12:
        assert lean.preemptions > 0  # the case's premise: preempted requests come back
    assert lean.cached_tokens == full.cached_tokens
    assert lean == full


class _CountingSimulator(VllmSimulator):
    """The ``vllm`` profile, counting the steps its steady decoders ran without a visit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unvisited = 0

    def _settle(self, r, step):
        self.unvisited += step - self._since[r]
        super()._settle(r, step)


def _dropping_budget(simulator):
    """``simulator`` whose token budget drops to 8 every fifth step: the decoders after the
    eighth token of those steps do not run (vLLM's loop stops where the budget runs out), which
    a fixed budget never leaves behind a steady decoder (a request is admitted only while the
    budget lasts, so the running requests after it are the latest admitted, still prefilling)."""

    class Dropping(simulator):
        def step(self):
            self.budget = 8 if self.steps % 5 == 4 else 2048
            super().step()

    return Dropping


@pytest.mark.parametrize(
    ("profile", "memory", "budget"),
    [
        (VllmProfile(), 40, None),
        (VllmProfile(async_scheduling=False), 40, None),
        (VllmProfile(), 40, _dropping_budget),
        (VllmProfile(async_scheduling=False), 40, _dropping_budget),
        # a budget that preempts: steady decoders are the victims
        (VllmProfile(), 12, None),
        (VllmProfile(async_scheduling=False, long_prefill_token_threshold=300, max_num_seqs=40), 12, None),
    ],
    ids=[
        "async",
        "sync",
        "async-budget-drops",
        "sync-budget-drops",
        "async-preempts",
        "sync-threshold-preempts",
    ],
)
@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("policy", ["shared_buffer", "kind_pools"])
def test_vllms_steady_decoders_give_the_figures_of_visiting_every_request(
    policy, caching, profile, memory, budget
):
    """A steady decoder (a decode that changes no table, caches nothing and does not finish for
    some steps) is counted, not visited, until its next event; its counts are brought up to date
    when it is visited, preempted or left out by the token budget. Every field of the result,
    per-step series and the step-time model's timeline included, matches visiting every
    request every step: sync and async (an output still in flight when it is brought up to
    date), a budget that runs out among the decoders, preemptions, a shared prefix, caching
    off and on."""
    context = SizingContext(max_model_len=8192, max_num_batched_tokens=2048)
    specs = model_layer_specs("google/gemma-3-27b-it", REGISTRY)
    plan = plan_kv_cache(specs, memory * GIB, context, registry=REGISTRY, policy=policy)
    prompt, output = parse_length("lognormal:1024:1.0"), parse_length("lognormal:200:1.0")
    workload = synthetic(
        120, prompt, output, rate=0.6, seed=2, max_model_len=8192, prefix_share=0.5, prefix_tokens=512
    )
    config, _ = load_model_config("google/gemma-3-27b-it")
    step_time = roofline(config, REGISTRY, plan, find_gpu("H100"))
    results = []
    steppers = []
    for simulator in (_CountingSimulator, _FullPathSimulator):
        if budget is not None:
            simulator = budget(simulator)
        stepper = simulator(plan, workload, profile, prefix_caching=caching, step_time=step_time)
        while not stepper.done:
            stepper.step()
        results.append(stepper.result())
        steppers.append(stepper)
    steady, visited = results
    assert steppers[0].unvisited > 1000  # the case's premise: decoders did run unvisited
    if memory == 12:
        assert steady.preemptions > 0
    assert steady.timeline is not None
    assert steady == visited
