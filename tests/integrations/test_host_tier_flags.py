"""The engine flags for a plan's host tier, and what each engine allocates for them, by hand
(docs/reference/host-tier-flags.md cites the engines' lines these follow)."""

from __future__ import annotations

import pytest

from kvcore import SizingContext, plan_kv_cache
from kvcore.errors import InvalidInputError
from kvcore.integrations.host_tier.flags import (
    host_tier_flags,
    lmcache_host_tier,
    sglang_host_tier,
    vllm_host_tier,
)
from kvcore.planning.offload import with_host_memory
from tests.helpers import full, mix, sliding

GIB = 1 << 30


def _llama(registry, host, *, heads=8, layers=32, num_blocks=20_480):
    """Llama-3.1-8B's cache on one rank: 32 layers of 8 KV heads of 128 in bfloat16, 128 KiB a
    token, 2 MiB a block of 16 tokens (4 heads, 1 MiB, on each of two tensor-parallel ranks)."""
    specs = {f"l{i}": full(block_size=16, heads=heads, head_size=128) for i in range(layers)}
    plan = plan_kv_cache(
        specs, 64 * GIB, SizingContext(max_model_len=8192), registry=registry, num_blocks=num_blocks
    )
    return with_host_memory(plan, host)


def test_vllm_counts_every_rank_and_a_chunk_of_one_block_each(registry):
    plan = _llama(registry, 128 * GIB)
    assert plan.bytes_per_block == 2 * 2**20 and plan.host_blocks_in(0) == 65_536
    one = vllm_host_tier(plan)
    assert one.flags == ("--kv-offloading-size 128", "--kv-offloading-backend native")
    assert (one.holds_count, one.allocated_bytes) == (65_536, 128 * GIB)
    # two tensor-parallel ranks of half the heads: the flag counts both ranks, a chunk is a
    # block of each (1 MiB x 2), and vLLM keeps as many blocks as the tier asks on each rank
    rank = _llama(registry, 64 * GIB, heads=4)
    two = vllm_host_tier(rank, world_size=2)
    assert two.flags[0] == "--kv-offloading-size 128"
    assert (two.holds_count, two.allocated_bytes) == (65_536, 128 * GIB)


def test_vllm_rounds_a_chunk_up_to_the_page_and_the_size_up_to_hold_the_tier(registry):
    # 3 layers of 1 head of 8 in bfloat16: 96 bytes a token, 1,536 a block; a chunk takes a 4 KiB page
    plan = _llama(registry, 10**6, heads=1, layers=3, num_blocks=1000)
    specs = {f"l{i}": full(block_size=16, heads=1, head_size=8) for i in range(3)}
    plan = with_host_memory(
        plan_kv_cache(specs, GIB, SizingContext(max_model_len=256), registry=registry, num_blocks=1000), 10**6
    )
    assert plan.bytes_per_block == 1536 and plan.host_blocks_in(0) == 651
    got = vllm_host_tier(plan)
    # 651 x 4,096 bytes = 0.002483368 GiB, written 0.002484 (rounded up): int(0.002484 x 2^30) // 4,096
    assert got.flags[0] == "--kv-offloading-size 0.002484"
    assert got.holds_count == int(0.002484 * GIB) // 4096 == 651
    assert got.allocated_bytes == 651 * 4096


def test_sglang_by_size_in_whole_gb_and_by_ratio_each_with_a_padding_page(registry):
    plan = _llama(registry, 128 * GIB)
    by_size, by_ratio = sglang_host_tier(plan)
    # 128 GiB is 137.4 GB: 138 GB // 131,072 bytes = 1,052,856 tokens, + 1 padding token
    assert by_size.flags == ("--enable-hierarchical-cache", "--hicache-size 138")
    assert by_size.holds_count == 138 * 10**9 // 131_072 + 1 == 1_052_857
    assert by_size.allocated_bytes == 1_052_857 * 131_072
    # device 20,480 blocks x 16 = 327,680 tokens; the tier's 1,048,576 is 3.2 of them
    assert by_ratio.flags[1] == "--hicache-ratio 3.2"
    assert by_ratio.holds_count == 1_048_577
    paged = sglang_host_tier(plan, page_size=64)[0]
    assert paged.holds_count == (138 * 10**9 // 131_072 // 64 + 1) * 64


def test_lmcache_allocates_whole_gib_as_floats_and_holds_whole_chunks(registry):
    got = lmcache_host_tier(_llama(registry, 100 * GIB + 1234 * 2**20))
    # 101.205078125 GiB (a whole number of 2 MiB blocks), written rounded up to 101.205079, all
    # of it pinned; chunks of 256 x 128 KiB
    assert got.flags == ("max_local_cpu_size: 101.205079", "chunk_size: 256")
    assert got.allocated_bytes == int(101.205079 * GIB)
    assert got.holds_count == int(101.205079 * GIB) // (256 * 131_072) * 256


def test_hybrid_plans_get_vllms_flag_and_say_why_not_the_others(registry):
    specs = mix((2, full()), (6, sliding(128)))
    plan = with_host_memory(
        plan_kv_cache(specs, GIB, SizingContext(max_model_len=4096), registry=registry), GIB
    )
    flags = host_tier_flags(plan)
    assert [s.engine for s in flags.settings] == ["vllm"]
    assert [line.split(":")[0] for line in flags.not_computed] == ["sglang", "lmcache"]
    assert "keep every token" in flags.not_computed[0]


def test_refusals(registry):
    plan = _llama(registry, 128 * GIB)
    with pytest.raises(InvalidInputError, match="no host tier"):
        host_tier_flags(plan.with_offload_tier(None))
    with pytest.raises(InvalidInputError, match="world_size must be >= 1"):
        vllm_host_tier(plan, world_size=0)
    pools = with_host_memory(
        plan_kv_cache(
            mix((2, full()), (6, sliding(128))),
            GIB,
            SizingContext(max_model_len=4096),
            registry=registry,
            policy="kind_pools",
        ),
        GIB,
    )
    with pytest.raises(InvalidInputError, match="2 block pools"):
        host_tier_flags(pools)
