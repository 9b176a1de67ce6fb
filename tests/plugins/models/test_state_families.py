"""The state-space families (Mamba-1, Mamba-2, GraniteMoeHybrid, Falcon-H1, Zamba2) and Gemma 3n,
read from the defaults of transformers' own config classes, saved with ``save_pretrained`` as a
checkpoint ships them.

The expected shapes are vLLM 0.32's ``MambaStateShapeCalculator`` formulas
(``vllm/model_executor/layers/mamba/mamba_utils.py``) over the fields each vLLM model passes
(``get_mamba_state_shape_from_config``), worked out by hand here; the architecture table
(``docs/reference/models.md``) holds the same families to vLLM's own specs on tiny configs.
"""

from __future__ import annotations

import json

import pytest

from kvcore import ModelConfigError, ModelOptions, layer_specs_from_config

transformers = pytest.importorskip("transformers")

F, S = "full_attention", "sliding_window"


def saved(config, tmp_path):
    config.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))


def shapes(spec):
    return [part.shape for part in spec.parts]


def test_mamba_defaults_hold_a_mamba1_state_on_every_layer(registry, tmp_path):
    # MambaConfig: hidden 768, expand 2 (intermediate_size 1536), state 16, conv 4, 32 layers
    config = saved(transformers.MambaConfig(), tmp_path)
    specs = layer_specs_from_config(config, registry)
    assert list(specs) == [f"backbone.layers.{i}.mixer" for i in range(32)]
    assert {tuple(map(tuple, shapes(s))) for s in specs.values()} == {((3, 1536), (1536, 16))}
    # tensor parallelism splits the inner width
    (spec, *_) = layer_specs_from_config(config, registry, ModelOptions(tp=2)).values()
    assert shapes(spec) == [(3, 768), (768, 16)]


def test_falcon_mamba_reads_as_mamba(registry, tmp_path):
    specs = layer_specs_from_config(saved(transformers.FalconMambaConfig(), tmp_path), registry)
    assert len(specs) == 32 and shapes(next(iter(specs.values()))) == [(3, 1536), (1536, 16)]


def test_mamba_refuses_a_tp_that_does_not_divide_the_inner_width(registry, tmp_path):
    config = saved(transformers.MambaConfig(), tmp_path)
    with pytest.raises(ModelConfigError, match=r"intermediate_size.*1536.*tp=5"):
        layer_specs_from_config(config, registry, ModelOptions(tp=5))


def test_mamba2_defaults_take_the_conv_width_from_expand(registry, tmp_path):
    # Mamba2Config: hidden 4096 x expand 2 = 8192 inner, 8 groups of state 128, 128 heads of 64
    specs = layer_specs_from_config(saved(transformers.Mamba2Config(), tmp_path), registry)
    assert len(specs) == 64
    assert shapes(next(iter(specs.values()))) == [(3, 8192 + 2 * 8 * 128), (128, 64, 128)]


def test_granitemoehybrid_defaults_and_attention_layers(registry, tmp_path):
    # GraniteMoeHybridConfig: 32 Mamba-2 layers, hidden 4096 x mamba_expand 2, one group of state 256
    specs = layer_specs_from_config(saved(transformers.GraniteMoeHybridConfig(), tmp_path), registry)
    assert len(specs) == 32
    assert shapes(specs["model.layers.0.mamba"]) == [(3, 8192 + 2 * 256), (128, 64, 256)]
    types = ["linear_attention", "full_attention"] * 2
    config = transformers.GraniteMoeHybridConfig(
        num_hidden_layers=4, layer_types=types, num_key_value_heads=8
    )
    specs = layer_specs_from_config(saved(config, tmp_path), registry)
    assert list(specs) == [
        "model.layers.0.mamba",
        "model.layers.1.self_attn",
        "model.layers.2.mamba",
        "model.layers.3.self_attn",
    ]
    attention = specs["model.layers.1.self_attn"]
    assert (attention.kind, attention.num_kv_heads, attention.head_size) == (F, 8, 128)


def test_falcon_h1_defaults_hold_attention_and_a_state_on_every_layer(registry, tmp_path):
    # FalconH1Config: 32 layers; 8 KV heads of 4096 / 32; mamba_d_ssm 1024 (128 heads of 8),
    # one group of state 256
    specs = layer_specs_from_config(saved(transformers.FalconH1Config(), tmp_path), registry)
    assert len(specs) == 64
    assert list(specs)[:2] == ["model.layers.0.self_attn", "model.layers.0.mamba"]
    attention, state = specs["model.layers.0.self_attn"], specs["model.layers.0.mamba"]
    assert (attention.kind, attention.num_kv_heads, attention.head_size) == (F, 8, 128)
    assert shapes(state) == [(3, 1024 + 2 * 256), (128, 8, 256)]


def test_zamba2_defaults_cache_each_hybrid_layers_attention(registry, tmp_path):
    # Zamba2Config: 54 layers, 9 hybrid; attention 32 heads of 2 x 2560 / 32 = 160; Mamba-2 of
    # 2560 x 2 = 5120 inner, 8 heads of 640, one group of state 64
    config = transformers.Zamba2Config()
    specs = layer_specs_from_config(saved(config, tmp_path), registry)
    hybrid = config.hybrid_layer_ids
    assert len(hybrid) == 9 and len(specs) == 54 + 9
    for i in hybrid:
        attention = specs[f"model.layers.{i}.shared_transformer.self_attn"]
        assert (attention.kind, attention.num_kv_heads, attention.head_size) == (F, 32, 160)
        assert f"model.layers.{i}.mamba_decoder.mamba" in specs
    assert shapes(specs["model.layers.0.mamba"]) == [(3, 5120 + 2 * 64), (8, 640, 64)]


def test_gemma3n_defaults_leave_the_shared_layers_out(registry, tmp_path):
    # Gemma3nTextConfig: 35 layers, four sliding (window 512) to one full, the last 15 shared
    config = transformers.Gemma3nTextConfig()
    specs = layer_specs_from_config(saved(config, tmp_path), registry)
    assert list(specs) == [f"model.layers.{i}.self_attn" for i in range(20)]
    kinds = [s.kind for s in specs.values()]
    assert kinds == [F if (i + 1) % 5 == 0 else S for i in range(20)]
    assert {(s.num_kv_heads, s.head_size) for s in specs.values()} == {(2, 256)}


def test_gemma3n_refuses_shared_layers_without_a_layer_to_read(registry, tmp_path):
    config = saved(transformers.Gemma3nTextConfig(), tmp_path)
    config["num_kv_shared_layers"] = 35
    with pytest.raises(ModelConfigError, match="num_kv_shared_layers"):
        layer_specs_from_config(config, registry)


@pytest.mark.parametrize("config_class", ["FalconH1Config", "Zamba2Config", "GraniteMoeHybridConfig"])
def test_kvcore_plan_plans_the_hybrids(run_cli, tmp_path, config_class):
    getattr(transformers, config_class)().save_pretrained(tmp_path)
    status, out, err = run_cli("plan", "--model", tmp_path, "--memory", "8GiB", "--max-model-len", "4096")
    assert status == 0, err
    assert "state" in out
