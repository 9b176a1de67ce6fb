import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "specs" / "gemma-3-27b.json"
BASE = ("--specs", EXAMPLE, "--memory", "40GiB", "--max-model-len", "32768")


def test_compare_shows_every_policy_with_different_figures(run_cli):
    status, out, err = run_cli("compare", *BASE, "--json")
    assert status == 0, err
    rows = {c["policy"]: c for c in json.loads(out)["candidates"]}
    assert set(rows) >= {"uniform", "shared_buffer"}
    # uniform cannot plan a hybrid model: the row says why
    assert rows["uniform"]["plan"] is None and "cannot plan" in rows["uniform"]["error"]
    assert rows["shared_buffer"]["efficiency"] > 0.99


def test_each_row_equals_what_plan_reports(run_cli):
    status, out, _ = run_cli(
        "compare", *BASE, "--block-sizes", "16,32", "--policies", "shared_buffer", "--json"
    )
    assert status == 0
    candidates = json.loads(out)["candidates"]
    assert [c["block_size"] for c in candidates] == [16, 32]
    figures = {c["block_size"]: (c["max_concurrency"], c["groups"]) for c in candidates}
    assert figures[16] != figures[32]
    for block in (16, 32):
        status, out, _ = run_cli("plan", *BASE, "--block-size", block, "--policy", "shared_buffer", "--json")
        plan = json.loads(out)
        assert (plan["max_concurrency"], len(plan["groups"])) == figures[block]


def test_kv_dtypes_are_compared(run_cli):
    status, out, _ = run_cli("compare", *BASE, "--kv-cache-dtypes", "auto,fp8", "--json")
    assert status == 0
    shared = [c for c in json.loads(out)["candidates"] if c["policy"] == "shared_buffer"]
    auto, fp8 = shared
    assert fp8["kv_cache_dtype"] == "float8_e4m3fn" and auto["kv_cache_dtype"] is None
    assert fp8["max_concurrency"] == pytest.approx(2 * auto["max_concurrency"], rel=0.01)


def test_table_output(run_cli):
    status, out, _ = run_cli("compare", *BASE)
    assert status == 0
    assert "shared_buffer" in out and "uniform" in out and "efficiency" in out


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--block-sizes", "16,x", "expected a whole number, got 'x'"),
        ("--block-sizes", "16,,32", "empty value in '16,,32'"),
        ("--kv-cache-dtypes", "fp9", "fp9"),
        ("--kv-cache-dtypes", "auto,", "empty value"),
        ("--policies", "shared_buffer,,uniform", "empty value"),
        ("--state-cache-modes", "none,some", "expected a state cache mode (none, align, all), got 'some'"),
    ],
)
def test_bad_lists_are_usage_errors(run_cli, flag, value, words):
    with pytest.raises(SystemExit) as info:
        run_cli("compare", *BASE, flag, value)
    assert info.value.code == 2
    assert words in run_cli.capsys.readouterr().err


def test_a_bundled_hybrid_shows_two_policies_each_as_plan_reports_it(run_cli):
    model = ("--model", "google/gemma-3-27b-it", "--memory", "80GiB", "--max-model-len", "32768")
    status, out, err = run_cli("compare", *model, "--json")
    assert status == 0, err
    planned = {c["policy"]: c for c in json.loads(out)["candidates"] if c["plan"] is not None}
    assert {"shared_buffer", "equal_groups"} <= set(planned)
    figures = {name: (c["max_concurrency"], c["groups"]) for name, c in planned.items()}
    assert figures["shared_buffer"] != figures["equal_groups"]
    for name, (concurrency, groups) in figures.items():
        status, out, _ = run_cli("plan", *model, "--policy", name, "--json")
        plan = json.loads(out)
        assert (plan["max_concurrency"], len(plan["groups"])) == (concurrency, groups)


def test_no_plan_reasons_name_the_command_line_flags(run_cli):
    status, out, err = run_cli(
        "compare", "--model", "google/gemma-3-27b-it", "--memory", "1GiB", "--max-model-len", "32768",
        "--json",
    )
    assert status == 1 and "no policy could plan" in err
    reasons = [c["error"] for c in json.loads(out)["candidates"] if c["policy"] == "shared_buffer"]
    assert reasons and "lower --max-model-len to" in reasons[0] and "(--memory" in reasons[0]
    assert "available_bytes" not in reasons[0]
