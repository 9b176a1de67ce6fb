"""``kvcore tune``: the report, JSON, plot, engine flags and errors."""

import json
from pathlib import Path

import pytest

from tests.helpers import write_step_profile

ROOT = Path(__file__).parents[2]
GEMMA = ROOT / "examples" / "specs" / "gemma-3-27b.json"
SMALL = ("--specs", GEMMA, "--memory", "2GiB", "--max-model-len", "4096")
SYNTHETIC = ("--requests", "40", "--prompt-len", "uniform:64:1024", "--output-len", "uniform:16:128")
SPACE = (
    "--policies",
    "shared_buffer,kind_pools",
    "--max-num-seqs",
    "8,128",
    "--max-num-batched-tokens",
    "512",
)


def test_the_report_has_the_best_the_effects_the_front_and_both_engines(run_cli):
    status, out, err = run_cli("tune", *SMALL, *SYNTHETIC, *SPACE)
    assert status == 0, err
    assert "objective tokens_per_step" in out
    assert "\nbest: " in out and "what each knob bought alone" in out and "Pareto front" in out
    assert "vLLM 0.33: " in out and "--kv-cache-memory-bytes 2147483648" in out
    assert "SGLang 0.5: " in out and "--page-size" in out and "--max-running-requests" in out
    # no SGLang profile is registered by kvcore itself: said, not stood in for
    assert "under the sglang profile" in out
    assert "tuning on 40 requests: done in" in err  # the progress line (off a terminal: one line)


def test_json_carries_the_best_front_trials_and_flags(run_cli):
    status, out, err = run_cli("tune", *SMALL, *SYNTHETIC, *SPACE, "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["objective"] == "tokens_per_step" and payload["latency_unit"] == "steps"
    best = payload["best"]
    assert best["score"] >= 0.999 * max(t["score"] for t in payload["trials"] if t["score"] is not None)
    assert payload["front"] and all(t["score"] is not None for t in payload["front"])
    assert payload["simulations"] <= len(payload["trials"])
    vllm = payload["engines"]["vllm"]
    assert vllm["flags"]["--max-num-seqs"] == str(best["knobs"]["max_num_seqs"])
    assert vllm["flags"]["--max-num-batched-tokens"] == "512"
    assert "--swa-full-tokens-ratio" in payload["engines"]["sglang"]["flags"]
    assert payload["engines"]["sglang"]["simulation"]["simulated"] is True


def test_plot_writes_an_svg(run_cli, tmp_path):
    path = tmp_path / "tune.svg"
    status, _out, err = run_cli("tune", *SMALL, *SYNTHETIC, *SPACE, "--plot", path)
    assert status == 0, err
    text = path.read_text()
    assert text.startswith("<svg") and "<polyline" in text and "circle" in text


def test_with_a_gpu_the_objective_is_in_seconds(run_cli):
    status, out, err = run_cli(
        "tune",
        "--model",
        "google/gemma-3-27b-it",
        "--memory",
        "4GiB",
        "--max-model-len",
        "4096",
        "--gpu",
        "H100",
        *SYNTHETIC,
        "--rate",
        "4",
        "--policies",
        "shared_buffer",
        "--max-num-seqs",
        "16,64",
        "--max-num-batched-tokens",
        "1024",
        "--slo-ttft",
        "2",
        "--json",
    )
    assert status == 0, err
    payload = json.loads(out)
    assert payload["objective"] == "goodput" and payload["latency_unit"] == "s"
    assert payload["best"]["latency_report"]["slo_ttft"] == 2.0


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--plot", "out.png"), "--plot writes SVG"),
        (("--objective", "throughput"), "is in seconds"),
        (("--policies", "shared_bufer"), "shared_buffer"),
        (("--max-num-seqs", "0"), "--max-num-seqs"),
        (("--max-num-batched-tokens", "8,,16"), "empty value"),
        (("--kv-cache-dtypes", "fp7"), "fp7"),
    ],
)
def test_bad_options_are_refused_with_the_fix(run_cli, extra, words):
    try:
        status, _, err = run_cli("tune", *SMALL, *SYNTHETIC, "--policies", "shared_buffer", *extra)
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
        _out, err = run_cli.capsys.readouterr()
    assert status != 0
    assert words in err and "Traceback" not in err


def test_the_plan_options_hold_for_every_candidate(run_cli):
    # Gemma 3 keeps two retention kinds (sliding and full): no shared_buffer layout fits one group
    space = ("--policies", "shared_buffer", "--max-num-seqs", "8", "--max-num-batched-tokens", "512")
    status, _, err = run_cli("tune", *SMALL, *SYNTHETIC, *space, "--passes", "1")
    assert status == 0, err
    status, _, err = run_cli("tune", *SMALL, *SYNTHETIC, *space, "--passes", "1", "--max-groups", "1")
    assert status == 1 and "in at most 1 group" in err and "its fewest is 2 groups" in err


