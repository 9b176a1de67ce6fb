"""Plans of several block pools wherever a plan is shown: `kvcore plan` (text and --json, one
rank and several), `kvcore check`, `--num-blocks` per pool, the start-up log, the memory map."""

from __future__ import annotations

import json

import pytest

from kvcore import SizingContext, plan_kv_cache
from kvcore.cli.memory_map import memory_map
from kvcore.engine.workflow import capacity_summary
from kvcore.planning.serialization import plan_from_dict
from tests.cli.conftest import full_entry, sliding_entry

MiB = 2**20


@pytest.fixture
def pooled_specs(spec_file):
    """Two full-attention layers (one with a smaller page) and three sliding-window layers."""
    layers = {
        "model.layers.0.attn": full_entry(),
        "model.layers.1.attn": sliding_entry(256),
        "model.layers.2.attn": full_entry(num_kv_heads=4),
        "model.layers.3.attn": sliding_entry(256),
        "model.layers.4.attn": sliding_entry(256),
    }
    return spec_file(layers), layers


def _inputs(path):
    """The spec file and budget every command here plans with."""
    return ("--specs", path, "--memory", "256MiB", "--max-model-len", "4096")


def _plan_args(path, *extra):
    return ("plan", *_inputs(path), "--policy", "kind_pools", *extra)


def test_plan_text_shows_every_pool_and_its_groups(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, out, _ = run_cli(*_plan_args(path))
    assert status == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("group"))
    assert header.split()[:3] == ["group", "pool", "kind"]
    blocks = [line for line in lines if "pool 0:" in line or "pool 1:" in line]
    assert len(blocks) == 2 and blocks[0].lstrip().startswith("blocks")
    assert any(line.strip().startswith("= ") and "in 2 pools" in line for line in lines)
    # the full-attention group mixes two page sizes: both shown
    assert "32.00 KiB/64.00 KiB" in out
    assert "blocks (pools 0-1)" in out


def test_plan_json_carries_pools_and_reads_back(run_cli, pooled_specs, tmp_path, registry):
    path, _ = pooled_specs
    status, out, _ = run_cli(*_plan_args(path, "--json"))
    assert status == 0
    data = json.loads(out)
    assert "num_blocks" not in data and "bytes_per_block" not in data
    assert [sorted(pool) for pool in data["pools"]] == [["bytes_per_block", "num_blocks", "offset"]] * 2
    assert {group.get("pool", 0) for group in data["groups"]} == {0, 1}
    assert any("layer_specs" in group for group in data["groups"])
    plan = plan_from_dict(data, registry)
    assert data["blocks_per_request_by_pool"] == list(plan.blocks_per_request_by_pool())
    assert min(data["max_concurrency_by_pool"]) == pytest.approx(data["max_concurrency"])
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    status, out, _ = run_cli("check", saved)
    assert status == 0
    pools = " + ".join(f"{p['num_blocks']:,} x" for p in data["pools"])
    assert "2 pools of " in out and pools.split(" x")[0] in out


