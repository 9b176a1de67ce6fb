"""kvcore's plans against SGLang 0.5's own code, on CPU.

For every bundled model SGLang can run, SGLang's own ``KVCacheConfigurator`` is built from the
model's ``config.json`` (:mod:`tests.integrations.sglang.sglang_models`) and:

- SGLang's ``create_memory_pool_configurator`` sizes the pools; kvcore's model of that sizing
  (:func:`kvcore.integrations.sglang.rules.own_pool_sizes`, what ``kvcore compare --engine
  sglang`` shows) gives the same tokens;
- kvcore's configurator plans the same layers (read from SGLang's model config) and SGLang's
  ``MHATokenToKVPool`` / ``MLATokenToKVPool`` / ``SWAKVPool`` are built from its
  ``MemoryPoolConfig``: each pool holds the tokens kvcore promises and allocates the plan's
  bytes, padded page included;
- once the plugin is registered through SGLang's ``HookRegistry``, SGLang's own
  ``KVCacheConfigurator.config_from_budget`` returns kvcore's pool sizes;
- for Mamba/linear hybrids (synthetic Qwen3-Next- and Nemotron-H-shaped configs; SGLang 0.5.23
  has no Jamba model), SGLang's own ``_handle_max_mamba_cache`` split is what kvcore models, and
  with the plugin's second hook SGLang's ``MambaPool`` and KV pool built from the plan hold the
  state slots and tokens kvcore promises.
"""

from __future__ import annotations

import contextlib

import pytest
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor import pool_configurator
from sglang.srt.plugins.hook_registry import HookRegistry

from kvcore import ModelOptions
from kvcore.frontends.hf_config import layer_specs_from_config, load_model_config, model_layer_specs
from kvcore.integrations.sglang import convert, plugin, rules
from kvcore.integrations.sglang.model import runs_hybrid_swa
from kvcore.planning.registry import Registry
from kvcore.plugins.sliding_window import SlidingWindowSpec
from tests.integrations.sglang.sglang_models import kv_cache_configurator

#: Bundled models whose KV layers SGLang's configurators size (full, sliding, MLA).
MODELS = [
    "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen3-8B",
    "microsoft/Phi-3-mini-4k-instruct",
    "mistralai/Mistral-7B-v0.1",
    "google/gemma-2-9b-it",
    "google/gemma-3-27b-it",
    "openai/gpt-oss-20b",
    "deepseek-ai/DeepSeek-V3",
]

PAGE = 16
RULES = rules.SglangRules(context_len=256, page_size=PAGE, chunked_prefill_size=64)
#: What the pools built on CPU may take.
BUDGET = 192 << 20


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.default(autoload=False)


def _as_sglang_runs(model: str, registry: Registry) -> dict:
    config, _ = load_model_config(model)
    hybrid = runs_hybrid_swa(config.get("architectures") or (), config)
    return rules.paged_specs(rules.as_sglang_runs(model_layer_specs(model, registry), hybrid), PAGE)


def _pool_bytes(pool: object) -> int:
    pools = [pool.full_kv_pool, pool.swa_kv_pool] if isinstance(pool, SWAKVPool) else [pool]
    total = 0
    for p in pools:
        for name in ("k_buffer", "v_buffer", "kv_buffer"):
            for t in getattr(p, name, None) or ():
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("model", MODELS)
def test_sglangs_own_sizing_is_what_kvcore_models(model, registry, tmp_path):
    kvc = kv_cache_configurator(model, tmp_path, page_size=PAGE)
    budget = 20 << 30
    theirs = pool_configurator.create_memory_pool_configurator(kvc).calculate_pool_sizes(budget, PAGE)
    ours = rules.own_pool_sizes(_as_sglang_runs(model, registry), budget, RULES)
    assert theirs.max_total_num_tokens == ours.max_total_num_tokens
    if ours.is_hybrid_swa:
        assert (theirs.full_max_total_num_tokens, theirs.swa_max_total_num_tokens) == (
            ours.full_tokens,
            ours.swa_tokens,
        )


