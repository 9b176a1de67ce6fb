"""The engine workflow on a small model built here: scan, profile, plan, allocate, bind, warm up."""

from __future__ import annotations

import logging

import pytest
import torch

from kvcore import (
    Executor,
    InvalidInputError,
    KVCacheBindingError,
    LocalExecutor,
    Registry,
    SizingContext,
    SpecMismatchError,
    get_plugin_manager,
    initialize_kv_caches,
    plan_kv_cache,
)
from kvcore.engine.workflow import capacity_summary, merge_worker_specs
from kvcore.planning.capacity import Capacity
from kvcore.runtime.memory import HostMemory
from kvcore.runtime.torch_dtypes import torch_dtype
from tests.helpers import RecordingExecutor, full, sliding
from tests.runtime._fakes import FakeHost
from tests.runtime._kinds import ToyAttention, ToyAttentionPlugin, ToyModel

MiB = 2**20
ATTN = [f"model.layers.{i}.self_attn" for i in range(4)]


@pytest.fixture
def toy_registry():
    return Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=[ToyAttentionPlugin()]))


def _check_bound(model, plan, executor):
    modules = {name: m for name, m in model.named_modules() if isinstance(m, ToyAttention)}
    assert set(modules) == set(ATTN)
    for name in plan.layer_names:
        group = plan.group_of(name)
        spec = group.spec
        view = modules[name].kv_cache
        assert view.shape == (2, plan.num_pages(group), spec.block_size, spec.num_kv_heads, spec.head_size)
        assert view.dtype == torch_dtype(spec.dtype) and view is executor.kv_caches[name]


def test_initialize_kv_caches_profiles_plans_allocates_binds_and_warms_up(toy_registry, caplog):
    model = ToyModel()
    host = FakeHost(total=1024 * MiB, available=20 * MiB, rss=100 * MiB)
    seen = []

    def profile(m):
        seen.append("profile")
        m(torch.randn(64, 32))  # the largest batch the engine will run
        host.run(2 * MiB)  # what the fake device saw that run take

    def warmup(m):
        seen.append("warmup")
        assert all(mod.kv_cache is not None for mod in m.modules() if isinstance(mod, ToyAttention))
        m(torch.randn(8, 32))

    executor = LocalExecutor(
        model,
        "cpu",
        registry=toy_registry,
        profile_fn=profile,
        warmup_fn=warmup,
        utilization=0.5,
        memory=host,
    )
    assert isinstance(executor, Executor)
    with caplog.at_level(logging.INFO, logger="kvcore"):
        plan = initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    assert seen == ["profile", "warmup"]
    assert plan.available_memory_bytes == 10 * MiB - 2 * MiB == executor.memory_profile.kv_cache_bytes
    assert plan.policy == "shared_buffer" and set(plan.layer_names) == set(ATTN)
    _check_bound(model, plan, executor)
    written = model.model.layers[1].self_attn.kv_cache[:, 0]
    assert written.abs().sum() > 0  # the warm-up forward wrote through the bound view
    assert executor.plan is plan and set(executor.timings) >= {
        "specs",
        "memory",
        "allocate",
        "bind",
        "warmup",
    }
    assert "max concurrency" in caplog.text and "KV cache budget" in caplog.text


def test_the_real_host_probe_drives_the_same_workflow(toy_registry, frozen_heap):  # it collects garbage
    model = ToyModel()
    share = 16 * MiB / HostMemory().sample().free_bytes
    executor = LocalExecutor(
        model, "cpu", registry=toy_registry, utilization=share, profile_fn=lambda m: m(torch.randn(4, 32))
    )
    plan = initialize_kv_caches(executor, registry=toy_registry, max_model_len=128)
    profile = executor.memory_profile
    assert profile.source == "profiled"
    # The host's free memory moves between the sample above and the executor's own (other
    # processes, the other test workers among them, allocate and free meanwhile), so the cap is
    # the share of the executor's own sample: about 16 MiB, exactly share x its free bytes; the
    # plan must stay inside the budget the probe set.
    assert profile.cap_bytes == int(profile.free_before_bytes * share)
    assert 0 < profile.cap_bytes < profile.free_before_bytes
    assert 0 < plan.kv_cache_bytes <= profile.kv_cache_bytes <= profile.cap_bytes
    _check_bound(model, plan, executor)


