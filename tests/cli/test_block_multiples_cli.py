"""``--block-multiples`` on plan."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import full_entry, sliding_entry


def _layers():
    # pages in a 3:2 ratio: 10 sliding layers of 3 KV heads, 2 full layers of 2
    layers = {f"layers.{i}": sliding_entry(1024, num_kv_heads=3) for i in range(10)}
    layers.update({f"layers.{i}": full_entry(num_kv_heads=2) for i in (10, 11)})
    return layers


def test_any_multiple_is_recorded_and_used(run_cli, spec_file):
    path = spec_file(_layers())
    args = ("plan", "--specs", path, "--memory", "40GiB", "--max-model-len", "32768", "--json")
    status, out, err = run_cli(*args, "--block-multiples", "any")
    assert status == 0, err
    data = json.loads(out)
    assert data["options"]["block_multiples"] == "any"
    assert any(g["block_size"] % 16 == 0 and g["block_size"] & (g["block_size"] - 1) for g in data["groups"])
    status, out, _ = run_cli(*args)
    assert status == 0 and "options" not in json.loads(out)


def test_an_unknown_value_is_a_usage_error(run_cli, spec_file):
    with pytest.raises(SystemExit) as info:
        run_cli("plan", "--specs", spec_file(_layers()), "--memory", "1GiB", "--block-multiples", "odd")
    assert info.value.code == 2
    assert "--block-multiples: invalid choice: 'odd'" in run_cli.capsys.readouterr().err
