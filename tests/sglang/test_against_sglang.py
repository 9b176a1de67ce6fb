"""kvcore's plans as SGLang 0.5's own MemoryPoolConfig and pool classes, built on CPU.

For every bundled model SGLang can run, kvcore's plan (kind_pools, SGLang's rules) is turned
into SGLang's ``MemoryPoolConfig`` and SGLang's ``MHATokenToKVPool`` / ``MLATokenToKVPool`` /
``SWAKVPool`` are built from it: each pool holds the tokens kvcore promises and allocates the
plan's bytes, padded page included. The plugin's configurator replaces SGLang's through its
``HookRegistry``, and refuses what SGLang cannot run.
"""

from __future__ import annotations

import types

import pytest
import torch
from sglang.srt.configs.model_config import AttentionArch
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor import pool_configurator
from sglang.srt.runtime_context import get_parallel

from kvcore.frontends.hf_config import model_layer_specs
from kvcore.integrations.sglang import convert, plugin, rules
from kvcore.planning.registry import Registry
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec

#: Bundled models whose KV layers SGLang's configurators size (full, sliding, MLA).
MODELS = [
    "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen3-8B",
    "google/gemma-2-9b-it",
    "google/gemma-3-27b-it",
    "openai/gpt-oss-20b",
    "mistralai/Mistral-7B-v0.1",
    "deepseek-ai/DeepSeek-V3",
]

RULES = rules.SglangRules(context_len=256, page_size=16, chunked_prefill_size=64)
BUDGET = 192 << 20


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.default(autoload=False)


def _pool_bytes(pool: object) -> int:
    pools = [pool.full_kv_pool, pool.swa_kv_pool] if isinstance(pool, SWAKVPool) else [pool]
    total = 0
    for p in pools:
        for name in ("k_buffer", "v_buffer", "kv_buffer"):
            for t in getattr(p, name, None) or ():
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("model", MODELS)
def test_sglang_pools_hold_what_kvcore_promises(model, registry):
    specs = rules.paged_specs(model_layer_specs(model, registry), RULES.page_size)
    plan = rules.plan_for_sglang(specs, BUDGET, RULES, registry=registry)
    sizes = rules.pool_sizes(plan, specs)
    config = convert.memory_pool_config(sizes)
    assert isinstance(config, pool_configurator.MemoryPoolConfig)
    pool = convert.build_pools(sizes, specs)
    for group in plan.groups:
        kind = rules.POOL_OF_KIND[group.spec.kind]
        held = pool.size_swa if kind == "swa" else pool.size
        assert held == plan.tokens_held(group) == (sizes.swa_tokens if kind == "swa" else sizes.full_tokens)
    assert config.max_total_num_tokens == sizes.max_total_num_tokens
    # SGLang allocates size + page_size rows per layer: block 0 of each kvcore pool
    assert _pool_bytes(pool) == plan.kv_cache_bytes <= BUDGET


def _kvc(specs: dict, *, sliding_window: int | None) -> types.SimpleNamespace:
    """The fields of SGLang's KVCacheConfigurator its pool configurators read."""
    full = next(s for s in specs.values() if s.kind == "full_attention")
    swa = next((s for s in specs.values() if s.kind == "sliding_window"), full)
    ids = list(range(len(specs)))
    kinds = [s.kind for s in specs.values()]
    model_config = types.SimpleNamespace(
        attention_arch=AttentionArch.MHA,
        head_dim=full.head_size,
        v_head_dim=full.head_size,
        swa_head_dim=swa.head_size,
        context_len=RULES.context_len,
        get_num_kv_heads=lambda tp: full.num_kv_heads // tp,
        get_swa_num_kv_heads=lambda tp: swa.num_kv_heads // tp,
    )
    layer_info = types.SimpleNamespace(
        start_layer=0,
        end_layer=len(ids),
        full_attention_layer_ids=[i for i in ids if kinds[i] == "full_attention"],
        swa_attention_layer_ids=[i for i in ids if kinds[i] == "sliding_window"],
    )
    return types.SimpleNamespace(
        model_config=model_config,
        layer_info=layer_info,
        kv_cache_dtype=torch.bfloat16,
        page_size=RULES.page_size,
        is_hybrid_swa=sliding_window is not None,
        sliding_window_size=sliding_window,
        mambaish_config=None,
    )


def test_plugin_replaces_sglangs_configurator(monkeypatch, registry):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setenv(plugin.POLICY_VARIABLE, "kind_pools")
    original = pool_configurator.create_memory_pool_configurator
    plugin.register()
    try:
        HookRegistry.apply_hooks()
        assert pool_configurator.create_memory_pool_configurator is not original
        full = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="bfloat16")
        sliding = SlidingWindowSpec(
            block_size=16, num_kv_heads=4, head_size=64, dtype="bfloat16", sliding_window=256
        )
        specs = {convert.layer_name(i): (full if i % 4 == 3 else sliding) for i in range(8)}
        kvc = _kvc(specs, sliding_window=256)
        with get_parallel().override(attn_tp_size=1):
            configurator = plugin.KVCorePoolConfigurator(kvc, "kind_pools", RULES)
            config = configurator.calculate_pool_sizes(BUDGET, RULES.page_size)
        assert configurator.specs == specs
        plan = rules.plan_for_sglang(specs, BUDGET, RULES, registry=registry)
        sizes = rules.pool_sizes(plan, specs)
        assert (config.full_max_total_num_tokens, config.swa_max_total_num_tokens) == (
            sizes.full_tokens,
            sizes.swa_tokens,
        )
        with pytest.raises(rules.SglangIntegrationError, match="max-total-tokens"):
            configurator.calculate_pool_sizes_from_max_tokens(1024, RULES.page_size)
    finally:
        monkeypatch.setattr(pool_configurator, "create_memory_pool_configurator", original)
        HookRegistry._hooks.pop(plugin.TARGET, None)
        HookRegistry._patched.discard(plugin.TARGET)


def test_two_windows_are_refused(registry):
    def make(window: int) -> SlidingWindowSpec:
        return SlidingWindowSpec(
            block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=window
        )

    specs = {"a": make(128), "b": make(512)}
    with pytest.raises(rules.SglangIntegrationError, match=r"windows \[128, 512\]"):
        rules.plan_for_sglang(specs, BUDGET, RULES, registry=registry)


def test_unknown_policy_is_refused_at_start_up(monkeypatch):
    monkeypatch.setenv(plugin.POLICY_VARIABLE, "no_such_policy")
    with pytest.raises(rules.SglangIntegrationError, match="not a kvcore policy"):
        plugin.register()
