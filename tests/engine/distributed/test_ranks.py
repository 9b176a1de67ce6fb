"""Real CPU ranks over gloo: agreement on one plan, and every fault named on every live rank.

Each rank runs :func:`kvcore.initialize_kv_caches` with a
:class:`~kvcore.engine.distributed.DistributedExecutor` over its own stage of a small model (see
``_ranks.py``). The expected plans are computed here, in the test process, with the pure
:func:`~kvcore.planning.ranks.plan_for_ranks` on what each rank's executor reports.
"""

from __future__ import annotations

import json

import pytest

from kvcore.planning.capacity import split_budget
from kvcore.planning.serialization import plan_from_dict
from tests.engine.distributed._ranks import (
    DEAD,
    Scenario,
    expected_plans,
    preload_forkserver,
    run_ranks,
    toy_registry,
)

MiB = 2**20


@pytest.fixture(scope="module", autouse=True)
def _forkserver():
    preload_forkserver()


def _layer(i: int) -> str:
    return f"model.layers.{i}.self_attn"


def _check_agreed(scenario: Scenario, reports):
    registry = toy_registry()
    expected = expected_plans(scenario, registry)
    world = scenario.parallelism.world_size
    assert sorted(reports) == list(range(world))
    for rank, report in reports.items():
        assert report["ok"], f"rank {rank}: {report}"
        plan = plan_from_dict(report["plan"], registry)
        assert plan == expected[rank]
        own = [_layer(i) for i in scenario.stage_layers(rank)]
        assert sorted(plan.layer_names) == sorted(own)
        assert report["bound"] == report["with_views"] == sorted(own)  # only its own layers
        assert report["rank_plans"] == world
        assert report["fewest_most"] == [plan.num_blocks, plan.num_blocks]
    counts = {
        json.dumps(report["plan"].get("num_blocks", report["plan"].get("pools")))
        for report in reports.values()
    }
    assert len(counts) == 1
    return expected


def test_two_tensor_parallel_ranks_share_one_plan():
    scenario = Scenario(tp=2, pp=1, windows={1: 32, 3: 32, 5: 32, 7: 32}, memory=(6 * MiB, 4 * MiB))
    reports, _ = run_ranks(scenario)
    expected = _check_agreed(scenario, reports)
    # rank 1 has less memory: both get what rank 1 holds
    assert expected[0].num_blocks == 4 * MiB // expected[1].bytes_per_block
    assert expected[0].bytes_per_block == expected[1].bytes_per_block
    assert expected[0].available_memory_bytes == 6 * MiB


def test_two_pipeline_stages_with_different_kinds_get_their_own_bytes_per_block():
    # stage 0 (layers 0-3) is full attention with 4 KV heads; stage 1 (4-7) sliding windows
    scenario = Scenario(tp=1, pp=2, windows={i: 32 for i in range(4, 8)})
    reports, _ = run_ranks(scenario)
    expected = _check_agreed(scenario, reports)
    assert scenario.stage_layers(0) == [0, 1, 2, 3] and scenario.stage_layers(1) == [4, 5, 6, 7]
    kinds = [{g.spec.kind for g in plan.groups if g.layer_names} for plan in expected]
    assert kinds == [{"full_attention"}, {"sliding_window"}]
    # every rank keeps every group (empty where the layers are elsewhere)
    assert [len(plan.groups) for plan in expected] == [len(expected[0].groups)] * 2


