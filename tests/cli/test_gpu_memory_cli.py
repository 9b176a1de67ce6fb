"""``--gpu-memory`` / ``--utilization`` on plan, compare and simulate, and ``--max-model-len``'s
default from the model."""

import json

import pytest

from kvcore.frontends.hf_config import find_bundled_model
from kvcore.planning.gpu_budget import gpu_budget
from kvcore.planning.registry import Registry

GiB = 2**30
LLAMA = "meta-llama/Llama-3.1-8B"


def _expected(gpu, utilization=0.9, tokens=2048, tp=1):
    registry = Registry.default(autoload=False)
    config = find_bundled_model(LLAMA).config()
    return gpu_budget(config, registry, gpu, utilization=utilization, max_num_batched_tokens=tokens, tp=tp)


def test_plan_answers_how_long_and_how_many_in_one_line(run_cli):
    status, out, err = run_cli("plan", "--model", LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "auto")
    assert status == 0 and err == ""
    budget = _expected(80 * GiB)
    lines = out.splitlines()
    assert lines[0] == "GPU 80.00 GiB x utilization 0.9 = 72.00 GiB"
    assert "weights         14.96 GiB" in lines[1] and "8.03B parameters" in lines[1]
    assert lines[4].startswith("  = KV cache        55.54 GiB")
    answer = [line for line in lines if line.startswith("on this 80.00 GiB GPU:")]
    assert answer == [
        "on this 80.00 GiB GPU: requests of up to 131,072 tokens, 3.47 of them at once "
        "(454,992 tokens of KV cache)"
    ]
    assert f"budget {budget.kv_cache / GiB:.2f} GiB" in out


def test_plan_json_carries_the_budget(run_cli):
    status, out, _ = run_cli(
        "plan",
        "--model",
        LLAMA,
        "--gpu-memory",
        "40GiB",
        "--utilization",
        "0.95",
        "--max-model-len",
        "8192",
        "--json",
    )
    assert status == 0
    report = json.loads(out)
    budget = _expected(40 * GiB, utilization=0.95)
    assert report["gpu_budget"]["kv_cache_bytes"] == budget.kv_cache == report["available_memory_bytes"]
    assert report["gpu_budget"]["weights_bytes"] == 8_030_261_248 * 2
    assert report["gpu_budget"]["parameters"] == 8_030_261_248


def test_tensor_parallel_ranks_hold_a_share_of_the_weights(run_cli):
    status, out, _ = run_cli(
        "plan", "--model", LLAMA, "--gpu-memory", "24GiB", "--tp", "2", "--max-model-len", "8192"
    )
    assert status == 0
    assert "per rank (1/2 of the model)" in out
    assert f"= KV cache        {_expected(24 * GiB, tp=2).kv_cache / GiB:.2f} GiB" in out


@pytest.mark.parametrize("command", ["compare", "simulate"])
def test_compare_and_simulate_take_the_gpu_too(run_cli, command):
    extra = ["--requests", "4", "--prompt-len", "100", "--output-len", "10"] if command == "simulate" else []
    status, out, _ = run_cli(
        command, "--model", LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "8192", *extra
    )
    assert status == 0
    assert out.startswith("GPU 80.00 GiB x utilization 0.9 = 72.00 GiB")
    status, out, _ = run_cli(
        command, "--model", LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "8192", "--json", *extra
    )
    assert json.loads(out)["gpu_budget"]["kv_cache_bytes"] == _expected(80 * GiB).kv_cache


def test_memory_and_gpu_memory_exclude_each_other(run_cli):
    with pytest.raises(SystemExit) as exc:
        run_cli("plan", "--model", LLAMA, "--memory", "8GiB", "--gpu-memory", "80GiB")
    assert exc.value.code == 2
    assert "not allowed with argument" in run_cli.capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--model", LLAMA, "--memory", "8GiB", "--utilization", "0.8"],
            "--utilization applies to --gpu-memory only",
        ),
        (["--model", LLAMA, "--gpu-memory", "16GiB"], r"nothing is left for a KV cache on a 16.00 GiB GPU"),
        (["--model", "openai/gpt-oss-20b", "--gpu-memory", "8GiB"], "weights 12.82 GiB"),
    ],
)
def test_gpu_errors_are_one_line(run_cli, argv, message):
    status, out, err = run_cli("plan", *argv, "--max-model-len", "4096")
    assert status == 1 and out == ""
    assert err.startswith("kvcore: error:") and message in err and err.count("\n") == 1


def test_gpu_memory_needs_a_model(run_cli, spec_file):
    from tests.cli.conftest import full_entry

    status, _, err = run_cli(
        "plan", "--specs", spec_file({"l0": full_entry()}), "--gpu-memory", "80GiB", "--max-model-len", "64"
    )
    assert status == 1 and "--gpu-memory needs --model" in err


def test_max_model_len_defaults_to_the_models_position_embeddings(run_cli):
    status, out, err = run_cli("plan", "--model", LLAMA, "--memory", "40GiB", "--json")
    assert status == 0 and err == ""
    assert json.loads(out)["max_model_len"] == 131072


def test_a_length_beyond_the_model_warns(run_cli):
    status, _, err = run_cli(
        "plan",
        "--model",
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "--memory",
        "40GiB",
        "--max-model-len",
        "16384",
    )
    assert status == 0
    assert err == (
        "kvcore: warning: --max-model-len 16,384 is longer than meta-llama/Meta-Llama-3-8B-Instruct's "
        "max_position_embeddings (8,192); the model was not trained for such requests\n"
    )


