"""Every bundled config, layer by layer, against numbers worked out by hand.

Arithmetic used below (bf16 = 2 bytes per element, block 16):
- attention bytes per token and layer = 2 (K and V) x KV heads x head size x 2 bytes;
- MLA bytes per token and layer = (kv_lora_rank + qk_rope_head_dim) x 2 bytes;
- a page = 16 tokens x bytes per token; a state page = the state's bytes (aligned).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from kvcore import ModelOptions, layer_specs_from_config
from kvcore.frontends.hf_config import bundled_models
from kvcore.plugins.state import StatePart
from tests.zoo import bundled


class Expected(NamedTuple):
    """What a bundled config must give.

    kinds: kind label -> layer indices (labels as ``kind`` or ``kind(window or chunk)``).
    kv_heads, head_size: of every attention layer (``None`` for MLA-only models).
    bytes_per_token: of one attention (or MLA) layer.
    names: the module name pattern (with ``{i}``) of every layer, or kind -> pattern.
    dtype: of every attention (or MLA) layer.
    """

    kinds: dict[str, list[int]]
    kv_heads: int | None
    head_size: int | None
    bytes_per_token: int
    names: str | dict[str, str] = "model.layers.{i}.self_attn"
    dtype: str = "bfloat16"


def every(n, *, but=()):
    return [i for i in range(n) if i not in set(but)]


def split(n, kind, indices, rest):
    """``kind`` at ``indices`` of ``n`` layers, ``rest`` at every other layer."""
    return {kind: list(indices), rest: every(n, but=indices)}


LANGUAGE_MODEL = "model.language_model.layers.{i}.self_attn"

EXPECTED = {
    # 32 layers; attention iff i % 8 == 4 -> 4, 12, 20, 28; heads 4096 // 32 = 128; 2*8*128*2 = 4096
    "ai21labs/AI21-Jamba-1.5-Mini": Expected(
        split(32, "full_attention", [4, 12, 20, 28], "state"),
        8,
        128,
        4096,
        names={"full_attention": "model.layers.{i}.self_attn", "state": "model.layers.{i}.mamba"},
    ),
    # 61 MLA layers, latent 512 + 64 = 576 -> 576 * 2 = 1152 bytes per token
    "deepseek-ai/DeepSeek-V3": Expected({"mla": every(61)}, None, None, 1152),
    # 42 layers; sliding iff (i + 1) % 2 -> even layers; head_dim 256; 2*8*256*2 = 8192
    "google/gemma-2-9b-it": Expected(
        split(42, "sliding_window(4096)", range(0, 42, 2), "full_attention"), 8, 256, 8192
    ),
    # 62 layers; full iff (i + 1) % 6 == 0 -> 5, 11, ..., 59 (10); head_dim 128; 2*16*128*2 = 8192
    "google/gemma-3-27b-it": Expected(
        split(62, "full_attention", range(5, 62, 6), "sliding_window(1024)"), 16, 128, 8192, LANGUAGE_MODEL
    ),
    # 32 full layers; 4096 // 32 = 128; 2*8*128*2 = 4096
    "meta-llama/Llama-3.1-8B": Expected({"full_attention": every(32)}, 8, 128, 4096),
    # 16 full layers; head_dim 64; 2*8*64*2 = 2048
    "meta-llama/Llama-3.2-1B": Expected({"full_attention": every(16)}, 8, 64, 2048),
    # 48 layers; NoPE (full) iff (i + 1) % 4 == 0 -> 3, 7, ..., 47 (12); 36 chunked(8192); 2*8*128*2
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": Expected(
        split(48, "full_attention", range(3, 48, 4), "chunked_local_attention(8192)"),
        8,
        128,
        4096,
        names="language_model.model.layers.{i}.self_attn",
    ),
    "meta-llama/Meta-Llama-3-8B-Instruct": Expected({"full_attention": every(32)}, 8, 128, 4096),
    # 32 layers all sliding(2047); MHA 32 heads of 3072 // 32 = 96; 2*32*96*2 = 12288
    "microsoft/Phi-3-mini-4k-instruct": Expected({"sliding_window(2047)": every(32)}, 32, 96, 12288),
    # 32 layers all sliding(4096); 4096 // 32 = 128; 2*8*128*2 = 4096
    "mistralai/Mistral-7B-v0.1": Expected({"sliding_window(4096)": every(32)}, 8, 128, 4096),
    # explicit layer_types: sliding at even layers (12), full at odd (12); head_dim 64; 2*8*64*2 = 2048
    "openai/gpt-oss-20b": Expected(
        split(24, "sliding_window(128)", range(0, 24, 2), "full_attention"), 8, 64, 2048
    ),
    # 40 layers; cross attention at text_config.cross_attention_layers 3, 8, ..., 38 (8) over
    # 4 tiles x ((560 // 14)^2 + 1) = 6404 image tokens, full attention elsewhere (32);
    # 4096 // 32 = 128; 2*8*128*2 = 4096
    "meta-llama/Llama-3.2-11B-Vision-Instruct": Expected(
        split(40, "cross_attention(6404)", range(3, 40, 5), "full_attention"),
        8,
        128,
        4096,
        names={
            "full_attention": LANGUAGE_MODEL,
            "cross_attention(6404)": "model.language_model.layers.{i}.cross_attn",
        },
    ),
    # 32 decoder layers, each self attention (full) and cross attention over 1500 audio frames;
    # MHA 20 heads of 1280 // 20 = 64; float16: 2*20*64*2 = 5120
    "openai/whisper-large-v3": Expected(
        {"full_attention": every(32), "cross_attention(1500)": every(32)},
        20,
        64,
        5120,
        dtype="float16",
        names={
            "full_attention": "model.decoder.layers.{i}.self_attn",
            "cross_attention(1500)": "model.decoder.layers.{i}.encoder_attn",
        },
    ),
    # 36 full layers (use_sliding_window false); head_dim 128; 2*8*128*2 = 4096
    "Qwen/Qwen3-8B": Expected({"full_attention": every(36)}, 8, 128, 4096),
}


def label(spec):
    for field in ("sliding_window", "attention_chunk_size", "max_encoder_tokens"):
        if hasattr(spec, field):
            return f"{spec.kind}({getattr(spec, field)})"
    return spec.kind


#: Bundled models whose layers the table above cannot state (two specs a layer): tested below.
OWN_TESTS = {"deepseek-ai/DeepSeek-V3.2"}


def test_every_bundled_model_has_expectations():
    assert [m.name for m in bundled_models()] == sorted({*EXPECTED, *OWN_TESTS}, key=str.lower)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_bundled_model_layer_by_layer(registry, name):
    expected = EXPECTED[name]
    specs = layer_specs_from_config(bundled(name), registry)
    names = expected.names
    want = {
        (names if isinstance(names, str) else names[kind]).format(i=i): kind
        for kind, indices in expected.kinds.items()
        for i in indices
    }
    # names, model order and kinds (with windows / chunks)
    order = sorted(want, key=lambda n: int(n.split(".")[-2]))
    assert list(specs) == order
    assert {n: label(s) for n, s in specs.items()} == want
    for spec in specs.values():
        assert spec.block_size == 16
        if spec.kind == "state":
            continue
        assert str(spec.dtype) == expected.dtype
        assert spec.page_size_bytes == 16 * expected.bytes_per_token
        if expected.kv_heads is not None:
            assert (spec.num_kv_heads, spec.head_size) == (expected.kv_heads, expected.head_size)
            assert spec.bytes_per_token == expected.bytes_per_token


def test_gemma_3_27b(registry):
    specs = layer_specs_from_config(bundled("google/gemma-3-27b-it"), registry)
    full = [int(n.split(".")[-2]) for n, s in specs.items() if s.kind == "full_attention"]
    sliding = [s for s in specs.values() if s.kind == "sliding_window"]
    assert len(specs) == 62
    assert full == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert len(sliding) == 52 and {s.sliding_window for s in sliding} == {1024}
    assert {(s.num_kv_heads, s.head_size) for s in specs.values()} == {(16, 128)}


def test_gpt_oss_20b(registry):
    specs = list(layer_specs_from_config(bundled("openai/gpt-oss-20b"), registry).values())
    assert [s.kind for s in specs] == ["sliding_window", "full_attention"] * 12
    assert {s.sliding_window for s in specs if s.kind == "sliding_window"} == {128}
    assert {(s.num_kv_heads, s.head_size) for s in specs} == {(8, 64)}


def test_llama_4_scout(registry):
    specs = list(
        layer_specs_from_config(bundled("meta-llama/Llama-4-Scout-17B-16E-Instruct"), registry).values()
    )
    assert len(specs) == 48
    assert sum(s.kind == "full_attention" for s in specs) == 12
    chunked = [s for s in specs if s.kind == "chunked_local_attention"]
    assert len(chunked) == 36 and {s.attention_chunk_size for s in chunked} == {8192}
    assert {(s.num_kv_heads, s.head_size) for s in specs} == {(8, 128)}


def test_deepseek_v3(registry):
    specs = list(layer_specs_from_config(bundled("deepseek-ai/DeepSeek-V3"), registry).values())
    assert len(specs) == 61
    assert {(s.kind, s.kv_lora_rank, s.qk_rope_head_dim, s.latent_size) for s in specs} == {
        ("mla", 512, 64, 576)
    }


def test_deepseek_v32_caches_a_latent_and_an_indexer_key_on_every_layer(registry):
    config = bundled("deepseek-ai/DeepSeek-V3.2")
    specs = layer_specs_from_config(config, registry)
    # 61 layers, each its MLA latent then its indexer's keys, named as vLLM names them
    assert list(specs) == [
        name
        for i in range(61)
        for name in (f"model.layers.{i}.self_attn", f"model.layers.{i}.self_attn.indexer")
    ]
    latents = {s for n, s in specs.items() if not n.endswith(".indexer")}
    keys = {s for n, s in specs.items() if n.endswith(".indexer")}
    assert {(s.kind, s.latent_size, s.bytes_per_token, str(s.dtype)) for s in latents} == {
        ("mla", 576, 576 * 2, "bfloat16")
    }
    # index_head_dim 128 fp8 + 128 / 128 float32 scales = 132 bytes
    assert {(s.kind, s.index_head_dim, s.bytes_per_token, str(s.dtype)) for s in keys} == {
        ("dsa_indexer", 128, 132, "float8_e4m3fn")
    }
    # an fp8 cache packs the latent as the sparse kernels read it: 512 + 4 x 4 + 64 x 2 = 656
    fp8 = layer_specs_from_config(config, registry, ModelOptions(kv_cache_dtype="fp8", block_size=64))
    assert {s.page_size_bytes for n, s in fp8.items() if not n.endswith(".indexer")} == {64 * 656}
    assert {s.page_size_bytes for n, s in fp8.items() if n.endswith(".indexer")} == {64 * 132}


@pytest.mark.parametrize(
    ("fields", "with_indexer"),
    [
        ({"index_topk_freq": 2}, [True, True, False, True, False, True]),  # offset 2: layer 1 first
        ({"index_topk_freq": 3, "index_skip_topk_offset": 1}, [True, False, False, True, False, False]),
        ({"index_topk_pattern": "FSSFFS"}, [True, False, False, True, True, False]),
    ],
)
def test_dsa_layers_that_share_a_top_k_hold_no_indexer(registry, fields, with_indexer):
    """vLLM's rule (deepseek_v2.py:1144-1168): a layer that reuses the previous top-k builds no
    indexer, so it caches no keys."""
    config = {**bundled("deepseek-ai/DeepSeek-V3.2"), "num_hidden_layers": 6, **fields}
    specs = layer_specs_from_config(config, registry)
    assert [f"model.layers.{i}.self_attn.indexer" in specs for i in range(6)] == with_indexer


def test_jamba_1_5_mini(registry):
    specs = list(layer_specs_from_config(bundled("ai21labs/AI21-Jamba-1.5-Mini"), registry).values())
    assert sum(s.kind == "full_attention" for s in specs) == 4
    states = [s for s in specs if s.kind == "state"]
    assert len(states) == 28
    # d_inner = mamba_expand * hidden_size = 2 * 4096; conv keeps mamba_d_conv - 1 = 3 inputs
    assert set(states) == {
        states[0].__class__(
            block_size=16,
            parts=(
                StatePart(name="conv", shape=(3, 8192), dtype="bfloat16"),
                StatePart(name="ssm", shape=(8192, 16), dtype="bfloat16"),
            ),
        )
    }
    # 3 * 8192 * 2 + 8192 * 16 * 2 = 49,152 + 262,144
    assert states[0].page_size_bytes == 311_296
