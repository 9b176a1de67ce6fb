"""What an operator meets first: ``--version``, the policies ``--help`` names, numpy installed."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from kvcore.cli import build_parser
from kvcore.planning.registry import Registry

ROOT = Path(__file__).parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"kvcore {importlib.metadata.version('kvcore')}\n"


def _help(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return " ".join(sub.format_help().split())


@pytest.mark.parametrize(
    ("command", "option"),
    [("plan", "--policy"), ("allocate", "--policy"), ("compare", "--policies"), ("simulate", "--policies")],
)
def test_help_names_the_registered_policies(command, option):
    text = _help(command)
    assert option in text
    for name in Registry.default().policies:
        assert name in text


def test_numpy_is_a_base_dependency():
    """torch warns at import when numpy is missing; the base install must not make it warn."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S)
    assert dependencies is not None
    assert re.search(r'^\s*"numpy[^"]*",', dependencies.group(1), re.M)