@pytest.mark.parametrize("model", MODELS)
def test_sglang_pools_hold_what_kvcore_promises(model, registry, tmp_path):
    kvc = kv_cache_configurator(model, tmp_path, page_size=PAGE)
    specs = convert.specs_from_sglang(kvc)
    # SGLang's model config and kvcore's model front end agree on every layer's bytes per token
    ours = _as_sglang_runs(model, registry)
    assert sorted(map(rules.token_bytes, specs.values())) == sorted(map(rules.token_bytes, ours.values()))
    own = pool_configurator.create_memory_pool_configurator(kvc)
    config = plugin.KVCorePoolConfigurator(kvc, own, "kind_pools", RULES).calculate_pool_sizes(BUDGET, PAGE)
    assert isinstance(config, pool_configurator.MemoryPoolConfig)
    plan = rules.plan_for_sglang(RULES.request(specs, BUDGET), RULES, registry=registry)
    sizes = rules.pool_sizes(plan, specs)
    assert config == convert.memory_pool_config(sizes)
    pool = convert.build_pools(sizes, specs)
    for group in plan.groups:
        swa = rules.POOL_OF_KIND[group.spec.kind] == "swa"
        held = pool.size_swa if swa else pool.size
        assert held == plan.tokens_held(group) == (sizes.swa_tokens if swa else sizes.full_tokens)
    # SGLang allocates size + page_size rows per layer: block 0 of each kvcore pool
    assert _pool_bytes(pool) == plan.kv_cache_bytes <= BUDGET


@contextlib.contextmanager
def plugin_hooked(monkeypatch, policy: str = "kind_pools"):
    """The plugin registered and SGLang's hooks applied, undone after (for the other tests)."""
    monkeypatch.setenv(plugin.POLICY_VARIABLE, policy)
    original = pool_configurator.create_memory_pool_configurator
    handle = KVCacheConfigurator.__dict__["_handle_max_mamba_cache"]
    plugin.register()
    try:
        HookRegistry.apply_hooks()
        assert pool_configurator.create_memory_pool_configurator is not original
        yield
    finally:
        pool_configurator.create_memory_pool_configurator = original
        KVCacheConfigurator._handle_max_mamba_cache = handle
        for target in (plugin.TARGET, plugin.MAMBA_TARGET):
            HookRegistry._hooks.pop(target, None)
            HookRegistry._patched.discard(target)


def test_plugin_replaces_sglangs_configurator(monkeypatch, registry, tmp_path):
    model, budget = "microsoft/Phi-3-mini-4k-instruct", 2 << 30
    kvc = kv_cache_configurator(model, tmp_path, page_size=PAGE)
    sglang_own = kvc.config_from_budget(budget)
    with plugin_hooked(monkeypatch):
        config = kvc.config_from_budget(budget)  # SGLang's own start-up path
    sglang_rules = plugin._rules_of(kvc)
    specs = convert.specs_from_sglang(kvc)
    plan = rules.plan_for_sglang(sglang_rules.request(specs, budget), sglang_rules, registry=registry)
    assert config == convert.memory_pool_config(rules.pool_sizes(plan, specs))
    # the padded page is inside kvcore's budget, outside SGLang's own
    assert config.max_total_num_tokens == sglang_own.max_total_num_tokens - PAGE
    own = pool_configurator.create_memory_pool_configurator(kvc)
    with pytest.raises(rules.SglangIntegrationError, match="max-total-tokens"):
        plugin.KVCorePoolConfigurator(kvc, own, "kind_pools").calculate_pool_sizes_from_max_tokens(1024, PAGE)


