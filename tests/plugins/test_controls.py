"""Plugin controls: autoloading off, blocking by name, tracing; as environment switches and as
CLI flags. Entry points come from a real distribution written to a folder on ``sys.path``."""

import json
import sys

import pytest

from kvcore import PluginFailedWarning, PluginLoadError, PluginValidationError, Registry, hookimpl
from kvcore.cli import main
from kvcore.planning.manager import trace_hook_calls
from tests.helpers import full
from tests.plugins.conftest import RING_PLUGIN

SWITCHES = (
    "KVCORE_DISABLE_PLUGIN_AUTOLOAD",
    "KVCORE_BLOCK_PLUGINS",
    "KVCORE_TRACE_PLUGINS",
    "KVCORE_STRICT_PLUGINS",
)


@pytest.fixture(autouse=True)
def no_switches(monkeypatch):
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)


def test_entry_points_load_by_default(install):
    install()
    entry = {e.name: e for e in Registry.default().kind_entries()}["acme.ring"]
    assert (entry.origin.source, entry.origin.name) == ("entry point", "acme")
    assert (entry.origin.distribution, entry.origin.version) == ("acme-kv-acme", "1.0")


@pytest.mark.parametrize("value", ["1", "true", "yes", "on"])
def test_disable_autoload_from_environment(install, monkeypatch, value):
    install()
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", value)
    registry = Registry.default()
    assert "acme.ring" not in registry.kinds
    assert "full_attention" in registry.kinds  # built-ins are not entry points


@pytest.mark.parametrize("value", ["", "0", "false", "no"])
def test_autoload_stays_on_for_false_values(install, monkeypatch, value):
    install()
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", value)
    assert "acme.ring" in Registry.default().kinds


def test_an_explicit_autoload_argument_beats_the_environment(install, monkeypatch):
    install()
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert "acme.ring" in Registry.default(autoload=True).kinds
    monkeypatch.delenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD")
    assert "acme.ring" not in Registry.default(autoload=False).kinds


def test_block_entry_points_and_builtins_from_environment(install, monkeypatch):
    install()
    monkeypatch.setenv("KVCORE_BLOCK_PLUGINS", " acme , kvcore.plugins.mla,")
    registry = Registry.default()
    assert not {"acme.ring", "mla"} & set(registry.kinds)
    assert not registry.pm.has_plugin("acme")


def test_block_argument_adds_to_the_environment(install, monkeypatch):
    install()
    monkeypatch.setenv("KVCORE_BLOCK_PLUGINS", "kvcore.plugins.mla")
    registry = Registry.default(block=["acme"])
    assert not {"acme.ring", "mla"} & set(registry.kinds)


def test_a_broken_entry_point_is_named_and_can_be_blocked(install):
    install("broken", "raise ImportError('no module named acme_native')\n")
    with pytest.raises(PluginLoadError) as info:
        Registry.default(strict=True)
    message = str(info.value)
    assert "kvcore plugin 'broken'" in message
    assert "of distribution acme-kv-broken 1.0" in message
    assert "ImportError: no module named acme_native" in message
    assert "KVCORE_BLOCK_PLUGINS=broken" in message
    assert isinstance(info.value.__cause__, ImportError)
    assert "full_attention" in Registry.default(block=["broken"], strict=True).kinds


def test_a_broken_entry_point_leaves_the_rest_loaded(install):
    install()  # a healthy plugin beside the broken one still loads
    install("broken", "raise ImportError('no module named acme_native')\n")
    with pytest.warns(PluginFailedWarning, match=r"kvcore plugin 'broken'.*acme-kv-broken 1.0") as caught:
        registry = Registry.default()
    assert len(caught) == 1
    assert {"full_attention", "acme.ring"} <= set(registry.kinds)
    (failure,) = registry.pm.failures
    assert (failure.origin.name, failure.stage) == ("broken", "import")
    assert "no module named acme_native" in failure.error
    assert failure.remedy == "fix it or uninstall acme-kv-broken, or skip it with KVCORE_BLOCK_PLUGINS=broken"
    assert not registry.pm.has_plugin("broken")


