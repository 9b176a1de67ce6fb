"""The per-family rules and the model options, on small configs written out in each test."""

from __future__ import annotations

import pytest

from kvcore import ModelFamily, ModelOptions, dtypes, hookimpl, layer_specs_from_config
from kvcore.spec import describe_spec
from tests.zoo import NEMOTRON_H_LIKE, QWEN3_NEXT_LIKE, bundled, synthetic

BASE = {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4}


def kinds(registry, config, options=None):
    """``[kind or kind(window)]`` per layer, in model order."""
    out = []
    for spec in layer_specs_from_config(config, registry, options).values():
        extra = getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None)
        out.append(f"{spec.kind}({extra})" if extra else spec.kind)
    return out


F, S = "full_attention", "sliding_window"


def typed(model_type, layer_types, **fields):
    """``BASE`` as a ``model_type`` config with explicit ``layer_types`` and the given fields."""
    return {**BASE, "model_type": model_type, "layer_types": list(layer_types), **fields}


# -- layer types ---------------------------------------------------------------------------


def test_explicit_layer_types_win_over_the_family_pattern(registry):
    # gemma3_text's default pattern (period 6) would make all four layers sliding
    config = typed("gemma3_text", [F, "sliding_attention"] * 2, head_dim=64, sliding_window=512)
    assert kinds(registry, config) == [F, f"{S}(512)", F, f"{S}(512)"]
    # llama has no pattern of its own, but honours layer_types too
    llama = typed("llama", ["sliding_attention"] * 4, sliding_window=64)
    assert kinds(registry, llama) == [f"{S}(64)"] * 4


def test_legacy_layer_type_names_are_read(registry):
    config = typed("llama", ["attention"] * 4)
    assert kinds(registry, config) == [F] * 4


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_window_needs_use_sliding_window(registry, model_type):
    # Qwen2.5 ships sliding_window 131072 with use_sliding_window false: all full attention
    off = {**BASE, "model_type": model_type, "sliding_window": 131072, "max_window_layers": 2}
    assert kinds(registry, off) == [F] * 4
    # on: the first max_window_layers layers are full, the rest slide
    on = {**off, "use_sliding_window": True, "sliding_window": 256}
    assert kinds(registry, on) == [F, F, f"{S}(256)", f"{S}(256)"]
    # max_window_layers absent: transformers' default 28 -> layers 28 and 29 of 30 slide
    default = {**on, "num_hidden_layers": 30}
    del default["max_window_layers"]
    assert kinds(registry, default) == [F] * 28 + [f"{S}(256)"] * 2
    # sliding_window absent: transformers' default 4096
    no_window = {**on}
    del no_window["sliding_window"]
    assert kinds(registry, no_window) == [F, F, f"{S}(4096)", f"{S}(4096)"]


def test_qwen3_moe_slides_every_layer_unless_max_window_layers_is_stated(registry):
    config = {**BASE, "model_type": "qwen3_moe", "use_sliding_window": True, "sliding_window": 128}
    assert kinds(registry, config) == [f"{S}(128)"] * 4
    assert kinds(registry, {**config, "max_window_layers": 1}) == [F] + [f"{S}(128)"] * 3


def test_mistral_window_null_absent_and_set(registry):
    config = {**BASE, "model_type": "mistral"}
    assert kinds(registry, {**config, "sliding_window": None}) == [F] * 4
    assert kinds(registry, config) == [f"{S}(4096)"] * 4  # MistralConfig's default
    assert kinds(registry, {**config, "sliding_window": 1000}) == [f"{S}(1000)"] * 4


def test_phi3_window_is_uniform_when_set(registry):
    config = {**BASE, "model_type": "phi3"}
    assert kinds(registry, config) == [F] * 4
    assert kinds(registry, {**config, "sliding_window": 2047}) == [f"{S}(2047)"] * 4


def test_gemma2_alternates_sliding_first(registry):
    config = {**BASE, "model_type": "gemma2", "head_dim": 256, "sliding_window": 4096}
    assert kinds(registry, config) == [f"{S}(4096)", F] * 2


def test_gemma3_pattern_default_and_explicit(registry):
    config = {
        **BASE,
        "num_hidden_layers": 12,
        "model_type": "gemma3_text",
        "head_dim": 64,
        "sliding_window": 512,
    }
    assert [i for i, k in enumerate(kinds(registry, config)) if k == F] == [5, 11]
    assert [i for i, k in enumerate(kinds(registry, {**config, "sliding_window_pattern": 3})) if k == F] == [
        2,
        5,
        8,
        11,
    ]


