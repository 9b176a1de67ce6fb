"""unified_pool: one block table per retention kind (kind_pools' groups), every kind's pages in
one pool of rows that the kinds lend each other (a wide page over an aligned run of rows)."""

import pytest

from kvcore import BlockPool, GroupLimitError, PlanOptions, SizingContext, efficiency, plan_kv_cache
from kvcore.frontends.hf_config import layer_specs_from_config
from kvcore.planning.invariants import check_plan
from kvcore.policies.unified_pool import MAX_RUN, choose_rows, kind_buckets
from tests.helpers import chunked, full, mix, sliding
from tests.policies.test_shared_buffer import CTX, GIB, _State
from tests.zoo import bundled


def _plan(registry, specs, budget=40 * GIB, context=CTX, **kwargs):
    return plan_kv_cache(specs, budget, context, registry=registry, policy="unified_pool", **kwargs)


def test_one_group_per_retention_kind_in_one_pool(registry):
    specs = mix((7, full()), (5, sliding(2048)), (11, sliding(512)))
    plan = _plan(registry, specs)
    assert len(plan.groups) == 3 and len(plan.pools) == 1
    for group in plan.groups:
        assert len({specs[name].retention_key for name in group.layer_names}) == 1
    check_plan(plan)


def test_gemma3_kinds_share_a_row_that_wastes_nothing(registry):
    """52 sliding and 10 full-attention layers of one page P: the row of 2 P holds a sliding page
    in 26 rows and a full-attention page in 5, so one request takes exactly the bytes its layers
    need, more than shared_buffer's seven groups hold (99.53 %)."""
    specs = layer_specs_from_config(bundled("google/gemma-3-27b-it"), registry)
    plan = _plan(registry, specs, 80 * GIB)
    page = next(iter(specs.values())).page_size_bytes
    assert plan.bytes_per_block == 2 * page
    spans = {g.spec.kind: (len(g.layer_names), g.spec.block_size, g.blocks_per_page) for g in plan.groups}
    assert spans == {"sliding_window": (52, 16, 26), "full_attention": (10, 16, 5)}
    shared = plan_kv_cache(specs, 80 * GIB, CTX, registry=registry, policy="shared_buffer")
    assert efficiency(plan, specs) > efficiency(shared, specs)
    assert len(plan.groups) < len(shared.groups)
    check_plan(plan)


def test_equal_pages_take_one_row_each(registry):
    specs = mix((12, sliding(128)), (12, full()))
    plan = _plan(registry, specs)
    assert [g.blocks_per_page for g in plan.groups] == [1, 1]
    assert plan.bytes_per_block == 12 * full().page_size_bytes
    assert efficiency(plan, specs) > 0.999


def test_a_wider_kind_takes_a_run_of_the_narrower_kinds_row(registry):
    # Llama-4-Scout's shape: 36 chunked layers beside 12 full ones of one page: 3 rows a page
    specs = mix((3, chunked(8192)), (1, full()), (3, chunked(8192)), (1, full()))
    plan = _plan(registry, specs)
    by_kind = {g.spec.kind: g.blocks_per_page for g in plan.groups}
    assert by_kind == {"chunked_local_attention": 3, "full_attention": 1}
    check_plan(plan)


def test_a_state_keeps_its_page_and_spans_rows(registry):
    specs = mix((4, full()), (28, _State()))
    plan = _plan(registry, specs, 80 * GIB, SizingContext(max_model_len=131072))
    state = next(g for g in plan.groups if g.spec.kind == "test.state")
    assert state.spec == _State() and state.blocks_per_page >= 1
    assert len(plan.groups) == 2
    check_plan(plan)


def test_a_divisor_row_is_not_tried_for_runs_beyond_the_limit(registry):
    # rows of 97 and 98 pages: their divisor (one page) would make runs of 97 and 98 ids, so the
    # wider kind's page is the row, and the narrower kind's page leaves one page of it empty
    page = full(heads=1).page_size_bytes
    specs = mix((97, full(heads=1)), (98, sliding(64, heads=1)))
    options = PlanOptions(max_block_size=16)
    assert max(span for _, span in choose_rows(kind_buckets(specs, CTX, options))) <= MAX_RUN
    plan = _plan(registry, specs, 8 * GIB, options=options)
    assert plan.bytes_per_block == 98 * page
    assert [g.blocks_per_page for g in plan.groups] == [1, 1]
    check_plan(plan)


def test_max_groups_below_the_kinds_is_refused(registry):
    specs = mix((7, full()), (5, sliding(2048)))
    with pytest.raises(GroupLimitError):
        _plan(registry, specs, options=PlanOptions(max_groups=1))


def test_the_kinds_grow_from_the_two_ends_of_the_pool(registry):
    """Runs of two lengths and no single ids: the shorter runs (full attention) are taken from
    the low end, the longer (sliding) from the high end, so they meet in the middle rather than
    cut each other's runs up."""
    specs = layer_specs_from_config(bundled("google/gemma-3-27b-it"), registry)
    short = SizingContext(max_model_len=512, max_num_batched_tokens=512)
    plan = _plan(registry, specs, 80 * GIB, short, num_blocks=26 * 40)
    assert [g.blocks_per_page for g in plan.groups] == [26, 5]
    pool = BlockPool(plan)
    full_group = next(i for i, g in enumerate(plan.groups) if g.spec.kind == "full_attention")
    slide_group = next(i for i, g in enumerate(plan.groups) if g.spec.kind == "sliding_window")
    low = pool.allocate(full_group, 3)
    high = pool.allocate(slide_group, 2)
    assert low == [0, 1, 2]  # run indices of 5 ids: ids 0..14
    assert high == [39, 38]  # run indices of 26 ids: the last two
    pool.free(full_group, low[1:2])
    assert pool.allocate(full_group, 1) == [1]  # the hole is refilled from the low end
    # every id is someone's or free; the free runs of 26 are the ones no run of 5 has touched
    assert pool.num_free_pages(slide_group) == 40 - 2 - 1


def test_prefix_caching_is_off_for_pages_over_runs_and_says_why(registry):
    specs = mix((5, sliding(64, block_size=4)), (1, full(block_size=4)))
    context = SizingContext(max_model_len=256, max_num_batched_tokens=64)
    plan = _plan(registry, specs, GIB, context, num_blocks=600)
    assert sorted(g.blocks_per_page for g in plan.groups) == [1, 5]
    pool = BlockPool(plan, prefix_caching=True)
    assert not pool.prefix_caching
    assert "run of 5 block ids" in pool.prefix_cache_stats.reason
    pool.reserve("a", 200)  # the pool still serves, without the cache
    pool.free_request("a")
    assert pool.num_free_blocks == 600