def test_a_spec_file_still_needs_a_length(run_cli, spec_file):
    from tests.cli.conftest import full_entry

    status, _, err = run_cli("plan", "--specs", spec_file({"l0": full_entry()}), "--memory", "1GiB")
    assert status == 1 and "give --max-model-len N" in err


def test_a_model_nobody_counts_names_memory_on_the_command_line(run_cli, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "acme",
                "layer_types": ["full_attention"],
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "head_dim": 64,
            }
        )
    )
    status, _, err = run_cli("plan", "--model", config, "--gpu-memory", "80GiB", "--max-model-len", "1024")
    assert status == 1
    assert "no plugin counts the weights of model type 'acme'" in err
    assert "give the KV budget as --memory SIZE instead of --gpu-memory" in err


def test_a_gpu_too_small_names_the_flags_to_change(run_cli):
    status, _, err = run_cli("plan", "--model", LLAMA, "--gpu-memory", "18GiB", "--max-model-len", "4096")
    assert status == 1
    assert "more --tp ranks, a higher --utilization or a smaller --max-num-batched-tokens" in err
    # at 16 GiB neither the whole GPU nor no activations would leave room: only the ways that can
    status, _, err = run_cli("plan", "--model", LLAMA, "--gpu-memory", "16GiB", "--max-model-len", "4096")
    assert status == 1 and err.rstrip().endswith("use a larger GPU or more --tp ranks")


# --gpu NAME and the budget (issue 38: `--gpu H100` was read as an abbreviation of --gpu-memory)


def _usage_error(run_cli, *argv):
    with pytest.raises(SystemExit) as info:
        run_cli(*argv)
    return info.value.code, run_cli.capsys.readouterr().err


def test_no_option_is_abbreviated(run_cli):
    code, err = _usage_error(run_cli, "allocate", "--model", LLAMA, "--memory", "1GiB", "--gpu", "H100")
    assert code == 2
    assert "unrecognized arguments: --gpu H100" in err and "cannot read size" not in err
    code, err = _usage_error(
        run_cli, "plan", "--model", LLAMA, "--gpu-mem", "80GiB", "--max-model-len", "8192"
    )
    assert code == 2 and "--gpu-mem" in err


def test_plan_takes_the_gpu_by_name(run_cli):
    """The issue's own command: `plan ... --gpu-memory 80GiB --gpu H100` plans (the GPU bounds the
    budget), `--gpu H100` alone is the budget, and more memory than the GPU has is refused."""
    plan = ("plan", "--model", LLAMA, "--max-model-len", "8192", "--json")
    status, both, err = run_cli(*plan, "--gpu-memory", "80GiB", "--gpu", "H100")
    assert status == 0, err
    status, named, err = run_cli(*plan, "--gpu", "H100")
    assert status == 0, err
    assert json.loads(both)["num_blocks"] == json.loads(named)["num_blocks"]
    status, _, err = run_cli(*plan, "--gpu-memory", "96GiB", "--gpu", "H100")
    assert status == 1 and "--gpu-memory 96.00 GiB is more than --gpu H100's memory" in err


_SIMULATE = ("simulate", "--model", LLAMA, "--max-model-len", "8192", "--policies", "shared_buffer")
_REQUESTS = ("--requests", "4", "--prompt-len", "100", "--output-len", "10")


def test_gpu_name_gives_the_gpu_memory_when_no_budget_is_given(run_cli):
    status, out, err = run_cli(*_SIMULATE, *_REQUESTS, "--gpu", "H100", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["gpu_budget"]["gpu_memory_bytes"] == 80 * GiB  # the H100's 80 GB are binary
    assert report["available_memory_bytes"] == _expected(80 * GiB).kv_cache


def test_gpu_memory_over_the_named_gpu_is_refused(run_cli):
    status, _, err = run_cli(*_SIMULATE, *_REQUESTS, "--gpu", "H100", "--gpu-memory", "96GiB")
    assert status == 1
    assert "--gpu-memory 96.00 GiB is more than --gpu H100's memory (H100-SXM: 80.00 GiB)" in err
    status, _, err = run_cli(*_SIMULATE, *_REQUESTS, "--gpu", "H100", "--gpu-memory", "40GiB", "--json")
    assert status == 0, err


def test_no_budget_at_all_names_the_three_ways(run_cli):
    status, _, err = run_cli(*_SIMULATE, *_REQUESTS)
    assert status == 1
    assert "--memory SIZE" in err and "--gpu-memory SIZE" in err and "--gpu NAME" in err


@pytest.mark.parametrize("given", [["--memory", "-40GiB"], ["--memory=-40GiB"], ["--gpu-memory", "-8GiB"]])
def test_a_negative_size_says_a_size_must_be_positive(run_cli, given):
    code, err = _usage_error(run_cli, "plan", "--model", LLAMA, *given, "--max-model-len", "4096")
    assert code == 2
    assert "a size must be positive" in err and "expected one argument" not in err


def test_weights_larger_than_the_gpu_do_not_suggest_a_higher_utilization(run_cli):
    status, _, err = run_cli(
        "plan", "--model", "Qwen/Qwen3-8B", "--gpu-memory", "8GiB", "--max-model-len", "4096"
    )
    assert status == 1
    assert "the weights alone (15.26 GiB) are more than the whole GPU" in err
    assert "at least 3 such GPUs" in err and "quantized checkpoint" in err
    assert "--utilization" not in err
    # weights that fit, with too little left at 0.9: the whole GPU would do, so --utilization helps
    status, _, err = run_cli(
        "plan", "--model", "Qwen/Qwen3-8B", "--gpu-memory", "17GiB", "--max-model-len", "4096"
    )
    assert status == 1 and "a higher --utilization" in err and "weights alone" not in err
