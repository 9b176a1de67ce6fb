"""``kvcore simulate --gpu`` / ``--step-profile``: latency percentiles, tokens per second and
goodput in the table and the JSON, the model that made the seconds, and the errors."""

import json
from pathlib import Path

import pytest

from tests.helpers import write_step_profile

ROOT = Path(__file__).parents[2]
GEMMA = ROOT / "examples" / "specs" / "gemma-3-27b.json"
LLAMA = ("--model", "meta-llama/Llama-3.1-8B", "--memory", "4GiB", "--max-model-len", "4096")
SYNTHETIC = ("--requests", "40", "--prompt-len", "uniform:64:512", "--output-len", "lognormal:64:0.5")


def _profile(tmp_path):
    return write_step_profile(tmp_path / "steps.jsonl")


def test_a_gpu_roofline_prints_latency_percentiles_tokens_per_second_and_goodput(run_cli):
    status, out, err = run_cli(
        "simulate",
        *LLAMA,
        *SYNTHETIC,
        "--rate",
        "5",
        "--gpu",
        "H100",
        "--slo-ttft",
        "200ms",
        "--slo-itl",
        "0.02",
    )
    assert status == 0, err
    assert "Poisson 5/s" in out
    assert "time: roofline on H100-SXM, a lower bound" in out
    assert "goodput = requests meeting TTFT 200.0 ms and ITL 20.0 ms" in out
    header = next(line for line in out.splitlines() if "TTFT p50" in line).split()
    for column in ("ITL", "E2E", "p90", "p99", "tok/s", "goodput"):
        assert column in header


def test_the_json_carries_the_latencies_and_the_model_that_made_them(run_cli):
    status, out, err = run_cli(
        "simulate", *LLAMA, *SYNTHETIC, "--rate", "5", "--gpu", "h200", "--tp", "2", "--json"
    )
    assert status == 0, err
    payload = json.loads(out)
    latency = payload["candidates"][0]["simulation"]["latency"]
    assert latency["model"] == "roofline on H200 (tp 2), a lower bound"
    for key in ("ttft", "itl", "e2e"):
        spread = latency[key]
        assert 0 < spread["p50"] <= spread["p90"] <= spread["p99"]
    assert latency["e2e"]["p50"] >= latency["ttft"]["p50"]
    assert latency["output_tokens_per_second"] > 0 and latency["seconds"] > 0
    assert latency["good_requests"] == 40 and latency["slo_ttft"] is None
    assert "timeline" not in payload["candidates"][0]["simulation"]


def test_a_faster_gpu_serves_the_same_steps_in_less_time(run_cli):
    figures = {}
    for gpu in ("A100-40GB", "B200"):
        status, out, err = run_cli("simulate", *LLAMA, *SYNTHETIC, "--gpu", gpu, "--json")
        assert status == 0, err
        sim = json.loads(out)["candidates"][0]["simulation"]
        figures[gpu] = (sim["steps"], sim["latency"]["seconds"])
    assert figures["A100-40GB"][0] == figures["B200"][0]  # all at once: the same steps
    assert figures["B200"][1] < figures["A100-40GB"][1] / 3  # 8 TB/s against 1.55 TB/s


def test_a_measured_profile_times_a_spec_file_run(run_cli, tmp_path):
    path = _profile(tmp_path)
    args = ("--specs", GEMMA, "--memory", "2GiB", "--max-model-len", "4096", *SYNTHETIC)
    status, out, err = run_cli("simulate", *args, "--step-profile", path, "--policies", "auto")
    assert status == 0, err
    assert f"time: measured profile {path} (18 samples, fit within 0.0 %)" in out


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--gpu", "H1000"), "did you mean H100"),
        (("--slo-ttft", "1"), "--slo-ttft need seconds: give --gpu NAME"),
    ],
)
def test_timing_errors_are_one_line_with_the_fix(run_cli, extra, says):
    status, out, err = run_cli("simulate", *LLAMA, *SYNTHETIC, *extra)
    assert status == 1 and out == "" and err.count("\n") == 1
    assert says in err


