"""``kvcore simulate --prefix-caching`` and ``--prefix-share/--prefix-len``: the hit column,
the JSON figures, and the errors."""

import json

import pytest

from tests.cli.test_simulate_cli import SMALL

SHARED = (
    "--requests",
    "60",
    "--prompt-len",
    "uniform:64:512",
    "--output-len",
    "lognormal:64:0.5",
    "--prefix-share",
    "0.8",
    "--prefix-len",
    "1024",
    "--rate",
    "2",
)


def test_the_table_gains_a_prefix_hits_column(run_cli):
    status, out, err = run_cli("simulate", *SMALL, *SHARED, "--policies", "shared_buffer", "--prefix-caching")
    assert status == 0, err
    lines = out.splitlines()
    assert "0.8 share a 1024-token prefix" in lines[0]
    assert "prefix caching on" in lines[2]
    assert lines[3].split()[-2:] == ["prefix", "hits"]
    assert lines[5].split()[-1].endswith("%") and lines[5].split()[-1] != "0.0%"


def test_json_reports_what_caching_bought(run_cli):
    runs = {}
    for flag in ((), ("--prefix-caching",)):
        status, out, err = run_cli(
            "simulate", *SMALL, *SHARED, "--policies", "shared_buffer", "--json", *flag
        )
        assert status == 0, err
        runs[bool(flag)] = json.loads(out)["candidates"][0]["simulation"]
    on, off = runs[True], runs[False]
    assert on["prefix_caching"] and not off["prefix_caching"]
    assert on["cached_tokens"] > 0 and 0 < on["prefix_hit_rate"] < 1 and off["cached_tokens"] == 0
    assert on["steps"] < off["steps"] and on["served_tokens_per_step"] > off["served_tokens_per_step"]


def test_compare_ranks_with_prefix_caching_too(run_cli):
    status, _, err = run_cli(
        "compare", *SMALL, "--workload", "/dev/null", "--prefix-caching", "--policies", "shared_buffer"
    )
    assert status == 1 and "the trace has no requests" in err
    status, _, err = run_cli("compare", *SMALL, *SHARED, "--prefix-caching", "--policies", "shared_buffer")
    assert status == 0, err


def test_prefix_share_and_len_go_together(run_cli):
    status, _, err = run_cli("simulate", *SMALL, *SHARED[:-6], "--prefix-share", "0.5")
    assert status == 1 and "--prefix-share and --prefix-len go together" in err
    with pytest.raises(SystemExit) as info:
        run_cli("simulate", *SMALL, *SHARED[:-6], "--prefix-share", "2", "--prefix-len", "9")
    assert info.value.code == 2 and "expected a number from 0 to 1" in run_cli.capsys.readouterr().err