def test_bytes_kvcore_does_not_plan_are_refused(tmp_path):
    kvc = kv_cache_configurator("meta-llama/Llama-3.1-8B", tmp_path, page_size=PAGE)
    kvc.kv_cache_dtype_str = "mxfp8"  # SGLang adds a scale byte per 32 elements
    own = pool_configurator.create_memory_pool_configurator(kvc)
    with pytest.raises(rules.SglangIntegrationError, match="bytes per token"):
        plugin.KVCorePoolConfigurator(kvc, own, "kind_pools", RULES)


def test_two_windows_are_refused(registry):
    def make(window: int) -> SlidingWindowSpec:
        return SlidingWindowSpec(
            block_size=PAGE, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=window
        )

    specs = {"a": make(128), "b": make(512)}
    with pytest.raises(rules.SglangIntegrationError, match=r"windows \[128, 512\]"):
        rules.plan_for_sglang(RULES.request(specs, BUDGET), RULES, registry=registry)


def test_unknown_policy_is_refused_at_start_up(monkeypatch):
    monkeypatch.setenv(plugin.POLICY_VARIABLE, "no_such_policy")
    with pytest.raises(rules.SglangIntegrationError, match="not a kvcore policy"):
        plugin.register()


#: Mamba/linear hybrids SGLang 0.5.23 runs (it has no Jamba model): synthetic configs shaped like
#: Qwen3-Next and Nemotron-H (tests/configs, each says so in its "_synthetic" key).
HYBRIDS = [
    "tests/configs/synthetic__qwen3-next-like.json",
    "tests/configs/synthetic__nemotron-h-like.json",
]
#: SGLang's CPU settings for a Mamba hybrid: no extra buffer (it needs a GPU), so page 1 and no overlap.
MAMBA_ARGS = {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True}
MAMBA_BUDGET = 24 << 30
#: What the Mamba and KV pools built on CPU may take (a 1,024-token context keeps it to a few requests).
MAMBA_BUILD_BUDGET = 1 << 30


def _mamba_rules(kvc) -> rules.SglangRules:
    return plugin._rules_of(kvc)


@pytest.mark.parametrize("model", HYBRIDS)
def test_sglangs_own_mamba_split_is_what_kvcore_models(model, registry, tmp_path):
    from sglang.srt.runtime_context import get_schedule

    kvc = kv_cache_configurator(model, tmp_path, page_size=1, **MAMBA_ARGS)
    sglang_rules = _mamba_rules(kvc)
    assert sglang_rules.mamba_slots_per_request == rules.mamba_slots_per_request(overlap_schedule=False) == 3
    left = kvc._handle_max_mamba_cache(MAMBA_BUDGET / (1 << 30))  # SGLang's own split
    theirs = pool_configurator.create_memory_pool_configurator(kvc).calculate_pool_sizes(
        int(left * (1 << 30)), 1
    )
    specs = rules.as_sglang_runs(model_layer_specs(model, registry), hybrid_swa=False)
    ours = rules.own_pool_sizes(rules.paged_specs(specs, 1), MAMBA_BUDGET, sglang_rules)
    assert (get_schedule().max_mamba_cache_size, theirs.max_total_num_tokens) == (
        ours.mamba_states,
        ours.full_tokens,
    )
    # kvcore's front end and SGLang agree on a state slot's bytes (temporal state in float32)
    slot = sum(rules.token_bytes(s) for s in specs.values() if s.kind == "state")
    assert slot == kvc.mambaish_config.mamba2_cache_params.mamba_cache_per_req