def test_strictness_from_the_environment(install, monkeypatch):
    install("broken", "raise RuntimeError('boom at import')\n")
    monkeypatch.setenv("KVCORE_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="RuntimeError: boom at import"):
        Registry.default()
    with pytest.warns(PluginFailedWarning):
        Registry.default(strict=False)  # the argument beats the environment


HALF_BROKEN = """
import attrs
from kvcore import KVCacheSpec, hookimpl


@attrs.frozen(kw_only=True)
class HalfSpec(KVCacheSpec):
    kind = "acme.half"

    @property
    def page_size_bytes(self):
        return self.block_size * 4


@hookimpl
def kvcore_register_spec_kinds(register):
    register(HalfSpec)


@hookimpl
def kvcore_register_policies(register):
    raise RuntimeError("policy table missing")
"""


def test_a_plugin_failing_in_a_later_hook_is_dropped_whole(install):
    install("half", HALF_BROKEN)
    with pytest.warns(PluginFailedWarning, match="failed in kvcore_register_policies: RuntimeError"):
        registry = Registry.default()
    assert "acme.half" not in registry.kinds  # registered in the first hook, dropped with the plugin
    assert [f.stage for f in registry.pm.failures] == ["registration"]
    with pytest.raises(PluginLoadError, match="policy table missing"):
        Registry.default(strict=True)


def test_a_plugin_with_an_unknown_hook_is_skipped(install):
    install(
        "typo",
        "from kvcore import hookimpl\n\n@hookimpl\ndef kvcore_register_spec_kind(register):\n    pass\n",
    )
    with pytest.warns(PluginFailedWarning, match="implements a hook kvcore does not have"):
        registry = Registry.default()
    assert [(f.origin.name, f.stage) for f in registry.pm.failures] == [("typo", "hooks")]
    with pytest.raises(PluginValidationError):
        Registry.default(strict=True)


def test_a_duplicate_kind_from_an_entry_point_is_skipped(install):
    install("dup", RING_PLUGIN.replace('"acme.ring"', '"full_attention"'))
    with pytest.warns(PluginFailedWarning, match="registered twice"):
        registry = Registry.default()
    assert registry.kinds["full_attention"].__module__ == "kvcore.plugins.full_attention"


def test_plugins_check_reports_health(install, capsys):
    install()
    assert main(["plugins", "--check"]) == 0
    out = capsys.readouterr().out
    assert "acme-kv-acme 1.0" in out and "FAILED" not in out
    install("broken", "raise ImportError('no module named acme_native')\n")
    assert main(["plugins", "--check"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("kvcore: warning: kvcore plugin 'broken'")
    assert "FAILED (import)" in captured.out
    assert (
        "fix: fix it or uninstall acme-kv-broken, or skip it with KVCORE_BLOCK_PLUGINS=broken" in captured.out
    )
    assert main(["plugins", "--check", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["failed"] == 1
    assert {row["name"]: row["status"] for row in data["plugins"]}["broken"] == "failed"
    assert main(["--block-plugin", "broken", "plugins", "--check"]) == 0


def test_a_command_still_runs_beside_a_broken_plugin(install, capsys):
    install("broken", "raise ImportError('no module named acme_native')\n")
    assert (
        main(["plan", "--model", "meta-llama/Llama-3.1-8B", "--memory", "1GiB", "--max-model-len", "1024"])
        == 0
    )
    captured = capsys.readouterr()
    assert "kvcore: warning: kvcore plugin 'broken'" in captured.err
    assert "max concurrency" in captured.out


def test_trace_reports_each_call_its_plugins_and_result(monkeypatch, capsys):
    monkeypatch.setenv("KVCORE_TRACE_PLUGINS", "1")
    registry = Registry.default(autoload=False)
    registry.cache_layout(full(block_size=4, heads=2, head_size=8))
    lines = capsys.readouterr().err.splitlines()
    assert (
        "kvcore trace: kvcore_register_spec_kinds(register=<function>) -> kvcore.plugins.full_attention"
        in lines
    )
    assert "kvcore trace: kvcore_register_spec_kinds returned []" in lines
    call = next(line for line in lines if line.startswith("kvcore trace: kvcore_cache_layout(spec="))
    # every layout implementation, in call order: the built-ins are trylast, attention answers
    assert call.endswith("kvcore.plugins.attention") or "kvcore.plugins.attention," in call
    assert any(line.startswith("kvcore trace: kvcore_cache_layout returned CacheLayout(") for line in lines)


def test_no_trace_unless_asked(capsys):
    Registry.default(autoload=False)
    assert capsys.readouterr().err == ""


def test_trace_argument_beats_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("KVCORE_TRACE_PLUGINS", "1")
    Registry.default(autoload=False, trace=False)
    assert capsys.readouterr().err == ""


def _listed(out):
    data = json.loads(out)
    return {k["kind"] for k in data["spec_kinds"]}, {p["name"] for p in data["plugins"]}


def test_cli_lists_entry_points_unless_autoload_is_off(install, capsys):
    install()
    assert main(["plugins", "--json"]) == 0
    kinds, plugins = _listed(capsys.readouterr().out)
    assert "acme.ring" in kinds and "acme" in plugins
    assert main(["--no-plugin-autoload", "plugins", "--json"]) == 0
    kinds, plugins = _listed(capsys.readouterr().out)
    assert "acme.ring" not in kinds and "acme" not in plugins


def test_cli_autoload_off_from_environment(install, monkeypatch, capsys):
    install()
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert main(["plugins", "--json"]) == 0
    assert "acme.ring" not in _listed(capsys.readouterr().out)[0]


def test_cli_blocks_plugins_by_name(install, capsys):
    install()
    assert main(["--block-plugin", "acme", "--block-plugin", "kvcore.plugins.mla", "plugins", "--json"]) == 0
    kinds, plugins = _listed(capsys.readouterr().out)
    assert not {"acme.ring", "mla"} & kinds
    assert not {"acme", "kvcore.plugins.mla"} & plugins


def test_cli_trace_goes_to_stderr_and_leaves_json_intact(capsys):
    assert main(["--no-plugin-autoload", "--trace-plugins", "plugins", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "full_attention" in _listed(out)[0]
    assert "kvcore trace: kvcore_register_policies(register=<function>) -> kvcore.policies.uniform" in err


def test_cli_broken_plugin_is_one_line_and_blocking_it_recovers(install, capsys, monkeypatch):
    install("broken", "raise ImportError('no module named acme_native')\n")
    assert main(["plugins"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcore: warning: kvcore plugin 'broken'")
    monkeypatch.setenv("KVCORE_STRICT_PLUGINS", "1")
    assert main(["plugins"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvcore: error: kvcore plugin 'broken'")
    assert main(["--block-plugin", "broken", "plugins"]) == 0
    assert capsys.readouterr().err == ""


def test_trace_reports_a_raising_hook_and_stops_when_asked(make_kvcore_registry):
    class Broken:
        @hookimpl
        def kvcore_cache_layout(self, spec):
            raise ValueError("no layout for you")

    registry = make_kvcore_registry(Broken())
    lines = []
    stop = trace_hook_calls(registry.pm, lines.append)
    with pytest.raises(ValueError, match="no layout for you"):
        registry.cache_layout(full())
    assert lines[-1] == "kvcore trace: kvcore_cache_layout raised ValueError: no layout for you\n"
    assert "-> tests.plugins.test_controls:" in lines[0]  # the inline plugin, asked first
    stop()
    with pytest.raises(ValueError):
        registry.cache_layout(full())
    assert len(lines) == 2


def test_plugins_check_names_the_api_a_plugin_was_written_for(install, capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "kvcore.plugins.models.common", raising=False)
    install("old", "from kvcore.plugins.models.common import ConfigFields\n")  # 0.1's kit, removed in 0.3
    install()
    assert main(["plugins", "--check", "--json"]) == 1
    out, err = capsys.readouterr()
    rows = {row["name"]: row for row in json.loads(out)["plugins"]}
    assert "kvcore: warning: kvcore plugin 'old'" in err
    assert rows["old"]["status"] == "failed" and "use kvcore.plugins.models.kit" in rows["old"]["error"]
    assert rows["acme"]["api"] == "0.2" and rows["acme"]["deprecated"] == []
    assert rows["kvcore.plugins.mla"]["api"] == "0.2"
