"""The ``vllm`` profile's fast path (:class:`~kvcore.simulation.profiles.vllm.VllmSimulator`: steady
decoders, compact tables, lazy hashing, the free queue as runs, the admission memo, event
bounds), with every speed path on, none on (``speed_paths=()``) or any mix of them, held to its
plain reference (:mod:`kvcore.simulation.profiles.vllm_reference`: vLLM's scheduler and KV-cache
manager, method by method): on random plans and traces, every field of the result, per-step
series and the timeline included, is the same, or both refuse the run with the same error."""

from __future__ import annotations

import os
import warnings

import attrs
import pytest
from hypothesis import HealthCheck, event, given, reject, settings, strategies as st

from kvcore import SizingContext, simulate
from kvcore.errors import InvalidInputError, PolicyNotApplicableError, SimulationWarning
from kvcore.plan import KVCachePlan
from kvcore.planning.capacity import request_bytes
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.plugins.state import StatePart
from kvcore.simulation.profiles.vllm import SPEED_PATHS, VllmProfile, VllmSimulator
from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler
from kvcore.simulation.steps import StepRecord
from kvcore.simulation.workload import Request, Workload
from kvcore.testing import strategies as kst

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))

#: the kinds the profile runs: full attention, sliding windows, chunked local attention, MLA, state
KINDS = ("full_attention", "sliding_window", "chunked_local_attention", "mla", "state")
POLICIES = ("uniform", "shared_buffer", "equal_groups", "kind_pools", "unified_pool")


@attrs.frozen
class _SecondsPerToken:
    """A step-time model: a fixed cost per step and per token, so the timeline follows the steps."""

    description: str = "test: 1 ms a step + 10 us a token"

    def __call__(self, record: StepRecord) -> float:
        return 1e-3 + 1e-5 * (record.prefill_tokens + record.decode_tokens)


def _contexts() -> st.SearchStrategy[SizingContext]:
    return kst.sizing_contexts(
        max_model_len=st.integers(32, 640), max_num_batched_tokens=st.sampled_from([8, 32, 64, 256])
    )


@st.composite
def _plans(draw: st.DrawFn) -> KVCachePlan:
    """A plan of up to three specs of the profile's kinds, by any built-in policy, whose budget
    holds one to two (or four) requests of ``max_model_len`` (tight: requests wait, preempt
    and evict)."""
    specs = draw(
        kst.layer_specs(max_layers=6, max_distinct=3, spec_strategy=kst.specs(KINDS, registry=REGISTRY))
    )
    return _tight_plan(draw, specs)


