"""Errors about block counts of several pools say each pool's count, in a Python caller's terms
or the command line's."""

from __future__ import annotations

import pytest

from kvcore import SizingContext, plan_kv_cache
from kvcore.cli.inputs import FLAG_NAMES
from kvcore.error_messages import render
from kvcore.errors import InsufficientMemoryError, MultiplePoolsError
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec

MiB = 2**20


@pytest.fixture
def specs():
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    sliding = SlidingWindowSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=256
    )
    return {"l0": full, "l1": sliding, "l2": full, "l3": sliding}


def _plan(specs, registry, num_blocks):
    return plan_kv_cache(
        specs,
        64 * MiB,
        SizingContext(max_model_len=4096),
        registry=registry,
        policy="kind_pools",
        num_blocks=num_blocks,
    )


def test_a_count_of_counts_other_than_the_pools(specs, registry):
    with pytest.raises(MultiplePoolsError) as info:
        _plan(specs, registry, 100)
    error = info.value
    assert (error.num_pools, error.forced_counts, error.policy) == (2, 1, "kind_pools")
    assert str(error).endswith("give one count per pool (num_blocks=(N, N))")
    assert render(error, FLAG_NAMES).endswith("give one count per pool (--num-blocks N,N)")


def test_forced_counts_over_the_budget_name_each_pool(specs, registry):
    with pytest.raises(InsufficientMemoryError) as info:
        _plan(specs, registry, (3000, 1000))
    error = info.value
    assert error.required_pool_blocks == (3000, 1000)
    assert error.available_pool_blocks is not None and len(error.available_pool_blocks) == 2
    assert sum(error.available_pool_blocks) == error.available_blocks
    fit = ",".join(map(str, error.available_pool_blocks))
    assert str(error).startswith("num_blocks=(3000, 1000) needs ")
    assert f"at most ({fit.replace(',', ', ')}) fit" in str(error)
    assert render(error, FLAG_NAMES).startswith("--num-blocks 3000,1000 needs ")
    assert f"at most {fit} fit" in render(error, FLAG_NAMES)


def test_forced_counts_below_one_request_name_what_each_pool_needs(specs, registry):
    with pytest.raises(InsufficientMemoryError) as info:
        _plan(specs, registry, (3, 3))
    error = info.value
    assert error.available_pool_blocks == (3, 3)
    assert error.required_pool_blocks == (256, 145)
    assert "num_blocks=(3, 3) holds" in str(error) and "raise num_blocks to at least (256, 145)" in str(error)
    assert "raise --num-blocks to at least 256,145" in render(error, FLAG_NAMES)
    # the figures survive being said of one rank
    ranked = error.on_rank("rank 1")
    assert (ranked.required_pool_blocks, ranked.available_pool_blocks) == ((256, 145), (3, 3))


def test_too_little_memory_names_the_pool_that_is_short(specs, registry):
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache(
            specs, 3 * MiB, SizingContext(max_model_len=4096), registry=registry, policy="kind_pools"
        )
    error = info.value
    need, have = error.required_pool_blocks, error.available_pool_blocks
    assert need is not None and have is not None
    short = [str(p) for p in range(2) if have[p] < need[p]]
    assert short
    assert f"blocks per pool: {need[0]}, {need[1]}" in str(error)
    assert f"(blocks per pool: {have[0]}, {have[1]}; short in pool {' and '.join(short)})" in str(error)