@pytest.mark.parametrize(
    ("model", "budget", "build"),
    [(HYBRIDS[0], MAMBA_BUILD_BUDGET, True), (HYBRIDS[1], MAMBA_BUDGET, False)],
    ids=["qwen3-next-like", "nemotron-h-like"],
)
def test_plugin_sizes_sglangs_mamba_and_kv_pools_as_kvcore_promises(
    model, budget, build, monkeypatch, registry, tmp_path
):
    from sglang.srt.runtime_context import get_schedule

    kvc = kv_cache_configurator(model, tmp_path, page_size=1, context_length=1024, **MAMBA_ARGS)
    with plugin_hooked(monkeypatch):
        # SGLang's own start-up path: the Mamba split, then the configurator on what is left
        left = kvc._handle_max_mamba_cache(budget / (1 << 30))
        config = kvc.config_from_budget(int(left * (1 << 30)))
    specs = convert.specs_from_sglang(kvc)
    sglang_rules = _mamba_rules(kvc)
    plan = rules.plan_for_sglang(sglang_rules.request(specs, budget), sglang_rules, registry=registry)
    paged = rules.sglang_specs(specs, sglang_rules)
    sizes = rules.pool_sizes(plan, paged)
    assert get_schedule().max_mamba_cache_size == sizes.mamba_states > 0
    assert config == convert.memory_pool_config(sizes)
    # each request holds SGLang's slots: the plan's requests are what SGLang lets run
    assert plan.max_concurrency() <= sizes.mamba_states / sglang_rules.mamba_slots_per_request
    # SGLang caps its running requests by the state slots: no fewer than kvcore's plan holds
    running = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
    slots = sglang_rules.mamba_slots_per_request
    assert running == sizes.mamba_states // slots >= int(plan.max_concurrency())
    assert rules.pool_bytes(sizes, paged) == plan.kv_cache_bytes <= budget
    if not build:  # Nemotron-H's slots are 0.9 GB each: sized, not allocated, on CPU
        return
    # SGLang's pools built from those sizes hold what kvcore's plan promises
    names = list(specs)
    state_ids = [names.index(n) for n, s in specs.items() if s.kind == "state"]
    mamba = convert.build_mamba_pool(sizes, kvc.mambaish_config.mamba2_cache_params, state_ids)
    attention = {n: s for n, s in specs.items() if s.kind != "state"}
    kv = convert.build_pools(sizes, attention)
    state_group = next(g for g in plan.groups if g.spec.kind == "state")
    full_group = next(g for g in plan.groups if g.spec.kind != "state")
    assert mamba.size == plan.usable_blocks_in(state_group.pool) == sizes.mamba_states
    assert kv.size == plan.tokens_held(full_group) == sizes.full_tokens
    mamba_bytes = mamba.mamba_cache.mem_usage_bytes()
    assert mamba_bytes == (sizes.mamba_states + 1) * rules.cell_bytes(
        specs, [n for n in specs if n not in attention]
    )
    assert mamba_bytes + _pool_bytes(kv) == plan.kv_cache_bytes


def test_mamba_settings_kvcore_does_not_plan_are_refused(monkeypatch, tmp_path):
    kvc = kv_cache_configurator(HYBRIDS[0], tmp_path, page_size=1, max_mamba_cache_size=64, **MAMBA_ARGS)
    monkeypatch.setenv(plugin.POLICY_VARIABLE, "kind_pools")
    with pytest.raises(rules.SglangIntegrationError, match="max-mamba-cache-size"):
        plugin.handle_max_mamba_cache(lambda *a: None, kvc, 8.0)


#: A synthetic DeepSeek-V3.2-shaped config (its "_synthetic" key says what is made up).
DSA_CONFIG = "tests/integrations/sglang/synthetic__deepseek-v32-like.json"
#: DeepSeek's sparse attention in SGLang: its DSATokenToKVPool needs 64-token pages.
DSA_PAGE = 64
DSA_RULES = rules.SglangRules(context_len=1024, page_size=DSA_PAGE, chunked_prefill_size=256)
#: DSA models: the bundled DeepSeek-V3.2 (61 layers), and the 4-layer synthetic one with every
#: other layer reusing its top-k (SGLang's dsa_layer_skips_topk: no index keys there).
DSA_MODELS = {
    "DeepSeek-V3.2": ("deepseek-ai/DeepSeek-V3.2", None),
    "v32-like, shared top-k": (DSA_CONFIG, {"index_topk_freq": 2}),
}
DSA_DTYPES = {"bf16": "bfloat16", "fp8": "float8_e4m3fn"}


