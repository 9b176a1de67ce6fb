"""Installed, the package is found through its entry points alone, and the CLI plans its kind."""

import json
from pathlib import Path

from kvcore import Registry
from kvcore.cli import main

SPEC_FILE = Path(__file__).parent.parent / "specs" / "llama-3.1-8b-int8.json"


def test_entry_points_register_the_kind_and_the_policy():
    registry = Registry.default(autoload=True)
    kinds = {e.name: e for e in registry.kind_entries()}
    policies = {e.name: e for e in registry.policy_entries()}
    assert kinds["example.quantized_kv"].origin.source == "entry point"
    assert kinds["example.quantized_kv"].origin.distribution == "kvcore-example-quantized"
    assert policies["example.separate_regions"].origin.name == "example_separate_regions"


def test_kvcore_plan_reads_the_example_spec_file(capsys):
    status = main(
        ["plan", "--specs", str(SPEC_FILE), "--memory", "24GiB", "--max-model-len", "8192", "--json"]
    )
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == "uniform"  # every layer has the same spec
    assert report["groups"][0]["kind"] == "example.quantized_kv"
    assert report["groups"][0]["page_size_bytes"] == 33280
    assert report["num_blocks"] == 24 * 2**30 // (32 * 33280) == 24197
