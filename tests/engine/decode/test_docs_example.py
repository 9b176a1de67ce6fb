"""The runner example of docs/explanation/shared-buffer.md runs and prints what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

PAGE = Path(__file__).parents[3] / "docs" / "explanation" / "shared-buffer.md"


def test_the_block_table_example_prints_what_the_page_shows(capsys):
    blocks = re.findall(r"```(\w*)\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    index = next(i for i, (lang, code) in enumerate(blocks) if "PagedAttentionRunner" in code)
    shown = next(code for lang, code in blocks[index + 1 :] if lang == "text")
    exec(compile(blocks[index][1], str(PAGE), "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == shown
