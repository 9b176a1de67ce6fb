"""The docs keep up with the code: every hook, built-in kind, conformance check and plugin switch
is documented, code quoted from files matches them, and documented outputs are current."""

import contextlib
import importlib.metadata
import inspect
import io
import re
import shlex
import types
from pathlib import Path

import attrs
import pytest
import torch

from kvcore import Registry, hookspecs, scan_module
from kvcore.cli import build_parser, main
from kvcore.planning.manager import BUILTIN_PLUGINS, ENV_BLOCK, ENV_DISABLE_AUTOLOAD, ENV_TRACE
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.testing import checks
from kvcore.testing.conformance import PolicyConformance, SpecKindConformance
from kvcore.testing.registries import build_registry
from tests.meta.doc_blocks import PAGES

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
HOOKS_MD = DOCS / "reference" / "hooks.md"
ENVIRONMENT_MD = DOCS / "reference" / "environment.md"
TEST_YOUR_PLUGIN_MD = DOCS / "how-to" / "test-your-plugin.md"
#: The pages this test owns the links of (the whole site is checked by `mkdocs build --strict`).
PLUGIN_PAGES = (
    HOOKS_MD,
    ENVIRONMENT_MD,
    TEST_YOUR_PLUGIN_MD,
    DOCS / "how-to" / "write-a-spec-plugin.md",
    DOCS / "how-to" / "write-a-policy.md",
)

HOOKS = {
    name: fn
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if getattr(fn, f"{hookspecs.PROJECT_NAME}_spec", None) is not None
}
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _hook_sections():
    """``{hook name: (parameter names in the heading, section text)}`` from hooks.md."""
    text = HOOKS_MD.read_text(encoding="utf-8")
    parts = re.split(r"^### `(\w+)\(([^)]*)\)`\s*$", text, flags=re.M)
    sections = {}
    for name, args, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        body = re.split(r"^##? ", body, flags=re.M)[0]  # up to the next section heading
        sections[name] = ([a.strip() for a in args.split(",") if a.strip()], body)
    return sections


SECTIONS = _hook_sections()


def test_every_hook_has_a_section_and_no_section_is_stale():
    assert sorted(SECTIONS) == sorted(HOOKS)


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_section_states_the_contract(name):
    args, body = SECTIONS[name]
    params = list(inspect.signature(HOOKS[name]).parameters)
    assert args == params, f"the heading of {name} must list its parameters {params}"
    for param in params:
        assert f"`{param}`" in body, f"{name}: parameter {param!r} is not described"
    for label in ("**Parameters:**", "**Returns:**", "**Calling convention:**", "**When:**"):
        assert label in body, f"{name}: no {label} line"
    convention = body.split("**Calling convention:**")[1].split("\n")[0]
    first = bool(getattr(HOOKS[name], f"{hookspecs.PROJECT_NAME}_spec").get("firstresult"))
    assert ("first result" in convention) == first and ("all results" in convention) == (not first)
    examples = [code for lang, code in FENCE.findall(body) if lang == "python"]
    assert any("@hookimpl" in code and f"def {name}(" in code for code in examples)


def _example_plugin(name):
    code = next(code for lang, code in FENCE.findall(SECTIONS[name][1]) if lang == "python")
    module = types.ModuleType(f"hooks_md_{name}")
    exec(compile(code, f"{HOOKS_MD}:{name}", "exec"), module.__dict__)
    return module


def _check_spec_kinds(module, registry):
    assert "acme.ring" in registry.kinds
    checks.check_page_size(module.RingSpec(block_size=16, slots=4))


def _check_policies(module, registry):
    assert registry.policy("acme.small_uniform").why_not({}) is None


def _check_model_families(module, registry):
    config = {"model_type": "acme", "num_hidden_layers": 2, "num_key_value_heads": 8, "head_dim": 128}
    specs = registry.layer_specs(config)
    assert list(specs) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]


def _check_spec_for_module(module, registry):
    model = torch.nn.Sequential(module.AcmeAttention(num_kv_heads=4, head_dim=64))
    assert [s.num_kv_heads for s in scan_module(model, registry).values()] == [4]


def _check_cache_layout(module, registry):
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
    assert [p.name for p in registry.cache_layout(spec).parts] == ["k", "v"]
    checks.check_cache_layout(spec, registry)


def _check_spec_strategies(module, registry):
    from hypothesis import given, settings

    from kvcore.testing.strategies import spec_strategy

    @settings(max_examples=10, database=None)
    @given(spec=spec_strategy(FullAttentionSpec, registry=registry))
    def heads_are_narrowed(spec):
        assert spec.num_kv_heads in (1, 8) and spec.head_size == 128

    heads_are_narrowed()


def _check_count_parameters(module, registry):
    from kvcore.planning.gpu_budget import count_parameters

    config = {"model_type": "acme", "hidden_size": 8, "num_hidden_layers": 2}
    config.update(intermediate_size=16, vocab_size=10)
    assert count_parameters(config, registry).params == 80 + 2 * 4 * 64 + 2 * 3 * 8 * 16 + 5 * 8


