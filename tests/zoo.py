"""The model configs the tests read, as fresh dicts: bundled models by name and the synthetic
configs of ``tests/configs`` (front ends, families, the state kind, the command line)."""

from __future__ import annotations

import copy
from pathlib import Path

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
