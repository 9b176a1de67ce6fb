"""The package keeps its layers: contract ← planning ← front ends ← runtime ← simulation ← engine ← CLI.

Every ``import`` in ``kvcore/`` (the built-in plugins and policies included) is read from the source,
lazy imports inside functions and ``TYPE_CHECKING`` blocks too, and checked against these rules:

1. a module imports only modules of its own layer or of the layers above it (:data:`ALLOWED`);
2. built-in kinds, families and policies import the contract (and planning where they must);
3. nothing outside the command line imports it, and no internal module imports the façade
   (``kvcore/__init__``), which would hide where a name comes from and invite cycles;
4. no import cycles between modules;
5. no private name (``_name``) is imported from another module;
6. torch is imported only by the runtime, the engine, the testing kit and the two module scans
   (the simulation uses the torch-free block pool and never imports it);
   every other module stays torch-free even through what it imports when it is loaded (an
   ``if TYPE_CHECKING:`` import of a torch type for an annotation never runs, so it is allowed).

The second half of the file feeds the checker the imports that broke these rules before the
package was reshaped, so a checker that stopped looking would fail here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kvcore"

#: The layer a module belongs to, by prefix (longest first); top-level modules are the contract.
PREFIXES: tuple[tuple[str, str], ...] = (
    ("kvcore.planning", "planning"),
    ("kvcore.frontends", "frontends"),
    ("kvcore.runtime", "runtime"),
    ("kvcore.simulation", "simulation"),
    ("kvcore.tuning", "tuning"),
    ("kvcore.engine", "engine"),
    ("kvcore.integrations", "integrations"),
    ("kvcore.cli", "cli"),
    ("kvcore.testing", "testing"),
    ("kvcore.plugins", "plugins"),
    ("kvcore.policies", "policies"),
    ("kvcore.data", "data"),
)
FACADE = "kvcore"
MAIN = "kvcore.__main__"

#: The layers below the integrations, which the integrations, the CLI and the testing kit import.
BELOW_INTEGRATIONS = ("contract", "planning", "frontends", "runtime", "simulation", "tuning", "engine")
#: Which layers each layer may import (its own included).
ALLOWED: dict[str, frozenset[str]] = {
    "contract": frozenset({"contract"}),
    "planning": frozenset({"contract", "planning"}),
    "frontends": frozenset({"contract", "planning", "frontends", "data"}),
    "runtime": frozenset({"contract", "planning", "runtime"}),
    "simulation": frozenset({"contract", "planning", "runtime", "simulation"}),
    "tuning": frozenset({"contract", "planning", "runtime", "simulation", "tuning"}),
    "engine": frozenset({"contract", "planning", "frontends", "runtime", "engine"}),
    "integrations": frozenset({*BELOW_INTEGRATIONS, "integrations", "plugins"}),
    "cli": frozenset({*BELOW_INTEGRATIONS, "integrations", "cli"}),
    "testing": frozenset({*BELOW_INTEGRATIONS, "testing", "plugins"}),
    "plugins": frozenset({"contract", "planning", "plugins"}),
    "policies": frozenset({"contract", "planning", "policies"}),
    "data": frozenset(),
    "facade": frozenset({"contract", "planning", "frontends", "runtime", "simulation", "engine"}),
    "main": frozenset({"cli"}),
}
#: Modules that may import torch: the runtime, the engine, the integrations, the testing kit,
#: the module scans.
TORCH_LAYERS = frozenset({"runtime", "engine", "integrations", "testing"})
#: The only package that may import vLLM (an extra, in an environment of its own).
VLLM_PACKAGE = "kvcore.integrations.vllm"
SGLANG_PACKAGE = "kvcore.integrations.sglang"
TORCH_MODULES = frozenset({"kvcore.frontends.module_scan", "kvcore.plugins.transformers_modules"})


@attrs.frozen
class Import:
    """One import statement: who imports what, and how."""

    importer: str
    target: str  # a module name (``torch``, ``kvcore.plan``, ...)
    names: tuple[str, ...] = ()  # names taken from the target (``from X import a, b``)
    top_level: bool = True  # runs when the importer is loaded (not in a function or TYPE_CHECKING)
    line: int = 0
    typing_only: bool = False  # inside ``if TYPE_CHECKING:``: read by type checkers, never run

    def __str__(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.importer}:{self.line} imports {self.target}{names}"


def layer_of(module: str) -> str:
    """The layer of a kvcore module (``"external"`` for anything outside kvcore)."""
    if module == FACADE:
        return "facade"
    if module == MAIN:
        return "main"
    for prefix, layer in PREFIXES:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    if module.startswith("kvcore."):
        return "contract"
    return "external"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> Iterator[Path]:
    """Every module of the package, the built-in plugins and policies included."""
    yield from sorted(PACKAGE.rglob("*.py"))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, tree: ast.AST, known: set[str]) -> Iterator[Import]:
    """The imports in ``tree``, with ``from kvcore import submodule`` resolved to the submodule."""

    def visit(node: ast.AST, top_level: bool, typing_only: bool = False) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, alias.name, (), top_level, child.lineno, typing_only)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = tuple(a.name for a in child.names)
                subs = [n for n in names if f"{child.module}.{n}" in known]
                for sub in subs:
                    yield Import(module, f"{child.module}.{sub}", (), top_level, child.lineno, typing_only)
                rest = tuple(n for n in names if n not in subs)
                if rest or not subs:
                    yield Import(module, child.module, rest, top_level, child.lineno, typing_only)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, False, typing_only)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), False, True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), top_level, typing_only)
            else:
                yield from visit(child, top_level, typing_only)

    yield from visit(tree, True)


def package_imports() -> list[Import]:
    """Every import statement of every kvcore module."""
    trees = {module_name(p): ast.parse(p.read_text(), str(p)) for p in source_files()}
    known = set(trees)
    return [imp for module, tree in trees.items() for imp in imports_of(module, tree, known)]


def _is_kvcore(target: str) -> bool:
    return target == FACADE or target.startswith("kvcore.")


def _is_torch(target: str) -> bool:
    return target == "torch" or target.startswith("torch.")


def _cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def violations(imports: Iterable[Import]) -> list[str]:
    """Every broken rule, one line each (see the module docstring for the rules)."""
    imports = list(imports)
    problems: list[str] = []
    # an explicit import of one's own package is left out (kvcore.cli.plan using kvcore.cli's
    # helpers), except the façade, which every module would otherwise reach that way
    internal = [
        i
        for i in imports
        if _is_kvcore(i.target) and (i.target == FACADE or i.target not in _parents(i.importer))
    ]
    for imp in internal:
        source, target = layer_of(imp.importer), layer_of(imp.target)
        if target == "facade" and source not in ("cli", "testing", "main"):
            problems.append(f"{imp}: import the defining module, not the kvcore façade")
        elif target == "cli" and source not in ("cli", "main"):
            problems.append(f"{imp}: nothing outside the command line imports it")
        elif target not in ALLOWED[source] and target != "facade":
            problems.append(f"{imp}: the {source} layer may not import the {target} layer")
        private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        if private:
            problems.append(f"{imp}: private name(s) {', '.join(private)} used outside their module")
    for cycle in _cycles((i.importer, i.target) for i in internal):
        problems.append(f"import cycle between {', '.join(cycle)}")
    for imp in imports:
        layer = layer_of(imp.importer)
        if imp.typing_only:  # annotations may name torch types; they never import torch
            continue
        if _is_torch(imp.target) and layer not in TORCH_LAYERS and imp.importer not in TORCH_MODULES:
            problems.append(f"{imp}: the {layer} layer must not import torch")
        vllm = imp.target == "vllm" or imp.target.startswith("vllm.")
        if vllm and not imp.importer.startswith(VLLM_PACKAGE):
            problems.append(f"{imp}: only {VLLM_PACKAGE} imports vllm")
        sglang = imp.target == "sglang" or imp.target.startswith("sglang.")
        if sglang and not imp.importer.startswith(SGLANG_PACKAGE):
            problems.append(f"{imp}: only {SGLANG_PACKAGE} imports sglang")
    problems.extend(_torch_at_load(imports))
    return problems


def _torch_at_load(imports: list[Import]) -> Iterator[str]:
    """Torch-free modules must not load torch through what they import when they are loaded."""
    loads: dict[str, set[str]] = {}
    for imp in imports:
        if imp.top_level:
            loads.setdefault(imp.importer, set()).add(imp.target)
            for parent in _parents(imp.target):
                if _is_kvcore(parent):
                    loads[imp.importer].add(parent)
    for module in sorted(loads):
        layer = layer_of(module)
        if layer in TORCH_LAYERS or module in TORCH_MODULES or layer in ("facade", "main"):
            continue
        seen: dict[str, str] = {module: ""}
        todo = [module]
        while todo:
            current = todo.pop()
            for target in sorted(loads.get(current, ())):
                if target in seen:
                    continue
                seen[target] = current
                if _is_torch(target):
                    chain = [target]
                    while seen[chain[-1]]:
                        chain.append(seen[chain[-1]])
                    yield f"{module} loads torch when imported: {' <- '.join(chain)}"
                    todo = []
                    break
                if _is_kvcore(target):
                    todo.append(target)


# -- the package as it is ------------------------------------------------------------------


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return package_imports()


def test_the_package_is_read_whole(imports: list[Import]) -> None:
    importers = {i.importer for i in imports}
    for module in (
        "kvcore.hookspecs",
        "kvcore.planning.planner",
        "kvcore.runtime.allocation",
        "kvcore.engine.distributed",
        "kvcore.simulation.simulator",
        "kvcore.cli.plan",
        "kvcore.plugins.mla",
        "kvcore.plugins.models.deepseek",
        "kvcore.policies.shared_buffer",
        "kvcore.testing.checks",
        "kvcore.integrations.vllm.convert",
    ):
        assert module in importers
    assert any(not i.top_level for i in imports), "lazy imports must be read too"


def test_the_layers_hold(imports: list[Import]) -> None:
    problems = violations(imports)
    assert not problems, "\n".join(problems)


# -- the checker catches what used to be wrong ----------------------------------------------


def _with(imports: list[Import], *extra: Import) -> list[str]:
    before = set(violations(imports))
    return [p for p in violations([*imports, *extra]) if p not in before]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # hookspecs reached the policy/layout modules, which loaded torch
        ((Import("kvcore.hookspecs", "torch"),), "must not import torch"),
        ((Import("kvcore.hookspecs", "torch", top_level=False),), "must not import torch"),
        ((Import("kvcore.cache_layout", "torch"),), "must not import torch"),
        # the contract reaching down into planning (hookspecs -> policy selection, registry)
        ((Import("kvcore.hookspecs", "kvcore.planning.registry"),), "contract layer may not import"),
        # registry -> layout (check_fits) when layout was a torch module: planning loading torch
        ((Import("kvcore.planning.registry", "kvcore.runtime.allocation"),), "planning layer may not"),
        # plugins/attention, mla, state -> kvcore.layout (torch)
        ((Import("kvcore.plugins.attention", "torch"),), "plugins layer must not import torch"),
        ((Import("kvcore.plugins.mla", "kvcore.runtime.allocation"),), "plugins layer may not"),
        # every model family -> kvcore.models (ModelOptions) -> specfile, serialization, cattrs
        ((Import("kvcore.plugins.models.llama", "kvcore.frontends.hf_config"),), "plugins layer may not"),
        # the registry <-> serialization cycle, lazy import included
        (
            (
                Import("kvcore.planning.registry", "kvcore.planning.serialization", top_level=False),
                Import("kvcore.planning.serialization", "kvcore.planning.registry"),
            ),
            "import cycle",
        ),
        # private names across modules
        ((Import("kvcore.policy", "kvcore.plan", ("_tensors",)),), "private name"),
        ((Import("kvcore.testing.checks", "kvcore.plan", ("_structural_problems",)),), "private name"),
        # planning going through the façade, and anything importing the command line
        ((Import("kvcore.planning.planner", "kvcore", ("Registry",)),), "not the kvcore façade"),
        ((Import("kvcore.engine.workflow", "kvcore.cli.report"),), "nothing outside the command line"),
        # the simulation stays torch-free and below the engine
        ((Import("kvcore.simulation.simulator", "torch"),), "simulation layer must not import torch"),
        ((Import("kvcore.simulation.simulator", "kvcore.engine.local"),), "simulation layer may not"),
        (
            (Import("kvcore.simulation.simulator", "kvcore.runtime.allocation"),),
            "loads torch when imported",
        ),
        # vLLM stays in its integration, and the integrations above the engine
        ((Import("kvcore.engine.workflow", "vllm.v1.kv_cache_interface"),), "only kvcore.integrations.vllm"),
        ((Import("kvcore.planning.planner", "vllm", top_level=False),), "only kvcore.integrations.vllm"),
        ((Import("kvcore.engine.local", "kvcore.integrations.vllm.rules"),), "engine layer may not"),
        # torch pulled in at load time through another module
        (
            (
                Import("kvcore.cli.plan", "kvcore.engine.local"),
                Import("kvcore.engine.local", "torch"),
            ),
            "loads torch when imported",
        ),
    ],
)
def test_the_checker_catches_the_old_imports(
    imports: list[Import], extra: tuple[Import, ...], expected: str
) -> None:
    new = _with(imports, *extra)
    assert any(expected in p for p in new), new


def test_a_lazy_torch_import_in_the_command_line_is_allowed_at_load(imports: list[Import]) -> None:
    lazy = Import("kvcore.cli.plan", "kvcore.engine.local", top_level=False)
    assert not [p for p in _with(imports, lazy) if "loads torch" in p]
