"""kvcore's vLLM plugin: the entry point vLLM loads, and vLLM's own engine-core start-up
(``EngineCore._initialize_kv_caches``) taking its ``KVCacheConfig`` from kvcore when
``KVCORE_VLLM_POLICY`` names a policy. The model executor is a stand-in that reports the layer
specs and memory a worker would and records the configs it is given; everything else is vLLM's.
"""

from __future__ import annotations

import importlib.metadata
import types

import pytest
import vllm.v1.engine.core as core
from vllm.v1 import kv_cache_interface as vk

from kvcore import Registry, model_layer_specs
from kvcore.integrations.vllm import admission, convert, plugin
from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules, plan_for_vllm
from kvcore.testing.mixes import openelm_like

GIB = 2**30
REGISTRY = Registry.default()


class Executor:
    """What ``EngineCore._initialize_kv_caches`` asks of the model executor, one entry per worker."""

    def __init__(self, specs, memory):
        self.specs, self.memory, self.configs = specs, memory, None

    def get_kv_cache_specs(self):
        return self.specs

    def get_supported_kv_cache_layouts(self):
        return [["LBNHC"]] * len(self.specs)

    def set_kv_cache_layout(self, *args):
        pass

    def determine_available_memory(self):
        return self.memory

    def initialize_from_config(self, configs):
        self.configs = configs

    def compile_or_warm_up_model(self):
        pass


@pytest.fixture
def patched(monkeypatch):
    """vLLM's engine core as kvcore's plugin leaves it (restored afterwards)."""
    monkeypatch.setattr(core, "get_kv_cache_configs", core.get_kv_cache_configs)
    monkeypatch.setenv(plugin.POLICY_ENV, "shared_buffer")
    plugin.register()
    return core


def _start(specs, memory, rules):
    engine = types.SimpleNamespace(
        model_executor=Executor(specs, memory),
        collective_rpc=lambda *args, **kwargs: None,
        available_gpu_memory_for_kv_cache=0,
    )
    config = admission.vllm_config(rules)
    scheduler_config = core.EngineCore._initialize_kv_caches(engine, config)
    return engine.model_executor.configs, scheduler_config


def test_vllm_finds_the_plugin():
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert found.get("kvcore") == "kvcore.integrations.vllm.plugin:register"


def test_without_the_variable_vllm_is_left_alone(monkeypatch):
    monkeypatch.setattr(core, "get_kv_cache_configs", core.get_kv_cache_configs)
    monkeypatch.delenv(plugin.POLICY_ENV, raising=False)
    before = core.get_kv_cache_configs
    plugin.register()
    assert core.get_kv_cache_configs is before


@pytest.mark.parametrize(
    "model", ["google/gemma-3-27b-it", "ai21labs/AI21-Jamba-1.5-Mini", "openai/gpt-oss-20b"]
)
def test_vllms_engine_core_takes_kvcores_plan(patched, model):
    rules = VllmRules(max_model_len=8192)
    specs = model_layer_specs(model, REGISTRY)
    vllm_specs = admission.vllm_layer_specs(specs, rules)
    workers, scheduler_config = _start([vllm_specs], [8 * GIB], rules)
    expected = plan_for_vllm(
        rules.request(convert.specs_from_vllm(vllm_specs, rename=False), 8 * GIB, policy="shared_buffer"),
        rules,
        registry=REGISTRY,
    )
    assert len(workers) == 1
    assert workers[0].num_blocks == scheduler_config.num_blocks == expected.num_blocks
    assert [g.layer_names for g in workers[0].kv_cache_groups] == [
        list(g.layer_names) for g in expected.groups
    ]
    # the scheduler's config runs what kvcore promised
    promise = admission.promised(expected)
    assert admission.runs_all(scheduler_config, rules, promise)
    assert not admission.runs_all(scheduler_config, rules, promise + 1)


