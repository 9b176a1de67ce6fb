"""``--model org/name`` from a local Hugging Face cache (a fake one in ``tmp_path``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvcore.cli import main
from kvcore.errors import UnknownModelError
from kvcore.frontends.hf_cache import find_cached_config, hub_cache_dir
from kvcore.frontends.hf_config import find_bundled_model, load_model_config

ACME = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def cache_repo(cache: Path, name: str, configs: dict[str, dict], main_ref: str | None) -> Path:
    """Write ``models--org--name`` with one snapshot per revision, and ``refs/main``."""
    org, model = name.split("/")
    repo = cache / f"models--{org}--{model}"
    for revision, config in configs.items():
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(config))
    if main_ref is not None:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(main_ref)
    return repo


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache that HF_HUB_CACHE names."""
    cache = tmp_path / "hub"
    cache.mkdir()
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    assert hub_cache_dir() == Path.home() / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old"))
    assert hub_cache_dir() == tmp_path / "old"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "new"))
    assert hub_cache_dir() == tmp_path / "new"


def test_refs_main_names_the_snapshot(hub):
    cache_repo(hub, "acme/tiny", {"aaa": {**ACME, "num_hidden_layers": 3}, "bbb": ACME}, main_ref="bbb\n")
    config, source = load_model_config("acme/tiny")
    assert config["num_hidden_layers"] == 2
    assert source.startswith("acme/tiny (Hugging Face cache ") and "bbb" in source


def test_without_refs_the_newest_snapshot_is_used(hub):
    repo = cache_repo(hub, "acme/tiny", {"old": {**ACME, "num_hidden_layers": 3}, "new": ACME}, main_ref=None)
    os.utime(repo / "snapshots" / "old" / "config.json", (1, 1))
    assert find_cached_config("acme/tiny") == repo / "snapshots" / "new" / "config.json"


def test_the_org_and_name_match_without_case(hub):
    cache_repo(hub, "Acme/Tiny", {"rev": ACME}, main_ref="rev")
    assert find_cached_config("acme/tiny") is not None


def test_the_bundled_zoo_comes_first(hub):
    cache_repo(hub, "meta-llama/Llama-3.1-8B", {"rev": ACME}, main_ref="rev")
    config, source = load_model_config("meta-llama/Llama-3.1-8B")
    assert source == "bundled meta-llama/Llama-3.1-8B"
    assert config == find_bundled_model("meta-llama/Llama-3.1-8B").config()


@pytest.mark.parametrize("name", ["tiny", "acme/tiny/extra", "../tiny", "acme/.."])
def test_names_that_are_not_repositories_are_not_looked_up(hub, name):
    assert find_cached_config(name) is None


def test_a_model_nowhere_names_the_cache_it_looked_in(hub):
    with pytest.raises(UnknownModelError, match="nor in the Hugging Face cache") as exc:
        load_model_config("acme/missing")
    assert str(hub) in str(exc.value)


def test_kvcore_plan_reads_a_cached_model_and_defaults_its_length(hub, capsys, monkeypatch):
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    cache_repo(hub, "acme/tiny", {"rev": ACME}, main_ref="rev")
    assert main(["plan", "--model", "acme/tiny", "--memory", "64MiB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_model_len"] == 4096
    assert len(report["groups"]) == 1
