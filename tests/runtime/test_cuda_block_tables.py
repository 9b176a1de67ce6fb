"""BlockTables on a CUDA device: the tables live there, sync() copies the rows written on the
host, the tensors never move, and slot mappings come back on the device. Skipped without CUDA;
tests/runtime/test_block_tables.py runs the same logic on the CPU."""

from __future__ import annotations

import pytest
import torch

from kvcore import BlockPool, BlockTables, PlanOptions, SizingContext, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.runtime.block_pool import NULL_PAGE
from tests.helpers import full, mix, sliding

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_tables_sync_to_the_device_in_place():
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    specs = mix(
        (2, full(block_size=4, heads=1, head_size=8)), (2, sliding(8, block_size=4, heads=1, head_size=8))
    )
    context = SizingContext(max_model_len=64, max_num_batched_tokens=16)
    plan = plan_kv_cache(
        specs, 2**30, context, registry=registry, options=PlanOptions(reserve_null_block=True), num_blocks=60
    )
    pool = BlockPool(plan, prefix_caching=True)
    tables = BlockTables(pool, max_requests=4, device="cuda")
    pointers = [t.data_ptr() for t in tables.tensors]
    for request in ("a", "b"):
        hit = pool.attach_prefix(request, list(range(40)))
        tables.update(request, pool.reserve(request, 40))
        tables.update(request, pool.release_stale(request, 40))
        assert request == "a" or hit == 36
    tables.sync()
    torch.cuda.synchronize()
    assert [t.data_ptr() for t in tables.tensors] == pointers and tables.tensors[0].is_cuda
    for request in ("a", "b"):
        row = tables.row(request)
        for group, tensor in enumerate(tables.tensors):
            want = [0 if p == NULL_PAGE else p for p in pool.block_table(request, group)]
            assert tensor[row, : len(want)].tolist() == want
    slots = tables.slot_mapping([("b", 36, 4)], pad_to=8)
    assert all(s is not None and s.is_cuda and s.dtype == torch.int64 for s in slots)