def _check_scheduler_profiles(module, registry):
    assert registry.scheduler_profile("acme.small_steps").description.startswith("kvcore's rules")


#: What each hook's example must do once registered (a hook without an entry is only registered).
EXAMPLE_CHECKS = {
    "kvcore_register_spec_strategies": _check_spec_strategies,
    "kvcore_register_spec_kinds": _check_spec_kinds,
    "kvcore_register_policies": _check_policies,
    "kvcore_register_model_families": _check_model_families,
    "kvcore_spec_for_module": _check_spec_for_module,
    "kvcore_cache_layout": _check_cache_layout,
    "kvcore_count_parameters": _check_count_parameters,
    "kvcore_register_scheduler_profiles": _check_scheduler_profiles,
}


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_examples_register_and_work(name):
    module = _example_plugin(name)
    registry = build_registry(module)
    implementers = [impl.plugin for impl in getattr(registry.pm.hook, name).get_hookimpls()]
    assert module in implementers
    EXAMPLE_CHECKS.get(name, lambda module, registry: None)(module, registry)


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_builtin_implementations_are_listed_under_their_hook(name):
    registry = Registry.default(autoload=False)
    builtins = [
        impl.plugin_name
        for impl in getattr(registry.pm.hook, name).get_hookimpls()
        if impl.plugin_name in BUILTIN_PLUGINS
    ]
    missing = [plugin for plugin in builtins if f"`{plugin}`" not in SECTIONS[name][1]]
    assert missing == [], f"docs/reference/hooks.md, {name}: list the built-in plugins {missing}"


def _kind_docs():
    """``{file: text}`` of the reference pages."""
    return {path: path.read_text(encoding="utf-8") for path in sorted((DOCS / "reference").glob("*.md"))}


@pytest.mark.parametrize("kind", sorted(Registry.default(autoload=False).kinds))
def test_every_builtin_kind_is_documented_with_its_fields(kind):
    cls = Registry.default(autoload=False).spec_class(kind)
    row = re.compile(rf"^\| `{re.escape(kind)}` \||^#+ .*`{re.escape(kind)}`", re.M)
    pages = [(path, text) for path, text in _kind_docs().items() if row.search(text)]
    assert pages, f"document kind {kind!r} in docs/reference/ (a table row or a heading naming it)"
    text = "".join(text for _, text in pages)
    undocumented = [a.name for a in attrs.fields(cls) if f"`{a.name}`" not in text]
    assert undocumented == [], f"kind {kind!r}: fields {undocumented} are not documented"


@pytest.mark.parametrize("suite", [SpecKindConformance, PolicyConformance])
def test_every_conformance_check_is_documented(suite):
    text = TEST_YOUR_PLUGIN_MD.read_text(encoding="utf-8")
    assert [name for name in suite.check_names() if f"| `{name}` |" not in text] == []


def test_plugin_switches_are_documented():
    text = ENVIRONMENT_MD.read_text(encoding="utf-8")
    flags = [a.option_strings[0] for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert flags, "the kvcore parser has global flags"
    for switch in (ENV_DISABLE_AUTOLOAD, ENV_BLOCK, ENV_TRACE, *flags):
        assert f"`{switch}" in text, f"docs/reference/environment.md does not document {switch}"


def _quotes():
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"<!-- quote: (\S+) -->\n```\w*\n(.*?)```", text, re.S):
            yield pytest.param(match.group(1), match.group(2), id=f"{page.name}:{match.group(1)}")


@pytest.mark.parametrize(("path", "quoted"), list(_quotes()))
def test_quoted_code_matches_its_file(path, quoted):
    source = (ROOT / path).read_text(encoding="utf-8")
    lines = quoted.splitlines()
    assert lines, f"empty quote of {path}"
    assert "\n".join(lines) in source, f"the quote of {path} no longer matches the file; copy it again"


def _checked_outputs():
    # README.md and every docs page (tests/meta/doc_blocks.py says what each marker means)
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        pattern = r"<!-- checked-output(: slow)? -->\n```console\n\$ (.*?)\n(.*?)```"
        for match in re.finditer(pattern, text, re.S):
            marks = [pytest.mark.slow] if match.group(1) else []
            yield pytest.param(
                match.group(2), match.group(3), id=f"{page.name}:{match.group(2)[:60]}", marks=marks
            )


EXAMPLE_INSTALLED = "example_quantized" in {ep.name for ep in importlib.metadata.entry_points(group="kvcore")}


@pytest.mark.parametrize(("command", "output"), list(_checked_outputs()))
def test_documented_outputs_are_current(monkeypatch, command, output):
    if "example" in command and not EXAMPLE_INSTALLED:
        pytest.skip(
            "kvcore-example-quantized is not installed: pip install -e examples/kvcore-example-quantized"
        )
    argv = shlex.split(command)
    assert argv[0] == "kvcore"
    for name in (ENV_DISABLE_AUTOLOAD, ENV_BLOCK, ENV_TRACE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv[1:]) == 0
    assert out.getvalue() == output, f"re-run `{command}` and paste its output into the docs"


@pytest.mark.parametrize("page", PLUGIN_PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
