"""``--uniform-block-size`` and ``--max-groups`` on plan, compare and allocate."""

from __future__ import annotations

import json

import pytest

GEMMA = ("--model", "google/gemma-3-27b-it", "--memory", "80GiB", "--max-model-len", "32768")


def test_plan_json_records_the_options_given_and_keeps_them_within_bounds(run_cli):
    status, out, err = run_cli("plan", *GEMMA, "--json", "--uniform-block-size", "--max-groups", "8")
    assert status == 0, err
    data = json.loads(out)
    assert data["options"]["uniform_block_size"] is True and data["options"]["max_groups"] == 8
    assert len(data["groups"]) <= 8
    assert len({g["block_size"] for g in data["groups"]}) == 1


def test_plan_json_without_options_has_no_options_key(run_cli):
    status, out, _ = run_cli("plan", *GEMMA, "--json")
    assert status == 0 and "options" not in json.loads(out)


def test_too_few_groups_is_one_error_line_with_the_flag(run_cli):
    status, out, err = run_cli("plan", *GEMMA, "--max-groups", "1")
    assert status == 1 and out == ""
    assert err.strip().splitlines() == [
        "kvcore: error: policy 'shared_buffer' cannot plan these layers in at most 1 group (--max-groups 1): "
        "its fewest is 2 groups (one per retention kind at least); raise --max-groups to 2 or more"
    ]


def test_compare_lists_each_policy_within_the_bound(run_cli):
    status, out, err = run_cli("compare", *GEMMA, "--max-groups", "2")
    assert status == 0, err
    rows = [
        line.split() for line in out.splitlines() if line.startswith(("  shared_buffer", "  equal_groups"))
    ]
    assert rows and all(int(row[5]) <= 2 for row in rows)


def test_allocate_takes_the_flags(run_cli, spec_file):
    from tests.cli.conftest import full_entry, sliding_entry

    layers = {f"layers.{i}": full_entry() if i % 3 == 2 else sliding_entry(128) for i in range(7)}
    status, out, err = run_cli(
        "allocate",
        "--specs",
        spec_file(layers),
        "--device",
        "cpu",
        "--memory",
        "32MiB",
        "--max-model-len",
        "256",
        "--uniform-block-size",
        "--max-groups",
        "2",
    )
    assert status == 0, err
    assert "2 groups" in out


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_a_bad_group_bound_is_a_usage_error(run_cli, bad):
    with pytest.raises(SystemExit) as caught:
        run_cli("plan", *GEMMA, "--max-groups", bad)
    assert caught.value.code == 2


def test_a_saved_plan_refuses_the_options(run_cli, spec_file, tmp_path):
    from tests.cli.conftest import full_entry

    layers = {f"layers.{i}": full_entry() for i in range(2)}
    status, out, _ = run_cli(
        "plan", "--specs", spec_file(layers), "--memory", "8MiB", "--max-model-len", "256", "--json"
    )
    assert status == 0
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    for flags in (["--max-groups", "2"], ["--uniform-block-size"], ["--block-multiples", "any"]):
        status, _, err = run_cli("allocate", "--plan", saved, "--device", "cpu", *flags)
        assert status == 1 and f"{flags[0]} cannot be combined with --plan" in err
