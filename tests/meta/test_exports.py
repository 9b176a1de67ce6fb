"""The public façade: ``kvcore.__all__`` is exactly what the reference documents, each name is
written once in ``kvcore/__init__.py``'s table and resolves, and importing kvcore stays cheap."""

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import kvcore

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_API = ROOT / "docs" / "reference" / "plugin-api.md"
PYTHON_REFERENCE = ROOT / "docs" / "reference" / "python.md"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _plugin_api_names() -> set[str]:
    """The names of the plugin API's table of ``kvcore``'s names (its second column)."""
    rows = _section(PLUGIN_API.read_text(encoding="utf-8"), "## The names of `kvcore`").splitlines()
    names: set[str] = set()
    for row in rows:
        cells = row.split(" | ")
        if row.startswith("| ") and len(cells) == 2 and not row.startswith("| for |"):
            names |= set(re.findall(r"`(\w+)`", cells[1]))
    return names


def _python_reference_names() -> set[str]:
    """The façade names the Python reference uses: the owners of its members written without a
    module (``KVCachePlan.pools``) and every ``kvcore.NAME`` that is neither a module (the
    ``kvcore.engine`` logger) nor a name 0.3 removed (said to be removed)."""
    text = PYTHON_REFERENCE.read_text(encoding="utf-8")
    owners = set(re.findall(r"^\| `([A-Z]\w*)[.(`]", text, re.M))
    named = {
        name
        for name in re.findall(r"`kvcore\.(\w+)(?![\w.])", text)
        if name not in kvcore._REMOVED and importlib.util.find_spec(f"kvcore.{name}") is None
    }
    return owners | named


def test_the_public_names_are_exactly_the_documented_ones():
    documented = _plugin_api_names()
    assert len(documented) > 90
    assert documented == set(kvcore.__all__)
    assert _python_reference_names() - documented == set()  # python.md uses no other façade name


def test_each_public_name_resolves_from_the_module_that_defines_it():
    assert len(kvcore.__all__) == len(set(kvcore.__all__))
    for name in kvcore.__all__:
        assert getattr(kvcore, name) is not None, name
    for name, module in kvcore._LAZY.items():
        assert getattr(importlib.import_module(module), name) is getattr(kvcore, name), name
    public = {name for name in dir(kvcore) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(kvcore, name)).__name__ == "module"}
    assert set(kvcore.__all__) == public - modules  # submodules are not names of the façade


def test_the_table_and_what_type_checkers_read_are_the_same_names():
    tree = ast.parse((ROOT / "kvcore" / "__init__.py").read_text(encoding="utf-8"))
    (block,) = [node for node in tree.body if isinstance(node, ast.If)]  # if _typing.TYPE_CHECKING:
    typed = {
        alias.asname or alias.name: statement.module
        for statement in block.body
        if isinstance(statement, ast.ImportFrom)
        for alias in statement.names
    }
    assert typed == kvcore._LAZY


def test_import_kvcore_does_not_import_torch():
    # pytest imports kvcore at start-up wherever it is installed (the pytest11 plugin), so the
    # package itself must not pull in torch until a name that needs it is used (one that does,
    # kvcore.allocate, resolves in the test above, where torch is loaded already: a child that
    # imported torch only to see it come would spend most of this test's time doing so).
    code = (
        "import sys, kvcore, kvcore.testing.pytest_plugin; kvcore.plan_kv_cache; kvcore.longest_admitted; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_attribute():
    try:
        kvcore.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