def test_four_ranks_tp2_pp2():
    scenario = Scenario(
        tp=2,
        pp=2,
        num_layers=10,
        windows={0: 32, 2: 32, 4: 32, 6: 32, 8: 32},
        memory=(4 * MiB, 4 * MiB, 3 * MiB, 4 * MiB),
    )
    reports, _ = run_ranks(scenario)
    expected = _check_agreed(scenario, reports)
    assert [scenario.stage_layers(r) for r in range(4)] == [[0, 1, 2, 3, 4]] * 2 + [[5, 6, 7, 8, 9]] * 2
    fewest = min(p.available_memory_bytes // p.bytes_per_block for p in expected)
    assert expected[0].num_blocks == fewest == 3 * MiB // expected[2].bytes_per_block


def test_ranks_of_several_pools_agree_on_the_fewest_blocks_of_each_pool():
    # full attention and sliding windows in every stage: kind_pools makes two pools; the ranks'
    # budgets differ, and each pool's count is the smallest any rank's own split gives it
    scenario = Scenario(
        tp=2,
        pp=2,
        windows={i: 32 for i in range(0, 8, 2)},
        memory=(4 * MiB, 3 * MiB, 4 * MiB, 5 * MiB),
        policy="kind_pools",
    )
    reports, _ = run_ranks(scenario)
    expected = _check_agreed(scenario, reports)
    assert all(len(plan.pools) == 2 for plan in expected)
    counts = [pool.num_blocks for pool in expected[0].pools]
    assert all([pool.num_blocks for pool in plan.pools] == counts for plan in expected)
    # what each rank's own budget would give each pool; the agreed count is the minimum per pool
    own = [
        split_budget(
            plan.available_memory_bytes,
            [pool.bytes_per_block for pool in plan.pools],
            plan.blocks_per_request_by_pool(),
        )
        for plan in expected
    ]
    assert counts == [min(split[p] for split in own) for p in range(2)]
    assert own[1] == tuple(counts)  # rank 1 has the least memory: it sets both pools
    assert own[0] != own[1]


def test_tensor_parallel_ranks_that_disagree_fail_on_every_rank_naming_the_layer_and_ranks():
    # layer 2 is on stage 0 (ranks 0, 1); rank 1 builds it with 3 KV heads instead of 4 // 2
    scenario = Scenario(tp=2, pp=2, faults={1: "heads"})
    reports, _ = run_ranks(scenario)
    assert sorted(reports) == [0, 1, 2, 3]
    for report in reports.values():
        assert report["error"] == "SpecMismatchError"
        message = report["message"]
        assert "layer 'model.layers.2.self_attn' (reported by ranks 0, 1)" in message
        assert "rank 1 reports" in message and "but rank 0 reports" in message
        assert "num_kv_heads (2 vs 3)" in message


@pytest.mark.slow  # real ranks waiting out their timeout (~5 s)
@pytest.mark.parametrize("fault", ["exit", "hang"])
def test_a_rank_that_dies_or_hangs_is_named_on_every_other_rank_within_the_timeout(fault):
    scenario = Scenario(tp=2, pp=2, faults={2: fault}, timeout_s=2.0)
    reports, exitcodes = run_ranks(scenario)
    assert sorted(reports) == [0, 1, 3]
    for report in reports.values():
        assert report["error"] == "DistributedAgreementError"
        assert report["ranks"] == [2]
        assert report["message"].startswith("rank 2 (pp stage 1, tp rank 0) did not answer within 2 s")
        assert report["seconds"] < 20.0
    # the first rank to give up waited its whole timeout; the others follow its abort, so they
    # may raise a little before their own deadlines
    assert max(report["seconds"] for report in reports.values()) >= 2.0
    if fault == "exit":
        assert exitcodes[2] == DEAD


def test_a_rank_that_raises_stops_the_others_at_once_naming_it():
    # the timeout is far longer than the test's guard: only the error marker can end the wait
    scenario = Scenario(tp=2, pp=1, faults={1: "raise"}, timeout_s=600.0)
    reports, _ = run_ranks(scenario, guard_s=30.0)
    assert reports[1]["error"] == "MemoryProfilingError"  # its own error, raised as is
    other = reports[0]
    assert other["error"] == "DistributedAgreementError" and other["ranks"] == [1]
    assert "rank 1 failed: MemoryProfilingError: the profile run left no room" in other["message"]
