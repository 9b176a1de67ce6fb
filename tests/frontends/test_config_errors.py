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


BAD = [
    pytest.param(
        without(LLAMA, "num_hidden_layers"),
        ModelConfigError,
        "'num_hidden_layers' is missing",
        id="missing layer count",
    ),
    pytest.param(
        {**LLAMA, "num_attention_heads": 0},
        ModelConfigError,
        "'num_attention_heads' must be an int >= 1 (got 0)",
        id="zero heads",
    ),
    pytest.param(
        {**LLAMA, "num_key_value_heads": -2},
        ModelConfigError,
        "'num_key_value_heads' must be an int >= 1 (got -2)",
        id="negative KV heads",
    ),
    pytest.param(
        {**LLAMA, "head_dim": "128"},
        ModelConfigError,
        "'head_dim' must be an int >= 1 (got '128', a str)",
        id="head_dim as text",
    ),
    pytest.param(
        {**LLAMA, "num_hidden_layers": True},
        ModelConfigError,
        "'num_hidden_layers' must be an int",
        id="bool layer count",
    ),
    pytest.param(
        {**LLAMA, "hidden_size": 3},
        ModelConfigError,
        "gives a head size of 0; set 'head_dim'",
        id="head size 0",
    ),
    pytest.param(
        {**LLAMA, "model_type": "banana"},
        UnknownModelError,
        ("model type 'banana'", "add-a-model-family"),
        id="unknown model type",
    ),
    pytest.param(without(LLAMA, "model_type"), UnknownModelError, "without 'model_type'", id="no model type"),
    pytest.param(
        {**LLAMA, "layer_types": ["full_attention", "banana"]},
        ModelConfigError,
        "'layer_types[1]' is 'banana'",
        id="unknown layer type",
    ),
    pytest.param(
        {**LLAMA, "layer_types": ["full_attention"]},
        ModelConfigError,
        "'layer_types' lists 1 layers but 'num_hidden_layers' is 2",
        id="layer_types too short",
    ),
    pytest.param(
        {**LLAMA, "layer_types": "full_attention"},
        ModelConfigError,
        "'layer_types' must be a list of strings",
        id="layer_types not a list",
    ),
    pytest.param(
        {**LLAMA, "layer_types": ["sliding_attention"] * 2},
        ModelConfigError,
        "'sliding_window' is missing",
        id="sliding without a window",
    ),
    pytest.param(
        {**LLAMA, "model_type": "mistral", "sliding_window": 0},
        ModelConfigError,
        "'sliding_window' must be an int >= 1 (got 0)",
        id="zero window",
    ),
    pytest.param(
        {**LLAMA, "model_type": "x", "layer_types": ["full_attention", "linear_attention"]},
        ModelConfigError,
        ("'linear_attention'", "need a family plugin"),
        id="state layer in an unknown model",
    ),
    pytest.param(
        {**LLAMA, "torch_dtype": "int4"},
        ModelConfigError,
        "'torch_dtype' is not a cache dtype",
        id="bad dtype",
    ),
    pytest.param(
        {"model_type": "gemma3"},
        ModelConfigError,
        "gemma3 config: 'text_config' is missing",
        id="gemma3 without text_config",
    ),
    pytest.param(
        gemma3(num_key_value_heads=0),
        ModelConfigError,
        "'text_config.num_key_value_heads' must be an int >= 1 (got 0)",
        id="gemma3 zero KV heads",
    ),
    pytest.param(
        {**LLAMA, "model_type": "gemma2", "sliding_window": 8},
        ModelConfigError,
        "gemma2 config: 'head_dim' is missing",
        id="gemma2 without head_dim",
    ),
    pytest.param(
        without(bundled("deepseek-ai/DeepSeek-V3"), "kv_lora_rank"),
        ModelConfigError,
        "deepseek_v3 config: 'kv_lora_rank' is missing",
        id="deepseek without rank",
    ),
    pytest.param(
        {**bundled("ai21labs/AI21-Jamba-1.5-Mini"), "mamba_d_conv": 1},
        ModelConfigError,
        "'mamba_d_conv' must be an int >= 2 (got 1)",
        id="jamba conv kernel 1",
    ),
    pytest.param(
        {**bundled("ai21labs/AI21-Jamba-1.5-Mini"), "attn_layer_offset": 8},
        ModelConfigError,
        "'attn_layer_offset' (8) must be smaller",
        id="jamba offset >= period",
    ),
    pytest.param(
        {**synthetic(NEMOTRON_H_LIKE), "hybrid_override_pattern": "M*X"},
        ModelConfigError,
        "'hybrid_override_pattern[2]' is 'X'",
        id="nemotron bad pattern",
    ),
    pytest.param(
        {**synthetic(NEMOTRON_H_LIKE), "num_hidden_layers": 3},
        ModelConfigError,
        "spells 118 layers but 'num_hidden_layers' is 3",
        id="nemotron count mismatch",
    ),
    pytest.param(
        without(synthetic(NEMOTRON_H_LIKE), "hybrid_override_pattern"),
        ModelConfigError,
        "'hybrid_override_pattern' is missing",
        id="nemotron no pattern",
    ),
    pytest.param(
        without(synthetic(QWEN3_NEXT_LIKE), "linear_num_value_heads"),
        ModelConfigError,
        "'linear_num_value_heads' is missing",
        id="qwen3_next missing heads",
    ),
    pytest.param(
        {**LLAMA, "layer_types": ["mlp", "mlp"]},
        ModelConfigError,
        "no layer holds a KV cache",
        id="no cache layers",
    ),
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
