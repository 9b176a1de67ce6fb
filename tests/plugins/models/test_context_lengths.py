"""Every model's length from its config: the field the config states, else the default of its
transformers config class (each family's ``config_defaults``), against the context lengths the
models were published with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcore import ModelFamily
from kvcore.errors import PluginValidationError
from kvcore.frontends.hf_config import (
    LENGTH_KEYS,
    ModelLength,
    bundled_models,
    max_position_embeddings,
    model_length,
    read_config_file,
    text_config,
)
from tests.zoo import NEMOTRON_H_LIKE, QWEN3_NEXT_LIKE, bundled, synthetic

#: Configs of the shared model zoo that differ from the bundled ones (README.md there).
SHARED_ZOO = Path(__file__).parent / "shared_zoo"

#: The longest context each model was published with, from its Hugging Face model card (and
#: its config.json where the card states none).
PUBLISHED = {
    # card: "32,768 natively"; the config's 40,960 leaves room for 32,768 output tokens after
    # an 8,192-token prompt (huggingface.co/Qwen/Qwen3-8B), and engines read the config
    "Qwen/Qwen3-8B": 40_960,
    "ai21labs/AI21-Jamba-1.5-Mini": 262_144,  # card: 256K context window
    # card: 128K in evaluation; config.json states 163,840, which vLLM serves
    "deepseek-ai/DeepSeek-V3": 163_840,
    # config.json states 163,840 (as V3's), which vLLM serves
    "deepseek-ai/DeepSeek-V3.2": 163_840,
    "google/gemma-2-9b-it": 8_192,  # card: context length of 8192 tokens
    "google/gemma-3-27b-it": 131_072,  # card: 128K tokens; the config omits the field
    "meta-llama/Llama-3.1-8B": 131_072,  # card: 128k
    "meta-llama/Llama-3.2-11B-Vision-Instruct": 131_072,  # card: 128k
    "meta-llama/Llama-3.2-1B": 131_072,  # card: 128k
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": 10_485_760,  # card: 10M
    "meta-llama/Meta-Llama-3-8B-Instruct": 8_192,  # card: 8k
    "microsoft/Phi-3-mini-4k-instruct": 4_096,  # card: 4K tokens
    "mistralai/Mistral-7B-v0.1": 32_768,  # config.json (the card states none)
    "openai/gpt-oss-20b": 131_072,  # card: 128k context
    "openai/whisper-large-v3": 448,  # the decoder's max_target_positions
}


def test_every_bundled_model_is_in_the_table():
    assert {m.name for m in bundled_models()} == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_bundled_models_have_their_published_length(registry, name):
    assert max_position_embeddings(bundled(name), registry) == PUBLISHED[name]


@pytest.mark.parametrize("path", sorted(SHARED_ZOO.glob("*.json")), ids=lambda p: p.stem)
def test_shared_zoo_configs_have_their_published_length(registry, path):
    name = path.stem.replace("__", "/", 1)
    assert max_position_embeddings(read_config_file(path), registry) == PUBLISHED[name]


def test_gemma_3_27b_takes_its_config_class_default(registry):
    config = bundled("google/gemma-3-27b-it")
    assert not any(key in text_config(config) or key in config for key in LENGTH_KEYS)
    assert model_length(config, registry) == ModelLength(
        value=131_072, key="max_position_embeddings", default=True
    )
    # without the families' defaults nothing states it
    assert model_length(config) is None


def test_a_stated_length_wins_over_the_default(registry):
    config = bundled("google/gemma-3-27b-it")
    config["text_config"]["max_position_embeddings"] = 32_768
    assert model_length(config, registry) == ModelLength(value=32_768, key="max_position_embeddings")


def _omitting_the_length(config):
    for part in (config, text_config(config)):
        for key in LENGTH_KEYS:
            part.pop(key, None)
    return config


def _every_config():
    yield from ((m.name, m.config()) for m in bundled_models())
    yield from ((p.name, synthetic(p)) for p in (NEMOTRON_H_LIKE, QWEN3_NEXT_LIKE))


@pytest.mark.parametrize(
    ("name", "config"), list(_every_config()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_family_defaults_as_transformers_does(registry, name, config):
    """With the length deleted, each family answers its transformers config class's default."""
    transformers = pytest.importorskip("transformers")
    model_type = config["model_type"]
    expected_config = transformers.AutoConfig.for_model(model_type)
    expected_config = getattr(expected_config, "text_config", None) or expected_config
    expected = next(
        getattr(expected_config, key) for key in LENGTH_KEYS if getattr(expected_config, key, None)
    )
    length = model_length(_omitting_the_length(config), registry)
    assert length is not None and length.default, name
    assert length.value == expected, f"{name} ({model_type}): {length.value} != transformers' {expected}"


def test_every_family_of_a_model_type_gives_a_default(registry):
    for model_type, family in registry.model_families.items():
        assert family.defaults_for(model_type), f"family {family.name} gives no default for {model_type}"


def test_config_defaults_are_checked():
    def specs(config, options):
        return {}

    with pytest.raises(PluginValidationError, match="map model types"):
        ModelFamily(
            name="a", model_types=("a",), layer_specs=specs, config_defaults={"max_position_embeddings": 5}
        )
    with pytest.raises(PluginValidationError, match="does not claim"):
        ModelFamily(name="a", model_types=("a",), layer_specs=specs, config_defaults={"b": {"x": 1}})
    family = ModelFamily(name="a", model_types=("a",), layer_specs=specs, config_defaults={"a": {"x": 1}})
    assert family.defaults_for("a") == {"x": 1} and family.defaults_for("b") == {} and hash(family)


def test_plan_auto_is_capped_by_the_default(run_cli):
    status, out, err = run_cli(
        "plan",
        "--model",
        "google/gemma-3-27b-it",
        "--gpu-memory",
        "80GiB",
        "--max-model-len",
        "auto",
        "--json",
    )
    assert status == 0, err
    data = json.loads(out)
    assert data["max_model_len"] == 131_072
    assert data["max_model_len_auto"]["limited_by"] == "cap" and data["max_model_len_auto"]["cap"] == 131_072
    assert "config class's default" in data["max_model_len_auto"]["cap_name"]


def test_plan_defaults_the_length_to_the_default(run_cli):
    status, out, err = run_cli("plan", "--model", "google/gemma-3-27b-it", "--gpu-memory", "80GiB")
    assert status == 0, err
    assert "max_model_len 131,072" in out


def test_models_listing_shows_the_default(run_cli):
    status, out, err = run_cli("models", "--json")
    assert status == 0, err
    rows = {row["name"]: row for row in json.loads(out)["models"]}
    assert rows["google/gemma-3-27b-it"]["max_position_embeddings"] == 131_072
