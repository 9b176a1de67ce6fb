"""``kvcore models`` and ``kvcore plan --model``, run in-process."""

from __future__ import annotations

import json

import pytest

from kvcore.frontends.hf_config import bundled_models


def test_models_lists_every_bundled_model(run_cli):
    status, out, err = run_cli("models")
    assert status == 0, err
    for model in bundled_models():
        assert model.name in out
    gemma = next(line for line in out.splitlines() if "google/gemma-3-27b-it" in line)
    assert "62" in gemma and "52 sliding_window(1024), 10 full_attention" in gemma
    jamba = next(line for line in out.splitlines() if "Jamba" in line)
    assert "28 state, 4 full_attention" in jamba and "8.31 MiB" in jamba  # 28 x 311,296 bytes


def test_models_json(run_cli):
    status, out, _ = run_cli("models", "--json", "--tp", "2")
    data = {m["name"]: m for m in json.loads(out)["models"]}
    assert status == 0 and len(data) == len(bundled_models())
    llama = data["meta-llama/Llama-3.1-8B"]
    # 32 layers x 2 (K, V) x 4 KV heads per rank (8 // 2) x 128 x 2 bytes
    assert llama["layers"] == 32 and llama["kv_bytes_per_token"] == 32 * 2 * 4 * 128 * 2
    assert data["deepseek-ai/DeepSeek-V3"]["kinds"] == {"mla": 61}
    assert data["ai21labs/AI21-Jamba-1.5-Mini"]["state_bytes_per_request"] == 28 * (3 * 4096 + 4096 * 16) * 2


def test_models_shows_one_model_layer_by_layer(run_cli):
    status, out, _ = run_cli("models", "openai/gpt-oss-20b")
    assert status == 0
    assert out.splitlines()[0].endswith("24 layers with a cache: 12 sliding_window(128), 12 full_attention")
    assert "model.layers.23.self_attn" in out
    status, out, _ = run_cli("models", "gpt-oss-20b", "--json")
    assert json.loads(out)["layers"]["model.layers.0.self_attn"]["sliding_window"] == 128


def test_plan_a_bundled_model(run_cli):
    status, out, err = run_cli(
        "plan", "--model", "google/gemma-3-27b-it", "--memory", "80GiB", "--max-model-len", "32768"
    )
    assert status == 0, err
    assert "policy shared_buffer" in out and "sliding_window" in out and "efficiency 99." in out


def test_plan_a_config_folder_with_model_options(run_cli, tmp_path):
    config = next(m for m in bundled_models() if m.name == "meta-llama/Llama-3.1-8B").config()
    (tmp_path / "config.json").write_text(json.dumps(config))
    status, out, err = run_cli(
        "plan",
        "--model",
        tmp_path,
        "--memory",
        "8GiB",
        "--max-model-len",
        "8192",
        "--tp",
        "4",
        "--kv-cache-dtype",
        "fp8",
        "--block-size",
        "32",
        "--json",
    )
    assert status == 0, err
    (group,) = json.loads(out)["groups"]
    assert (group["num_kv_heads"], group["dtype"], group["block_size"]) == (2, "float8_e4m3fn", 32)
    # 32 layers x 32 tokens x 2 x 2 heads x 128 x 1 byte
    assert json.loads(out)["bytes_per_block"] == 32 * 32 * 2 * 2 * 128


def test_spec_source_is_required_and_exclusive(run_cli, capsys, tmp_path):
    common = ("--memory", "1GiB", "--max-model-len", "16")
    with pytest.raises(SystemExit) as info:
        run_cli("plan", *common)
    assert info.value.code == 2
    assert "one of the arguments --specs --model is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        run_cli("plan", "--specs", tmp_path / "x.json", "--model", "gemma-3-27b-it", *common)
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_model_options_need_a_model(run_cli, tmp_path):
    status, _, err = run_cli(
        "plan", "--specs", tmp_path / "x.json", "--tp", "2", "--memory", "1G", "--max-model-len", "8"
    )
    assert status == 1
    assert err.strip() == "kvcore: error: --tp applies to --model only; a spec file states its own sizes"


def test_bad_model_inputs_are_one_line_errors(run_cli):
    common = ("--memory", "80GiB", "--max-model-len", "4096")
    status, _, err = run_cli("plan", "--model", "not-a-model", *common)
    assert status == 1 and "nor a bundled model" in err and len(err.strip().splitlines()) == 1
    status, _, err = run_cli("plan", "--model", "Qwen3-8B", "--kv-cache-dtype", "int4", *common)
    assert status == 1 and "or 'auto'" in err and len(err.strip().splitlines()) == 1
    status, _, err = run_cli("plan", "--model", "AI21-Jamba-1.5-Mini", "--tp", "3", *common)
    assert status == 1
    assert "bundled ai21labs/AI21-Jamba-1.5-Mini: jamba config: 'mamba_expand * hidden_size' is 8192" in err
