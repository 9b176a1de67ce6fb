"""The transformers module front end: a scan of a tiny model equals the specs of its config.

Each model is built from a bundled (or synthetic) config shrunk to tiny widths, with random
weights and no download; layer counts, layer patterns and windows stay as published, so the
family rules are checked against transformers' own modules. Needs ``kvcore[transformers]``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from kvcore import InvalidSpecError, ModelOptions, dtypes, layer_specs_from_config, scan_module
from kvcore.frontends.hf_config import bundled_models
from tests.zoo import NEMOTRON_H_LIKE, QWEN3_NEXT_LIKE, synthetic

transformers = pytest.importorskip("transformers")

#: Widths every tiny model gets, and the sizes replaced where a config has them.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "vocab_size": 128,
    "num_attention_heads": 4,
    "pad_token_id": 0,
}
TINY_IF_PRESENT = {
    "num_key_value_heads": 2,
    "head_dim": 16,
    "attention_head_dim": 16,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "q_lora_rank": 16,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "intermediate_size_mlp": 64,
    "n_group": 1,
    "topk_group": 1,
    "mamba_dt_rank": 8,
    "mamba_d_state": 8,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}
#: Keys that would make the tiny model large or invalid (token ids beyond the tiny vocabulary).
DROP = ("bos_token_id", "eos_token_id", "quantization_config", "auto_map", "rope_scaling", "_synthetic")
TINY_VISION = {
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
    "vision_output_dim": 32,
    "projector_input_dim": 32,
    "projector_output_dim": 32,
}


def shrink(part):
    out = {k: v for k, v in part.items() if k not in DROP}
    out.update(TINY)
    out.update({k: v for k, v in TINY_IF_PRESENT.items() if k in part})
    if part.get("model_type") in ("qwen3_next", "nemotron_h"):  # transformers' defaults are 512 / 128 experts
        out.update(num_experts=2, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)
        out.update(shared_expert_intermediate_size=32)
    if "attention_head_dim" in part:
        out["head_dim"] = out["attention_head_dim"]  # transformers 5 reads head_dim only
    return out


def tiny(config):
    """``config`` with tiny widths (the text part of a wrapper too) and a tiny vision tower."""
    out = shrink(config)
    if "text_config" in config:
        out["text_config"] = shrink(config["text_config"])
    if "vision_config" in config or config["model_type"] in ("gemma3", "llama4"):
        out["vision_config"] = dict(TINY_VISION)
        out["mm_tokens_per_image"] = 4
    return out


def build(config, dtype=torch.bfloat16):
    """The model class the config's ``architectures`` names, with random weights."""
    hf_config = transformers.AutoConfig.for_model(**copy.deepcopy(config))
    model_class = getattr(transformers, config["architectures"][0])
    return model_class._from_config(hf_config, dtype=dtype)


#: Bundled models the module front end cannot scan yet: it does not tell a cross-attention module
#: (Whisper's encoder_attn, Mllama's cross_attn) from self attention; their config families are
#: checked layer by layer in test_zoo.py and test_encoder_decoder.py.
CROSS_ATTENTION_MODELS = ("meta-llama/Llama-3.2-11B-Vision-Instruct", "openai/whisper-large-v3")
CONFIGS = {m.name: m.config for m in bundled_models() if m.name not in CROSS_ATTENTION_MODELS} | {
    "nemotron-h-like (synthetic)": lambda: synthetic(NEMOTRON_H_LIKE),
    "qwen3-next-like (synthetic)": lambda: synthetic(QWEN3_NEXT_LIKE),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_scan_equals_config(registry, name):
    config = tiny(CONFIGS[name]())
    model = build(config)
    scanned = scan_module(model, registry)
    derived = layer_specs_from_config(config, registry)
    assert list(scanned) == list(derived)  # same names, same order
    assert scanned == derived


@pytest.mark.parametrize(
    "name",
    [
        "google/gemma-3-27b-it",
        "ai21labs/AI21-Jamba-1.5-Mini",
        "deepseek-ai/DeepSeek-V3",
        "nemotron-h-like (synthetic)",
    ],
)
def test_scan_equals_config_with_options(registry, name):
    config = tiny(CONFIGS[name]())
    model = build(config)
    options = ModelOptions(tp=2, kv_cache_dtype="fp8", state_dtype="float32", block_size=32)
    scanned = scan_module(model, registry, options)
    assert scanned == layer_specs_from_config(config, registry, options)
    assert {s.block_size for s in scanned.values()} == {32}


def test_vision_towers_are_not_scanned(registry):
    model = build(tiny(CONFIGS["google/gemma-3-27b-it"]()))
    names = [n for n, _ in model.named_modules() if n.endswith("self_attn")]
    assert any("vision_tower" in n for n in names)
    assert not any("vision_tower" in n for n in scan_module(model, registry))


def test_auto_dtype_is_the_weights_dtype(registry):
    config = tiny(CONFIGS["meta-llama/Llama-3.2-1B"]())
    scanned = scan_module(build(config, dtype=torch.float16), registry)
    assert {s.dtype for s in scanned.values()} == {dtypes.float16}


def test_modules_outside_transformers_are_not_claimed(registry):
    class LookAlike(torch.nn.Module):
        """Has everything a transformers attention module has, but is not one."""

        def __init__(self):
            super().__init__()
            self.layer_idx = 0
            self.head_dim = 16
            self.k_proj = torch.nn.Linear(64, 32)

    with pytest.raises(InvalidSpecError, match="no submodule of Sequential"):
        scan_module(torch.nn.Sequential(LookAlike()), registry)