def test_gemma3_wrapper_reads_text_config_and_the_wrapper_dtype(registry):
    text = {**BASE, "head_dim": 64, "sliding_window": 512}
    specs = layer_specs_from_config(
        {"model_type": "gemma3", "torch_dtype": "float16", "text_config": text}, registry
    )
    assert next(iter(specs)) == "model.language_model.layers.0.self_attn"
    assert {s.dtype for s in specs.values()} == {dtypes.float16}


def test_gpt_oss_default_alternation_without_layer_types(registry):
    config = {**BASE, "model_type": "gpt_oss", "head_dim": 64, "sliding_window": 128}
    assert kinds(registry, config) == [f"{S}(128)", F] * 2


def test_llama4_no_rope_layers(registry):
    text = {**BASE, "model_type": "llama4_text", "head_dim": 128, "attention_chunk_size": 8192}
    # 1 = RoPE = chunked local; 0 = NoPE = full
    assert kinds(registry, {**text, "no_rope_layers": [1, 0, 1, 1]}) == [
        "chunked_local_attention(8192)",
        F,
        "chunked_local_attention(8192)",
        "chunked_local_attention(8192)",
    ]
    # an empty list counts as absent: interval 2 -> layers 1 and 3 are NoPE
    assert (
        kinds(registry, {**text, "no_rope_layers": [], "no_rope_layer_interval": 2})
        == [
            "chunked_local_attention(8192)",
            F,
        ]
        * 2
    )
    # a null chunk size makes every layer full
    assert kinds(registry, {**text, "attention_chunk_size": None}) == [F] * 4
    wrapped = layer_specs_from_config({"model_type": "llama4", "text_config": text}, registry)
    assert list(wrapped)[3] == "language_model.model.layers.3.self_attn"


def test_deepseek_ignores_kv_heads_and_head_dim(registry):
    config = {
        **BASE,
        "model_type": "deepseek_v2",
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "head_dim": 64,  # transformers-5 dumps set it from qk_rope_head_dim
        "num_key_value_heads": 128,
    }
    specs = layer_specs_from_config(config, registry, ModelOptions(tp=8))
    # MLA latent replicated on every rank: still 512 + 64 per token
    assert {(s.kind, s.latent_size) for s in specs.values()} == {("mla", 576)}


def test_jamba_period_and_offset(registry):
    config = {
        **BASE,
        "num_hidden_layers": 6,
        "model_type": "jamba",
        "attn_layer_period": 3,
        "attn_layer_offset": 1,
        "mamba_expand": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
    }
    specs = layer_specs_from_config(config, registry)
    assert list(specs) == [
        "model.layers.0.mamba",
        "model.layers.1.self_attn",
        "model.layers.2.mamba",
        "model.layers.3.mamba",
        "model.layers.4.self_attn",
        "model.layers.5.mamba",
    ]
    state = specs["model.layers.0.mamba"]
    # d_inner = 2 * 512 = 1024: conv (3, 1024) and ssm (1024, 16), bf16
    assert [p.shape for p in state.parts] == [(3, 1024), (1024, 16)]
    assert state.page_size_bytes == (3 * 1024 + 1024 * 16) * 2


def test_nemotron_h_pattern_and_state(registry):
    config = synthetic(NEMOTRON_H_LIKE)
    specs = layer_specs_from_config(config, registry)
    pattern = config["hybrid_override_pattern"]
    assert [int(n.split(".")[2]) for n in specs] == [i for i, c in enumerate(pattern) if c in "M*"]
    assert all(n.endswith(".mixer") for n in specs)
    attention = {s for n, s in specs.items() if pattern[int(n.split(".")[2])] == "*"}
    state = {s for n, s in specs.items() if pattern[int(n.split(".")[2])] == "M"}
    assert {(s.kind, s.num_kv_heads, s.head_size) for s in attention} == {("full_attention", 8, 128)}
    (mamba,) = state
    # conv channels 256*64 + 2*8*256 = 20480, kernel 4 -> 3 kept; ssm (256, 64, 256)
    assert [p.shape for p in mamba.parts] == [(3, 20480), (256, 64, 256)]
    assert mamba.page_size_bytes == (3 * 20480 + 256 * 64 * 256) * 2  # 8,511,488


