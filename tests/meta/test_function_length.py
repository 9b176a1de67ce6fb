"""Functions that read in one screen: none in ``kvcore/`` runs over 80 lines (issue 41).

A function's lines count from its ``def`` to its last line, docstring included. A data table is
a module-level assignment, not a function, so tables are not held to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvcore

MOST_LINES = 80


def long_functions(root: Path, most: int = MOST_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function under ``root`` longer than ``most`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_kvcore_runs_over_80_lines():
    assert long_functions(Path(kvcore.__file__).parent) == []


def test_the_check_finds_a_long_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MOST_LINES))
    (package / "mod.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(package) == [f"pkg/mod.py:1 long ({MOST_LINES + 1} lines)"]