def test_a_gpu_roofline_needs_a_model_and_a_bad_profile_names_its_line(run_cli, tmp_path):
    args = ("--specs", GEMMA, "--memory", "2GiB", "--max-model-len", "4096", *SYNTHETIC)
    status, _, err = run_cli("simulate", *args, "--gpu", "H100")
    assert status == 1 and "--gpu needs --model" in err and "--step-profile" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prefill_tokens": 1}\n')
    status, _, err = run_cli("simulate", *args, "--step-profile", bad)
    assert status == 1 and f"{bad}:1:" in err


def test_compare_with_a_workload_adds_the_latency_columns_and_json(run_cli):
    args = ("compare", *LLAMA, *SYNTHETIC, "--rate", "5", "--gpu", "H100", "--policies", "auto")
    status, out, err = run_cli(*args, "--slo-itl", "50ms")
    assert status == 0, err
    assert "time: roofline on H100-SXM, a lower bound" in out
    header = next(line for line in out.splitlines() if "TTFT p99" in line)
    assert "ITL p99" in header and "out tok/s" in header and "goodput req/s" in header
    status, out, err = run_cli(*args, "--json")
    assert status == 0, err
    simulation = json.loads(out)["candidates"][0]["simulation"]
    assert simulation["latency"]["ttft"]["p99"] > 0
    status, _, err = run_cli("compare", *LLAMA, "--gpu", "H100")
    assert status == 1 and "give a workload" in err


def test_a_trace_in_seconds_needs_a_step_time_model(run_cli, tmp_path):
    path = tmp_path / "seconds.jsonl"
    path.write_text('{"prompt_tokens": 100, "output_tokens": 10, "arrival_time": 0.5}\n')
    status, _, err = run_cli("simulate", *LLAMA, "--trace", path)
    assert status == 1 and "arrival_time in seconds" in err and "--gpu NAME" in err
    status, out, err = run_cli("simulate", *LLAMA, "--trace", path, "--gpu", "L40S", "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["workload"]["last_arrival_time"] == 0.5
    latency = payload["candidates"][0]["simulation"]["latency"]
    assert latency["model"] == "roofline on L40S, a lower bound"
    assert latency["seconds"] > 0.5  # the request arrives at 0.5 s: the clock jumped there


def test_steps_beyond_what_the_profile_measured_are_named_in_the_table_and_the_json(run_cli, tmp_path):
    narrow = write_step_profile(
        tmp_path / "narrow.jsonl", prefill=(0, 64, 128), decode=(1, 2, 4), context=(100, 2000)
    )
    args = ("simulate", *LLAMA, *SYNTHETIC, "--policies", "uniform", "--step-profile", narrow)
    status, out, err = run_cli(*args)
    assert status == 0, err
    line = next(line for line in out.splitlines() if "beyond the steps the profile measured" in line)
    assert (
        line.startswith("  uniform: ")
        and "decode requests down to 0 and up to" in line
        and "(measured 1 to 4)" in line
    )
    status, out, err = run_cli(*args, "--json")
    assert status == 0, err
    reach = json.loads(out)["candidates"][0]["simulation"]["latency"]["reach"]
    assert 0 < reach["outside"] <= reach["steps"]
    decode = next(t for t in reach["terms"] if t["term"] == "decode_requests")
    assert decode["high"] == 4 and decode["most"] > 4
    # a profile measured over every step the run takes says nothing
    wide = _profile(tmp_path)
    status, out, err = run_cli(
        "simulate", *LLAMA, *SYNTHETIC, "--policies", "uniform", "--step-profile", wide, "--json"
    )
    assert status == 0, err
    reach = json.loads(out)["candidates"][0]["simulation"]["latency"]["reach"]
    assert reach["steps"] > 0
