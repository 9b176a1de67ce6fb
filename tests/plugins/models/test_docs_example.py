"""The family plugin of docs/how-to/add-a-model-family.md runs and prints what the page shows."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from kvcore import ModelConfigError, Registry, get_plugin_manager, layer_specs_from_config

HOW_TO = Path(__file__).parents[3] / "docs" / "how-to" / "add-a-model-family.md"


def blocks(language):
    """The page's fenced code blocks whose info string is ``language``, in page order."""
    found, current, info = [], None, ""
    for line in HOW_TO.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, info = [], line[3:].strip()
            else:
                if info == language:
                    found.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return found


@pytest.fixture
def acme_module(tmp_path, monkeypatch):
    (tmp_path / "acme_kvcore.py").write_text(blocks("python")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    yield tmp_path
    sys.modules.pop("acme_kvcore", None)


def test_the_example_prints_what_the_page_shows(acme_module, capsys):
    (acme_module / "try_acme.py").write_text(blocks("python")[1])
    runpy.run_path(str(acme_module / "try_acme.py"))
    shown = next(b for b in blocks("text") if b.startswith("model.layers.0.mixer"))
    assert capsys.readouterr().out == shown


def test_the_example_names_a_missing_window(acme_module):
    import acme_kvcore

    registry = Registry.from_plugin_manager(get_plugin_manager(plugins=[acme_kvcore]))
    config = {"model_type": "acme", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4}
    with pytest.raises(ModelConfigError, match="acme config: 'local_window' is missing"):
        layer_specs_from_config(config, registry)


def test_the_attention_only_row_example_registers_and_reads(tmp_path, monkeypatch):
    (tmp_path / "acme_lite_kvcore.py").write_text(blocks("python")[2])
    monkeypatch.syspath_prepend(str(tmp_path))
    import acme_lite_kvcore

    try:
        pm = get_plugin_manager(autoload=False, plugins=[acme_lite_kvcore])
        registry = Registry.from_plugin_manager(pm)
        config = {
            "model_type": "acme_lite",
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "sliding_window": 256,
        }
        kinds = [spec.kind for spec in layer_specs_from_config(config, registry).values()]
        assert kinds == (["sliding_window"] * 3 + ["full_attention"]) * 2
        with pytest.raises(ModelConfigError, match="acme_lite config: 'head_dim' is missing"):
            layer_specs_from_config({**config, "head_dim": None}, registry)
    finally:
        sys.modules.pop("acme_lite_kvcore", None)


def test_a_config_no_family_knows_fails_as_the_page_shows(tmp_path, monkeypatch, capsys):
    # the page's first block: a folder acme/ holding a config.json of model type acme
    from tests.meta.doc_blocks import console_runs, run_command

    command, shown = next(
        run for block in blocks("console") for run in console_runs(block) if "--model acme " in run[0]
    )
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "config.json").write_text('{"model_type": "acme", "num_hidden_layers": 4}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    status, _, err = run_command(command)
    assert (status, err) == (1, shown)