def _dsa_configurator(monkeypatch, tmp_path, model, dtype):
    import torch

    # SGLang's DSA argument resolution reads the GPU's compute capability: answer a Hopper's
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    source, changes = DSA_MODELS[model]
    return kv_cache_configurator(
        source,
        tmp_path,
        page_size=DSA_PAGE,
        kv_cache_dtype=getattr(torch, DSA_DTYPES[dtype]),
        config_changes=changes,
    )


def _dsa_sglang(monkeypatch, tmp_path, model, dtype):
    """The DSA case's configurator, the specs kvcore reads off it and SGLang's own pool configurator."""
    kvc = _dsa_configurator(monkeypatch, tmp_path, model, dtype)
    return kvc, convert.specs_from_sglang(kvc), pool_configurator.create_memory_pool_configurator(kvc)


def _dsa_pool_bytes(pool) -> int:
    """Bytes SGLang's DSATokenToKVPool allocated: the latents and the indexer keys."""
    buffers = [*pool.kv_buffer, *pool.index_k_with_scale_buffer]
    return sum(t.numel() * t.element_size() for t in buffers)


@pytest.mark.parametrize("dtype", list(DSA_DTYPES))
@pytest.mark.parametrize("model", list(DSA_MODELS))
def test_dsa_layers_are_sglangs_latent_and_indexer_bytes(model, dtype, monkeypatch, tmp_path, registry):
    _, specs, own = _dsa_sglang(monkeypatch, tmp_path, model, dtype)
    # SGLang's cell (latent + indexer over every layer) is kvcore's specs' bytes per token
    assert own._cell_size == sum(rules.token_bytes(s) for s in specs.values())
    latent = 656 if dtype == "fp8" else 1152
    assert {rules.token_bytes(s) for s in specs.values()} == {latent, 132}
    # kvcore's model front end reads the config into the same layers and bytes
    source, changes = DSA_MODELS[model]
    config, _ = load_model_config(source)
    ours = layer_specs_from_config(
        {**config, **(changes or {})},
        registry,
        ModelOptions(kv_cache_dtype=DSA_DTYPES[dtype], block_size=DSA_PAGE),
    )
    assert {n.replace(".self_attn", ""): s for n, s in ours.items()} == specs
    # and SGLang's own sizing of a budget is kvcore's model of it
    budget = 20 << 30
    theirs = own.calculate_pool_sizes(budget, DSA_PAGE)
    assert theirs.max_total_num_tokens == rules.own_pool_sizes(specs, budget, DSA_RULES).max_total_num_tokens


@pytest.mark.parametrize("dtype", list(DSA_DTYPES))
@pytest.mark.parametrize("model", list(DSA_MODELS))
def test_sglangs_dsa_pool_holds_what_kvcore_promises(model, dtype, monkeypatch, tmp_path, registry):
    kvc, specs, own = _dsa_sglang(monkeypatch, tmp_path, model, dtype)
    config = plugin.KVCorePoolConfigurator(kvc, own, "kind_pools", DSA_RULES).calculate_pool_sizes(
        BUDGET, DSA_PAGE
    )
    plan = rules.plan_for_sglang(DSA_RULES.request(specs, BUDGET), DSA_RULES, registry=registry)
    # one group: the latents and the indexer keys share SGLang's token slot, pages of two sizes
    (group,) = plan.groups
    assert {s.kind for s in group.specs} == {"mla", "dsa_indexer"}
    sizes = rules.pool_sizes(plan, specs)
    assert config == convert.memory_pool_config(sizes)
    pool = convert.build_pools(sizes, specs)
    assert type(pool).__name__ == "DSATokenToKVPool"
    assert pool.size == plan.tokens_held(group) == sizes.full_tokens > 0
    # SGLang allocates size + page_size rows of latents and of index keys per layer: block 0
    assert _dsa_pool_bytes(pool) == plan.kv_cache_bytes == rules.pool_bytes(sizes, specs) <= BUDGET


