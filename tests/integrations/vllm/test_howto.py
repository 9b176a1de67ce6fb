"""docs/how-to/serve-with-vllm.md: its vLLM outputs and code run as quoted (they need vLLM, so
they are checked here rather than by tests/meta/test_docs.py)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from kvcore.cli import main

PAGE = Path(__file__).parents[3] / "docs" / "how-to" / "serve-with-vllm.md"
TEXT = PAGE.read_text(encoding="utf-8")
OUTPUTS = re.findall(r"<!-- checked-output: vllm -->\n```console\n\$ (.*?)\n(.*?)```", TEXT, re.S)
CODE = re.findall(r"<!-- checked-code: vllm -->\n```python\n(.*?)```", TEXT, re.S)


def test_the_page_has_checked_blocks():
    assert OUTPUTS and CODE


@pytest.mark.parametrize(("command", "output"), OUTPUTS)
def test_outputs_are_current(command, output):
    argv = shlex.split(command)
    assert argv[0] == "kvcore"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv[1:]) == 0
    assert out.getvalue() == output, f"re-run `{command}` and paste its output into {PAGE.name}"


@pytest.mark.parametrize("code", CODE)
def test_code_runs(code):
    exec(compile(code, str(PAGE), "exec"), {})
