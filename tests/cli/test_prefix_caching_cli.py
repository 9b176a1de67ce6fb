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
    assert lines[2].startswith("plans: ")
    assert "prefix caching on" in lines[3]
    assert lines[4].split()[-2:] == ["prefix", "hits"]
    assert lines[6].split()[-1].endswith("%") and lines[6].split()[-1] != "0.0%"


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
        "compare", *SMALL, "--trace", "/dev/null", "--prefix-caching", "--policies", "shared_buffer"
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


# -- hybrids: hits per group kind, and the block size's trade ------------------------------------

HYBRID = (
    "--memory",
    "8GiB",
    "--max-model-len",
    "8192",
    "--trace",
    "examples/traces/chat-system-prompts.jsonl",
    "--prefix-caching",
    "--scheduler",
    "kvcore",
    "--policies",
    "shared_buffer",
)


def test_simulate_reports_hits_per_group_kind_on_a_hybrid(run_cli):
    status, out, err = run_cli(
        "simulate", "--model", "ai21labs/AI21-Jamba-1.5-Mini", "--state-cache-mode", "align", *HYBRID
    )
    assert status == 0, err
    lines = out.splitlines()
    at = lines.index(
        "prefix hits by group kind (lookups whose hit used the kind's cached pages, and the pages):"
    )
    assert lines[at + 1].startswith("  shared_buffer: state ") and "full_attention" in lines[at + 1]
    status, out, err = run_cli(
        "simulate",
        "--model",
        "ai21labs/AI21-Jamba-1.5-Mini",
        "--state-cache-mode",
        "align",
        *HYBRID,
        "--json",
    )
    by_kind = json.loads(out)["candidates"][0]["simulation"]["prefix_hits_by_kind"]
    assert set(by_kind) == {"state", "full_attention"}
    assert by_kind["state"]["hits"] == by_kind["state"]["pages"] > 0  # one checkpoint a hit


def test_a_hybrid_hits_its_states_with_the_default_vllm_profile(run_cli):
    """Jamba under the default ``vllm`` profile with prefix caching and states kept at block
    boundaries: vLLM 0.33 caches Mamba states in ``mamba_cache_mode='align'``, so requests that
    share a system prompt hit it (the profile used to hit nothing on a plan with state groups)."""
    default = [arg for arg in HYBRID if arg not in ("--scheduler", "kvcore")]
    status, out, err = run_cli(
        "simulate",
        "--model",
        "ai21labs/AI21-Jamba-1.5-Mini",
        "--state-cache-mode",
        "align",
        *default,
        "--json",
    )
    assert status == 0, err
    payload = json.loads(out)
    assert payload["scheduler"]["name"] == "vllm"
    simulation = payload["candidates"][0]["simulation"]
    assert simulation["prefix_caching"] and simulation["cached_tokens"] > 0
    assert 0 < simulation["prefix_hit_rate"] < 1


def test_without_checkpoints_a_state_model_reports_no_kind(run_cli):
    status, out, err = run_cli("simulate", "--model", "ai21labs/AI21-Jamba-1.5-Mini", *HYBRID, "--json")
    assert status == 0, err
    simulation = json.loads(out)["candidates"][0]["simulation"]
    assert not simulation["prefix_caching"] and "prefix_hits_by_kind" not in simulation


def test_compare_shows_the_block_size_trade_of_hits(run_cli):
    status, out, err = run_cli(
        "compare",
        "--model",
        "ai21labs/AI21-Jamba-1.5-Mini",
        "--state-cache-mode",
        "align",
        *HYBRID,
        "--block-sizes",
        "16,256,1024",
    )
    assert status == 0, err
    header = next(line for line in out.splitlines() if line.lstrip().startswith("policy"))
    assert header.split()[-4:] == ["hit", "unit", "prefix", "hits"]
    rows = {
        line.split()[1]: line.split()
        for line in out.splitlines()
        if line.lstrip().startswith("shared_buffer")
    }
    assert [rows[b][-2] for b in ("16", "256", "1024")] == ["16", "256", "1024"]
    rates = [float(rows[b][-1].rstrip("%")) for b in ("16", "256", "1024")]
    assert rates[0] > rates[1] > rates[2] > 0  # coarser blocks hit less of each shared prompt
