"""``kvcore profile --engine transformers``: a tiny random-weight model (saved locally, no
download) run through transformers' continuous batching, its batches timed and written as a
profile ``--step-profile`` reads."""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvcore.simulation.profile_file import HEADER_KEY, read_profile_file  # noqa: E402
from kvcore.simulation.timing import read_profile  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=128,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = tmp_path_factory.mktemp("models") / "llama"
    model.save_pretrained(path)
    return path


def test_profile_times_transformers_continuous_batching_and_writes_a_profile(
    run_cli, tiny_llama, tmp_path, frozen_heap
):
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    out = tmp_path / "steps.jsonl"
    status, stdout, stderr = run_cli(
        "profile",
        "--engine", "transformers",
        "--model", tiny_llama,
        "--dtype", "float32",
        "--max-model-len", "128",
        "--max-num-seqs", "4",
        "--max-batched-tokens", "64",
        "--engine-arg", "num_blocks=64",
        "--engine-arg", "page_size=16",
        "--repeats", "1",
        "--decode-steps", "2",
        "-o", out,
    )  # fmt: skip
    assert status == 0, stderr
    assert f"wrote {out}" in stdout
    assert "held-out error" in stdout and "all held-out steps" in stdout
    read = read_profile_file(out)
    header = read.header
    assert header is not None
    assert header.engine == "transformers" and header.engine_version == transformers.__version__
    assert header.model == str(tiny_llama)
    assert header.device.startswith(("cpu", "NVIDIA"))
    assert {"kvcore", "transformers", "torch"} <= set(header.versions)
    assert header.settings["max_batch_tokens"] == 64 and header.settings["num_blocks"] == 64
    assert header.settings["repeats"] == 1
    kinds = {(s.prefill_tokens > 0, s.decode_requests > 0) for s in read.samples}
    assert kinds == {(True, False), (False, True), (True, True)}, "prefill, decode and mixed steps"
    assert all(s.prefill_tokens <= 64 and s.requests is not None and s.requests <= 4 for s in read.samples)
    assert max(s.decode_requests for s in read.samples) == 4
    profile = read_profile(out)
    assert profile.samples == len(read.samples)
    assert profile.max_error <= header.tolerance
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first) == {HEADER_KEY}


def test_profile_refuses_a_model_it_cannot_load_in_one_line(run_cli, tmp_path):
    status, _, stderr = run_cli(
        "profile", "--engine", "transformers", "--model", tmp_path / "absent", "-o", tmp_path / "p.jsonl"
    )
    assert status == 1
    assert stderr.startswith("kvcore: error: transformers cannot load the model")
    assert "Traceback" not in stderr
    assert not (tmp_path / "p.jsonl").exists()


def test_profile_refuses_an_engine_arg_without_a_value(run_cli, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        run_cli(
            "profile", "--engine", "vllm", "--model", "m", "-o", tmp_path / "p.jsonl", "--engine-arg", "x"
        )
    assert exit_.value.code == 2
    assert "expected KEY=VALUE" in run_cli.capsys.readouterr().err


def test_the_cpu_clock_is_refused_for_transformers_in_one_line(run_cli, tiny_llama, tmp_path):
    """transformers runs its batches on a thread of its own: the process's CPU time cannot be
    split into its steps, so --clock cpu is refused before the model loads."""
    status, _, stderr = run_cli(
        "profile",
        "--engine",
        "transformers",
        "--model",
        tiny_llama,
        "--clock",
        "cpu",
        "-o",
        tmp_path / "p.jsonl",
    )
    assert status == 1
    assert stderr.startswith("kvcore: error: --clock cpu times vLLM's steps only")
    assert not (tmp_path / "p.jsonl").exists()