def test_meta_device_with_a_fixed_size_checks_shapes_without_memory(toy_registry):
    model = ToyModel(num_layers=4)
    executor = LocalExecutor(model, "meta", registry=toy_registry, kv_cache_bytes=64 * 2**30)
    plan = initialize_kv_caches(executor, registry=toy_registry, max_model_len=131072)
    assert plan.kv_cache_bytes > 60 * 2**30
    _check_bound(model, plan, executor)
    assert model.model.layers[0].self_attn.kv_cache.is_meta


def test_kv_sharing_layers_take_no_memory_and_get_their_target_view(toy_registry):
    model = ToyModel()
    sharing = {ATTN[3]: ATTN[1]}
    executor = LocalExecutor(model, "cpu", registry=toy_registry, kv_sharing=sharing, kv_cache_bytes=4 * MiB)
    assert set(executor.get_kv_cache_spec()) == set(ATTN[:3])
    plan = initialize_kv_caches(executor, registry=toy_registry, max_model_len=64)
    assert ATTN[3] not in plan.layer_names
    layers = model.model.layers
    assert layers[3].self_attn.kv_cache is layers[1].self_attn.kv_cache is executor.kv_caches[ATTN[3]]
    assert set(executor.bound) == set(ATTN)
    # the plan records the sharing: the sharing layer is in its target's group (as in vLLM), so a
    # runner looping over the groups gives it the target's block table
    assert plan.kv_sharing == sharing
    assert plan.group_of(ATTN[3]) is plan.group_of(ATTN[1])
    assert plan.tensor_of(ATTN[3]) is plan.tensor_of(ATTN[1])
    tables = {name for index in range(len(plan.groups)) for name in plan.block_table_layers(index)}
    assert tables == set(ATTN)


def test_a_sharing_target_without_a_cache_is_an_error(toy_registry):
    executor = LocalExecutor(ToyModel(), "cpu", registry=toy_registry, kv_sharing={ATTN[3]: "model.lm_head"})
    with pytest.raises(KVCacheBindingError, match=r"model\.lm_head"):
        executor.get_kv_cache_spec()


def test_a_plan_for_other_layers_fails_before_allocating(toy_registry):
    model = ToyModel()
    calls = []
    executor = LocalExecutor(
        model, "cpu", registry=toy_registry, kv_cache_bytes=MiB, allocator=lambda n, d: calls.append(n)
    )
    specs = executor.get_kv_cache_spec()
    other = plan_kv_cache(
        {**{k: v for k, v in specs.items() if k != ATTN[0]}, "model.extra": full()},
        2**26,
        SizingContext(max_model_len=64),
        registry=toy_registry,
    )
    with pytest.raises(KVCacheBindingError) as info:
        executor.initialize(other)
    assert repr(ATTN[0]) in str(info.value) and "'model.extra'" in str(info.value)
    assert calls == []


def test_any_executor_following_the_protocol_runs_the_workflow(registry):
    executor = RecordingExecutor({"a": full(), "b": sliding(128)}, 2**30)
    assert isinstance(executor, Executor)
    plan = initialize_kv_caches(executor, registry=registry, context=SizingContext(max_model_len=4096))
    assert executor.calls == ["specs", "memory", ("initialize", plan.num_blocks)]
    assert plan.available_memory_bytes == 2**30


class AgreeingRecorder(RecordingExecutor):
    """An executor of ranks that agree: plans the request it is given, alone."""

    def agree_on_plan(self, request, *, registry):
        self.calls.append(("agree", request.policy, request.num_blocks))
        return plan_kv_cache(
            request.specs,
            request.budgets[0],
            request.context,
            registry=registry,
            num_blocks=request.num_blocks,
        )


