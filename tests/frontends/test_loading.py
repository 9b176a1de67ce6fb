"""Reading configs (files, folders, bundled names) the way transformers reads JSON."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from importlib import resources

import pytest

from kvcore import ModelConfigError, UnknownModelError, model_layer_specs
from kvcore.errors import InvalidInputError
from kvcore.frontends.hf_config import (
    bundled_models,
    find_bundled_model,
    load_model_config,
    max_position_embeddings,
    read_config_file,
)


def test_bare_infinity_and_nan_are_read(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "nemotron_h", "time_step_limit": [0.0, Infinity], "x": NaN}')
    config = read_config_file(path)
    assert config["time_step_limit"] == [0.0, math.inf]
    assert math.isnan(config["x"])


def test_tagged_floats_are_decoded(tmp_path):
    # transformers >= 5 writes non-finite floats as {"__float__": "Infinity"}
    path = tmp_path / "config.json"
    data = {"a": {"__float__": "-Infinity"}, "b": [{"__float__": "Infinity"}], "c": {"__float__": "x"}}
    path.write_text(json.dumps(data))
    config = read_config_file(path)
    assert config["a"] == -math.inf and config["b"] == [math.inf]
    assert config["c"] == {"__float__": "x"}  # not a tag transformers knows: left alone


def test_a_folder_holding_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert read_config_file(tmp_path) == {"model_type": "llama"}
    with pytest.raises(InvalidInputError, match=r"holds no config\.json"):
        read_config_file(tmp_path / "..")


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        ("[1, 2]", ModelConfigError, "must be a JSON object (got an array)"),
        ('"llama"', ModelConfigError, "must be a JSON object (got a string)"),
        ("{", InvalidInputError, "is not valid JSON"),
    ],
)
def test_files_that_are_not_configs(tmp_path, text, error, match):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(error, match=re.escape(match)):
        read_config_file(path)


def test_bundled_models_are_the_zoo_files():
    zoo = resources.files("kvcore.data").joinpath("zoo")
    files = sorted(e.name for e in zoo.iterdir() if e.name.endswith(".json"))
    assert sorted(m.filename for m in bundled_models()) == files
    assert {"NOTES.md", "SOURCES.md"} <= {e.name for e in zoo.iterdir()}
    assert find_bundled_model("google/gemma-3-27b-it").filename == "google__gemma-3-27b-it.json"


def test_bundled_names_are_found_by_short_name_and_any_case():
    assert find_bundled_model("GEMMA-3-27B-IT").name == "google/gemma-3-27b-it"
    assert find_bundled_model("qwen/qwen3-8b").name == "Qwen/Qwen3-8B"
    assert find_bundled_model("gemma-4") is None


def test_unknown_names_list_the_bundled_ones():
    with pytest.raises(UnknownModelError, match="nor a bundled model") as info:
        load_model_config("not-a-model")  # not org/name: never looked up on the Hub
    assert "google/gemma-3-27b-it" in str(info.value)


def test_an_existing_path_wins_over_a_bundled_name(tmp_path, monkeypatch):
    folder = tmp_path / "google" / "gemma-3-27b-it"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "local"}))
    monkeypatch.chdir(tmp_path)
    config, source = load_model_config("google/gemma-3-27b-it")
    assert config == {"model_type": "local"} and source == "google/gemma-3-27b-it"
    monkeypatch.chdir(tmp_path / "google")
    config, source = load_model_config("google/gemma-3-27b-it")
    assert config["model_type"] == "gemma3" and source == "bundled google/gemma-3-27b-it"


def test_errors_name_where_the_config_came_from(registry, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    with pytest.raises(
        ModelConfigError, match="^" + re.escape(f"{path}: llama config: 'num_attention_heads' is missing")
    ):
        model_layer_specs(path, registry)


def test_max_position_embeddings():
    assert max_position_embeddings({"max_position_embeddings": 4096}) == 4096
    assert (
        max_position_embeddings(
            {"text_config": {"max_position_embeddings": 10}, "max_position_embeddings": 5}
        )
        == 10
    )
    assert max_position_embeddings({"text_config": {}}) is None


@pytest.mark.slow  # a fresh interpreter that imports torch (~5-12 s)
def test_plugins_load_without_transformers():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["transformers"] = None  # any import of transformers now fails
        import torch
        from kvcore import Registry, layer_specs_from_config
        from kvcore.frontends.hf_config import bundled_models
        registry = Registry.default(autoload=False)
        assert "kvcore.plugins.transformers_modules" in dict(registry.pm.list_name_plugin())
        config = next(m for m in bundled_models() if m.name == "Qwen/Qwen3-8B").config()
        assert len(layer_specs_from_config(config, registry)) == 36
        spec = registry.spec_for_module(torch.nn.Linear(2, 2), "x")
        assert spec is None
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