def test_whisper_starts_with_cross_attention_sized_by_vllms_encoder_budget(patched):
    """An encoder-decoder model: the plugin converts vLLM's CrossAttentionSpec with the
    scheduler's max_num_encoder_input_tokens (what vLLM sizes it by), and the scheduler's config
    runs what kvcore promised, each request bringing that many encoder tokens."""
    rules = VllmRules(max_model_len=448)
    specs = model_layer_specs("openai/whisper-large-v3", REGISTRY)
    vllm_specs = admission.vllm_layer_specs(specs, rules)
    assert sum(type(s) is vk.CrossAttentionSpec for s in vllm_specs.values()) == 32
    workers, scheduler_config = _start([vllm_specs], [8 * GIB], rules)
    encoder = admission.vllm_config(rules).scheduler_config.max_num_encoder_input_tokens
    sized = VllmRules(max_model_len=448, max_encoder_tokens=encoder)
    expected = plan_for_vllm(
        sized.request(
            convert.specs_from_vllm(vllm_specs, rename=False, max_encoder_tokens=encoder),
            8 * GIB,
            policy="shared_buffer",
        ),
        sized,
        registry=REGISTRY,
    )
    assert workers[0].num_blocks == scheduler_config.num_blocks == expected.num_blocks
    kinds = {type(g.kv_cache_spec) for g in workers[0].kv_cache_groups}
    assert kinds == {vk.FullAttentionSpec, vk.CrossAttentionSpec}
    promise = admission.promised(expected)
    assert admission.runs_all(scheduler_config, sized, promise)
    assert not admission.runs_all(scheduler_config, sized, promise + 1)


def test_a_mixed_page_plan_reaches_the_workers_as_uniform_type_specs(patched):
    """Layers of one kind whose pages differ (OpenELM-like) start in one block table: the
    workers get a UniformTypeKVCacheSpecs group, the scheduler its first layer's spec, as vLLM's
    engine core gives them, and the scheduler's config runs the promise."""
    rules = VllmRules(max_model_len=2048)
    vllm_specs = admission.vllm_layer_specs(openelm_like(), rules)
    workers, scheduler_config = _start([vllm_specs], [GIB], rules)
    (group,) = workers[0].kv_cache_groups
    assert isinstance(group.kv_cache_spec, vk.UniformTypeKVCacheSpecs)
    assert len({s.page_size_bytes for s in group.kv_cache_spec.kv_cache_specs.values()}) == 3
    assert isinstance(scheduler_config.kv_cache_groups[0].kv_cache_spec, vk.FullAttentionSpec)
    expected = plan_for_vllm(
        rules.request(convert.specs_from_vllm(vllm_specs, rename=False), GIB, policy="shared_buffer"),
        rules,
        registry=REGISTRY,
    )
    promise = admission.promised(expected)
    assert admission.runs_all(workers[0], rules, promise)
    assert not admission.runs_all(workers[0], rules, promise + 1)
    views = admission.allocate_on_meta(workers[0])
    assert set(views) == set(vllm_specs)


def test_pipeline_stages_get_the_smallest_block_count(patched):
    rules = VllmRules(max_model_len=8192)
    specs = admission.vllm_layer_specs(model_layer_specs("meta-llama/Llama-3.1-8B", REGISTRY), rules)
    names = list(specs)
    stages = [{n: specs[n] for n in names[:16]}, {n: specs[n] for n in names[16:]}]
    workers, _ = _start(stages, [8 * GIB, 6 * GIB], rules)
    assert workers[0].num_blocks == workers[1].num_blocks == 6 * GIB // (16 * 2 * 16 * 8 * 128 * 2)
    assert set(workers[0].kv_cache_groups[0].layer_names) == set(names[:16])


def test_a_layout_that_splits_pages_is_refused(patched):
    rules = VllmRules(max_model_len=8192)
    config = admission.vllm_config(rules, layout="LHBNC")
    specs = admission.vllm_layer_specs(model_layer_specs("meta-llama/Llama-3.2-1B", REGISTRY), rules)
    with pytest.raises(VllmIntegrationError, match="VLLM_KV_CACHE_LAYOUT=LBNHC"):
        plugin.kvcore_kv_cache_configs(config, [specs], [GIB], "shared_buffer")


def test_speculative_lookahead_is_named_where_the_plan_leaves_it_out(monkeypatch, caplog):
    rules = VllmRules(max_model_len=8192)
    config = admission.vllm_config(rules)
    specs = admission.vllm_layer_specs(model_layer_specs("meta-llama/Llama-3.2-1B", REGISTRY), rules)
    monkeypatch.setattr(type(config), "num_lookahead_tokens", property(lambda self: 3))
    with caplog.at_level("WARNING", logger="kvcore.vllm"):
        plugin.kvcore_kv_cache_configs(config, [specs], [GIB], "shared_buffer")
    assert "3 speculative lookahead slots" in caplog.text