def test_an_agreeing_executor_gets_the_request(registry):
    specs, context = {"a": full(), "b": sliding(128)}, SizingContext(max_model_len=4096)
    executor = AgreeingRecorder(specs, 2**30)
    plan = initialize_kv_caches(
        executor, registry=registry, context=context, policy="uniform", num_blocks=500
    )
    assert plan.num_blocks == 500
    assert executor.calls == ["specs", "memory", ("agree", "uniform", 500), ("initialize", 500)]


def test_the_request_length_must_be_given_once(registry):
    executor = RecordingExecutor({"a": full()}, 2**30)
    with pytest.raises(InvalidInputError, match="max_model_len"):
        initialize_kv_caches(executor, registry=registry)
    with pytest.raises(InvalidInputError, match="give one of them"):
        initialize_kv_caches(
            executor, registry=registry, context=SizingContext(max_model_len=8), max_model_len=9
        )


def test_pipeline_stages_union_and_disagreeing_ranks_are_named():
    merged = merge_worker_specs([{"l0": full()}, {"l1": sliding(64)}])
    assert list(merged) == ["l0", "l1"]
    with pytest.raises(SpecMismatchError, match=r"layer 'l0' \(reported by workers 0, 1\)"):
        merge_worker_specs([{"l0": full(heads=8)}, {"l0": full(heads=4)}])
    with pytest.raises(InvalidInputError, match="empty"):
        merge_worker_specs([])


def test_capacity_summary_reports_the_plan_figures(registry):
    plan = plan_kv_cache(
        {"a": full(), "b": sliding(128)}, 2**30, SizingContext(max_model_len=4096), registry=registry
    )
    text = capacity_summary(plan)
    capacity = Capacity.of(plan)
    first, *groups = text.splitlines()
    # the total and the concurrency lead; no group's own token capacity reads like a total
    assert first.startswith(
        f"KV cache: {capacity.kv_cache_tokens:,} tokens, max concurrency {plan.max_concurrency():,.2f} "
        "requests of 4,096 tokens; "
    )
    assert capacity.kv_cache_tokens == int(plan.max_concurrency() * 4096)
    for index, (group, line) in enumerate(zip(plan.groups, groups, strict=True)):
        assert line.startswith(
            f"  group {index}: {group.spec.kind}, 1 layer, block size {group.spec.block_size}, "
        )
        assert f"{plan.tokens_held(group):,} tokens" not in line


def test_capacity_summary_says_when_a_block_size_was_raised(registry):
    from kvcore.frontends.hf_config import model_layer_specs

    specs = model_layer_specs("google/gemma-3-27b-it", registry)
    plan = plan_kv_cache(specs, 80 * 2**30, SizingContext(max_model_len=32768), registry=registry)
    text = capacity_summary(plan, specs)
    # the figure: 701,333 tokens in all, where each group "held" 1,048,576 or more
    assert text.startswith("KV cache: 701,333 tokens, max concurrency 21.40 requests of 32,768 tokens; ")
    raised = [line for line in text.splitlines() if "raised" in line]
    assert raised == [
        "  group 6: sliding_window, 2 layers, block size 64 (raised from 16 by the policy), "
        "49 pages per request"
    ]
    assert "raised" not in capacity_summary(plan)  # without the specs it cannot be told


def test_a_model_with_no_cache_layers_starts_with_an_unbounded_capacity(toy_registry, caplog):
    # an attention-free model: nothing to scan, so the engine is told its specs (none)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    host = FakeHost(total=1024 * MiB, available=20 * MiB, rss=100 * MiB)
    warmed = []
    executor = LocalExecutor(
        model,
        "cpu",
        registry=toy_registry,
        specs={},
        profile_fn=lambda m: m(torch.randn(4, 32)),
        warmup_fn=lambda m: warmed.append(m(torch.randn(2, 32)).shape),
        utilization=0.5,
        memory=host,
    )
    with caplog.at_level(logging.INFO, logger="kvcore"):
        plan = initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    assert plan.groups == () and plan.kv_cache_bytes == 0 and executor.kv_caches == {}
    assert warmed == [torch.Size([2, 32])]
    capacity = Capacity.of(plan)
    assert capacity.unbounded and capacity.kv_cache_tokens is None
    assert "KV cache: unbounded tokens, max concurrency unbounded requests of 256 tokens" in caplog.text
