import json
from pathlib import Path

import pytest

from tests.cli.conftest import full_entry, sliding_entry

EXAMPLE = Path(__file__).parents[2] / "examples" / "specs" / "gemma-3-27b.json"


def test_table_output(run_cli):
    status, out, err = run_cli("plan", "--specs", EXAMPLE, "--memory", "40GiB", "--max-model-len", "32768")
    assert status == 0, err
    assert "policy shared_buffer (auto: the layers have 2 different specs)" in out
    assert "sliding_window" in out and "full_attention" in out
    assert "max concurrency" in out and "efficiency 99." in out


def test_json_output_has_the_documented_keys(run_cli, spec_file):
    layers = {f"l{i}": full_entry() if i % 2 else sliding_entry(128) for i in range(24)}
    status, out, _ = run_cli(
        "plan", "--specs", spec_file(layers), "--memory", "24GiB", "--max-model-len", "8192", "--json"
    )
    assert status == 0
    data = json.loads(out)
    for key in (
        "policy",
        "num_blocks",
        "max_model_len",
        "available_memory_bytes",
        "kv_cache_bytes",
        "max_concurrency",
        "ideal_concurrency",
        "groups",
        "tensors",
    ):
        assert key in data
    assert data["available_memory_bytes"] == 24 * 2**30
    assert data["max_model_len"] == 8192
    assert isinstance(data["max_concurrency"], float)
    assert data["max_concurrency"] <= data["ideal_concurrency"]
    group = next(g for g in data["groups"] if g["kind"] == "sliding_window")
    assert {"kind", "block_size", "page_size_bytes", "layers", "sliding_window"} <= set(group)
    assert {"size", "offset", "shared_by"} <= set(data["tensors"][0])
    assert data["kv_cache_bytes"] == data["num_blocks"] * data["bytes_per_block"]


def test_uniform_json_matches_hand_computation(run_cli, spec_file):
    entry = {
        "kind": "full_attention",
        "block_size": 16,
        "num_kv_heads": 2,
        "head_size": 64,
        "dtype": "float32",
    }
    path = spec_file({"l1": entry, "l2": entry})
    status, out, _ = run_cli(
        "plan", "--specs", path, "--memory", str(16384 * 2 * 32), "--max-model-len", "16", "--json"
    )
    data = json.loads(out)
    assert status == 0
    assert (data["policy"], data["num_blocks"]) == ("uniform", 32)
    assert data["max_concurrency"] == 32.0


def test_options_reach_the_plan(run_cli, spec_file):
    path = spec_file({"a": full_entry(), "b": sliding_entry(1024)})
    status, out, _ = run_cli(
        "plan",
        "--specs",
        path,
        "--memory",
        "1GiB",
        "--max-model-len",
        "4096",
        "--block-size",
        "32",
        "--max-num-batched-tokens",
        "512",
        "--policy",
        "shared_buffer",
        "--num-blocks",
        "200",
        "--json",
    )
    data = json.loads(out)
    assert status == 0
    assert data["num_blocks"] == 200
    assert {g["block_size"] for g in data["groups"]} == {32}
    assert data["context"]["max_num_batched_tokens"] == 512


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "100MiB", "--max-model-len", "131072"], "largest max_model_len that fits is"),
        (["--memory", "1GiB", "--max-model-len", "16", "--policy", "uniform"], "cannot plan these layers"),
        (["--memory", "1GiB", "--max-model-len", "16", "--policy", "nope"], "unknown policy 'nope'"),
    ],
)
def test_bad_input_is_one_line_without_traceback(run_cli, spec_file, args, message):
    path = spec_file({"a": full_entry(), "b": sliding_entry(1024)})
    status, _, err = run_cli("plan", "--specs", path, *args)
    assert status == 1
    assert err.startswith("kvcore: error: ") and err.count("\n") == 1
    assert message in err and "Traceback" not in err


def test_bad_spec_file_is_one_line(run_cli, spec_file, capsys):
    path = spec_file({"a": {**full_entry(), "num_kv_heads": 0}})
    status, _, err = run_cli("plan", "--specs", path, "--memory", "1GiB", "--max-model-len", "16")
    assert status == 1
    assert "layer 'a'" in err and "'num_kv_heads' must be >= 1 (got 0)" in err
    status, _, err = run_cli(
        "plan", "--specs", path.parent / "missing.json", "--memory", "1GiB", "--max-model-len", "16"
    )
    assert status == 1 and "file not found" in err


@pytest.mark.parametrize("memory", ["-5GiB", "lots"])
def test_unreadable_sizes_are_usage_errors(run_cli, capsys, memory):
    with pytest.raises(SystemExit) as info:
        run_cli("plan", "--memory", memory, "--max-model-len", "16", "--specs", "x.json")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--memory" in err and "Traceback" not in err


def test_map_flag_writes_a_picture(run_cli, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "plan.svg"
    status, out, err = run_cli(
        "plan", "--specs", EXAMPLE, "--memory", "40GiB", "--max-model-len", "32768", "--map", target
    )
    assert status == 0 and "max concurrency" in out
    assert target.read_text().lstrip().startswith("<?xml")
    assert err.startswith(f"kvcore: wrote {target} (the memory map, ") and err.count("\n") == 1


def test_map_flag_rejects_other_formats(run_cli, tmp_path):
    status, _, err = run_cli(
        "plan",
        "--specs",
        EXAMPLE,
        "--memory",
        "40GiB",
        "--max-model-len",
        "32768",
        "--map",
        tmp_path / "x.gif",
    )
    assert status == 1 and ".png or .svg" in err


def test_serving_options_reach_the_plan(run_cli):
    status, out, _ = run_cli(
        "plan",
        "--model",
        "ai21labs/AI21-Jamba-1.5-Mini",
        "--memory",
        "24GiB",
        "--max-model-len",
        "65536",
        "--num-speculative-tokens",
        "2",
        "--json",
    )
    assert status == 0
    report = json.loads(out)
    assert report["context"]["num_speculative_tokens"] == 2
    status, out, _ = run_cli(
        "plan",
        "--model",
        "deepseek-ai/DeepSeek-V3",
        "--memory",
        "80GiB",
        "--max-model-len",
        "8192",
        "--speculative",
        "mtp",
    )
    assert status == 0 and "mla       62" in out
    status, out, _ = run_cli(
        "plan",
        "--model",
        "openai/whisper-large-v3",
        "--memory",
        "8GiB",
        "--max-model-len",
        "448",
        "--max-encoder-tokens",
        "3000",
    )
    assert status == 0 and "max_encoder_tokens=3000" in out


def test_compare_shows_what_each_state_cache_mode_costs(run_cli):
    status, out, _ = run_cli(
        "compare",
        "--model",
        "ai21labs/AI21-Jamba-1.5-Mini",
        "--memory",
        "24GiB",
        "--max-model-len",
        "65536",
        "--policies",
        "shared_buffer",
        "--state-cache-modes",
        "none,align",
    )
    assert status == 0
    assert "state cache" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("  shared_buffer")]
    assert [row[5] for row in rows] == ["none", "align"]


def test_a_bad_state_cache_mode_is_an_argparse_error(run_cli):
    with pytest.raises(SystemExit) as exc:
        run_cli(
            "plan",
            "--model",
            "ai21labs/AI21-Jamba-1.5-Mini",
            "--memory",
            "24GiB",
            "--max-model-len",
            "64",
            "--state-cache-mode",
            "some",
        )
    assert exc.value.code == 2
