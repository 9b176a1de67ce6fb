"""BlockTables by hand: padding with the null block or the out-of-range sentinel, rows given and
taken back, in-place updates, slot mappings (freed pages, padding, state groups) and errors.
The random programs are in test_pool_properties.py; the CUDA copy is test_cuda_block_tables.py."""

from __future__ import annotations

import pytest
import torch

from kvcore import (
    BlockPool,
    BlockTables,
    InvalidInputError,
    KVCacheGroup,
    PlanOptions,
    SizingContext,
    plan_kv_cache,
)
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.runtime.block_tables import PAD_SLOT
from tests.helpers import full, mix, sliding
from tests.runtime.test_block_pool import ATT, STATE, _plan as _hand_plan

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
CTX = SizingContext(max_model_len=64, max_num_batched_tokens=16)
SPECS = mix(
    (2, full(block_size=4, heads=1, head_size=8)), (2, sliding(8, block_size=4, heads=1, head_size=8))
)


def _pool(null: bool, num_blocks: int = 40) -> BlockPool:
    options = PlanOptions(reserve_null_block=True) if null else None
    return BlockPool(
        plan_kv_cache(SPECS, 2**30, CTX, registry=REGISTRY, options=options, num_blocks=num_blocks)
    )


def test_without_a_null_block_entries_pad_with_one_past_the_last_page():
    pool = _pool(null=False)
    tables = BlockTables(pool, max_requests=2)
    assert tables.pad_pages == (40, 40) and tables.max_pages == (16, 16)
    assert all(t.dtype == torch.int32 and t.shape == (2, 16) for t in tables.tensors)
    assert tables.update("a", pool.reserve("a", 10)) == 0
    assert tables.tensors[0][0].tolist() == [0, 1, 2] + [40] * 13
    slots = tables.slot_mapping([("a", 0, 10)], pad_to=12)
    assert slots[0].tolist() == [*range(10), PAD_SLOT, PAD_SLOT]


def test_with_a_null_block_entries_and_slots_pad_into_it():
    pool = _pool(null=True)
    tables = BlockTables(pool, max_requests=2)
    assert tables.pad_pages == (0, 0)
    tables.update("a", pool.reserve("a", 12))
    tables.update("a", pool.release_stale("a", 12))  # the window (8) of token 12 starts at 5: page 0 goes
    sliding_row = tables.tensors[1][0].tolist()
    assert sliding_row[0] == 0 and all(page > 0 for page in sliding_row[1:3]) and sliding_row[3:] == [0] * 13
    slots = tables.slot_mapping([("a", 2, 2)], pad_to=3)[1].tolist()  # tokens 2, 3 lie on the freed page
    assert slots == [2, 3, 0]  # the null block's slots, which nobody reads


def test_rows_are_reused_lowest_first_and_cleared():
    pool = _pool(null=False)
    tables = BlockTables(pool, max_requests=2)
    tables.update("a", pool.reserve("a", 4))
    tables.update("b", pool.reserve("b", 4))
    with pytest.raises(InvalidInputError, match="all 2 are taken"):
        tables.update("c", pool.reserve("c", 4))
    pool.free_request("a")
    tables.remove("a")
    assert tables.tensors[0][0].tolist() == [40] * 16 and "a" not in tables
    assert tables.update("c", {}) == 0 and tables.rows(["c", "b"]).tolist() == [0, 1]
    with pytest.raises(InvalidInputError, match="has no block-table row"):
        tables.row("a")


def test_truncate_pads_the_cut_entries_in_place():
    pool = _pool(null=False)
    tables = BlockTables(pool, max_requests=1)
    before = tables.tensors[0]
    tables.update("a", pool.reserve("a", 20))
    tables.update("a", pool.truncate("a", 9))
    assert tables.tensors[0] is before  # the same tensor, written in place
    assert tables.tensors[0][0].tolist()[3:] == [40] * 13 and len(pool.block_table("a", 0)) == 3


def test_a_table_longer_than_the_row_is_refused():
    pool = _pool(null=False)
    tables = BlockTables(pool, max_requests=1, max_num_tokens=8)
    with pytest.raises(InvalidInputError, match="a block-table row holds 2"):
        tables.update("a", pool.reserve("a", 12))
    assert "a" not in tables


def test_a_state_group_has_a_row_of_one_page_and_no_slots():
    plan = _hand_plan(
        [
            KVCacheGroup(layer_names=("full",), spec=full(block_size=4, **ATT)),
            KVCacheGroup(layer_names=("state",), spec=STATE, blocks_per_page=4),
        ],
        32,
    )
    pool = BlockPool(plan)
    tables = BlockTables(pool, max_requests=1)
    tables.update("a", pool.reserve("a", 5))
    assert tables.max_pages[1] == 1 and tables.tensors[1][0].tolist() == pool.block_table("a", 1)
    full_slots, state_slots = tables.slot_mapping([("a", 0, 5)])
    assert state_slots is None and full_slots is not None and len(full_slots) == 5
