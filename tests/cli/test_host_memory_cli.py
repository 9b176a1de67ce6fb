"""``kvcore simulate --host-memory``: one size (the tier line and JSON), a comma list (the tier
curve), and the settings that refuse it."""

import json

import pytest

TRACE = "examples/traces/chat-system-prompts.jsonl"
LLAMA = ("--model", "meta-llama/Llama-3.1-8B", "--memory", "2GiB", "--max-model-len", "8192")
KVCORE = ("--trace", TRACE, "--policies", "auto", "--prefix-caching", "--scheduler", "kvcore")


@pytest.fixture
def first_requests(tmp_path):
    """The trace's first 120 requests: enough for its prompts to outgrow a 2 GiB device, few
    enough for the vllm profile's tier, which replays on the plain reference."""
    path = tmp_path / "first120.jsonl"
    with open(TRACE, encoding="utf-8") as trace:
        path.write_text("".join(trace.readlines()[:120]), encoding="utf-8")
    return path


def test_one_size_adds_the_tier_line_and_json_figures(run_cli):
    status, out, err = run_cli("simulate", *LLAMA, *KVCORE, "--host-memory", "8GiB")
    assert status == 0, err
    line = next(line for line in out.splitlines() if line.startswith("  host tier"))
    assert "blocks; hit tokens" in line and "from the host" in line and "back" in line
    status, out, err = run_cli("simulate", *LLAMA, *KVCORE, "--host-memory", "8GiB", "--json")
    assert status == 0, err
    simulation = json.loads(out)["candidates"][0]["simulation"]
    tier = simulation["host_tier"]
    assert tier["enabled"] and tier["host_hit_tokens"] > 0
    assert tier["device_hit_tokens"] + tier["host_hit_tokens"] == simulation["cached_tokens"]
    assert simulation["host_transfer_seconds"] == 0.0


def test_a_comma_list_prints_the_tier_curve(run_cli):
    status, out, err = run_cli("simulate", *LLAMA, *KVCORE, "--host-memory", "0,4GiB,16GiB", "--json")
    assert status == 0, err
    curve = json.loads(out)["tier_curve"]
    assert [p["host_memory_bytes"] for p in curve] == [0, 4 << 30, 16 << 30]
    assert curve[0]["simulation"]["host_tier"] is None  # every point names the figures
    rates = [p["simulation"]["prefix_hit_rate"] for p in curve]
    assert rates[0] < rates[1] < rates[2]  # this trace's prompts outgrow the device
    status, out, err = run_cli("simulate", *LLAMA, *KVCORE, "--host-memory", "0,4GiB", "--gpu", "H100")
    assert status == 0, err
    lines = out.splitlines()
    assert "tier curve over 2 host-memory sizes" in lines[0]
    assert lines[1] == "plans: kvcore's own, as kvcore plan makes them"
    assert "TTFT p50" in lines[2] and "link s" in lines[2]
    assert len([line for line in lines if line.startswith("  auto")]) == 2
    assert "an estimate" in lines[-1]


def test_the_vllm_profile_simulates_vllms_cpu_offloading(run_cli, first_requests):
    """The default profile (``vllm``) simulates the tier as vLLM's native CPU offloading
    (``--kv-offloading-size``): the hit rate grows with host memory, the tier counts its loads."""
    args = ("--trace", first_requests, "--policies", "auto", "--prefix-caching")
    status, out, err = run_cli("simulate", *LLAMA, *args, "--host-memory", "0,4GiB,16GiB", "--json")
    assert status == 0, err
    curve = json.loads(out)["tier_curve"]
    rates = [p["simulation"]["prefix_hit_rate"] for p in curve]
    assert rates[0] < rates[1] < rates[2]
    tier = curve[2]["simulation"]["host_tier"]
    assert tier["host_hits"] > 0 and tier["restored_bytes"] > 0
    assert tier["device_hit_tokens"] + tier["host_hit_tokens"] == curve[2]["simulation"]["cached_tokens"]


def test_a_plan_the_vllm_profile_cannot_offload_is_refused_by_name(run_cli):
    """Gemma-3's sliding layers: the vllm profile's CPU tier is one full-attention group's."""
    gemma = ("--model", "google/gemma-3-27b-it", "--memory", "8GiB", "--max-model-len", "8192")
    status, _, err = run_cli(
        "simulate",
        *gemma,
        "--trace",
        TRACE,
        "--prefix-caching",
        "--host-memory",
        "8GiB",
        "--policies",
        "auto",
    )
    assert status != 0 and "one full-attention or MLA group" in err and "Traceback" not in err