def test_sglang_s_own_figure_is_said_once(run_cli):
    """A model of one pool: "SGLang's own configurator with these flags: 65,536", not
    "... 65,536 tokens: 65,536" (issue 38)."""
    status, out, err = run_cli(
        "tune", "--model", "meta-llama/Llama-3.2-1B", "--memory", "2GiB", "--max-model-len", "4096",
        *SYNTHETIC, "--policies", "shared_buffer", "--max-num-seqs", "8", "--max-num-batched-tokens", "512",
    )  # fmt: skip
    assert status == 0, err
    (line,) = [line for line in out.splitlines() if "SGLang's own configurator" in line]
    assert line.endswith("SGLang's own configurator with these flags: 65,536"), line


def test_tune_says_when_even_the_best_candidate_is_overloaded(run_cli):
    overloaded = ("--requests", "300", "--prompt-len", "1000", "--output-len", "200", "--rate", "1")
    argv = (
        "tune",
        *SMALL,
        *overloaded,
        "--policies",
        "shared_buffer",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "512",
    )
    status, out, err = run_cli(*argv)
    assert status == 0, err
    (line,) = [line for line in out.splitlines() if "overloaded" in line]
    assert (
        line.startswith("  even the best candidate: overloaded: requests arrive at 0.9")
        and "queue grows" in line
    )
    status, out, err = run_cli(*argv, "--json")
    payload = json.loads(out)
    assert payload["best"]["load"]["overloaded"] is True
    assert payload["workload"]["num_requests"] == 300


def test_tune_takes_vllm_s_spellings(run_cli):
    """``--max-num-seqs`` / ``--max-num-batched-tokens`` as vLLM spells them (issue 38; 0.1's
    ``--num-seqs`` / ``--batched-tokens`` were removed in 0.3, tests/plugins/test_removed_in_0_3.py)."""
    base = ("tune", *SMALL, *SYNTHETIC, "--policies", "shared_buffer", "--passes", "1", "--json")
    status, out, err = run_cli(*base, "--max-num-seqs", "8,16", "--max-num-batched-tokens", "512,1024")
    assert status == 0, err
    assert "deprecated" not in err
    knobs = [t["knobs"] for t in json.loads(out)["trials"]]
    assert {k["max_num_seqs"] for k in knobs} == {8, 16}
    assert {k["max_num_batched_tokens"] for k in knobs} == {512, 1024}
    assert json.loads(out)["default"]["knobs"]["max_num_batched_tokens"] == 512


def test_the_default_candidate_says_where_vllms_batch_defaults_come_from(run_cli):
    """vLLM picks max_num_seqs / max_num_batched_tokens per device (EngineArgs.get_batch_defaults):
    tune names the file and function, and on a GPU what vLLM itself would start with."""
    status, out, err = run_cli("tune", *SMALL, *SYNTHETIC, "--policies", "kind_pools")
    assert status == 0, err
    assert (
        "default candidate: max_num_seqs 128, max_num_batched_tokens 2,048; vllm serve's defaults on CPU: "
        "max_num_seqs 128, max_num_batched_tokens 2,048 (vllm/engine/arg_utils.py, "
        "EngineArgs.get_batch_defaults)"
    ) in out
    status, out, err = run_cli(
        "tune", "--model", "google/gemma-3-27b-it", "--memory", "4GiB", "--max-model-len", "4096",
        "--gpu", "H100", *SYNTHETIC, "--policies", "kind_pools", "--json",
    )  # fmt: skip
    assert status == 0, err
    assert json.loads(out)["vllm_defaults"] == {
        "device": "H100-SXM (80 GiB)",
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
    }


def test_tune_says_when_its_pick_is_timed_beyond_what_the_profile_measured(run_cli, tmp_path):
    profile = write_step_profile(
        tmp_path / "steps.jsonl", prefill=(0, 256, 512), decode=(1, 4, 8), context=(100, 4000)
    )
    status, out, err = run_cli("tune", *SMALL, *SYNTHETIC, *SPACE, "--rate", "20", "--step-profile", profile)
    assert status == 0, err
    # max_num_seqs 8 and 128 are tried: the profile measured up to 8 decoding requests
    assert "  the best candidate: " in out or "  the default: " in out
    assert "lie beyond the steps the profile measured" in out and "(measured 1 to 8)" in out
