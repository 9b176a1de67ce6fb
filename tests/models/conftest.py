"""Fixtures for the model tests: the configs kvcore reads, as fresh dicts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kvcore.frontends.hf_config import bundled_models, read_config_file

#: Synthetic configs (test data, not published models): see the "_synthetic" key of each.
SYNTHETIC = Path(__file__).parent / "configs"
NEMOTRON_H_LIKE = SYNTHETIC / "synthetic__nemotron-h-like.json"
QWEN3_NEXT_LIKE = SYNTHETIC / "synthetic__qwen3-next-like.json"


def bundled(name):
    """A fresh copy of a bundled model's config."""
    return next(m for m in bundled_models() if m.name == name).config()


def synthetic(path):
    """A fresh copy of a synthetic config."""
    return copy.deepcopy(read_config_file(path))


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run ``kvcore`` in-process with autoloading off; return (status, stdout, stderr)."""
    from kvcore.cli import main

    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(*argv):
        status = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run
