"""The how-to's engine example runs as printed: its script, run here, prints the page's output."""

from __future__ import annotations

import logging
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
HOWTO = ROOT / "docs" / "how-to" / "integrate-with-an-engine.md"


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)


def _machine_free(text: str) -> str:
    """The fixed-size line shows this machine's total and free memory; mask those two numbers."""
    return re.sub(r"\(total [^;]*; not profiled\)", "(total T, free F; not profiled)", text)


def test_the_engine_example_prints_what_the_page_shows(capsys, monkeypatch):
    blocks = _blocks(HOWTO.read_text())
    index = next(i for i, (lang, code) in enumerate(blocks) if lang == "python" and "def main(" in code)
    script = blocks[index][1]
    shown = next(code for lang, code in blocks[index + 1 :] if lang == "text")
    monkeypatch.setattr("sys.argv", ["integrate.py"])  # the CPU run the page shows
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers.clear()  # let the script's logging.basicConfig() take effect, as in a fresh process
    try:
        exec(compile(script, str(HOWTO), "exec"), {"__name__": "__main__"})
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved
    out = capsys.readouterr().out
    assert _machine_free(out).splitlines() == _machine_free(shown).splitlines()
