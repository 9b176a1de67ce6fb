"""The compiled build's guard (:mod:`kvcore.simulation.compiled`): extension modules run only
beside the sources they were built from.

The compiled modules themselves are tested by the whole suite run again on them (CI's
"the compiled simulator" section builds them with ``KVCORE_MYPYC=1``).
"""

from __future__ import annotations

import ast
import json
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from kvcore import StaleBuildError
from kvcore.simulation import compiled
from kvcore.simulation.compiled import COMPILED_MODULES, DIGESTS_FILE, module_name, source_digest

REPOSITORY = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path, *, extensions: bool) -> Path:
    """A copy of the compiled modules' sources under ``tmp_path``, each with an extension module
    beside it when ``extensions``, and the build's record of the sources."""
    for path in COMPILED_MODULES:
        source = tmp_path / path
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes((REPOSITORY / path).read_bytes())
        if extensions:
            source.with_name(source.stem + EXTENSION_SUFFIXES[0]).write_bytes(b"")
    digests = {path: source_digest(tmp_path / path) for path in COMPILED_MODULES}
    (tmp_path / DIGESTS_FILE).write_text(json.dumps(digests))
    return tmp_path


def test_pure_python_sources_need_no_record(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "_ROOT", _tree(tmp_path, extensions=False))
    (tmp_path / DIGESTS_FILE).unlink()
    assert compiled.compiled_modules() == []
    compiled.check_compiled_sources()


def test_extensions_built_from_the_sources_beside_them_run(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "_ROOT", _tree(tmp_path, extensions=True))
    assert compiled.compiled_modules() == [module_name(path) for path in COMPILED_MODULES]
    compiled.check_compiled_sources()


def test_a_source_changed_since_the_build_stops_its_extensions(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "_ROOT", _tree(tmp_path, extensions=True))
    changed = tmp_path / "kvcore/simulation/profiles/vllm/lean.py"
    changed.write_text(changed.read_text() + "\n# edited after the build\n")
    with pytest.raises(StaleBuildError, match=r"profiles/vllm/lean\.py changed since the build.*rebuild"):
        compiled.check_compiled_sources()


def test_extensions_without_the_builds_record_are_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "_ROOT", _tree(tmp_path, extensions=True))
    (tmp_path / DIGESTS_FILE).unlink()
    with pytest.raises(StaleBuildError, match=f"{len(COMPILED_MODULES)} modules compiled"):
        compiled.check_compiled_sources()


def test_the_compiled_modules_are_the_simulators_and_import_no_kvcore_at_build_time():
    """Each named module exists; the stepper, which every profile subclasses, is among them; and
    ``compiled.py`` imports nothing of kvcore at its top (``setup.py`` reads it before kvcore is
    installed)."""
    assert all((REPOSITORY / path).is_file() for path in COMPILED_MODULES)
    assert "kvcore/simulation/stepper.py" in COMPILED_MODULES
    tree = ast.parse((REPOSITORY / "kvcore/simulation/compiled.py").read_text())
    top_imports = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert not [name for name in top_imports if name and name.startswith("kvcore")]
