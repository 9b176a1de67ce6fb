"""DeepSeek-V4: its config mapped to the sliding-window latents, compressed latents, compressor
states and indexer keys vLLM 0.34 caches, byte for byte.

No published DeepSeek-V4 config is vendored (``kvcore/data/zoo/SOURCES.md``): configs come from
transformers' ``DeepseekV4Config`` defaults, saved as a checkpoint ships them, and from
hand-written ones of the older per-layer ``compress_ratios`` form. The expected bytes are worked
out here from the formulas vLLM's code states (cited in ``kvcore/plugins/models/deepseek_v4.py``),
not from kvcore's specs.
"""

from __future__ import annotations

import json

import pytest

from kvcore import ModelConfigError, ModelOptions, SizingContext, layer_specs_from_config
from kvcore.errors import PolicyNotApplicableError
from kvcore.frontends.hf_config import max_position_embeddings
from kvcore.planning.planner import plan_kv_cache
from kvcore.plugins.models.deepseek_v4 import layer_ratios, packed_bytes
from kvcore.plugins.models.kit import ConfigFields

transformers = pytest.importorskip("transformers")

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"


def saved(config, tmp_path):
    config.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))


def pad(size, alignment):
    return -(-size // alignment) * alignment


def expected_pages(ratio, *, fp8):
    """The page of every cache of a layer of ``ratio`` (0: sliding), by hand from vLLM's rules:
    a page holds ``block_size // tokens_per_state`` rows of ``state_content_bytes`` (packed) or
    ``head_size x dtype`` (plain, no V), padded up to 576 (fp8_ds_mla) or 512 bytes."""
    head, index_head = 512, 128
    row = 448 + 64 * 2 + 8 if fp8 else head * 2  # fp8_ds_mla: 448 fp8 + 64 bf16 + 8 scales; plain bf16
    align = 576 if fp8 else 512
    pages = {".swa_cache": pad(64 * row, align)}  # 64-token blocks, one row a token
    if ratio:
        coff = 2 if ratio == 4 else 1
        pages[""] = pad(256 // ratio * row, align)  # 256-token blocks, one row per ratio tokens
        state_block = 4 if ratio == 4 else 8
        pages[".compressor.state_cache"] = pad(state_block * 2 * coff * head * 4, align)  # float32
    if ratio == 4:
        pages[".indexer.k_cache"] = pad(256 // 4 * (index_head + index_head // 128 * 4), align)
        pages[".indexer.compressor.state_cache"] = pad(4 * 2 * 2 * index_head * 4, align)
    return pages


@pytest.fixture(scope="module")
def default_config(tmp_path_factory):
    return saved(transformers.DeepseekV4Config(), tmp_path_factory.mktemp("dsv4"))


@pytest.mark.parametrize("fp8", [False, True], ids=["bfloat16", "fp8_ds_mla"])
def test_every_cache_has_the_bytes_vllm_gives_it(registry, default_config, fp8):
    options = ModelOptions(kv_cache_dtype="fp8" if fp8 else None)
    specs = layer_specs_from_config(default_config, registry, options)
    # transformers' default schedule: two ratio-128 layers, then 128 and 4 in turn (43 layers)
    ratios = [128, 128] + [4 if i % 2 else 128 for i in range(41)]
    expected = {}
    for i, ratio in enumerate(ratios):
        for suffix, page in expected_pages(ratio, fp8=fp8).items():
            expected[f"model.layers.{i}.attn{suffix}"] = page
    assert {name: spec.page_size_bytes for name, spec in specs.items()} == expected
    assert len(specs) == 43 * 3 + 20 * 2


def test_the_worked_figures(registry, default_config):
    """The figures of the docs' table, for the default bfloat16 and the fp8 caches."""
    plain = layer_specs_from_config(default_config, registry)
    packed = layer_specs_from_config(default_config, registry, ModelOptions(kv_cache_dtype="fp8"))
    csa, hca = "model.layers.3.attn", "model.layers.0.attn"
    assert (plain[csa].page_size_bytes, plain[hca].page_size_bytes) == (65536, 2048)
    assert (packed[csa].page_size_bytes, packed[hca].page_size_bytes) == (37440, 1728)  # 37376, 1168 padded
    assert packed[csa + ".swa_cache"].page_size_bytes == 37440
    assert packed[csa + ".indexer.k_cache"].page_size_bytes == 8640  # 64 x 132 = 8448, padded to 576
    assert plain[csa + ".indexer.k_cache"].page_size_bytes == 8704  # padded to 512
    assert packed_bytes(512, 64) == 584  # vLLM's state_content_bytes


def test_kinds_windows_and_retention(registry, default_config):
    specs = layer_specs_from_config(default_config, registry)
    layer = "model.layers.3.attn"
    assert specs[layer].kind == "compressed_mla" and specs[layer].compress_ratio == 4
    assert specs[layer + ".indexer.k_cache"].kind == "compressed_indexer"
    window = specs[layer + ".swa_cache"]
    assert (window.kind, window.sliding_window, window.block_size) == ("sliding_window_mla", 128, 64)
    assert specs[layer + ".compressor.state_cache"].sliding_window == 8  # coff 2 x ratio 4
    assert specs["model.layers.0.attn.compressor.state_cache"].sliding_window == 128  # coff 1 x 128
    # a latent and its indexer keep every entry: one retention kind with full attention's rule
    assert specs[layer].retention_key == specs[layer + ".indexer.k_cache"].retention_key
    # the window frees its pages: a 64k request holds 4 blocks of 64 (window 128 + 2048 new tokens)
    context = SizingContext(max_model_len=65536)
    assert window.max_num_blocks(context) == -(-(127 + 2048 + 63) // 64)
    assert specs[layer].max_num_blocks(context) == 65536 // 256


def test_legacy_compress_ratios_and_sliding_layers(registry):
    config = {
        "model_type": "deepseek_v4",
        "num_hidden_layers": 3,
        "compress_ratios": [0, 4, 128, 0],  # the MTP layer's ratio comes last and is not planned
    }
    specs = layer_specs_from_config(config, registry)
    assert [n for n in specs if n.startswith("model.layers.0.")] == ["model.layers.0.attn.swa_cache"]
    assert specs["model.layers.1.attn"].compress_ratio == 4
    assert specs["model.layers.2.attn"].compress_ratio == 128
    assert "model.layers.2.attn.indexer.k_cache" not in specs


def test_layer_types_and_compress_rates(registry):
    cfg = ConfigFields({"layer_types": [SWA, CSA, HCA], "compress_rates": {CSA: 4, HCA: 128}}, "deepseek_v4")
    assert layer_ratios(cfg, 3) == [0, 4, 128]
    assert layer_ratios(ConfigFields({}, "deepseek_v4"), 5) == [128, 128, 128, 4, 128]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (
            {"compress_ratios": [0, 8]},
            r"'compress_ratios' has 8 at layer 1; DeepSeek-V4 layers use 0, 4 or 128",
        ),
        ({"compress_ratios": [0]}, r"lists 1 ratios but 'num_hidden_layers' is 2"),
        ({"layer_types": [SWA, "full_attention"]}, r"has 'full_attention' at layer 1"),
        ({"layer_types": [SWA, CSA], "compress_rates": {CSA: 16}}, r"ratio 16; vLLM builds DeepSeek-V4"),
        ({"head_dim": 64, "qk_rope_head_dim": 128}, r"rotary part \(128\) exceeds head_dim 64"),
    ],
)
def test_bad_configs_are_refused_with_the_reason(registry, fields, match):
    config = {"model_type": "deepseek_v4", "num_hidden_layers": 2, **fields}
    with pytest.raises(ModelConfigError, match=match):
        layer_specs_from_config(config, registry)


def test_the_config_class_default_length(registry, default_config):
    config = {k: v for k, v in default_config.items() if k != "max_position_embeddings"}
    assert max_position_embeddings(config, registry) == 1_048_576


@pytest.mark.parametrize("policy", ["shared_buffer", "kind_pools", "unified_pool", "auto"])
def test_policies_that_plan_it(registry, default_config, policy):
    specs = layer_specs_from_config(default_config, registry)
    plan = plan_kv_cache(
        specs, 20 * 2**30, SizingContext(max_model_len=65536), registry=registry, policy=policy
    )
    assert {name for group in plan.groups for name in group.layer_names} == set(specs)


@pytest.mark.parametrize(("policy", "why"), [("uniform", "the same spec"), ("equal_groups", "one size")])
def test_policies_that_refuse_it(registry, default_config, policy, why):
    specs = layer_specs_from_config(default_config, registry)
    with pytest.raises(PolicyNotApplicableError, match=why):
        plan_kv_cache(specs, 20 * 2**30, SizingContext(max_model_len=65536), registry=registry, policy=policy)


def test_kvcore_plan_plans_deepseek_v4(run_cli, tmp_path):
    transformers.DeepseekV4Config().save_pretrained(tmp_path)
    status, out, err = run_cli("plan", "--model", tmp_path, "--memory", "80GiB", "--json")
    assert status == 0, err
    plan = json.loads(out)
    kinds = {group["kind"] for group in plan["groups"]}
    kinds |= {spec["kind"] for group in plan["groups"] for spec in (group.get("layer_specs") or {}).values()}
    assert kinds == {"compressed_mla", "compressed_indexer", "sliding_window_mla"}
    assert sum(len(group["layers"]) for group in plan["groups"]) == 169
    assert plan["efficiency"] > 0.9


def test_the_family_replaces_the_refusal(registry, default_config):
    assert registry.family_for(default_config).name == "deepseek_v4"


_TINY = {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "head_dim": 32,
    "q_lora_rank": 24,
    "o_lora_rank": 16,
    "o_groups": 2,
    "vocab_size": 100,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "layer_types": [SWA, CSA, HCA, CSA],
    "num_nextn_predict_layers": 0,
}


@pytest.mark.parametrize("fields", [_TINY, {}], ids=["tiny, every layer type", "the config class defaults"])
def test_parameter_count_equals_the_transformers_model(registry, tmp_path, fields):
    import torch

    from kvcore.planning.gpu_budget import count_parameters

    hf_config = transformers.DeepseekV4Config(**fields)
    with torch.device("meta"):
        model = transformers.DeepseekV4ForCausalLM(hf_config)
    count = count_parameters(saved(hf_config, tmp_path), registry)
    assert count.params == sum(p.numel() for p in model.parameters())
    assert bool(count.notes) == bool(hf_config.num_nextn_predict_layers)  # the MTP layer, named


def test_kvcore_plan_with_gpu_memory(run_cli, tmp_path):
    # the weights are counted, so --gpu-memory works: 284.3B parameters in bfloat16 need 530 GiB
    transformers.DeepseekV4Config().save_pretrained(tmp_path)
    status, out, err = run_cli("plan", "--model", tmp_path, "--gpu-memory", "141GiB", "--tp", "8", "--json")
    assert status == 0, err
    assert json.loads(out)["num_blocks"] > 0
