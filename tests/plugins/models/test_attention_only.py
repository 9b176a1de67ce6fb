"""The attention-only table reads every config exactly as the per-family modules it replaced.

``attention_only_before.json`` holds what the separate llama, mistral, qwen, phi3, gemma2,
gemma3 and gpt_oss modules answered (specs, or the error) before they became rows of one table,
for the bundled models of those families and for small configs that exercise each rule, with
default options and with ``tp=2``, fp8, a float32 state and block size 32.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvcore import KVCoreError, ModelOptions, layer_specs_from_config
from kvcore.frontends.hf_config import bundled_models
from kvcore.plugins.models.attention_only import FAMILIES
from kvcore.spec import describe_spec

BEFORE = json.loads((Path(__file__).parent / "attention_only_before.json").read_text(encoding="utf-8"))
OPTIONS = (ModelOptions(), ModelOptions(tp=2, kv_cache_dtype="fp8", state_dtype="float32", block_size=32))

BASE = {"num_hidden_layers": 6, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4}
MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "phi3",
    "gemma2",
    "gpt_oss",
    "gemma3_text",
    "gemma3",
)
#: Fields added to BASE, one config each: every pattern knob on, off, absent, null and bad.
VARIANTS = (
    {},
    {"head_dim": 64},
    {"sliding_window": 100},
    {"sliding_window": None},
    {"head_dim": 64, "sliding_window": 100},
    {"use_sliding_window": True},
    {"use_sliding_window": True, "sliding_window": 100, "max_window_layers": 2},
    {"use_sliding_window": True, "sliding_window": None},
    {"use_sliding_window": "yes"},
    {"layer_types": ["sliding_attention", "full_attention"] * 3, "sliding_window": 77, "head_dim": 32},
    {"layer_types": ["chunked_attention"] * 6, "attention_chunk_size": 50},
    {"layer_types": ["sliding_attention"] * 6},
    {"layer_types": ["mlp", "full_attention", "linear_attention", "full_attention", "moe", "full_attention"]},
    {"layer_types": ["full_attention"] * 5},
    {"num_key_value_heads": None},
    {"num_key_value_heads": 0},
    {"hidden_size": 4},
    {"dtype": "float16"},
    {"torch_dtype": "float32", "head_dim": 64},
    {"torch_dtype": 3},
    {"max_window_layers": -1, "use_sliding_window": True},
    {"sliding_window": 0, "head_dim": 64},
    {"kv_lora_rank": 512, "qk_rope_head_dim": 64},
    {"sliding_window_pattern": 3, "head_dim": 64, "sliding_window": 10},
    {"attention_chunk_size": 40, "head_dim": 64},
    {"attention_chunk_size": None, "head_dim": 64},
    {"num_hidden_layers": 0},
)


def configs():
    """``{case: config}``, named as in the fixture (without the options suffix)."""
    cases = {}
    for model_type in MODEL_TYPES:
        for extra in VARIANTS:
            cases[f"{model_type}:{json.dumps(extra, sort_keys=True)}"] = {
                **BASE,
                "model_type": model_type,
                **extra,
            }
        text = {**BASE, "model_type": model_type, "head_dim": 64, "layer_types": ["full_attention"] * 6}
        cases[f"{model_type}:nested"] = {"model_type": model_type, "text_config": text}
    claimed = {t for row in FAMILIES for t in row.model_types}
    for model in bundled_models():
        config = model.config()
        if config["model_type"] in claimed:
            cases[model.name] = config
    return cases


CONFIGS = configs()


def answer(config, registry, options):
    """What the fixture holds for one config: the specs in compact form, or the error."""
    try:
        specs = layer_specs_from_config(copy.deepcopy(config), registry, options)
    except KVCoreError as exc:
        return f"{type(exc).__name__}: {exc}"
    prefixes = {name.rsplit(".", 2)[0] for name in specs}
    described = [describe_spec(spec) for spec in specs.values()]
    distinct = list(dict.fromkeys(described))
    assert list(specs) == [f"{next(iter(prefixes))}.{i}.self_attn" for i in range(len(specs))]
    return {
        "layers": "".join(str(distinct.index(d)) for d in described),
        "prefix": prefixes.pop(),
        "specs": distinct,
    }


def test_the_fixture_covers_every_case():
    assert sorted(BEFORE) == sorted(f"{case}|{i}" for case in CONFIGS for i in range(len(OPTIONS)))


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_each_row_reads_as_before(registry, case):
    for index, options in enumerate(OPTIONS):
        assert answer(CONFIGS[case], registry, options) == BEFORE[f"{case}|{index}"], f"options {index}"


def test_rows_claim_distinct_model_types_and_every_row_is_registered(registry):
    claimed = [t for row in FAMILIES for t in row.model_types]
    assert len(claimed) == len(set(claimed))
    for row in FAMILIES:
        for model_type in row.model_types:
            assert registry.model_families[model_type].name == row.name


def test_a_cohere2_sliding_layer_caches_its_window_and_the_current_token(registry):
    # vLLM 0.32 commandr.py:237-244: a Cohere 2 sliding layer sees [pos - W, pos], W + 1 tokens
    types = ["sliding_attention"] * 3 + ["full_attention"]
    for model_type in ("cohere2", "cohere2_moe"):
        config = {
            **BASE,
            "num_hidden_layers": 4,
            "model_type": model_type,
            "sliding_window": 64,
            "layer_types": types,
        }
        specs = list(layer_specs_from_config(config, registry, ModelOptions()).values())
        assert [s.kind for s in specs] == ["sliding_window"] * 3 + ["full_attention"]
        assert {s.sliding_window for s in specs[:3]} == {65}
        # without layer_types: Cohere2Config's default pattern, three sliding to one full
        del config["layer_types"]
        config["num_hidden_layers"] = 8
        specs = list(layer_specs_from_config(config, registry, ModelOptions()).values())
        assert [s.kind == "full_attention" for s in specs] == [False, False, False, True] * 2


@pytest.mark.parametrize(
    "model_type",
    [
        "cohere",
        "gemma",
        "granite",
        "granitemoe",
        "granitemoeshared",
        "glm4",
        "ernie4_5",
        "ernie4_5_moe",
        "apertus",
        "olmoe",
        "stablelm",
        "nemotron",
        "hyperclovax",
    ],
)
def test_llama_like_rows_cache_every_layer_in_full(registry, model_type):
    config = {**BASE, "model_type": model_type, "head_dim": 32, "sliding_window": 100}
    specs = list(layer_specs_from_config(config, registry, ModelOptions()).values())
    assert [(s.kind, s.num_kv_heads, s.head_size) for s in specs] == [("full_attention", 4, 32)] * 6


@pytest.mark.parametrize("model_type", ["mixtral", "ministral3"])
def test_mixtral_and_ministral3_slide_every_layer_when_a_window_is_set(registry, model_type):
    config = {**BASE, "model_type": model_type, "head_dim": 32}
    specs = list(layer_specs_from_config(config, registry, ModelOptions()).values())
    assert {s.kind for s in specs} == {"full_attention"}  # the classes default the window to null
    specs = list(
        layer_specs_from_config({**config, "sliding_window": 100}, registry, ModelOptions()).values()
    )
    assert [(s.kind, s.sliding_window) for s in specs] == [("sliding_window", 100)] * 6