@st.composite
def _windowed_plans(draw: st.DrawFn) -> KVCachePlan:
    """Gemma-3's shape: several layers of full attention and of sliding windows short enough
    for requests to outgrow, of one block size (one hash block: lazy hashing is on), so a
    request with a shared prefix or a hit frees pages before its window and finishes with
    shared and own pages (the speed path ``shared_runs``)."""
    block = draw(st.sampled_from([4, 8, 16]))
    shape = {"block_size": block, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    full = REGISTRY.spec_class("full_attention")(**shape)
    sliding = REGISTRY.spec_class("sliding_window")(
        **shape, sliding_window=draw(st.integers(block, 8 * block))
    )
    pattern = draw(st.lists(st.booleans(), min_size=2, max_size=8).filter(lambda kinds: len(set(kinds)) == 2))
    return _tight_plan(draw, {f"model.layers.{i}": sliding if s else full for i, s in enumerate(pattern)})


def _tight_plan(draw: st.DrawFn, specs: dict) -> KVCachePlan:
    """A plan of ``specs`` by any built-in policy whose budget holds one to two (or four)
    requests of ``max_model_len``."""
    context = draw(_contexts())
    need = request_bytes(specs, context)
    budget = draw(st.integers(need, draw(st.sampled_from([2, 2, 4])) * need))
    problem = kst.PlanningProblem(specs=specs, context=context, available_bytes=budget)
    policy = draw(st.sampled_from(POLICIES))
    try:
        plan = problem.plan(policy, REGISTRY)
    except PolicyNotApplicableError:
        reject()
    if not plan.usable_blocks:
        reject()
    return plan


@st.composite
def _state_plans(draw: st.DrawFn) -> KVCachePlan:
    """A plan of state (Mamba) layers beside attention layers of one block size (full, sliding,
    chunked local, MLA), or of state layers alone: with prefix caching, vLLM runs the state
    layers in ``mamba_cache_mode='align'``, whose states hit."""
    block = draw(st.sampled_from([8, 16, 32]))
    attention = draw(
        kst.layer_specs(
            min_layers=0,
            max_layers=4,
            max_distinct=2,
            spec_strategy=kst.specs(KINDS[:-1], registry=REGISTRY).map(
                lambda spec: attrs.evolve(spec, block_size=block)
            ),
        )
    )
    states = draw(
        kst.layer_specs(
            max_layers=3, max_distinct=2, spec_strategy=kst.specs(["state"], registry=REGISTRY), prefix="s."
        )
    )
    specs = {**attention, **states}
    context = draw(_contexts())
    need = request_bytes(specs, context)
    budget = draw(st.integers(need, draw(st.sampled_from([2, 3, 4])) * need))
    problem = kst.PlanningProblem(specs=specs, context=context, available_bytes=budget)
    try:
        plan = problem.plan(draw(st.sampled_from(POLICIES)), REGISTRY)
    except PolicyNotApplicableError:
        reject()
    if not plan.usable_blocks:
        reject()
    return plan


def _multi_pool_plans() -> st.SearchStrategy[KVCachePlan]:
    """Plans of several pools (``kind_pools`` plans and hand-built ones: pages of several block
    ids, pools of unequal sizes)."""
    context = SizingContext(max_model_len=256, max_num_batched_tokens=64)
    return kst.multi_pool_plans(kinds=KINDS, registry=REGISTRY, context=context, max_requests=2)


@st.composite
def _workloads(draw: st.DrawFn, max_model_len: int, *, seconds: bool = False) -> Workload:
    """2 to 16 requests: bursts (several arriving at one step) and gaps, short and long prompts
    (up to ``max_model_len``), some leading with one of two shared prefixes; with ``seconds``,
    the arrivals are times (10 ms a step)."""
    count = draw(st.integers(2, 16))
    prefixes = draw(st.lists(st.integers(1, max(1, max_model_len // 2)), min_size=2, max_size=2))
    arrivals = sorted(
        draw(st.lists(st.sampled_from([0, 0, 0, 1, 3, 10, 40]), min_size=count, max_size=count))
    )
    requests = []
    for index, arrival in enumerate(arrivals):
        long = draw(st.booleans())
        top = max_model_len - 1 if long else max(1, min(max_model_len - 1, 96))
        prompt = draw(st.integers(1, max(1, top)))
        output = draw(
            st.integers(1, max(1, min(max_model_len - prompt, draw(st.sampled_from([8, 48, 200])))))
        )
        share = draw(st.sampled_from([None, 0, 0, 1]))
        # a request may share the whole prefix or its first half (a prefix's requests sharing
        # more or less of it)
        prefix = (
            min(prefixes[share] // draw(st.sampled_from([1, 1, 2])) or 1, prompt) if share is not None else 0
        )
        requests.append(
            Request(
                id=index,
                prompt_tokens=prompt,
                output_tokens=output,
                arrival_step=0 if seconds else arrival,
                arrival_time=arrival / 100 if seconds else None,
                prefix_id=share if prefix else None,
                prefix_tokens=prefix,
            )
        )
    return Workload(tuple(requests), name="random")


def _profiles() -> st.SearchStrategy[VllmProfile]:
    return st.builds(
        VllmProfile,
        async_scheduling=st.booleans(),
        max_num_seqs=st.sampled_from([1, 3, 128]),
        reserve_full_isl=st.sampled_from([True, True, False]),
        long_prefill_token_threshold=st.sampled_from([0, 0, 16]),
        # vLLM's default (0: a window caches only where a later request can resume), dense, or
        # periodic (a multiple of the scheduler's block, or both refuse it alike)
        prefix_cache_retention_interval=st.sampled_from([0, 0, None, 32, 64]),
    )


def _speed_paths() -> st.SearchStrategy[frozenset[str]]:
    """Every speed path, none, or any mix."""
    every = frozenset(SPEED_PATHS)
    return st.one_of(st.just(every), st.just(frozenset()), st.frozensets(st.sampled_from(SPEED_PATHS)))


def _run(
    stepper_class: type,
    plan: KVCachePlan,
    workload: Workload,
    profile: VllmProfile,
    caching: bool,
    timed: bool,
    **options,
):
    """The run's result, or the error that refused it (its type and message); the warning of a
    chunked group off the scheduler's block (which then never hits) is left out."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        try:
            stepper = stepper_class(
                plan,
                workload,
                profile,
                prefix_caching=caching,
                step_time=_SecondsPerToken() if timed else None,
                **options,
            )
            for _ in range(20_000):  # every run here ends in far fewer steps
                if stepper.done:
                    return stepper.result()
                stepper.step()
        except InvalidInputError as error:
            return (type(error), str(error))
    raise AssertionError("the run did not end in 20,000 steps")


#: what each example draws: a plan (one pool or several), a profile, a workload, and the switches
DRAWS = {
    "data": st.data(),
    "plan": st.one_of(_plans(), _plans(), _plans(), _windowed_plans(), _multi_pool_plans(), _state_plans()),
    "profile": _profiles(),
    "caching": st.booleans(),
    "timed": st.booleans(),
    "paths": _speed_paths(),
}
#: plans and workloads are filtered, and a run of either scheduler takes a while
HEALTH = [HealthCheck.too_slow, HealthCheck.filter_too_much]


@pytest.mark.property
@settings(deadline=None, suppress_health_check=HEALTH)
@given(**DRAWS)
def test_the_fast_path_gives_the_references_figures(data, plan, profile, caching, timed, paths):
    """The fast path against the reference, as many examples as the hypothesis profile runs
    (60 in ``ci``); the slow run hunts longer (the next test)."""
    _fast_path_equals_reference(data, plan, profile, caching, timed, paths)


@pytest.mark.slow
@pytest.mark.property
@settings(
    max_examples=int(os.environ.get("KVCORE_REFERENCE_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=HEALTH,
)
@given(**DRAWS)
def test_the_fast_path_gives_the_references_figures_over_a_longer_hunt(
    data, plan, profile, caching, timed, paths
):
    """The same check over 200 examples (``KVCORE_REFERENCE_EXAMPLES`` sets the count): about
    12 s on a loaded 2-core machine, so it runs with the slow set (CI runs it)."""
    _fast_path_equals_reference(data, plan, profile, caching, timed, paths)


def _fast_path_equals_reference(data, plan, profile, caching, timed, paths):
    """Every field of the fast path's result, with any of its speed paths on, equals the
    reference's, per-step running requests and pool usage, preemptions, recomputed and cached
    tokens, queue delays and the timeline included; or both refuse the run with one error."""
    workload = data.draw(_workloads(plan.context.max_model_len, seconds=timed and data.draw(st.booleans())))
    event(f"speed paths: {'all' if len(paths) == len(SPEED_PATHS) else len(paths)}")
    fast = _run(VllmSimulator, plan, workload, profile, caching, timed, speed_paths=paths)
    reference = _run(VllmReferenceScheduler, plan, workload, profile, caching, timed)
    if isinstance(fast, tuple) or isinstance(reference, tuple):
        event("refused")
        assert fast == reference
        return
    event(f"preempts: {fast.preemptions > 0}")
    event(f"hits: {fast.cached_tokens > 0}")
    event(f"kinds: {sorted({type(g.spec).kind for g in plan.groups})}")
    if caching and any(type(g.spec).kind == "state" for g in plan.groups):
        retention = profile.prefix_cache_retention_interval
        event(f"state groups, caching on, retention {retention}: hits {fast.cached_tokens > 0}")
    for field in attrs.fields(type(fast)):
        assert getattr(fast, field.name) == getattr(reference, field.name), field.name


def test_the_reference_is_reachable_by_name_and_flag():
    """``vllm-reference`` (and ``VllmProfile(reference=True)``) replay with the reference; the
    result names the profile that ran and gives the ``vllm`` profile's figures."""
    profile = REGISTRY.scheduler_profile("vllm-reference")
    assert isinstance(profile, VllmProfile) and profile.reference
    plan = kst.PlanningProblem(
        specs={
            "model.layers.0": REGISTRY.spec_class("full_attention")(
                block_size=16, num_kv_heads=1, head_size=8, dtype="float16"
            )
        },
        context=SizingContext(max_model_len=256, max_num_batched_tokens=64),
        available_bytes=8 * 2**10,  # 16 blocks of 16 tokens
    ).plan("uniform", REGISTRY)
    workload = Workload(
        tuple(
            Request(id=i, prompt_tokens=100 + i, output_tokens=40, prefix_id=0, prefix_tokens=64)
            for i in range(6)
        ),
        name="six",
    )
    by_name = simulate(plan, workload, scheduler="vllm-reference", prefix_caching=True, registry=REGISTRY)
    fast = simulate(plan, workload, scheduler="vllm", prefix_caching=True, registry=REGISTRY)
    assert by_name.scheduler == "vllm-reference" and fast.scheduler == "vllm"
    assert attrs.evolve(by_name, scheduler="vllm") == fast
    assert fast.cached_tokens > 0 and fast.preemptions > 0  # the case's premise: hits, a tight pool
    flagged = simulate(
        plan, workload, scheduler=VllmProfile(reference=True), prefix_caching=True, registry=REGISTRY
    )
    assert flagged == fast


@pytest.mark.parametrize("caching", [False, True])
def test_the_reference_refuses_what_the_fast_path_refuses(caching):
    """A request the pool cannot hold even alone is the same one-line error from both."""
    plan = kst.PlanningProblem(
        specs={
            "model.layers.0": REGISTRY.spec_class("full_attention")(
                block_size=16, num_kv_heads=1, head_size=8, dtype="float16"
            )
        },
        context=SizingContext(max_model_len=512, max_num_batched_tokens=64),
        available_bytes=8 * 2**10,
    ).plan("uniform", REGISTRY)
    workload = Workload((Request(id=0, prompt_tokens=500, output_tokens=4),), name="one")
    errors = []
    for reference in (False, True):
        with pytest.raises(
            InvalidInputError, match="cannot be admitted even with the pool to itself"
        ) as caught:
            simulate(
                plan,
                workload,
                scheduler=VllmProfile(reference=reference),
                prefix_caching=caching,
                registry=REGISTRY,
            )
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


def test_an_unknown_speed_path_is_refused():
    """A speed path the profile does not have is a one-line error naming those it has."""
    plan = kst.PlanningProblem(
        specs={
            "model.layers.0": REGISTRY.spec_class("full_attention")(
                block_size=16, num_kv_heads=1, head_size=8, dtype="float16"
            )
        },
        context=SizingContext(max_model_len=256, max_num_batched_tokens=64),
        available_bytes=8 * 2**10,
    ).plan("uniform", REGISTRY)
    workload = Workload((Request(id=0, prompt_tokens=10, output_tokens=4),), name="one")
    with pytest.raises(InvalidInputError, match="unknown speed path 'warp': the vllm profile's are event_"):
        VllmSimulator(plan, workload, VllmProfile(), speed_paths=("warp",))


@pytest.mark.property
@settings(deadline=None, suppress_health_check=HEALTH)
@given(
    data=st.data(),
    plan=_state_plans(),
    profile=_profiles(),
    timed=st.booleans(),
    paths=_speed_paths(),
)
def test_the_fast_path_gives_the_references_figures_with_cached_states(data, plan, profile, timed, paths):
    """State groups under prefix caching (vLLM's ``mamba_cache_mode='align'``): the fast path,
    whose speed paths step aside for them, against the reference."""
    _fast_path_equals_reference(data, plan, profile, True, timed, paths)


def _full_and_sliding_plan():
    """One full-attention and one 32-token sliding layer, blocks of 16, in 512 KiB."""
    shape = {"block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    return kst.PlanningProblem(
        specs={
            "model.layers.0": REGISTRY.spec_class("full_attention")(**shape),
            "model.layers.1": REGISTRY.spec_class("sliding_window")(**shape, sliding_window=32),
        },
        context=SizingContext(max_model_len=512, max_num_batched_tokens=256),
        available_bytes=512 * 2**10,
    ).plan("shared_buffer", REGISTRY)


def test_requests_sharing_more_or_less_of_a_prefix_hit_what_they_share():
    """Two requests that never ran, of one prefix, looked up in one step, one sharing all of it
    and one half (``hit_memo`` remembers the hit per prefix and length shared): each hits what
    it shares, as the reference's do."""
    plan = _full_and_sliding_plan()
    workload = Workload(
        (
            Request(id=0, prompt_tokens=200, output_tokens=4, prefix_id=0, prefix_tokens=128),
            Request(
                id=1, prompt_tokens=180, output_tokens=4, arrival_step=20, prefix_id=0, prefix_tokens=128
            ),
            Request(id=2, prompt_tokens=170, output_tokens=4, arrival_step=20, prefix_id=0, prefix_tokens=64),
        ),
        name="more or less of a prefix",
    )
    # dense retention: the window keeps every block, so the prefix computed by the first
    # request is hit by the next two (vLLM's default keeps only its prompt's end: see below)
    profile = VllmProfile(prefix_cache_retention_interval=None)
    fast = _run(VllmSimulator, plan, workload, profile, True, False)
    assert fast == _run(VllmReferenceScheduler, plan, workload, profile, True, False)
    assert fast.cached_tokens == 128 + 64  # the premise: both hit, each what it shares


def _three_in_turn() -> Workload:
    """Three requests of one 128-token prefix, each arriving once the one before has finished."""
    return Workload(
        tuple(
            Request(
                id=i,
                prompt_tokens=200 + i,
                output_tokens=4,
                arrival_step=20 * i,
                prefix_id=0,
                prefix_tokens=128,
            )
            for i in range(3)
        ),
        name="three in turn",
    )


@pytest.mark.parametrize("reference", [False, True])
def test_a_thinned_window_hits_a_shared_prefix_from_its_third_request(reference):
    """vLLM's default ``prefix_cache_retention_interval`` 0: a sliding window caches only the
    blocks a later request can resume at. The first request of a prefix keeps its window's
    blocks before its own prompt's end, not the prefix's; the second finds the prefix in full
    attention only (no hit) and keeps the window's blocks at the prefix's end (its junction);
    the third hits the prefix. Dense retention (``None``) lets the second hit it already."""
    plan = _full_and_sliding_plan()
    workload = _three_in_turn()
    stepper = VllmReferenceScheduler if reference else VllmSimulator
    sparse = _run(stepper, plan, workload, VllmProfile(), True, False)
    dense = _run(stepper, plan, workload, VllmProfile(prefix_cache_retention_interval=None), True, False)
    assert sparse.cached_tokens == 128 and dense.cached_tokens == 2 * 128


@pytest.mark.parametrize("interval", [0, 64])
def test_thinned_windows_keep_every_speed_path_and_the_references_figures(interval):
    """vLLM's sparse retention keeps every speed path on (lazy hashing counts as cached, when a
    request's own blocks are freed, only those vLLM would have hashed) and the figures stay the
    reference's: 40 requests, half of them of one shared prefix, the admission gate off on a pool
    tight enough to preempt and evict, sync and async."""
    shape = {"block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    full = REGISTRY.spec_class("full_attention")(**shape)
    sliding = REGISTRY.spec_class("sliding_window")(**shape, sliding_window=48)
    plan = kst.PlanningProblem(  # Gemma-3's shape: two sliding layers to one full one
        specs={f"model.layers.{i}": sliding if i % 3 else full for i in range(6)},
        context=SizingContext(max_model_len=512, max_num_batched_tokens=128),
        available_bytes=160 * 2**10,
    ).plan("equal_groups", REGISTRY)
    requests = tuple(
        Request(
            id=i,
            prompt_tokens=120 + 37 * i % 200,
            output_tokens=20 + 13 * i % 90,
            arrival_step=3 * i,
            prefix_id=0 if i % 2 else None,
            prefix_tokens=96 if i % 2 else 0,
        )
        for i in range(40)
    )
    workload = Workload(requests, name="shared prefixes, tight")
    for scheduling in (False, True):
        profile = VllmProfile(
            async_scheduling=scheduling, reserve_full_isl=False, prefix_cache_retention_interval=interval
        )
        stepper = VllmSimulator(plan, workload, profile, prefix_caching=True)
        assert stepper.speed_paths == frozenset(SPEED_PATHS)
        fast = _run(VllmSimulator, plan, workload, profile, True, False)
        reference = _run(VllmReferenceScheduler, plan, workload, profile, True, False)
        assert fast == reference
        assert fast.preemptions and fast.cached_tokens  # the premise: it preempts and hits


def test_a_preempted_requests_unread_runs_still_queued_at_its_next_lookup(monkeypatch):
    """A preempted request's runs left unread at a lookup (``unread_runs``: marked deferred) and
    still in the free queue when it is looked up again (it was not admitted in between): the
    second lookup leaves them unread too, and the figures stay the reference's. The case is the
    one hypothesis found reaching it (one pool of 17 blocks of 4 tokens, full attention beside a
    4-token window, the admission gate off)."""
    shape = {"block_size": 4, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    plan = kst.PlanningProblem(
        specs={
            "model.layers.0": REGISTRY.spec_class("full_attention")(**shape),
            "model.layers.1": REGISTRY.spec_class("sliding_window")(**shape, sliding_window=4),
        },
        context=SizingContext(max_model_len=32, max_num_batched_tokens=8),
        available_bytes=2268,
    ).plan("unified_pool", REGISTRY)
    assert plan.usable_blocks == 17
    workload = Workload(
        tuple(
            Request(id=i, prompt_tokens=prompt, output_tokens=output)
            for i, (prompt, output) in enumerate([(10, 9), (22, 6), (3, 6), (1, 3)])
        ),
        name="four at once",
    )
    profile = VllmProfile(
        async_scheduling=False, reserve_full_isl=False, prefix_cache_retention_interval=None
    )
    unread_again = []  # lookups that found the runs a lookup before left unread, some still queued

    class Spy(VllmSimulator):  # (a subclass, not a patch: the compiled build's classes take none)
        def _leaves_runs_unread(self, r):
            pending = tuple(self._pending[r])
            if self._unread.get(r) == pending and any(self._runs.get(key) is not None for key in pending):
                unread_again.append(r)
            return super()._leaves_runs_unread(r)

    fast = _run(Spy, plan, workload, profile, True, False)
    assert unread_again  # the premise: the corner is reached
    assert fast == _run(VllmReferenceScheduler, plan, workload, profile, True, False)


def test_a_retention_interval_vllm_refuses_is_refused():
    """A positive interval off the scheduler's block, or on a plan with no sliding window, is
    the one-line error vLLM's check gives, from the fast path and the reference alike; without
    prefix caching a state group's block is ``max_model_len`` (``mamba_cache_mode='none'``),
    which the scheduler's block then counts."""
    shape = {"block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    full = {"model.layers.0": REGISTRY.spec_class("full_attention")(**shape)}
    hybrid = {**full, "model.layers.1": REGISTRY.spec_class("sliding_window")(**shape, sliding_window=32)}
    state = REGISTRY.spec_class("state")(
        block_size=16, parts=(StatePart(name="conv", shape=(4, 32), dtype="float16"),)
    )
    mamba = {**full, "model.layers.1": state}
    context = SizingContext(max_model_len=256, max_num_batched_tokens=64)
    workload = Workload((Request(id=0, prompt_tokens=10, output_tokens=4),), name="one")
    for specs, policy, interval, caching, message in (
        (
            hybrid,
            "shared_buffer",
            24,
            True,
            "retention_interval 24 is not a multiple of the scheduler's block (16",
        ),
        (
            full,
            "uniform",
            32,
            True,
            "retention_interval 32: policy 'uniform' has no sliding-window or state group",
        ),
        (
            mamba,
            "shared_buffer",
            64,
            False,
            "retention_interval 64 is not a multiple of the scheduler's block (256",
        ),
    ):
        plan = kst.PlanningProblem(specs=specs, context=context, available_bytes=64 * 2**10).plan(
            policy, REGISTRY
        )
        profile = VllmProfile(prefix_cache_retention_interval=interval)
        for stepper in (VllmSimulator, VllmReferenceScheduler):
            error, text = _run(stepper, plan, workload, profile, caching, False)
            assert error is InvalidInputError and message in text, text
    # with prefix caching, the state block is the attention block: 64 is a multiple of it
    plan = kst.PlanningProblem(specs=mamba, context=context, available_bytes=64 * 2**10).plan(
        "shared_buffer", REGISTRY
    )
    profile = VllmProfile(prefix_cache_retention_interval=64)
    assert not isinstance(_run(VllmSimulator, plan, workload, profile, True, False), tuple)


def _checkpointed_plan(checkpoint_slots: int):
    """One full-attention layer and one Mamba-2-like state layer (one prefill checkpoint block,
    alignment 1, when ``checkpoint_slots``), blocks of 16, room for a few requests."""
    shape = {"block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    state = REGISTRY.spec_class("state")(
        block_size=16,
        parts=(StatePart(name="conv", shape=(4, 32), dtype="float16"),),
        checkpoint_slots=checkpoint_slots,
        checkpoint_alignment=1 if checkpoint_slots else 0,
    )
    return kst.PlanningProblem(
        specs={"model.layers.0": REGISTRY.spec_class("full_attention")(**shape), "model.layers.1": state},
        context=SizingContext(max_model_len=256, max_num_batched_tokens=256),
        available_bytes=64 * 2**10,
    ).plan("shared_buffer", REGISTRY)


@pytest.mark.parametrize("retention", [None, 0])
@pytest.mark.parametrize("reference", [False, True])
def test_a_prefill_checkpoint_ends_the_prompt_in_one_step_and_is_hit(reference, retention):
    """vLLM 0.33's prefill checkpoint blocks (a Mamba-2 mixer's ``num_prefill_checkpoint_blocks``):
    a 100-token prompt of 16-token state blocks runs in one step, the state at token 96 written
    into a block of its own from inside it, where without them the scheduler stops the chunk at
    96 (a state is kept only at a chunk's end) and the prompt takes two steps. The step holds one
    state block more, and a later request of the same prompt hits those 96 tokens either way."""
    workload = Workload(
        (
            Request(id=0, prompt_tokens=100, output_tokens=4, prefix_id=0, prefix_tokens=100),
            Request(
                id=1, prompt_tokens=100, output_tokens=4, arrival_step=20, prefix_id=0, prefix_tokens=100
            ),
        ),
        name="one prompt twice",
    )
    profile = VllmProfile(async_scheduling=False, prefix_cache_retention_interval=retention)
    stepper = VllmReferenceScheduler if reference else VllmSimulator
    without = _run(stepper, _checkpointed_plan(0), workload, profile, True, False)
    with_checkpoints = _run(stepper, _checkpointed_plan(1), workload, profile, True, False)
    assert without.cached_tokens == with_checkpoints.cached_tokens == 96
    # the first prompt's prefill: two steps without (0-96, 96-100), one with, then 3 decodes;
    # the second's: its hit's rest (96-100), then 3 decodes
    busy = [sum(1 for running in result.running if running) for result in (without, with_checkpoints)]
    assert busy == [5 + 4, 4 + 4]
    plan = _checkpointed_plan(1)
    attention, state = (group.blocks_per_page for group in plan.groups)
    # the first step: 7 attention pages, and 2 states (the checkpoint's, the running one) or 1
    # (a state at 96 only, the chunk's end)
    assert with_checkpoints.pool_usage[0] == pytest.approx((7 * attention + 2 * state) / plan.usable_blocks)
    assert without.pool_usage[0] == pytest.approx((6 * attention + state) / plan.usable_blocks)


@pytest.mark.parametrize("reference", [False, True])
def test_thinned_states_hit_a_shared_prefix_from_its_third_request(reference):
    """A state (Mamba) group under sparse retention (``MambaManager.reachable_block_mask``):
    prompts of 200 tokens leading with one 128-token prefix, chunks of 64, so each request
    holds a state at tokens 64, 128 and 192. Under vLLM's default (0), the first keeps only
    the state before its own prompt's end (192); the second finds the prefix in full attention
    only (no hit) and keeps the state at that junction; the third hits the
    prefix. Dense retention (``None``), or an interval whose segments end at 128 (32, 64), lets
    the second hit it already; one whose segments do not (96) is as 0."""
    shape = {"block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    state = REGISTRY.spec_class("state")(
        block_size=16, parts=(StatePart(name="conv", shape=(4, 32), dtype="float16"),)
    )
    plan = kst.PlanningProblem(
        specs={"model.layers.0": REGISTRY.spec_class("full_attention")(**shape), "model.layers.1": state},
        context=SizingContext(max_model_len=512, max_num_batched_tokens=64),
        available_bytes=512 * 2**10,
    ).plan("shared_buffer", REGISTRY)
    workload = _three_in_turn()
    stepper = VllmReferenceScheduler if reference else VllmSimulator
    cached = {
        interval: _run(
            stepper, plan, workload, VllmProfile(prefix_cache_retention_interval=interval), True, False
        ).cached_tokens
        for interval in (0, None, 32, 64, 96)
    }
    assert cached == {0: 128, None: 2 * 128, 32: 2 * 128, 64: 2 * 128, 96: 128}
