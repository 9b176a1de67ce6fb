"""``--max-model-len auto``: the longest admitted length, capped by max_position_embeddings."""

import json

import pytest


def test_cli_auto_is_capped_by_max_position_embeddings(run_cli):
    status, out, _ = run_cli(
        "plan", "--model", "meta-llama/Llama-3.2-1B", "--memory", "8GiB", "--max-model-len", "auto"
    )
    assert status == 0
    assert "max_model_len 131,072 chosen automatically: the model's max_position_embeddings" in out


def test_cli_auto_bound_by_memory(run_cli):
    status, out, _ = run_cli(
        "plan", "--model", "meta-llama/Llama-3.2-1B", "--memory", "1GiB", "--max-model-len", "auto", "--json"
    )
    assert status == 0
    report = json.loads(out)
    assert report["max_model_len_auto"] == {
        "chosen": 32768,
        "limited_by": "memory",
        "cap": 131072,
        "cap_name": "max_position_embeddings",
    }
    assert report["max_model_len"] == 32768
    status, _, err = run_cli(
        "plan", "--model", "meta-llama/Llama-3.2-1B", "--memory", "1GiB", "--max-model-len", "32769"
    )
    assert status == 1 and "lower --max-model-len to 32768" in err


def test_cli_auto_for_a_spec_file_is_bound_by_memory(run_cli, tmp_path):
    path = tmp_path / "specs.json"
    layers = {
        f"model.layers.{i}": {
            "kind": "full_attention",
            "block_size": 16,
            "num_kv_heads": 8,
            "head_size": 128,
            "dtype": "bfloat16",
        }
        for i in range(4)
    }
    path.write_text(json.dumps({"layers": layers}))
    status, out, _ = run_cli("plan", "--specs", path, "--memory", "128MiB", "--max-model-len", "auto")
    assert status == 0
    assert "max_model_len 8,192 chosen automatically: the longest request the memory admits" in out


GEMMA_4GIB = ("--model", "google/gemma-3-27b-it", "--memory", "4GiB", "--max-model-len", "auto")


def test_compare_and_simulate_set_every_candidate_at_the_auto_plan_s_length(run_cli):
    """``auto`` in compare and simulate: the length ``kvcore plan --max-model-len auto`` answers,
    said on stderr, for every candidate (issue 38: refused outright)."""
    status, out, _ = run_cli("plan", *GEMMA_4GIB, "--json")
    length = json.loads(out)["max_model_len"]
    status, out, err = run_cli("compare", *GEMMA_4GIB, "--json")
    assert status == 0, err
    assert json.loads(out)["max_model_len"] == length
    assert f"kvcore: note: --max-model-len auto = {length:,} tokens" in err
    workload = ("--requests", "4", "--prompt-len", "100", "--output-len", "10", "--policies", "shared_buffer")
    status, out, err = run_cli("simulate", *GEMMA_4GIB, *workload, "--json")
    assert status == 0, err and json.loads(out)["max_model_len"] == length


def test_tune_refuses_auto_saying_why(run_cli):
    workload = ("--requests", "4", "--prompt-len", "100", "--output-len", "10")
    status, _, err = run_cli("tune", *GEMMA_4GIB, *workload)
    assert status == 1 and "no one length fits them all: give a number" in err


def test_cli_rejects_other_words(run_cli):
    with pytest.raises(SystemExit):
        run_cli(
            "plan", "--model", "meta-llama/Llama-3.2-1B", "--memory", "1GiB", "--max-model-len", "longest"
        )


def test_allocate_takes_auto(run_cli):
    status, out, _ = run_cli(
        "allocate",
        "--model",
        "meta-llama/Llama-3.2-1B",
        "--memory",
        "64MiB",
        "--max-model-len",
        "auto",
        "--device",
        "cpu",
        "--no-zero",
    )
    assert status == 0
    assert "max_model_len 2,048 chosen automatically: the longest request the memory admits" in out
