"""Bad configs give one-line errors naming the field; fuzzed configs give only KVCoreError."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, strategies as st

from kvcore import (
    KVCoreError,
    ModelConfigError,
    ModelOptions,
    Registry,
    UnknownModelError,
    layer_specs_from_config,
)
from kvcore.errors import InvalidInputError
from kvcore.frontends.hf_config import bundled_models
from kvcore.spec import KVCacheSpec
from tests.zoo import NEMOTRON_H_LIKE, QWEN3_NEXT_LIKE, bundled, synthetic

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def without(config, key):
    return {k: v for k, v in config.items() if k != key}


def gemma3(**text):
    base = bundled("google/gemma-3-27b-it")
    base["text_config"].update(text)
    return base


F = "full_attention"
JAMBA = bundled("ai21labs/AI21-Jamba-1.5-Mini")


#: test id -> (config, what its ModelConfigError says: a fragment or a tuple of fragments)
CONFIG_ERRORS = {
    "missing layer count": (without(LLAMA, "num_hidden_layers"), "'num_hidden_layers' is missing"),
    "zero heads": ({**LLAMA, "num_attention_heads": 0}, "'num_attention_heads' must be an int >= 1 (got 0)"),
    "negative KV heads": (
        {**LLAMA, "num_key_value_heads": -2},
        "'num_key_value_heads' must be an int >= 1 (got -2)",
    ),
    "head_dim as text": ({**LLAMA, "head_dim": "128"}, "'head_dim' must be an int >= 1 (got '128', a str)"),
    "bool layer count": ({**LLAMA, "num_hidden_layers": True}, "'num_hidden_layers' must be an int"),
    "head size 0": ({**LLAMA, "hidden_size": 3}, "gives a head size of 0; set 'head_dim'"),
    "unknown layer type": ({**LLAMA, "layer_types": [F, "banana"]}, "'layer_types[1]' is 'banana'"),
    "layer_types too short": (
        {**LLAMA, "layer_types": [F]},
        "'layer_types' lists 1 layers but 'num_hidden_layers' is 2",
    ),
    "layer_types not a list": ({**LLAMA, "layer_types": F}, "'layer_types' must be a list of strings"),
    "sliding without a window": (
        {**LLAMA, "layer_types": ["sliding_attention"] * 2},
        "'sliding_window' is missing",
    ),
    "zero window": (
        {**LLAMA, "model_type": "mistral", "sliding_window": 0},
        "'sliding_window' must be an int >= 1 (got 0)",
    ),
    "state layer in an unknown model": (
        {**LLAMA, "model_type": "x", "layer_types": [F, "linear_attention"]},
        ("'linear_attention'", "need a family plugin"),
    ),
    "bad dtype": ({**LLAMA, "torch_dtype": "int4"}, "'torch_dtype' is not a cache dtype"),
    "gemma3 without text_config": ({"model_type": "gemma3"}, "gemma3 config: 'text_config' is missing"),
    "gemma3 zero KV heads": (
        gemma3(num_key_value_heads=0),
        "'text_config.num_key_value_heads' must be an int >= 1 (got 0)",
    ),
    "gemma2 without head_dim": (
        {**LLAMA, "model_type": "gemma2", "sliding_window": 8},
        "gemma2 config: 'head_dim' is missing",
    ),
    "deepseek without rank": (
        without(bundled("deepseek-ai/DeepSeek-V3"), "kv_lora_rank"),
        "deepseek_v3 config: 'kv_lora_rank' is missing",
    ),
    "jamba conv kernel 1": ({**JAMBA, "mamba_d_conv": 1}, "'mamba_d_conv' must be an int >= 2 (got 1)"),
    "jamba offset >= period": ({**JAMBA, "attn_layer_offset": 8}, "'attn_layer_offset' (8) must be smaller"),
    "nemotron bad pattern": (
        {**synthetic(NEMOTRON_H_LIKE), "hybrid_override_pattern": "M*X"},
        "'hybrid_override_pattern[2]' is 'X'",
    ),
    "nemotron count mismatch": (
        {**synthetic(NEMOTRON_H_LIKE), "num_hidden_layers": 3},
        "spells 118 layers but 'num_hidden_layers' is 3",
    ),
    "nemotron no pattern": (
        without(synthetic(NEMOTRON_H_LIKE), "hybrid_override_pattern"),
        "'hybrid_override_pattern' is missing",
    ),
    "qwen3_next missing heads": (
        without(synthetic(QWEN3_NEXT_LIKE), "linear_num_value_heads"),
        "'linear_num_value_heads' is missing",
    ),
    "no cache layers": ({**LLAMA, "layer_types": ["mlp", "mlp"]}, "no layer holds a KV cache"),
}

#: test id -> (config, what its UnknownModelError says)
UNKNOWN_MODELS = {
    "unknown model type": ({**LLAMA, "model_type": "banana"}, ("model type 'banana'", "add-a-model-family")),
    "no model type": (without(LLAMA, "model_type"), "without 'model_type'"),
}

BAD = [
    pytest.param(config, error, match, id=name)
    for error, table in ((ModelConfigError, CONFIG_ERRORS), (UnknownModelError, UNKNOWN_MODELS))
    for name, (config, match) in table.items()
]


@pytest.mark.parametrize(("config", "error", "match"), BAD)
def test_bad_configs(registry, config, error, match):
    with pytest.raises(error) as info:
        layer_specs_from_config(config, registry)
    message = str(info.value)
    for fragment in (match,) if isinstance(match, str) else match:
        assert fragment in message
    assert "\n" not in message


def test_json_that_is_not_an_object(registry):
    with pytest.raises(ModelConfigError, match="must be a JSON object"):
        layer_specs_from_config(["llama"], registry)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "tp", "match"),
    [
        (
            bundled("ai21labs/AI21-Jamba-1.5-Mini"),
            3,
            "'mamba_expand \\* hidden_size' is 8192, which tp=3 does not divide",
        ),
        (synthetic(NEMOTRON_H_LIKE), 3, "'mamba_num_heads' is 256, which tp=3 does not divide"),
        (synthetic(QWEN3_NEXT_LIKE), 64, "'linear_num_key_heads' is 16, which tp=64 does not divide"),
    ],
)
def test_tp_that_does_not_divide_a_state(registry, config, tp, match):
    with pytest.raises(ModelConfigError, match=match):
        layer_specs_from_config(config, registry, ModelOptions(tp=tp))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tp": 0}, "'tp' must be an int >= 1"),
        ({"block_size": 2.5}, "'block_size' must be an int >= 1"),
        ({"kv_cache_dtype": "int4"}, "or 'auto'"),
        ({"state_dtype": "banana"}, "or 'auto'"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        ModelOptions(**kwargs)


def test_unknown_option_key():
    with pytest.raises(InvalidInputError, match="unknown model options \\['pp'\\]; known options: "):
        ModelOptions.from_mapping({"pp": 2})


# -- fuzzing -------------------------------------------------------------------------------

SOURCES = [m.config() for m in bundled_models()] + [synthetic(NEMOTRON_H_LIKE), synthetic(QWEN3_NEXT_LIKE)]

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 70000)
    | st.floats(allow_nan=True)
    | st.sampled_from(["", "bfloat16", "fp8", "banana", "full_attention", "linear_attention", "M*-E"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated_configs(draw):
    """A bundled (or synthetic) config with a few keys deleted or replaced, here or in text_config."""
    config = copy.deepcopy(draw(st.sampled_from(SOURCES)))
    for _ in range(draw(st.integers(1, 4))):
        part = config
        if isinstance(config.get("text_config"), dict) and draw(st.booleans()):
            part = config["text_config"]
        keys = sorted(part)
        key = draw(st.sampled_from(keys)) if keys and draw(st.integers(0, 4)) else draw(st.text(max_size=8))
        if draw(st.booleans()):
            part.pop(key, None)
        else:
            part[key] = draw(_values)
    return config


@pytest.fixture(scope="module")
def fuzz_registry():
    return Registry.default(autoload=False)


@given(
    config=mutated_configs(),
    tp=st.integers(1, 8),
    dtype=st.sampled_from(["auto", "fp8", "float16"]),
)
def test_mutated_configs_raise_only_kvcore_errors(fuzz_registry, config, tp, dtype):
    try:
        specs = layer_specs_from_config(config, fuzz_registry, ModelOptions(tp=tp, kv_cache_dtype=dtype))
    except KVCoreError as exc:
        assert "\n" not in str(exc)
    else:
        assert specs and all(isinstance(s, KVCacheSpec) and s.page_size_bytes > 0 for s in specs.values())
