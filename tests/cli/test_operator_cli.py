"""What an operator meets first: ``--version``, the policies ``--help`` names, numpy installed."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from kvcore.cli import COMMANDS, build_parser
from kvcore.cli.command import Command
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


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_is_listed_and_described_by_its_declaration(command):
    declared = importlib.import_module(f"kvcore.cli.{command}").COMMAND
    subparsers = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    listed = {action.dest: action.help for action in subparsers._choices_actions}
    assert listed[command] == declared.help
    # written as an indented paragraph, shown folded and wrapped (a long option may wrap at a hyphen)
    assert "".join(declared.description.split()) in "".join(_help(command).split())


def test_a_command_declaration_needs_both_texts():
    with pytest.raises(ValueError, match="help"):
        Command(help="", description="what it does")
    with pytest.raises(TypeError, match="description"):
        Command(help="what it does", description=None)


def test_numpy_comes_with_torch_and_the_base_install_has_neither():
    """torch warns at import when numpy is missing, so the extra that brings torch brings numpy;
    the base install (the planner) needs neither (tests/cli/test_light_install.py runs it so)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S)
    torch_extra = re.search(r"^torch = \[(.*?)^\]", text, re.M | re.S)
    assert dependencies is not None and torch_extra is not None
    assert not re.search(r'^\s*"(numpy|torch)[^"]*",', dependencies.group(1), re.M)
    assert re.search(r'^\s*"numpy[^"]*",', torch_extra.group(1), re.M)
    assert re.search(r'^\s*"torch>=[^"]*",', torch_extra.group(1), re.M)
