"""The example third-party package, found only through its entry points once pip-installed.

CI installs it (``pip install -e examples/kvcore-example-quantized``); without it these tests skip.
"""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvcore
from kvcore import Registry
from kvcore.cli import main

EXAMPLE = Path(__file__).parents[2] / "examples" / "kvcore-example-quantized"
SPEC_FILE = EXAMPLE / "specs" / "llama-3.1-8b-int8.json"
GEMMA = Path(__file__).parents[2] / "examples" / "specs" / "gemma-3-27b.json"

ENTRY_POINTS = {ep.name: ep for ep in importlib.metadata.entry_points(group="kvcore")}
pytestmark = pytest.mark.skipif(
    "example_quantized" not in ENTRY_POINTS,
    reason="kvcore-example-quantized is not installed; run pip install -e examples/kvcore-example-quantized",
)


@pytest.fixture(autouse=True)
def autoload_on(monkeypatch):
    for name in ("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "KVCORE_BLOCK_PLUGINS", "KVCORE_TRACE_PLUGINS"):
        monkeypatch.delenv(name, raising=False)


def test_found_through_its_entry_points_only():
    # nothing in kvcore names the package or its kind: the entry points are the only way in
    core = Path(kvcore.__file__).parent
    assert [p for p in core.rglob("*.py") if "example_quantized" in p.read_text(encoding="utf-8")] == []
    registry = Registry.default()
    kind = {e.name: e for e in registry.kind_entries()}["example.quantized_kv"]
    policy = {e.name: e for e in registry.policy_entries()}["example.separate_regions"]
    assert kind.origin.source == policy.origin.source == "entry point"
    assert (kind.origin.name, policy.origin.name) == ("example_quantized", "example_separate_regions")
    assert kind.origin.distribution == "kvcore-example-quantized"
    assert kind.qualname == "kvcore_example_quantized.quantized:QuantizedKVSpec"
    assert "example.quantized_kv" not in Registry.default(autoload=False).kinds


def test_kvcore_plugins_shows_it(tmp_path):
    # a real process, started outside the checkout, as a user runs it
    result = subprocess.run(
        [sys.executable, "-m", "kvcore", "plugins"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    version = importlib.metadata.version("kvcore-example-quantized")
    rows = [line.split() for line in result.stdout.splitlines()]
    kind_row = ["example.quantized_kv", "kvcore_example_quantized.quantized:QuantizedKVSpec"]
    assert [*kind_row, "kvcore-example-quantized"] in [row[:3] for row in rows]
    plugin_row = ["example_quantized", "entry", "point", "kvcore-example-quantized", version]
    assert plugin_row in [row[:5] for row in rows]


def test_kvcore_plan_with_its_kind_end_to_end(capsys):
    args = ["plan", "--specs", str(SPEC_FILE), "--memory", "24GiB", "--max-model-len", "8192"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "example.quantized_kv      32     16  32.50 KiB         512      387,152" in out
    assert "24,197 x 1.02 MiB = 24.00 GiB" in out
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["groups"][0]["scale_dtype"] == "float16"
    assert report["num_blocks"] == 24 * 2**30 // (32 * 33280)


def test_its_policy_is_a_baseline_for_shared_buffer(capsys):
    def efficiency(policy):
        argv = ["plan", "--specs", str(GEMMA), "--memory", "40GiB", "--max-model-len", "32768"]
        assert main([*argv, "--policy", policy, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["efficiency"]

    baseline, shared = efficiency("example.separate_regions"), efficiency("shared_buffer")
    # 52 sliding + 10 full layers: every block id pays for 62 pages but one request uses
    # 193 sliding and 2048 full blocks, so most pages idle
    assert baseline == pytest.approx(0.2196, abs=5e-4)
    assert shared > 0.99


def test_blocking_its_entry_point_makes_its_kind_unknown(capsys):
    argv = ["plan", "--specs", str(SPEC_FILE), "--memory", "24GiB", "--max-model-len", "8192"]
    assert main(["--block-plugin", "example_quantized", *argv]) == 1
    err = capsys.readouterr().err
    assert "unknown spec kind 'example.quantized_kv'" in err and err.count("\n") == 1


def test_its_baseline_is_compared_only_when_named(capsys):
    """The README's test command installs this package; its baseline policy must not join every
    compare, simulate and tune of the environment (issue 38): it runs where --policies names it,
    and --help names it apart, with its package."""
    argv = ["compare", "--specs", str(GEMMA), "--memory", "16GiB", "--max-model-len", "8192", "--json"]
    assert main(argv) == 0
    compared = {c["policy"] for c in json.loads(capsys.readouterr().out)["candidates"]}
    assert "example.separate_regions" not in compared and "shared_buffer" in compared
    assert main([*argv, "--policies", "example.separate_regions,shared_buffer"]) == 0
    compared = [c["policy"] for c in json.loads(capsys.readouterr().out)["candidates"]]
    assert compared == ["example.separate_regions", "shared_buffer"]
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse wraps at hyphens
    assert "compared when named: example.separate_regions (from kvcore-example-quantized)" in text