def test_the_sglang_profile_simulates_hicache(run_cli):
    """``--scheduler sglang --host-memory``: SGLang's HiCache (HiRadixCache): evicted radix
    nodes stay on the host and come back on a hit, so the hit rate grows with host memory."""
    sglang = ("--trace", TRACE, "--policies", "auto", "--prefix-caching", "--scheduler", "sglang")
    status, out, err = run_cli("simulate", *LLAMA, *sglang, "--host-memory", "0,4GiB,16GiB", "--json")
    assert status == 0, err
    curve = json.loads(out)["tier_curve"]
    rates = [p["simulation"]["prefix_hit_rate"] for p in curve]
    assert rates[0] < rates[1] < rates[2]
    tier = curve[2]["simulation"]["host_tier"]
    assert tier["host_hits"] > 0 and tier["restored_bytes"] > 0
    assert tier["device_hit_tokens"] + tier["host_hit_tokens"] == curve[2]["simulation"]["cached_tokens"]
    status, out, err = run_cli("simulate", *LLAMA, *sglang, "--host-memory", "8GiB")
    assert status == 0, err
    assert any(line.startswith("  host tier auto") and "from the host" in line for line in out.splitlines())


def test_a_tier_needs_prefix_caching_and_sizes(run_cli):
    status, _, err = run_cli(
        "simulate", *LLAMA, "--trace", TRACE, "--scheduler", "kvcore", "--host-memory", "8GiB"
    )
    assert status != 0 and "--prefix-caching" in err
    for bad in ("0,,4GiB", "4GiB,4GiB", "lots"):
        with pytest.raises(SystemExit):
            run_cli("simulate", *LLAMA, *KVCORE, "--host-memory", bad)


def test_the_curve_as_csv_and_as_a_plot(run_cli, tmp_path):
    status, out, err = run_cli("simulate", *LLAMA, *KVCORE, "--host-memory", "0,4GiB", "--csv")
    assert status == 0, err
    header, *rows = out.splitlines()
    assert header.startswith("host_memory_bytes,policy") and "host_tier" in header
    assert [row.split(",")[0] for row in rows] == ["0", str(4 << 30)]
    pytest.importorskip("matplotlib")
    plot = tmp_path / "curve.svg"
    status, _, err = run_cli("simulate", *LLAMA, *KVCORE, "--host-memory", "0,4GiB", "--plot", plot)
    assert status == 0, err
    assert "the tier curve plot" in err and "host memory (GiB)" in plot.read_text()


def test_a_run_without_a_tier_reports_as_before(run_cli):
    status, out, err = run_cli("simulate", *LLAMA, *KVCORE, "--json")
    assert status == 0, err
    simulation = json.loads(out)["candidates"][0]["simulation"]
    assert "host_tier" not in simulation and "host_transfer_seconds" not in simulation


def test_tune_replays_each_candidate_with_the_tier_and_prints_vllms_offloading_flags(run_cli, first_requests):
    """``kvcore tune --host-memory``: every candidate keeps the tier (replayed as vLLM's CPU
    offloading), and the vLLM flags name it as vLLM 0.33's ``EngineArgs`` do: the size in GiB
    (``--kv-offloading-size``) and the native backend."""
    args = (
        *LLAMA,
        "--trace",
        first_requests,
        "--prefix-caching",
        "--policies",
        "uniform",
        "--no-split-search",
    )
    status, out, err = run_cli("tune", *args, "--host-memory", "8GiB", "--json")
    assert status == 0, err
    payload = json.loads(out)
    vllm = payload["engines"]["vllm"]
    assert vllm["flags"]["--kv-offloading-size"] == "8"
    assert vllm["flags"]["--kv-offloading-backend"] == "native"
    assert "--kv-offloading-size 8 --kv-offloading-backend native" in vllm["command_line"]
    status, out, err = run_cli("tune", *args, "--json")
    assert status == 0, err
    plain = json.loads(out)["engines"]["vllm"]
    assert "--kv-offloading-size" not in plain["flags"]
    status, _, err = run_cli(
        "tune", *LLAMA, "--trace", TRACE, "--policies", "uniform", "--host-memory", "8GiB"
    )
    assert status != 0 and "prefix_caching" in err and "Traceback" not in err
