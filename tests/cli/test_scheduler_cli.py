"""``--scheduler`` and vLLM's settings on ``kvcore simulate`` and ``kvcore compare --workload``."""

import json
from pathlib import Path

from kvcore.cli.scheduler_options import VLLM_MAX_NUM_SEQS
from kvcore.simulation.profiles import vllm

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
