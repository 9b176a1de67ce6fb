"""``kvcore plan --tp N --pp M``: every simulated rank planned on one machine, no GPU."""

from __future__ import annotations

import json

from kvcore import Registry, SizingContext
from kvcore.frontends.hf_config import model_layer_specs
from kvcore.model_options import ModelOptions
from kvcore.planning.ranks import Parallelism, plan_for_ranks, simulate_rank_specs
from tests.cli.conftest import full_entry, sliding_entry

GiB = 2**30


def _expected(model, tp, pp, memory, length):
    registry = Registry.default(autoload=False)
    specs = model_layer_specs(model, registry, ModelOptions(tp=tp))
    layout = Parallelism(tp_size=tp, pp_size=pp)
    return plan_for_ranks(
        simulate_rank_specs(specs, layout),
        [memory] * layout.world_size,
        SizingContext(max_model_len=length),
        registry=registry,
        tp_size=tp,
    )


def test_tp2_pp2_shows_every_rank_then_the_plan(run_cli):
    status, out, err = run_cli(
        "plan",
        "--model",
        "google/gemma-3-27b-it",
        "--tp",
        "2",
        "--pp",
        "2",
        "--memory",
        "8GiB",
        "--max-model-len",
        "32768",
    )
    assert status == 0, err
    plans = _expected("google/gemma-3-27b-it", 2, 2, 8 * GiB, 32768)
    lines = out.splitlines()
    assert (
        lines[0] == f"ranks: tp 2 x pp 2 = 4, one block pool of {plans[0].num_blocks:,} blocks on every rank"
    )
    rows = [line.split() for line in lines[4:8]]
    assert [row[:4] for row in rows] == [
        ["0", "0", "0", "0-30"],
        ["1", "0", "1", "0-30"],
        ["2", "1", "0", "31-61"],
        ["3", "1", "1", "31-61"],
    ]
    assert all(f"{plans[0].num_blocks:,}" in line for line in lines[4:8])
    assert "plan of rank 0 (pp stage 0, tp rank 0): every rank has these groups" in out
    assert "policy shared_buffer (auto: the layers have 2 different specs)" in out


def test_json_has_a_ranks_list(run_cli):
    status, out, err = run_cli(
        "plan",
        "--model",
        "meta-llama/Llama-3.2-1B",
        "--tp",
        "2",
        "--pp",
        "3",
        "--memory",
        "1GiB",
        "--max-model-len",
        "4096",
        "--json",
    )
    assert status == 0, err
    data = json.loads(out)
    plans = _expected("meta-llama/Llama-3.2-1B", 2, 3, GiB, 4096)
    assert (data["tp"], data["pp"], len(data["ranks"])) == (2, 3, 6)
    assert data["num_blocks"] == plans[data["rank"]].num_blocks
    for rank, (entry, plan) in enumerate(zip(data["ranks"], plans, strict=True)):
        assert entry["rank"] == rank and (entry["pp_rank"], entry["tp_rank"]) == divmod(rank, 2)
        assert entry["num_blocks"] == plan.num_blocks == plans[0].num_blocks
        assert entry["bytes_per_block"] == plan.bytes_per_block
        assert entry["available_memory_bytes"] == GiB
        assert entry["kv_cache_bytes"] == plan.kv_cache_bytes
    # 16 layers in 3 stages: 6, 5, 5
    assert [data["ranks"][r]["layer_ranges"] for r in (0, 2, 4)] == ["0-5", "6-10", "11-15"]
    assert data["ranks"][2]["layers"][0] == "model.layers.6.self_attn"
    assert sum(entry["holds_fewest_blocks"] for entry in data["ranks"]) == 1
    assert data["ranks"][0]["holds_fewest_blocks"]  # the largest stage holds the fewest blocks


def test_pp_with_a_spec_file_cuts_its_layers(run_cli, spec_file):
    layers = {f"model.layers.{i}.attn": full_entry() if i < 2 else sliding_entry(256) for i in range(6)}
    status, out, err = run_cli(
        "plan",
        "--specs",
        spec_file(layers),
        "--pp",
        "2",
        "--memory",
        "64MiB",
        "--max-model-len",
        "1024",
        "--json",
    )
    assert status == 0, err
    ranks = json.loads(out)["ranks"]
    assert [r["layer_ranges"] for r in ranks] == ["0-2", "3-5"]
    assert ranks[0]["bytes_per_block"] != ranks[1]["bytes_per_block"]
    assert ranks[0]["num_blocks"] == ranks[1]["num_blocks"]


def test_one_rank_output_has_no_rank_section(run_cli):
    status, out, _ = run_cli(
        "plan", "--model", "meta-llama/Llama-3.2-1B", "--memory", "1GiB", "--max-model-len", "4096"
    )
    assert status == 0 and not out.startswith("ranks:") and "pp stage" not in out
    status, out, _ = run_cli(
        "plan", "--model", "meta-llama/Llama-3.2-1B", "--memory", "1GiB", "--max-model-len", "4096", "--json"
    )
    assert "ranks" not in json.loads(out)


def test_rank_errors_are_one_line_and_name_the_rank(run_cli):
    common = ("--model", "meta-llama/Llama-3.2-1B", "--max-model-len", "8192")
    status, _, err = run_cli("plan", *common, "--pp", "17", "--memory", "1GiB")
    assert status == 1 and "16 layer(s) cannot fill 17 pipeline stages" in err
    status, _, err = run_cli("plan", *common, "--tp", "2", "--pp", "2", "--memory", "10MiB")
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith(
        "kvcore: error: rank 0 (pp stage 0, tp rank 0) has the fewest blocks: one request of 8192"
    )
