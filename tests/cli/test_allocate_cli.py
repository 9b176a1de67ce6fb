"""``kvcore allocate`` on the CPU: plans, allocates for real, binds stand-in layers, times it."""

from __future__ import annotations

import json

import pytest
import torch

from kvcore.engine.stand_in import stand_in_model
from tests.cli.conftest import full_entry, sliding_entry

LAYER = {"num_kv_heads": 2, "head_size": 64}  # full_entry gives block size 16 and bfloat16


@pytest.fixture
def specs(spec_file):
    return spec_file(
        {
            f"model.layers.{i}.self_attn": full_entry(**LAYER) if i % 3 == 2 else sliding_entry(256, **LAYER)
            for i in range(6)
        }
    )


def test_allocate_with_a_fixed_size(run_cli, specs):
    status, out, err = run_cli(
        "allocate", "--specs", specs, "--device", "cpu", "--memory", "8MiB", "--max-model-len", "1024"
    )
    assert status == 0, err
    assert "policy shared_buffer" in out and "max concurrency" in out
    assert "allocated 8.00 MiB (8,388,608 bytes) on cpu in 1 tensor(s), zero-filled; bound 6 layers" in out
    for step in ("read specs", "memory", "plan", "allocate", "bind"):
        assert f"  {step}" in out
    assert "fixed at 8.00 MiB" in out


def test_allocate_with_a_utilization_profiles_the_device(run_cli, specs, monkeypatch):
    from kvcore.runtime.memory import HostMemory

    share = 8 * 2**20 / HostMemory().sample().free_bytes
    status, out, err = run_cli(
        "allocate", "--specs", specs, "--utilization", f"{share:.8f}", "--max-model-len", "512", "--no-zero"
    )
    assert status == 0, err
    assert "cap (" in out and "of available)" in out and "KV cache budget" in out
    assert "zero-filled" not in out


def test_uniform_specs_get_one_tensor_per_layer(run_cli, spec_file):
    path = spec_file({f"l{i}": full_entry(**LAYER) for i in range(3)}, "uniform.json")
    status, out, err = run_cli("allocate", "--specs", path, "--memory", "3MiB", "--max-model-len", "256")
    assert status == 0, err
    assert "in 3 tensor(s)" in out and "policy uniform" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "exactly one of the two"),
        (["--memory", "8MiB", "--utilization", "0.5"], "exactly one of the two"),
        (["--memory", "1MiB"], "lower --max-model-len"),
    ],
)
def test_budget_mistakes_are_one_line_errors(run_cli, specs, extra, message):
    status, out, err = run_cli("allocate", "--specs", specs, "--max-model-len", "1024", *extra)
    assert status == 1 and out == ""
    assert err.startswith("kvcore: error:") and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is absent")
def test_cuda_without_a_gpu_is_a_clear_error(run_cli, specs):
    status, _, err = run_cli(
        "allocate", "--specs", specs, "--device", "cuda:0", "--memory", "8MiB", "--max-model-len", "64"
    )
    assert status == 1 and "needs a CUDA GPU" in err and "use the cpu device" in err


@pytest.mark.parametrize(
    ("option", "value"), [("--device", "tpu"), ("--utilization", "0"), ("--utilization", "1.5")]
)
def test_bad_option_values_are_usage_errors(run_cli, specs, option, value):
    with pytest.raises(SystemExit) as info:
        run_cli("allocate", "--specs", specs, "--max-model-len", "64", option, value)
    assert info.value.code == 2


def test_stand_in_model_has_a_module_for_every_layer_name():
    names = ["model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.1", "lm"]
    model = stand_in_model(names)
    modules = dict(model.named_modules())
    assert all(name in modules for name in names)


def test_allocate_json_is_the_plan_report_with_what_allocation_did(run_cli, specs):
    status, out, _ = run_cli(
        "allocate", "--specs", specs, "--memory", "4MiB", "--max-model-len", "1024", "--json"
    )
    assert status == 0
    report = json.loads(out)
    status, plan_out, _ = run_cli(
        "plan", "--specs", specs, "--memory", "4MiB", "--max-model-len", "1024", "--json"
    )
    planned = json.loads(plan_out)
    assert {key: report[key] for key in planned} == planned  # every plan figure, unchanged
    assert report["device"] == "cpu" and report["allocated_bytes"] == planned["kv_cache_bytes"]
    assert report["memory_profile"]["source"] == "fixed"
    assert report["memory_profile"]["kv_cache_bytes"] == 4 * 2**20
    assert report["bound_layers"] == 6 and report["zero_filled"] is True
    assert list(report["timings_ms"])[:2] == ["read specs", "stand-in layers"]
    assert all(ms >= 0 for ms in report["timings_ms"].values())


def test_allocate_json_of_a_saved_plan(run_cli, specs, tmp_path):
    _, plan_out, _ = run_cli(
        "plan", "--specs", specs, "--memory", "4MiB", "--max-model-len", "1024", "--json"
    )
    saved = tmp_path / "plan.json"
    saved.write_text(plan_out)
    status, out, _ = run_cli("allocate", "--plan", saved, "--json", "--no-zero")
    assert status == 0
    report = json.loads(out)
    assert report["memory_profile"] is None or report["memory_profile"]["source"] == "fixed"
    assert report["zero_filled"] is False and report["bound_layers"] == 6
    assert report["num_blocks"] == json.loads(plan_out)["num_blocks"]
