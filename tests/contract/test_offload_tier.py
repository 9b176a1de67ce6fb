"""A plan's host tier: the value, how one amount is shared among pools, the plan check's rule,
plan JSON (old JSON without it still reads), and `kvcore plan --host-memory`."""

from __future__ import annotations

import json

import pytest

from kvcore import SizingContext, plan_kv_cache
from kvcore.cli import main
from kvcore.errors import InvalidInputError, PlanValidationError
from kvcore.plan import KVCachePool, OffloadTier, split_host_memory
from kvcore.planning.invariants import host_page_bytes, plan_problems, smallest_host_memory
from kvcore.planning.offload import with_host_memory
from kvcore.planning.serialization import plan_from_dict, plan_to_dict
from kvcore.plugins.state import StatePart, StateSpec
from tests.helpers import full, mix, sliding

CONTEXT = SizingContext(max_model_len=4096)


def _plan(registry, policy="shared_buffer", specs=None):
    return plan_kv_cache(
        specs or mix((2, full()), (6, sliding(128))), 1 << 30, CONTEXT, registry=registry, policy=policy
    )


@pytest.mark.parametrize("bad", [(-1,), (1.5,), ("8",), (True,), ()])
def test_the_tier_refuses_bad_byte_counts(bad):
    with pytest.raises(PlanValidationError):
        OffloadTier(pool_bytes=bad)


def test_one_amount_is_shared_as_the_pools_device_bytes_are_in_whole_blocks():
    pools = (
        KVCachePool(num_blocks=300, bytes_per_block=1000),
        KVCachePool(num_blocks=100, bytes_per_block=3000, offset=300_000),
    )
    # device bytes 300,000 and 300,000: half each, rounded down to whole blocks
    tier = split_host_memory(pools, 1_000_000)
    assert tier.pool_bytes == (500_000, 498_000)
    assert tier.nbytes == 998_000
    assert split_host_memory(pools, 0).pool_bytes == (0, 0)
    with pytest.raises(PlanValidationError, match="host memory must be an int"):
        split_host_memory(pools, -5)


def test_a_plan_counts_host_blocks_per_pool_and_keeps_device_figures(registry):
    plan = _plan(registry, "kind_pools")
    tiered = with_host_memory(plan, 4 << 30)
    assert tiered.kv_cache_bytes == plan.kv_cache_bytes  # host bytes are not device bytes
    assert tiered.max_concurrency() == plan.max_concurrency()
    for p, pool in enumerate(plan.pools):
        assert tiered.host_blocks_in(p) == tiered.offload_tier.pool_bytes[p] // pool.bytes_per_block > 0
        assert plan.host_blocks_in(p) == 0
    assert tiered.pool_plan(1).offload_tier == OffloadTier(pool_bytes=(tiered.offload_tier.pool_bytes[1],))


def test_json_round_trip_and_old_json_still_reads(registry):
    plan = _plan(registry, "kind_pools")
    tiered = with_host_memory(plan, 1 << 32)
    data = plan_to_dict(tiered, registry)
    assert data["offload_tier"] == {"pool_bytes": list(tiered.offload_tier.pool_bytes)}
    assert plan_from_dict(json.loads(json.dumps(data)), registry) == tiered
    old = plan_to_dict(plan, registry)
    assert "offload_tier" not in old
    assert plan_from_dict(old, registry).offload_tier is None
    with pytest.raises(InvalidInputError, match=r"offload_tier\.pool_bytes\[0\]"):
        plan_from_dict({**data, "offload_tier": {"pool_bytes": ["8GiB", 1]}}, registry)
    with pytest.raises(PlanValidationError, match="host bytes for 1 pool\\(s\\) but the plan has 2"):
        plan_from_dict({**data, "offload_tier": {"pool_bytes": [1 << 30]}}, registry)


def test_the_plan_check_refuses_a_tier_that_cannot_hold_a_page_with_numbers_and_a_fix(registry):
    state = StateSpec(block_size=16, parts=(StatePart(name="ssm", shape=(64, 64), dtype="float32"),))
    plan = _plan(registry, specs={**mix((2, full(heads=1, head_size=64))), "m": state})
    page = host_page_bytes(plan, 0)
    spans = {g.blocks_per_page for g in plan.groups}
    assert page == max(spans) * plan.bytes_per_block and max(spans) > 1  # a state page spans several ids
    (problem,) = plan_problems(plan.with_offload_tier(OffloadTier(pool_bytes=(page - 1,))))
    assert f"{page - 1:,} bytes, which cannot hold one of its pages of {page:,} bytes" in problem
    assert f"give it at least {page:,} bytes" in problem
    assert plan_problems(plan.with_offload_tier(OffloadTier(pool_bytes=(page,)))) == []
    assert plan_problems(plan.with_offload_tier(OffloadTier(pool_bytes=(0,)))) == [
        "the offload tier has 0 host bytes in every pool; give it host memory, or drop the tier"
    ]


def test_the_smallest_host_memory_serves_every_pool_and_one_byte_less_does_not(registry):
    plan = _plan(registry, "kind_pools")
    least = smallest_host_memory(plan)
    with_host_memory(plan, least)
    with pytest.raises(InvalidInputError, match="cannot hold one page of the plan: pool"):
        with_host_memory(plan, least - 1)


def test_plan_host_memory_on_the_command_line(capsys):
    args = ["plan", "--model", "google/gemma-3-27b-it", "--memory", "80GiB", "--max-model-len", "32768"]
    assert main([*args, "--host-memory", "256GiB"]) == 0
    out = capsys.readouterr().out
    # 256 GiB of 1.25 MiB blocks: 209,715 (and 0.75 MiB left over)
    assert (
        "host tier        209,715 x 1.25 MiB blocks = 256.00 GiB of host memory "
        "(3.20x the device's 65,536 usable blocks)" in out
    )
    assert main([*args, "--host-memory", "256GiB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["offload_tier"] == {"pool_bytes": [209_715 * 1_310_720]}
    assert report["host_tier"] == {"bytes": 209_715 * 1_310_720, "blocks_by_pool": [209_715]}
    assert main([*args, "--host-memory", "1KiB"]) == 1
    err = capsys.readouterr().err
    assert "give at least 1.25 MiB (1,310,720 bytes), or none" in err
    assert main(args) == 0
    assert "host tier" not in capsys.readouterr().out
