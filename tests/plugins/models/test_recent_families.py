"""This year's families: Gemma 4, Qwen3.5 / Qwen3.5-MoE, Kimi-Linear, Laguna, and the families
kvcore refuses by name (MiniMax-M3, GLM-5 Next, MiMo-V2-Flash, Step-3.5); DeepSeek-V4 has its own
file (``test_deepseek_v4.py``).

No published config of these models could be vendored (see ``kvcore/data/zoo/SOURCES.md``), so
each is read from the defaults of transformers' own config class, saved with
``save_pretrained`` as a checkpoint would ship it, and from hand-written configs for the fields
published checkpoints use. A tiny random-weight transformers model of each scans to the same
specs as its config.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvcore import ModelConfigError, ModelOptions, dtypes, layer_specs_from_config, scan_module
from kvcore.frontends.hf_config import max_position_embeddings
from kvcore.plugins.models.refused import REFUSED

transformers = pytest.importorskip("transformers")

F, S = "full_attention", "sliding_window"


def saved(config, tmp_path):
    """``config`` (a transformers config object) as its ``save_pretrained`` writes it."""
    config.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))


def by_index(specs):
    """``{layer index: spec}``."""
    return {int(name.split(".")[-2]): spec for name, spec in specs.items()}


def scanned_equals_config(registry, config, model_class, options=None):
    hf_config = transformers.AutoConfig.for_model(**config)
    model = getattr(transformers, model_class)._from_config(hf_config, dtype=torch.bfloat16)
    scanned = scan_module(model, registry, options)
    derived = layer_specs_from_config(config, registry, options)
    assert list(scanned) == list(derived)
    assert scanned == derived


# -- Gemma 4 -------------------------------------------------------------------------------


def test_gemma4_defaults_have_wider_full_layers(registry, tmp_path):
    config = saved(transformers.Gemma4TextConfig(), tmp_path)  # 30 layers, 5 sliding : 1 full
    layers = by_index(layer_specs_from_config(config, registry))
    assert len(layers) == 30
    full = [i for i, s in layers.items() if s.kind == F]
    assert full == [5, 11, 17, 23, 29]
    # per_layer_config gives the full layers head_dim 512 (Gemma4TextConfig's global_head_dim)
    assert {(layers[i].num_kv_heads, layers[i].head_size) for i in full} == {(4, 512)}
    sliding = {layers[i] for i in layers if i not in full}
    assert {(s.kind, s.num_kv_heads, s.head_size, s.sliding_window) for s in sliding} == {(S, 4, 256, 512)}
    # K and V of 4 heads x 512 in bf16, 16 tokens a block
    assert layers[5].page_size_bytes == 2 * 4 * 512 * 2 * 16


def test_gemma4_shared_kv_and_k_eq_v(registry, tmp_path):
    text = transformers.Gemma4TextConfig(
        num_kv_shared_layers=10, attention_k_eq_v=True, num_global_key_value_heads=1
    )
    config = saved(text, tmp_path)
    layers = by_index(layer_specs_from_config(config, registry))
    # the last 10 layers read layers 17 (full) and 19 (sliding): no cache of their own
    assert sorted(layers) == list(range(20))
    assert [i for i, mode in enumerate(text.kv_sharing_modes) if mode == "store"] == [17, 19]
    # the store layers keep their own kind: layer 19 still slides
    assert layers[19].kind == S and layers[19].sliding_window == 512
    # K = V full layers: one KV head of 512 (num_global_key_value_heads), keys and values both cached
    assert (layers[17].kind, layers[17].num_kv_heads, layers[17].head_size) == (F, 1, 512)
    assert layers[17].page_size_bytes == 2 * 1 * 512 * 2 * 16


def test_gemma4_published_fields_without_per_layer_config(registry):
    # the fields of a published Gemma 4 text config (before transformers 5.24 wrote per_layer_config)
    text = {
        "model_type": "gemma4_text",
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_global_key_value_heads": 2,
        "attention_k_eq_v": True,
        "sliding_window": 1024,
    }
    layers = by_index(layer_specs_from_config(text, registry))
    assert (layers[5].num_kv_heads, layers[5].head_size) == (2, 512)
    assert (layers[0].num_kv_heads, layers[0].head_size, layers[0].sliding_window) == (8, 256, 1024)
    # without K = V the global KV heads are not used (Gemma4TextConfig gates them on it)
    plain = by_index(layer_specs_from_config({**text, "attention_k_eq_v": False}, registry))
    assert (plain[5].num_kv_heads, plain[5].head_size) == (8, 512)
    # global_head_dim absent: Gemma4TextConfig's default 512
    del text["global_head_dim"]
    assert by_index(layer_specs_from_config(text, registry))[11].head_size == 512
    # the last layer is always full (transformers forces it)
    forced = {**text, "num_hidden_layers": 4, "layer_types": ["sliding_attention"] * 4}
    assert [s.kind for s in layer_specs_from_config(forced, registry).values()] == [S, S, S, F]


def test_gemma4_wrapper_and_tp(registry, tmp_path):
    config = saved(transformers.Gemma4Config(), tmp_path)
    specs = layer_specs_from_config(config, registry, ModelOptions(tp=2))
    assert next(iter(specs)) == "model.language_model.layers.0.self_attn"
    assert {s.num_kv_heads for s in specs.values()} == {2}
    assert max_position_embeddings(config, registry) == 131_072


def test_gemma4_unified_reads_as_gemma4(registry, tmp_path):
    config = saved(transformers.Gemma4UnifiedConfig(), tmp_path)
    layers = by_index(layer_specs_from_config(config, registry))
    assert [i for i, s in layers.items() if s.kind == F] == [5, 11, 17, 23, 29]
    assert (layers[5].head_size, layers[0].head_size, layers[0].sliding_window) == (512, 256, 1024)
    assert max_position_embeddings(config, registry) == 262_144


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_kv_shared_layers": 4}, "no layer would compute keys and values"),
        ({"num_kv_shared_layers": 1, "layer_types": ["sliding_attention"] * 3 + [F]}, "none of"),
        ({"use_bidirectional_attention": "all"}, "encoder-style"),
        ({"per_layer_config": {"7": {"head_dim": 64}}}, "layer indices in [0, 4)"),
    ],
)
def test_gemma4_bad_configs(registry, fields, message):
    config = {
        "model_type": "gemma4_text",
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "sliding_window": 128,
        **fields,
    }
    with pytest.raises(ModelConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        layer_specs_from_config(config, registry)


def test_gemma4_scan_equals_config(registry, tmp_path):
    text = transformers.Gemma4TextConfig(
        num_hidden_layers=12,
        hidden_size=64,
        intermediate_size=64,
        vocab_size=128,
        vocab_size_per_layer_input=128,
        hidden_size_per_layer_input=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        num_kv_shared_layers=4,
        sliding_window=64,
    )
    config = {**saved(text, tmp_path), "architectures": ["Gemma4ForCausalLM"]}
    scanned_equals_config(registry, config, "Gemma4ForCausalLM")


# -- Qwen3.5 -------------------------------------------------------------------------------


@pytest.mark.parametrize("config_class", ["Qwen3_5Config", "Qwen3_5MoeConfig"])
def test_qwen3_5_defaults(registry, tmp_path, config_class):
    config = saved(getattr(transformers, config_class)(), tmp_path)
    specs = layer_specs_from_config(config, registry)
    names = list(specs)
    assert names[3] == "model.language_model.layers.3.self_attn"
    assert names[0] == "model.language_model.layers.0.linear_attn"
    state = specs[names[0]]
    # conv (4 - 1, 2*16*128 + 32*128 = 8192), recurrent (32 value heads, 128, 128)
    assert [p.shape for p in state.parts] == [(3, 8192), (32, 128, 128)]
    assert sum(s.kind == F for s in specs.values()) == len(specs) // 4


def test_qwen3_5_recurrent_state_dtype(registry):
    config = {
        "model_type": "qwen3_5_text",
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
    }
    specs = layer_specs_from_config(config, registry, ModelOptions(tp=2))
    state = specs["model.layers.0.linear_attn"]
    assert [(p.shape, p.dtype) for p in state.parts] == [
        ((3, (2 * 4 * 64 + 8 * 64) // 2), dtypes.bfloat16),
        ((4, 64, 64), dtypes.float32),
    ]
    assert list(specs)[3] == "model.layers.3.self_attn"
    # an explicit state_dtype wins over mamba_ssm_dtype, as --mamba-ssm-cache-dtype does in vLLM
    forced = layer_specs_from_config(config, registry, ModelOptions(state_dtype="bfloat16"))
    assert {p.dtype for p in forced["model.layers.0.linear_attn"].parts} == {dtypes.bfloat16}
    with pytest.raises(ModelConfigError, match="mamba_ssm_dtype"):
        layer_specs_from_config({**config, "mamba_ssm_dtype": "int3"}, registry)


def test_qwen3_5_scan_equals_config(registry, tmp_path):
    text = transformers.Qwen3_5TextConfig(
        num_hidden_layers=4,
        hidden_size=64,
        intermediate_size=64,
        vocab_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    )
    config = {**saved(text, tmp_path), "architectures": ["Qwen3_5ForCausalLM"]}
    scanned_equals_config(registry, config, "Qwen3_5ForCausalLM")


# -- Kimi-Linear ---------------------------------------------------------------------------


def test_kimi_linear_defaults(registry, tmp_path):
    config = saved(transformers.KimiLinearConfig(), tmp_path)
    layers = by_index(layer_specs_from_config(config, registry))
    assert [i for i, s in layers.items() if s.kind == "mla"] == [4, 8, 12, 16, 20, 24]
    assert layers[4].latent_size == 512 + 64
    kda = layers[0]
    # conv over q, k and v: (4 - 1, 3 * 32 * 128); recurrent (32, 128, 128) in float32
    assert [(p.shape, p.dtype) for p in kda.parts] == [
        ((3, 12288), dtypes.bfloat16),
        ((32, 128, 128), dtypes.float32),
    ]
    assert kda.page_size_bytes == 3 * 12288 * 2 + 32 * 128 * 128 * 4
    assert max_position_embeddings(config, registry) == 1_048_576  # saved as model_max_length


def test_kimi_linear_published_linear_attn_config(registry):
    # the shape of a published Kimi-Linear config: 1-based layer lists in linear_attn_config
    config = {
        "model_type": "kimi_linear",
        "num_hidden_layers": 8,
        "num_attention_heads": 32,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "linear_attn_config": {
            "full_attn_layers": [4, 8],
            "kda_layers": [1, 2, 3, 5, 6, 7],
            "num_heads": 16,
            "head_dim": 64,
            "short_conv_kernel_size": 4,
        },
    }
    layers = by_index(layer_specs_from_config(config, registry, ModelOptions(tp=4)))
    assert [i for i, s in layers.items() if s.kind == "mla"] == [3, 7]
    assert [p.shape for p in layers[0].parts] == [(3, 3 * 16 * 64 // 4), (4, 64, 64)]
    bad = json.loads(json.dumps(config))
    bad["linear_attn_config"]["kda_layers"] = [1, 2, 3]
    with pytest.raises(ModelConfigError, match="without a type"):
        layer_specs_from_config(bad, registry)
    with pytest.raises(ModelConfigError, match="tp=3 does not divide"):
        layer_specs_from_config(config, registry, ModelOptions(tp=3))


def test_kimi_linear_scan_equals_config(registry, tmp_path):
    text = transformers.KimiLinearConfig(
        num_hidden_layers=5,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        vocab_size=128,
        pad_token_id=0,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        linear_num_heads=4,
        linear_head_dim=16,
    )
    config = {**saved(text, tmp_path), "architectures": ["KimiLinearForCausalLM"]}
    scanned_equals_config(registry, config, "KimiLinearForCausalLM")
    options = ModelOptions(tp=2, state_dtype="float32")
    scanned_equals_config(registry, config, "KimiLinearForCausalLM", options)


# -- Laguna and the refused families -------------------------------------------------------


def test_laguna_reads_layer_types_with_one_geometry(registry, tmp_path):
    config = saved(
        transformers.LagunaConfig(num_hidden_layers=4, layer_types=["sliding_attention", F] * 2),
        tmp_path,
    )
    specs = list(layer_specs_from_config(config, registry).values())
    assert [s.kind for s in specs] == [S, F, S, F]
    assert {(s.num_kv_heads, s.head_size) for s in specs} == {(8, 128)}
    assert specs[0].sliding_window == 512


@pytest.mark.parametrize(
    ("config_class", "model"),
    [("MiMoV2FlashConfig", "MiMo-V2-Flash")],
)
def test_refused_families_name_the_model_and_the_reason(registry, tmp_path, config_class, model):
    config = saved(getattr(transformers, config_class)(), tmp_path)
    # their configs list layer_types: without the refusal the generic fallback would plan them
    assert config["layer_types"]
    with pytest.raises(ModelConfigError, match=f"kvcore does not plan {model} models yet"):
        layer_specs_from_config(config, registry)


def test_the_module_front_end_refuses_values_of_another_head_size(registry):
    config = transformers.MiMoV2FlashConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        vocab_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
    )
    model = transformers.MiMoV2FlashForCausalLM._from_config(config, dtype=torch.bfloat16)
    with pytest.raises(ModelConfigError, match="different head sizes"):
        scan_module(model, registry)


@pytest.mark.parametrize("refusal", REFUSED, ids=lambda r: r.name)
def test_every_refusal_claims_its_model_types(registry, refusal):
    for model_type in refusal.model_types:
        assert registry.family_for({"model_type": model_type}).name == refusal.name
        with pytest.raises(ModelConfigError, match=refusal.model.replace("(", r"\(").replace(")", r"\)")):
            layer_specs_from_config({"model_type": model_type, "layer_types": [F]}, registry)


# -- weights ---------------------------------------------------------------------------------

_GEMMA4 = {
    "num_hidden_layers": 12,
    "hidden_size": 64,
    "intermediate_size": 96,
    "vocab_size": 128,
    "vocab_size_per_layer_input": 100,
    "hidden_size_per_layer_input": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
}
_QWEN3_5 = {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "intermediate_size": 96,
    "vocab_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}
_KIMI = {
    "num_hidden_layers": 5,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "vocab_size": 128,
    "pad_token_id": 0,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "linear_num_heads": 4,
    "linear_head_dim": 16,
}
_TINY_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64}
#: name -> (config class, fields, model class)
WEIGHTS = {
    "gemma4_text": ("Gemma4TextConfig", _GEMMA4, "Gemma4ForCausalLM"),
    "gemma4_text shared, K=V, double-wide": (
        "Gemma4TextConfig",
        {
            **_GEMMA4,
            "num_kv_shared_layers": 4,
            "attention_k_eq_v": True,
            "num_global_key_value_heads": 1,
            "use_double_wide_mlp": True,
        },
        "Gemma4ForCausalLM",
    ),
    "gemma4_text MoE, no PLE, biases, untied": (
        "Gemma4TextConfig",
        {
            **_GEMMA4,
            "hidden_size_per_layer_input": 0,
            "enable_moe_block": True,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 24,
            "attention_bias": True,
            "tie_word_embeddings": False,
        },
        "Gemma4ForCausalLM",
    ),
    "gemma4_unified": (
        "Gemma4UnifiedConfig",
        {"text_config": {**_GEMMA4, "num_kv_shared_layers": 4}},
        "Gemma4UnifiedForConditionalGeneration",
    ),
    "qwen3_5_text": ("Qwen3_5TextConfig", _QWEN3_5, "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": (
        "Qwen3_5MoeTextConfig",
        {
            **_QWEN3_5,
            "num_experts": 4,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 24,
            "layer_types": ["linear_attention", "full_attention"] * 2,
        },
        "Qwen3_5MoeForCausalLM",
    ),
    "qwen3_5 with its vision tower": (
        "Qwen3_5Config",
        {"text_config": _QWEN3_5, "vision_config": _TINY_VISION},
        "Qwen3_5ForConditionalGeneration",
    ),
    "kimi_linear": ("KimiLinearConfig", _KIMI, "KimiLinearForCausalLM"),
    "kimi_linear with query LoRA, two shared experts": (
        "KimiLinearConfig",
        {**_KIMI, "q_lora_rank": 24, "num_shared_experts": 2},
        "KimiLinearForCausalLM",
    ),
    "laguna": (
        "LagunaConfig",
        {
            "num_hidden_layers": 3,
            "hidden_size": 64,
            "intermediate_size": 96,
            "vocab_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_experts": 4,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 24,
            "num_experts_per_tok": 2,
            "num_attention_heads_per_layer": [4, 8, 4],
        },
        "LagunaForCausalLM",
    ),
    "laguna per-element gate, biases": (
        "LagunaConfig",
        {
            "num_hidden_layers": 3,
            "hidden_size": 64,
            "intermediate_size": 96,
            "vocab_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_experts": 4,
            "moe_intermediate_size": 32,
            "num_experts_per_tok": 2,
            "gating": "per-element",
            "attention_bias": True,
            "mlp_layer_types": ["sparse", "dense", "sparse"],
        },
        "LagunaForCausalLM",
    ),
}


@pytest.mark.parametrize("name", list(WEIGHTS))
def test_parameter_count_equals_the_transformers_model(registry, tmp_path, name):
    from kvcore.planning.gpu_budget import count_parameters

    config_class, fields, model_class = WEIGHTS[name]
    hf_config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(hf_config)
    expected = sum(p.numel() for p in model.parameters())
    count = count_parameters(saved(hf_config, tmp_path), registry)
    assert count.params == expected
    assert not count.notes


def test_gemma4_towers_are_named_when_left_out(registry, tmp_path):
    from kvcore.planning.gpu_budget import count_parameters

    config = saved(transformers.Gemma4Config(text_config=_GEMMA4, vision_config={}), tmp_path)
    (note,) = count_parameters(config, registry).notes
    assert "vision_config" in note and "not counted" in note


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config_class", "kinds"),
    [
        ("Gemma4Config", {"sliding_window", F}),
        ("Qwen3_5MoeConfig", {"state", F}),
        ("KimiLinearConfig", {"state", "mla"}),
    ],
)
def test_kvcore_plan_plans_them(run_cli, tmp_path, config_class, kinds):
    getattr(transformers, config_class)().save_pretrained(tmp_path)
    status, out, err = run_cli("plan", "--model", tmp_path, "--gpu-memory", "141GiB", "--json")
    assert status == 0, err
    plan = json.loads(out)
    assert {group["kind"] for group in plan["groups"]} == kinds


def test_kvcore_plan_refuses_mimo_v2_by_name(run_cli, tmp_path):
    transformers.MiMoV2FlashConfig().save_pretrained(tmp_path)
    status, out, err = run_cli("plan", "--model", tmp_path, "--memory", "80GiB")
    assert status != 0 and not out
    assert "kvcore does not plan MiMo-V2-Flash models yet" in err and "Traceback" not in err
