"""``--scheduler`` and vLLM's settings on ``kvcore simulate`` and ``kvcore compare --workload``."""

import json
from pathlib import Path

from kvcore.cli.scheduler_options import VLLM_MAX_NUM_SEQS
from kvcore.simulation.profiles import vllm
from tests.cli.test_inputs_hardening import error_line

ROOT = Path(__file__).parents[2]
GEMMA = ROOT / "examples" / "specs" / "gemma-3-27b.json"
SMALL = ("--specs", GEMMA, "--memory", "2GiB", "--max-model-len", "4096", "--policies", "shared_buffer")
SYNTHETIC = ("--requests", "60", "--prompt-len", "uniform:64:512", "--output-len", "lognormal:64:0.5")


def test_the_default_is_vllm_and_the_json_names_it(run_cli):
    status, out, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["scheduler"]["name"] == "vllm"
    assert payload["scheduler"]["settings"]["max_num_seqs"] == vllm.VLLM_MAX_NUM_SEQS == VLLM_MAX_NUM_SEQS
    simulation = payload["candidates"][0]["simulation"]
    assert simulation["scheduler"] == "vllm"
    assert simulation["scheduler_settings"]["async_scheduling"] is True


def test_vllms_settings_reach_the_profile(run_cli):
    status, out, err = run_cli(
        "simulate",
        *SMALL,
        *SYNTHETIC,
        "--json",
        "--sync-scheduling",
        "--max-num-seqs",
        "4",
        "--no-reserve-full-isl",
    )
    assert status == 0, err
    simulation = json.loads(out)["candidates"][0]["simulation"]
    assert simulation["peak_running"] <= 4
    assert simulation["scheduler_settings"] == {
        "async_scheduling": False,
        "max_num_seqs": 4,
        "scheduler_reserve_full_isl": False,
        "long_prefill_token_threshold": 0,
        "prefix_cache_retention_interval": 0,
    }


def test_the_retention_interval_reaches_the_profile(run_cli):
    """``--prefix-cache-retention-interval``: vLLM's default 0, a number, or ``dense`` (vLLM's
    ``None``), in the settings the JSON reports; with shared prefixes cached, dense retention
    hits another count of them on Gemma-3's sliding windows than vLLM's default."""
    hits = {}
    for given, expected in ((None, 0), ("1024", 1024), ("dense", None)):
        flag = () if given is None else ("--prefix-cache-retention-interval", given)
        status, out, err = run_cli(
            "simulate", *SMALL, *SYNTHETIC, "--prefix-share", "1", "--prefix-len", "256",
            "--prefix-caching", "--json", *flag,
        )  # fmt: skip
        assert status == 0, err
        simulation = json.loads(out)["candidates"][0]["simulation"]
        assert simulation["scheduler_settings"]["prefix_cache_retention_interval"] == expected
        hits[given] = simulation["cached_tokens"]
    assert hits["dense"] != hits[None]  # the setting moves the hits (here dense evicts more)


def test_a_retention_interval_vllm_refuses_is_a_one_line_error(run_cli):
    last = error_line(
        run_cli, "simulate", *SMALL, *SYNTHETIC, "--prefix-cache-retention-interval", "-4", status=2
    )
    assert last.endswith("expected a number >= 1, got -4 (or 0, or dense)")
    status, _, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--prefix-cache-retention-interval", "40")
    assert (
        status == 1 and "prefix_cache_retention_interval 40 is not a multiple of the scheduler's block" in err
    )
    assert len(err.strip().splitlines()) == 1, err


def test_kvcores_own_rules_by_name(run_cli):
    status, out, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--scheduler", "kvcore")
    assert status == 0, err
    assert out.splitlines()[0].endswith("; scheduler kvcore")
    status, out, err = run_cli("compare", *SMALL, *SYNTHETIC, "--scheduler", "kvcore")
    assert status == 0, err
    assert "by the kvcore scheduler" in out


def test_an_unknown_scheduler_and_vllm_settings_elsewhere_are_one_line_errors(run_cli):
    status, _, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--scheduler", "trtllm")
    assert status == 1 and "unknown scheduler 'trtllm'; choose one of vllm, kvcore, sglang" in err
    status, _, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--scheduler", "kvcore", "--max-num-seqs", "8")
    assert status == 1 and "--max-num-seqs: vLLM's settings, for --scheduler vllm only" in err


def test_sglangs_scheduler_by_name_runs_plans_sglang_can_hold(run_cli):
    pools = (*SMALL[:-1], "kind_pools")
    status, out, err = run_cli(
        "simulate", *pools, *SYNTHETIC, "--json", "--scheduler", "sglang", "--prefix-caching"
    )
    assert status == 0, err
    payload = json.loads(out)
    assert payload["scheduler"]["name"] == "sglang"
    settings = payload["candidates"][0]["simulation"]["scheduler_settings"]
    assert settings["page_size"] == 16 and settings["swa_tokens"] > 0 and settings["full_tokens"] > 0
    assert settings["max_running_requests"] >= 1 and settings["chunked_prefill_size"] == 2048
    # the shared buffer puts both kinds in one pool, which SGLang cannot run: one line with the fix
    status, _, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--scheduler", "sglang")
    assert status == 1 and "SGLang has one page size" in err and "kind_pools" in err


def test_the_vllm_reference_takes_vllms_settings_and_gives_its_figures(run_cli):
    """``--scheduler vllm-reference`` (the plain reference) takes vLLM's settings and prints the
    figures of ``vllm`` (the fast path) under its own name."""
    options = (*SMALL, *SYNTHETIC, "--json", "--sync-scheduling", "--max-num-seqs", "8", "--prefix-caching")
    results = {}
    for name in ("vllm", "vllm-reference"):
        status, out, err = run_cli("simulate", *options, "--scheduler", name)
        assert status == 0, err
        payload = json.loads(out)
        assert payload["scheduler"]["name"] == name
        simulation = payload["candidates"][0]["simulation"]
        assert simulation.pop("scheduler") == name
        assert simulation["scheduler_settings"]["max_num_seqs"] == 8
        results[name] = simulation
    assert results["vllm"] == results["vllm-reference"]
