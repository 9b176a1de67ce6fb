"""Parameter counts of the decoders counted from data (mixtures of experts, plain MLPs) and of
the state-space families, each equal to the parameters of the transformers model built from the
same config on the meta device (and the routers' score-correction biases, which transformers
keeps as buffers and the checkpoints and vLLM as parameters).

The configs are the architecture table's tiny ones
(:func:`tests.integrations.vllm_engine.architectures.tiny_config`: the class defaults shrunk),
whose vLLM 0.32 counts ``docs/reference/models.md`` shows equal to kvcore's, and variants that
reach the branches the defaults do not (shared experts, dense layers among MoE ones, biases,
MoE and latent layers of Nemotron-H, attention layers of GraniteMoeHybrid).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvcore.planning.gpu_budget import count_parameters

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tests.integrations.vllm_engine.architectures import tiny_config  # noqa: E402

#: name -> (model type, transformers model class, fields over the tiny config).
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mixtral": ("mixtral", "MixtralForCausalLM", {}),
    "olmoe": ("olmoe", "OlmoeForCausalLM", {}),
    "olmoe with attention biases": ("olmoe", "OlmoeForCausalLM", {"attention_bias": True}),
    "granitemoe": ("granitemoe", "GraniteMoeForCausalLM", {}),
    "granitemoeshared": ("granitemoeshared", "GraniteMoeSharedForCausalLM", {}),
    "granitemoeshared with a shared MLP": (
        "granitemoeshared",
        "GraniteMoeSharedForCausalLM",
        {"shared_intermediate_size": 96},
    ),
    "granitemoe_swa": ("granitemoe_swa", "GraniteMoeSWAForCausalLM", {}),
    "granite_swa": ("granite_swa", "GraniteSWAForCausalLM", {}),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeForCausalLM", {}),
    "qwen2_moe, a dense first layer, no QKV bias": (
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        {"mlp_only_layers": [0], "qkv_bias": False},
    ),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", {}),
    "qwen3_moe, experts every second layer": ("qwen3_moe", "Qwen3MoeForCausalLM", {"decoder_sparse_step": 2}),
    "ernie4_5_moe": ("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", {}),
    "ernie4_5_moe with biases, experts on layers 1 and 3": (
        "ernie4_5_moe",
        "Ernie4_5_MoeForCausalLM",
        {"use_bias": True, "moe_layer_interval": 2, "moe_layer_start_index": 0, "moe_num_shared_experts": 0},
    ),
    "cohere2_moe": ("cohere2_moe", "Cohere2MoeForCausalLM", {}),
    "cohere2_moe, a dense prefix and a shared expert": (
        "cohere2_moe",
        "Cohere2MoeForCausalLM",
        {
            "num_shared_experts": 1,
            "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
            "prefix_dense_intermediate_size": 96,
        },
    ),
    "cohere": ("cohere", "CohereForCausalLM", {}),
    "cohere2": ("cohere2", "Cohere2ForCausalLM", {}),
    "apertus": ("apertus", "ApertusForCausalLM", {}),
    "nemotron": ("nemotron", "NemotronForCausalLM", {}),
    "nemotron with MLP biases": ("nemotron", "NemotronForCausalLM", {"mlp_bias": True}),
    "nemotron_h": ("nemotron_h", "NemotronHForCausalLM", {}),
    "nemotron_h with MoE layers": (
        "nemotron_h",
        "NemotronHForCausalLM",
        {
            "layers_block_type": ["linear_attention", "moe", "full_attention", "moe"],
            "moe_shared_expert_intermediate_size": 48,
        },
    ),
    "nemotron_h with latent MoE": (
        "nemotron_h",
        "NemotronHForCausalLM",
        {
            "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"],
            "moe_shared_expert_intermediate_size": 48,
            "moe_latent_size": 32,
        },
    ),
    # the class's pad_token_id (151329) lies beyond the tiny vocabulary, which torch refuses
    "glm4": ("glm4", "Glm4ForCausalLM", {"pad_token_id": 0}),
    "exaone4": ("exaone4", "Exaone4ForCausalLM", {}),
    "exaone_moe": ("exaone_moe", "ExaoneMoeForCausalLM", {}),
    "exaone_moe, two shared experts, two dense layers": (
        "exaone_moe",
        "ExaoneMoeForCausalLM",
        {"num_shared_experts": 2, "mlp_layer_types": ["dense", "dense", "sparse", "sparse"]},
    ),
    "hyperclovax": ("hyperclovax", "HyperCLOVAXForCausalLM", {}),
    "hyperclovax without post-norms": ("hyperclovax", "HyperCLOVAXForCausalLM", {"use_post_norm": False}),
    "stablelm": ("stablelm", "StableLmForCausalLM", {}),
    "stablelm, parallel residual, QK LayerNorms, QKV biases": (
        "stablelm",
        "StableLmForCausalLM",
        {"use_parallel_residual": True, "qk_layernorm": True, "use_qkv_bias": True},
    ),
    "mamba": ("mamba", "MambaForCausalLM", {}),
    "mamba with projection biases": ("mamba", "MambaForCausalLM", {"use_bias": True, "time_step_rank": 12}),
    "falcon_mamba": ("falcon_mamba", "FalconMambaForCausalLM", {}),
    "mamba2": ("mamba2", "Mamba2ForCausalLM", {}),
    "mamba2 with two groups and biases": (
        "mamba2",
        "Mamba2ForCausalLM",
        {"n_groups": 2, "use_bias": True, "use_conv_bias": False},
    ),
    "granitemoehybrid": ("granitemoehybrid", "GraniteMoeHybridForCausalLM", {}),
    "granitemoehybrid with attention, without experts": (
        "granitemoehybrid",
        "GraniteMoeHybridForCausalLM",
        {
            "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
            "num_local_experts": 0,
            "shared_intermediate_size": 96,
        },
    ),
    "falcon_h1": ("falcon_h1", "FalconH1ForCausalLM", {}),
    "falcon_h1 with biases and the gated norm": (
        "falcon_h1",
        "FalconH1ForCausalLM",
        {
            "mamba_rms_norm": True,
            "mamba_proj_bias": True,
            "projectors_bias": True,
            "mlp_bias": True,
            "attention_bias": True,
            "mamba_d_ssm": None,
        },
    ),
    "zamba2": ("zamba2", "Zamba2ForCausalLM", {}),
    "zamba2, three hybrid layers on two shared blocks, attention adapters": (
        "zamba2",
        "Zamba2ForCausalLM",
        {
            "num_hidden_layers": 5,
            "layers_block_type": ["hybrid", "linear_attention", "hybrid", "hybrid", "linear_attention"],
            "num_mem_blocks": 2,
            "use_shared_attention_adapter": True,
            "adapter_rank": 16,
        },
    ),
    "gemma3n_text": ("gemma3n_text", "Gemma3nForCausalLM", {}),
    "gemma3n_text, per-layer widths, three AltUp streams": (
        "gemma3n_text",
        "Gemma3nForCausalLM",
        {"intermediate_size": [256, 128, 256, 128, 256, 128], "altup_num_inputs": 3, "laurel_rank": 16},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_count_equals_the_transformers_model(registry, tmp_path, name):
    model_type, model_class, extra = CASES[name]
    config = tiny_config(model_type, **extra)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    # a parameter two modules share (tied embeddings) is one tensor, counted once; the routers'
    # e_score_correction_bias (EXAONE-MoE, Nemotron-H) is a buffer to transformers but stored in
    # the checkpoint and a parameter to vLLM, so it counts (xIELU's constant buffers do not)
    expected = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    expected += sum(
        b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias")
    )
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    count = count_parameters(saved, registry)
    assert count.params == expected
    assert not count.notes  # counted as itself, not as a Llama-like estimate
