"""The plan check reads each layer of a mixed-page group with its own page, and keeps pools apart."""

from __future__ import annotations

import pytest

from kvcore import KVCacheGroup, KVCachePlan, KVCacheTensor, SizingContext
from kvcore.plan import KVCachePool
from kvcore.planning.invariants import plan_problems
from tests.helpers import full

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