def test_nemotron_h_explicit_types_and_legacy_keys(registry):
    config = {
        **BASE,
        "model_type": "nemotron_h",
        "layers_block_type": ["linear_attention", "mlp", "full_attention", "moe"],
        "attention_head_dim": 32,
        "head_dim": 99,  # attention_head_dim wins
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "mamba_n_groups": 2,
        "n_groups": 999,  # the legacy key wins, as in NemotronHConfig
        "ssm_state_size": 16,
        "mamba_d_conv": 2,
    }
    specs = layer_specs_from_config(config, registry)
    assert list(specs) == ["model.layers.0.mixer", "model.layers.2.mixer"]
    assert specs["model.layers.2.mixer"].head_size == 32
    # conv (2 - 1, 8*16 + 2*2*16 = 192), ssm (8, 16, 16)
    assert [p.shape for p in specs["model.layers.0.mixer"].parts] == [(1, 192), (8, 16, 16)]


def test_qwen3_next_interval_and_state(registry):
    config = synthetic(QWEN3_NEXT_LIKE)
    specs = layer_specs_from_config(config, registry)
    names = list(specs)
    assert [n for n in names if n.endswith("self_attn")] == [
        f"model.layers.{i}.self_attn" for i in range(3, 48, 4)
    ]
    assert len([n for n in names if n.endswith("linear_attn")]) == 36
    gdn = specs["model.layers.0.linear_attn"]
    # conv (4 - 1, 2*16*128 + 32*128 = 8192), recurrent (32, 128, 128)
    assert [p.shape for p in gdn.parts] == [(3, 8192), (32, 128, 128)]
    assert gdn.page_size_bytes == (3 * 8192 + 32 * 128 * 128) * 2  # 1,097,728
    full = specs["model.layers.3.self_attn"]
    assert (full.num_kv_heads, full.head_size) == (2, 256)
    explicit = {**config, "num_hidden_layers": 2, "layer_types": ["full_attention", "linear_attention"]}
    assert list(layer_specs_from_config(explicit, registry)) == [
        "model.layers.0.self_attn",
        "model.layers.1.linear_attn",
    ]


def test_generic_fallback_honours_layer_types(registry):
    layer_types = ["full_attention", "sliding_attention", "mlp", "chunked_attention"]
    config = typed("somebody_new", layer_types, sliding_window=100, attention_chunk_size=200)
    assert kinds(registry, config) == [F, f"{S}(100)", "chunked_local_attention(200)"]
    nested = {"model_type": "somebody_vl", "text_config": {**config, "model_type": "somebody_text"}}
    assert kinds(registry, nested) == [F, f"{S}(100)", "chunked_local_attention(200)"]


def test_a_family_plugin_wins_over_the_generic_fallback(make_registry):
    class AcmeFamily:
        @hookimpl
        def kvcore_register_model_families(self, register):
            register(ModelFamily(name="acme", model_types=("somebody_new",), layer_specs=acme_specs))

    def acme_specs(config, options):
        return {"acme.0": bundled_spec()}

    def bundled_spec():
        return next(
            iter(layer_specs_from_config(bundled("meta-llama/Llama-3.2-1B"), make_registry()).values())
        )

    config = typed("somebody_new", ["full_attention"] * 4)
    assert list(layer_specs_from_config(config, make_registry(AcmeFamily()))) == ["acme.0"]


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize(("tp", "heads"), [(1, 8), (2, 4), (8, 1), (16, 1)])
def test_tp_divides_kv_heads_down_to_one(registry, tp, heads):
    specs = layer_specs_from_config(bundled("meta-llama/Llama-3.1-8B"), registry, ModelOptions(tp=tp))
    assert {s.num_kv_heads for s in specs.values()} == {heads}  # max(1, 8 // tp)


def test_tp_shards_states(registry):
    jamba = bundled("ai21labs/AI21-Jamba-1.5-Mini")
    specs = layer_specs_from_config(jamba, registry, ModelOptions(tp=4))
    state = specs["model.layers.0.mamba"]
    assert [p.shape for p in state.parts] == [(3, 2048), (2048, 16)]  # 8192 / 4
    assert specs["model.layers.4.self_attn"].num_kv_heads == 2
    nemotron = layer_specs_from_config(synthetic(NEMOTRON_H_LIKE), registry, ModelOptions(tp=16))
    mamba = next(s for s in nemotron.values() if s.kind == "state")
    # 256 heads / 16; 8 groups are replicated to 16, one per rank: 16*64 + 2*1*256 = 1536
    assert [p.shape for p in mamba.parts] == [(3, 1536), (16, 64, 256)]