def test_one_pool_json_is_unchanged(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, out, _ = run_cli("plan", *_inputs(path), "--policy", "shared_buffer", "--json")
    assert status == 0
    data = json.loads(out)
    assert list(data)[:2] == ["policy", "num_blocks"]
    assert "pools" not in data and "bytes_per_block" in data
    assert "blocks_per_request_by_pool" not in data


def test_num_blocks_takes_one_count_per_pool(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, out, _ = run_cli(*_plan_args(path, "--num-blocks", "300,200", "--json"))
    assert status == 0
    assert [pool["num_blocks"] for pool in json.loads(out)["pools"]] == [300, 200]


def test_num_blocks_of_the_wrong_count_names_the_pools(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, _, err = run_cli(*_plan_args(path, "--num-blocks", "300"))
    assert status == 1
    assert err.strip() == (
        "kvcore: error: policy 'kind_pools' makes 2 block pools but 1 block count was forced; "
        "give one count per pool (--num-blocks N,N)"
    )
    status, _, err = run_cli(*_plan_args(path, "--num-blocks", "300,200", "--policy", "shared_buffer"))
    assert status == 1
    assert "makes 1 block pool but 2 block counts were forced" in err and "(--num-blocks N)" in err


def test_num_blocks_too_many_or_too_few_per_pool(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, _, err = run_cli(*_plan_args(path, "--num-blocks", "90000,90000"))
    assert status == 1
    assert err.startswith("kvcore: error: --num-blocks 90000,90000 needs ")
    assert "(2 pools, 180000 blocks in all)" in err and "Traceback" not in err
    status, _, err = run_cli(*_plan_args(path, "--num-blocks", "3,3"))
    assert status == 1
    assert "--num-blocks 3,3 holds" in err and "raise --num-blocks to at least 256," in err


@pytest.mark.parametrize("bad", ["300,", ",300", "300,0", "300,x"])
def test_num_blocks_list_is_checked(run_cli, pooled_specs, bad):
    path, _ = pooled_specs
    with pytest.raises(SystemExit) as info:
        run_cli(*_plan_args(path, "--num-blocks", bad))
    assert info.value.code == 2
    assert "argument --num-blocks" in run_cli.capsys.readouterr().err


def test_ranks_show_each_pool(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, out, _ = run_cli(*_plan_args(path, "--pp", "2"))
    assert status == 0
    assert out.splitlines()[0].startswith("ranks: tp 1 x pp 2 = 2, 2 block pools of ")
    assert "split by each pool's need per request" in out
    status, out, _ = run_cli(*_plan_args(path, "--pp", "2", "--json"))
    ranks = json.loads(out)["ranks"]
    assert all("bytes_per_block" not in rank and len(rank["pools"]) == 2 for rank in ranks)
    assert ranks[0]["pools"][0]["num_blocks"] == ranks[1]["pools"][0]["num_blocks"]


def _pooled_plan(registry, layers):
    from kvcore.planning.serialization import spec_from_dict

    specs = {name: spec_from_dict(entry, registry) for name, entry in layers.items()}
    plan = plan_kv_cache(
        specs, 256 * MiB, SizingContext(max_model_len=4096), registry=registry, policy="kind_pools"
    )
    return specs, plan


def test_start_up_log_names_pools_and_pages(registry, pooled_specs):
    _, layers = pooled_specs
    specs, plan = _pooled_plan(registry, layers)
    text = capacity_summary(plan, specs)
    assert "2 block pools (" in text.splitlines()[0]
    assert ", pool 1," in text or ", pool 0," in text
    assert "pages of 32.00 KiB/64.00 KiB" in text


def test_memory_map_shows_each_pool_region(registry, pooled_specs):
    _, layers = pooled_specs
    _, plan = _pooled_plan(registry, layers)
    data = memory_map(plan, rows=3)
    assert [label for label, _, _ in data.regions] == ["pool 0", "pool 1"]
    (_, a0, a1), (_, b0, b1) = data.regions
    assert a0 == 0 and a1 == b0 and b1 == data.buffer_bytes
    assert a1 - a0 == 3 * plan.pools[0].bytes_per_block and b1 - b0 == 3 * plan.pools[1].bytes_per_block
    for box in data.buffer_boxes:  # every page drawn inside its own pool's region
        pool = plan.group_of(box.label).pool
        _, lo, hi = data.regions[pool]
        assert lo <= box.x0 < box.x1 <= hi
    # each group's row is as wide as its own pool's block
    for gi, group in enumerate(plan.groups):
        boxes = [box for box in data.row_boxes if box.track == gi]
        assert max(box.x1 for box in boxes) == plan.pool_of(group).bytes_per_block
    assert "2 pools (" in data.title


def test_compare_for_vllm_labels_a_plan_of_pools_and_goes_on(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, out, _ = run_cli(
        "compare", *_inputs(path), "--engine", "vllm", "--policies", "shared_buffer,kind_pools"
    )
    assert status == 0
    assert (
        "kind_pools: no plan: policy 'kind_pools' made a plan of 2 block pools, but vLLM 0.33 has one" in out
    )
    assert any(line.lstrip().startswith("shared_buffer") for line in out.splitlines())


def test_vllm_runs_mixed_page_groups_of_one_pool_and_refuses_several_pools(registry):
    from kvcore.errors import KVCoreError
    from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules, check_runnable, plan_for_vllm
    from kvcore.planning.serialization import spec_from_dict
    from kvcore.policy import PlanOptions

    specs = {
        f"model.layers.{i}.attn": spec_from_dict(full_entry(num_kv_heads=2 + i % 3), registry)
        for i in range(6)
    }
    rules = VllmRules(max_model_len=1024)
    context = SizingContext(max_model_len=1024)
    mixed = plan_kv_cache(specs, 64 * MiB, context, registry=registry, policy="kind_pools")
    assert len(mixed.pools) == 1 and mixed.groups[0].layer_specs
    check_runnable(mixed)  # one pool, a mixed-page group of full attention: vLLM's UniformTypeKVCacheSpecs
    assert issubclass(VllmIntegrationError, KVCoreError)
    # planned for vLLM, mixed pages stay as the options say
    planned = plan_for_vllm(rules.request(specs, 64 * MiB, policy="shared_buffer"), rules, registry=registry)
    assert any(group.layer_specs for group in planned.groups)
    single = PlanOptions(mixed_pages=False)
    apart = plan_for_vllm(
        rules.request(specs, 64 * MiB, policy="shared_buffer", options=single), rules, registry=registry
    )
    assert not any(group.layer_specs for group in apart.groups)
    check_runnable(apart)
    # one spec per group, kind_pools gives each spec its own pool, which vLLM's one pool cannot run
    with pytest.raises(VllmIntegrationError, match="3 block pools"):
        plan_for_vllm(
            rules.request(specs, 64 * MiB, policy="kind_pools", options=single), rules, registry=registry
        )


def test_pool_split_shares_the_budget_and_is_recorded(run_cli, pooled_specs, registry):
    path, _ = pooled_specs
    status, out, _ = run_cli(*_plan_args(path, "--pool-split", "0.4,0.6", "--json"))
    assert status == 0
    data = json.loads(out)
    assert data["pool_split"] == [0.4, 0.6] and data["options"]["pool_split"] == [0.4, 0.6]
    budget = 256 * MiB
    for pool, share in zip(data["pools"], (0.4, 0.6), strict=True):
        assert pool["num_blocks"] == int(budget * share) // pool["bytes_per_block"]
    assert plan_from_dict(data, registry).pool_split == (0.4, 0.6)
    status, out, _ = run_cli(*_plan_args(path, "--json"))  # split by need: nothing recorded
    assert status == 0 and "pool_split" not in json.loads(out)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0.4,0.5", "--pool-split: the fractions must sum to 1 (got [0.4, 0.5]"),
        ("0.4,x", "expected one fraction of the budget per pool, comma-separated"),
        ("1.0", "--pool-split needs a fraction for each of at least 2 pools"),
    ],
)
def test_a_bad_pool_split_is_refused_by_argparse(run_cli, pooled_specs, value, words):
    path, _ = pooled_specs
    with pytest.raises(SystemExit) as exited:
        run_cli(*_plan_args(path, "--pool-split", value))
    assert exited.value.code == 2
    assert words in run_cli.capsys.readouterr().err


def test_pool_split_for_a_policy_of_one_pool_names_the_fix(run_cli, pooled_specs):
    path, _ = pooled_specs
    status, _, err = run_cli("plan", *_inputs(path), "--policy", "shared_buffer", "--pool-split", "0.4,0.6")
    assert status == 1
    assert "made 1 block pool" in err and "plan with a policy of several pools (kind_pools)" in err
