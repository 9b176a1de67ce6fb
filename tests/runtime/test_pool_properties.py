"""The block pool with prefix caching and rollback, and the block tables fed from it, driven by
random engine-like programs (admit with a cached prefix, compute chunks, truncate rejected
tokens, finish), with the invariants checked after every call:

- no page is in two requests' tables unless it is a cached prefix block whose reference count
  says so (and, without prefix caching, never);
- every page a table names belongs to that table's group, and free + held == usable;
- nothing leaks: once every request ends, free (counting cached-evictable) == usable and no
  block has a reference;
- the block-table tensors and the slot mappings match the pool's own lists.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import event, given, settings, strategies as st

from kvcore import BlockPoolExhaustedError, InvalidInputError, PlanOptions, SizingContext, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.runtime.block_pool import NULL_PAGE, BlockPool
from kvcore.runtime.block_tables import PAD_SLOT, BlockTables
from tests.helpers import chunked, full, mix, sliding

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
CTX = SizingContext(max_model_len=64, max_num_batched_tokens=16)
MODELS = {
    "full": mix((2, full(block_size=4, heads=1, head_size=8))),
    "full+sliding": mix(
        (2, full(block_size=4, heads=1, head_size=8)), (2, sliding(8, block_size=4, heads=1, head_size=8))
    ),
    "sliding 2 sizes": mix(
        (2, sliding(6, block_size=2, heads=1, head_size=8)), (2, full(block_size=4, heads=1, head_size=8))
    ),
    "chunked": mix(
        (2, chunked(8, block_size=4, heads=1, head_size=8)), (2, full(block_size=4, heads=1, head_size=8))
    ),
}
PREFIXES = [[1000 * p + i for i in range(64)] for p in range(3)]


def _plan(model: str, num_blocks: int, null: bool):
    options = PlanOptions(reserve_null_block=True) if null else None
    return plan_kv_cache(
        MODELS[model], 2**30, CTX, registry=REGISTRY, policy="auto", options=options, num_blocks=num_blocks
    )


def _check(pool: BlockPool, tables: BlockTables, caching: bool, record=event) -> None:
    held: Counter[int] = Counter()
    for request in pool.requests:
        for group in range(len(pool.groups)):
            table = pool.block_table(request, group)
            for page in table:
                if page != NULL_PAGE:
                    held[page] += 1
                    assert pool.owner(page) == group
            if request in tables.requests:
                row = tables.row(request)
                expected = [tables.pad_pages[group] if p == NULL_PAGE else p for p in table]
                expected += [tables.pad_pages[group]] * (tables.max_pages[group] - len(table))
                assert tables.tensors[group][row].tolist() == expected
    for block, count in held.items():
        if count > 1:
            record("a page shared")
            assert caching and pool.is_cached(block), f"block {block} is in {count} tables but not cached"
        assert pool.ref_count(block) == count
    assert pool.num_free_blocks + len(held) == pool.num_usable_blocks
    if pool.plan.null_block is not None:
        assert pool.plan.null_block not in held


def _check_slots(pool: BlockPool, tables: BlockTables, batch) -> None:
    slots = tables.slot_mapping(batch, pad_to=sum(n for _, _, n in batch) + 2)
    for group, mapping in enumerate(slots):
        size = pool.groups[group].spec.tokens_per_page
        pad_page = tables.pad_pages[group]
        want = []
        for request, first, count in batch:
            table = pool.block_table(request, group)
            for position in range(first, first + count):
                page = table[position // size]
                if page == NULL_PAGE:
                    want.append(
                        PAD_SLOT if pool.plan.null_block is None else pad_page * size + position % size
                    )
                else:
                    want.append(page * size + position % size)
        pad = PAD_SLOT if pool.plan.null_block is None else pad_page * size
        assert mapping is not None and mapping.dtype == torch.int64
        assert mapping.tolist() == [*want, pad, pad]


OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "step", "truncate", "finish"]), st.integers(0, 4), st.integers(1, 12)
    ),
    min_size=1,
    max_size=40,
)


@settings(deadline=None)
@given(
    model=st.sampled_from(sorted(MODELS)),
    num_blocks=st.integers(50, 90),
    null=st.booleans(),
    caching=st.booleans(),
    ops=OPS,
    shapes=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 48), st.integers(1, 24)), min_size=5, max_size=5
    ),
)
def test_random_programs_keep_the_pool_and_its_tables_honest(model, num_blocks, null, caching, ops, shapes):
    plan = _plan(model, num_blocks, null)
    pool = BlockPool(plan, prefix_caching=caching)
    tables = BlockTables(pool, max_requests=5)
    # request r: prompt = prefix p's first n tokens + its own tokens; total length m
    contents = []
    for r, (p, n, own) in enumerate(shapes):
        tokens = PREFIXES[p][:n] + [10_000 * (r + 1) + i for i in range(own)]
        contents.append(tokens[:63])
    computed: dict[int, int] = {}
    for op, r, amount in ops:
        tokens = contents[r]
        if op == "admit" and r not in computed:
            hit = pool.attach_prefix(r, tokens)
            assert hit % 4 == 0 and hit < len(tokens)
            assert hit == 0 or caching
            event("a prefix hit" if hit else "a miss")
            try:
                tables.update(r, pool.reserve(r, min(len(tokens), hit + amount)))
            except BlockPoolExhaustedError:
                pool.free_request(r)
                if r in tables.requests:
                    tables.remove(r)
            else:
                computed[r] = min(len(tokens), hit + amount)
                tables.update(r, pool.release_stale(r, computed[r]))
        elif op == "step" and r in computed and computed[r] < len(tokens):
            target = min(len(tokens), computed[r] + amount)
            try:
                tables.update(r, pool.reserve(r, target))
            except BlockPoolExhaustedError:
                continue
            _check_slots(pool, tables, [(r, computed[r], target - computed[r])])
            computed[r] = target
            tables.update(r, pool.release_stale(r, target))
        elif op == "truncate" and r in computed:
            target = max(0, computed[r] - amount)
            before = [pool.block_table(r, g) for g in range(len(pool.groups))]
            try:
                freed = pool.truncate(r, target)
            except InvalidInputError:
                event("a truncation refused")
                assert [pool.block_table(r, g) for g in range(len(pool.groups))] == before
            else:
                assert pool.num_tokens(r) == target
                event("a truncation")
                tables.update(r, freed)
                computed[r] = target
        elif op == "finish" and r in computed:
            pool.free_request(r)
            tables.remove(r)
            del computed[r]
        _check(pool, tables, caching)
    for r in list(computed):
        pool.free_request(r)
        tables.remove(r)
    _check(pool, tables, caching)
    assert pool.num_free_blocks == pool.num_usable_blocks  # nothing leaked
    assert all(pool.ref_count(b) == 0 for b in range(pool.num_blocks))
    assert all(t.eq(tables.pad_pages[g]).all() for g, t in enumerate(tables.tensors))
    stats = pool.prefix_cache_stats
    assert stats.enabled == caching and stats.hit_tokens <= stats.queried_tokens


def test_the_checks_catch_a_page_in_two_tables():
    plan = _plan("full", 20, False)
    pool = BlockPool(plan)
    tables = BlockTables(pool, max_requests=2)
    pool.reserve("a", 4)
    pool.reserve("b", 4)
    pool._records["b"].tables[0][0] = pool._records["a"].tables[0][0]  # a broken pool: one page in two tables
    with pytest.raises(AssertionError):
        _check(pool, tables, caching=False, record=print)