def test_a_dsa_page_sglang_refuses_is_refused(registry, monkeypatch, tmp_path):
    kvc = _dsa_configurator(monkeypatch, tmp_path, "v32-like, shared top-k", "bf16")
    specs = rules.paged_specs(convert.specs_from_sglang(kvc), PAGE)
    with pytest.raises(rules.SglangIntegrationError, match=r"--page-size 16.*64-token pages"):
        rules.plan_for_sglang(RULES.request(specs, BUDGET), RULES, registry=registry)


def test_pooled_dsa_keys_are_refused_naming_them(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    kvc = kv_cache_configurator(DSA_CONFIG, tmp_path, page_size=DSA_PAGE, config_changes={"index_kpool": 4})
    own = pool_configurator.create_memory_pool_configurator(kvc)
    with pytest.raises(rules.SglangIntegrationError, match=r"sparse attention \(DSA\).*index_kpool 4"):
        plugin.KVCorePoolConfigurator(kvc, own, "kind_pools", DSA_RULES)


def test_plugin_sizes_sglangs_dsa_pool_at_start_up(monkeypatch, tmp_path, registry):
    kvc = _dsa_configurator(monkeypatch, tmp_path, "DeepSeek-V3.2", "fp8")
    budget = 8 << 30
    with plugin_hooked(monkeypatch):
        config = kvc.config_from_budget(budget)  # SGLang's own start-up path
    specs = convert.specs_from_sglang(kvc)
    sized = plugin._rules_of(kvc)
    plan = rules.plan_for_sglang(sized.request(specs, budget), sized, registry=registry)
    assert config == convert.memory_pool_config(rules.pool_sizes(plan, specs))
    assert config.max_total_num_tokens == plan.tokens_held(plan.groups[0]) > 0


def _sglang_model_config(model: str, folder):
    """SGLang's own ``ModelConfig`` of a bundled model (its overrides applied), as the server builds it."""
    import json

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs

    config, _ = load_model_config(model)
    config = {k: v for k, v in config.items() if k != "quantization_config" and not k.startswith("_")}
    (folder / "config.json").write_text(json.dumps(config))
    args = ServerArgs(model_path=str(folder), device="cpu", skip_tokenizer_init=True)
    publish(args, role="scheduler")
    return ModelConfig.from_server_args(args)


@pytest.mark.parametrize("model", MODELS)
def test_sglang_gives_a_sliding_pool_where_kvcore_says(model, registry, tmp_path):
    # the one answer compare --engine sglang, tune and the plugin read is SGLang's own
    config, _ = load_model_config(model)
    theirs = _sglang_model_config(model, tmp_path).is_hybrid_swa
    assert runs_hybrid_swa(config.get("architectures") or (), config) == theirs
    kvc = kv_cache_configurator(model, tmp_path, page_size=PAGE)
    plugin.check_hybrid_swa(kvc)  # the plugin agrees as well
    assert bool(kvc.is_hybrid_swa) == theirs


def test_the_plugin_refuses_a_model_whose_sliding_pool_kvcore_would_get_wrong(tmp_path):
    import types

    kvc = kv_cache_configurator("google/gemma-3-27b-it", tmp_path, page_size=PAGE)
    # an SGLang that gave Gemma 3 its sliding pool would run other pools than kvcore shows
    wrong = types.SimpleNamespace(model_config=kvc.model_config, is_hybrid_swa=True)
    with pytest.raises(rules.SglangIntegrationError, match=r"gives this model .* a sliding-window pool"):
        plugin.check_hybrid_swa(wrong)