def test_fp8_applies_to_attention_and_mla_not_to_states(registry):
    options = ModelOptions(kv_cache_dtype="fp8")
    jamba = layer_specs_from_config(bundled("ai21labs/AI21-Jamba-1.5-Mini"), registry, options)
    assert jamba["model.layers.4.self_attn"].dtype == dtypes.float8_e4m3fn
    assert jamba["model.layers.4.self_attn"].page_size_bytes == 16 * 2 * 8 * 128  # one byte per element
    assert {p.dtype for p in jamba["model.layers.0.mamba"].parts} == {dtypes.bfloat16}
    deepseek = layer_specs_from_config(
        bundled("deepseek-ai/DeepSeek-V3"), registry, ModelOptions(kv_cache_dtype="fp8_e5m2")
    )
    assert {s.dtype for s in deepseek.values()} == {dtypes.float8_e5m2}


def test_state_dtype_and_block_size(registry):
    options = ModelOptions(state_dtype="float32", block_size=32)
    specs = layer_specs_from_config(bundled("ai21labs/AI21-Jamba-1.5-Mini"), registry, options)
    assert specs["model.layers.0.mamba"].page_size_bytes == 2 * 311_296  # float32 state, block size ignored
    assert specs["model.layers.4.self_attn"].page_size_bytes == 32 * 4096  # bf16 attention, 32 tokens


def test_model_dtype_keys(registry):
    config = {**BASE, "model_type": "llama"}
    assert {s.dtype for s in layer_specs_from_config(config, registry).values()} == {dtypes.bfloat16}
    assert {s.dtype for s in layer_specs_from_config({**config, "dtype": "float16"}, registry).values()} == {
        dtypes.float16
    }
    assert {
        s.dtype for s in layer_specs_from_config({**config, "torch_dtype": "float32"}, registry).values()
    } == {dtypes.float32}


def test_options_are_typed_values():
    options = ModelOptions(tp=2, kv_cache_dtype="fp8", block_size=32)
    assert options.kv_cache_dtype == dtypes.float8_e4m3fn
    assert options.state_dtype is None  # "auto": the model's dtype
    assert ModelOptions.from_mapping({"tp": 2, "kv_cache_dtype": "fp8", "block_size": 32}) == options
    assert ModelOptions(kv_cache_dtype="auto") == ModelOptions()


def test_describe_a_derived_state(registry):
    specs = layer_specs_from_config(bundled("ai21labs/AI21-Jamba-1.5-Mini"), registry)
    assert describe_spec(specs["model.layers.0.mamba"]) == (
        "state(block_size=16, parts=(conv[3x8192 bfloat16], ssm[8192x16 bfloat16]))"
    )


def test_mamba2_and_gated_delta_net_states_hold_vllms_prefill_checkpoint_in_align_mode(registry):
    """vLLM 0.33's Mamba-2 mixer always asks for one prefill checkpoint state, its gated-delta-net
    layer where FlashInfer runs its prefill (Hopper's default), Mamba-1 (Jamba) for none; only
    align mode holds it."""
    from kvcore.spec import SizingContext

    nemotron = layer_specs_from_config(synthetic(NEMOTRON_H_LIKE), registry)
    qwen = layer_specs_from_config(synthetic(QWEN3_NEXT_LIKE), registry)
    jamba = layer_specs_from_config(bundled("ai21labs/AI21-Jamba-1.5-Mini"), registry)
    held = {}
    for name, specs in (("nemotron", nemotron), ("qwen", qwen), ("jamba", jamba)):
        state = next(s for s in specs.values() if s.kind == "state")
        held[name] = {
            mode: state.max_num_blocks(SizingContext(max_model_len=8192, state_cache_mode=mode))
            for mode in ("none", "align")
        }
    assert held == {
        "nemotron": {"none": 1, "align": 3},
        "qwen": {"none": 1, "align": 3},
        "jamba": {"none": 1, "align": 2},
    }
    nemotron_state = next(s for s in nemotron.values() if s.kind == "state")
    assert (nemotron_state.checkpoint_slots, nemotron_state.checkpoint_alignment) == (1, 1)
