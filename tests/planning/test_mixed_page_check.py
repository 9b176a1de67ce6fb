"""The plan check reads each layer of a mixed-page group with its own page, and keeps pools apart."""

from __future__ import annotations

import pytest

from kvcore import KVCacheGroup, KVCachePlan, KVCacheTensor, SizingContext
from kvcore.plan import KVCachePool
from kvcore.planning.invariants import MAX_CHECKED_PAGES, _exact_problems, overlap_problems, plan_problems
from tests.helpers import full, sliding

CTX = SizingContext(max_model_len=64)
SMALL = full(block_size=16, heads=1, head_size=1, dtype="float32")  # 2 x 16 x 4 = 128 bytes
LARGE = full(block_size=16, heads=2, head_size=1, dtype="float32")  # 256 bytes


def _mixed(offsets: dict[str, int], row: int, blocks: int = 4, *, large_spec: bool = False) -> KVCachePlan:
    """Layer 'a' has the small page, 'b' the large; the group's spec is the small one (or, with
    ``large_spec``, the large one, 'a' then listed in ``layer_specs``)."""
    if large_spec:
        group = KVCacheGroup(layer_names=("a", "b"), spec=LARGE, layer_specs={"a": SMALL})
    else:
        group = KVCacheGroup(layer_names=("a", "b"), spec=SMALL, layer_specs={"b": LARGE})
    pages = {"a": SMALL.page_size_bytes, "b": LARGE.page_size_bytes}
    tensors = [
        KVCacheTensor(
            size=(blocks - 1) * row + pages[name], offset=offset, page_stride=row, shared_by=(name,)
        )
        for name, offset in offsets.items()
    ]
    return KVCachePlan(
        policy="test",
        num_blocks=blocks,
        bytes_per_block=row,
        single_buffer=True,
        groups=[group],
        tensors=tensors,
        context=CTX,
        available_memory_bytes=blocks * row,
    )


@pytest.mark.parametrize("large_spec", [False, True])
def test_side_by_side_pages_of_their_own_sizes_pass(large_spec):
    # with the group's large page for 'a', 'a' at 0 would seem to run into 'b' at 128
    assert plan_problems(_mixed({"a": 0, "b": 128}, row=384, large_spec=large_spec)) == []
    assert plan_problems(_mixed({"b": 0, "a": 256}, row=384, large_spec=large_spec)) == []


def test_a_large_page_over_its_neighbour_is_caught():
    # with the group's (small) page for 'b', 'b' at 0 and 'a' at 128 would look apart
    problems = plan_problems(_mixed({"b": 0, "a": 128}, row=384))
    assert problems and "pages of one group (group 0)" in problems[0]
    assert "'a'" in problems[0] and "'b'" in problems[0]


def test_two_pools_with_the_same_block_ids_never_overlap_a_sound_plan():
    first = KVCacheGroup(layer_names=("a", "b"), spec=SMALL, layer_specs={"b": LARGE})
    second = KVCacheGroup(layer_names=("c",), spec=SMALL, pool=1)
    pools = [
        KVCachePool(num_blocks=4, bytes_per_block=384),
        KVCachePool(num_blocks=4, bytes_per_block=128, offset=1536),
    ]
    plan = KVCachePlan(
        policy="test",
        pools=pools,
        single_buffer=True,
        groups=[first, second],
        tensors=[
            KVCacheTensor(size=3 * 384 + 128, offset=0, page_stride=384, shared_by=("a",)),
            KVCacheTensor(size=3 * 384 + 256, offset=128, page_stride=384, shared_by=("b",)),
            KVCacheTensor(size=4 * 128, offset=1536, page_stride=128, shared_by=("c",)),
        ],
        context=CTX,
        available_memory_bytes=2048,
    )
    assert plan_problems(plan) == []


def _two_pools(d_offset: int) -> KVCachePlan:
    """Pool 0: one layer 'a'. Pool 1 (from byte 512): group 1 of 'c' and 'd' side by side in
    rows of 256 bytes, and group 2 of 'e' on the bytes of 'c'; 'd' starts at ``d_offset`` in
    the pool's row."""
    groups = [
        KVCacheGroup(layer_names=("a",), spec=SMALL),
        KVCacheGroup(layer_names=("c", "d"), spec=SMALL, pool=1),
        KVCacheGroup(layer_names=("e",), spec=SMALL, pool=1),
    ]
    pools = [
        KVCachePool(num_blocks=4, bytes_per_block=128),
        KVCachePool(num_blocks=4, bytes_per_block=256, offset=512),
    ]
    return KVCachePlan(
        policy="test",
        pools=pools,
        single_buffer=True,
        groups=groups,
        tensors=[
            KVCacheTensor(size=4 * 128, offset=0, page_stride=128, shared_by=("a",)),
            KVCacheTensor(size=3 * 256 + 128, offset=512, page_stride=256, shared_by=("c", "e")),
            KVCacheTensor(size=3 * 256 + 128, offset=512 + d_offset, page_stride=256, shared_by=("d",)),
        ],
        context=CTX,
        available_memory_bytes=1536,
    )


def test_each_pool_is_checked_row_by_row_like_a_plan_of_one_pool():
    sound = _two_pools(128)
    assert overlap_problems(sound) == [] == _exact_problems(sound, MAX_CHECKED_PAGES)
    # 'd' over 'c' (one group): caught, as the exact check finds it, naming pool 1's bytes
    broken = _two_pools(64)
    fast, exact = overlap_problems(broken), _exact_problems(broken, MAX_CHECKED_PAGES)
    assert fast and exact
    assert fast[0].startswith("pool 1: bytes 576..640 are used by pages of one group (group 1)")
    assert exact[0].startswith("bytes 576..640 are used by pages of one group (group 1)")


def test_a_kind_pools_plan_is_checked_without_a_page_sweep(registry, monkeypatch):
    from kvcore import plan_kv_cache
    from kvcore.planning import invariants

    specs = {
        f"model.layers.{i}.attn": SMALL if i % 3 else sliding(64, heads=1, head_size=1, dtype="float32")
        for i in range(30)
    }
    plan = plan_kv_cache(specs, 2**20, CTX, registry=registry, policy="kind_pools")
    assert not plan.runs_in_one_pool
    monkeypatch.setattr(invariants, "_exact_problems", lambda *a: pytest.fail("the exact check ran"))
    assert overlap_problems(plan) == []
