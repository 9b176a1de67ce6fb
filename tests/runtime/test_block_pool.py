"""The block pool: shared ids, aligned runs, per-request tables, window release, clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kvcore import (
    NULL_PAGE,
    BlockPool,
    BlockPoolExhaustedError,
    InvalidInputError,
    KVCacheGroup,
    KVCachePlan,
    KVCacheTensor,
    SizingContext,
    plan_kv_cache,
)
from tests.helpers import chunked, full, mla, sliding
from tests.runtime._kinds import (
    CappedCrossAttentionSpec,
    CrossAttentionPlugin,
    CrossAttentionSpec,
    ToyStateSpec,
)

CTX = SizingContext(max_model_len=256, max_num_batched_tokens=32)


def _plan(groups, num_blocks, context=CTX):
    """A hand-made single-buffer plan whose groups share one row per block."""
    row = max(g.spec.page_size_bytes * len(g.layer_names) // g.blocks_per_page + 64 for g in groups)
    tensors = []
    for g in groups:
        for i, name in enumerate(g.layer_names):
            stride = row * g.blocks_per_page
            pages = num_blocks // g.blocks_per_page
            tensors.append(
                KVCacheTensor(
                    size=(pages - 1) * stride + g.spec.page_size_bytes if pages else 0,
                    offset=i * g.spec.page_size_bytes,
                    page_stride=stride,
                    shared_by=(name,),
                )
            )
    return KVCachePlan(
        policy="test",
        num_blocks=num_blocks,
        bytes_per_block=row,
        single_buffer=True,
        groups=groups,
        tensors=tensors,
        context=context,
        available_memory_bytes=row * num_blocks,
    )


ATT = dict(heads=1, head_size=8, dtype="float32")
STATE = ToyStateSpec(block_size=1, conv=4, ssm=60, dtype="float32")


def _pool(num_blocks=32, span=4):
    return BlockPool(
        _plan(
            [
                KVCacheGroup(layer_names=("full",), spec=full(block_size=4, **ATT)),
                KVCacheGroup(layer_names=("sw",), spec=sliding(8, block_size=4, **ATT)),
                KVCacheGroup(layer_names=("state",), spec=STATE, blocks_per_page=span),
            ],
            num_blocks,
        )
    )


def test_single_blocks_come_from_the_low_end_and_runs_from_the_high_end():
    pool = _pool()
    assert pool.allocate(0, 3) == [0, 1, 2]
    assert pool.allocate(2, 2) == [7, 6]  # pages 7 and 6 = block ids 28..31 and 24..27
    assert list(pool.blocks_of(2, 7)) == [28, 29, 30, 31]
    assert pool.allocate(1, 2) == [3, 4]
    assert pool.num_free_blocks == 32 - 3 - 8 - 2
    assert [pool.owner(b) for b in (0, 3, 24, 31, 5)] == [0, 1, 2, 2, None]


def test_a_freed_block_is_reused_first_and_a_freed_run_becomes_whole_again():
    pool = _pool()
    pool.allocate(0, 5)
    pool.free(0, [1])
    assert pool.allocate(1, 1) == [1]
    pages = pool.allocate(2, 6)
    assert sorted(pages) == [2, 3, 4, 5, 6, 7]  # chunks 0 and 1 hold single blocks
    assert pool.num_free_pages(2) == 0
    pool.free(2, [4])
    assert pool.num_free_pages(2) == 1 and pool.allocate(2, 1) == [4]


def test_scattered_free_blocks_are_no_run():
    pool = _pool(num_blocks=16, span=4)
    pool.allocate(0, 16)
    pool.free(0, [0, 5, 10, 15])  # four free ids, one in each aligned chunk
    assert pool.num_free_blocks == 4 and pool.num_free_pages(2) == 0
    with pytest.raises(BlockPoolExhaustedError) as info:
        pool.allocate(2, 1)
    assert "aligned run(s) of 4 block ids" in str(info.value) and "4 of 16 block ids" in str(info.value)
    assert info.value.requested_blocks == 4 and info.value.free_blocks == 4


def test_exhaustion_is_typed_with_numbers_and_takes_nothing():
    pool = _pool(num_blocks=8)
    pool.allocate(0, 6)
    with pytest.raises(BlockPoolExhaustedError) as info:
        pool.allocate(1, 3)
    assert info.value.requested_blocks == 3 and info.value.free_blocks == 2
    assert "needs 3 page(s) but 2 of 8 block ids are free" in str(info.value)
    assert pool.num_free_blocks == 2


def test_freeing_what_a_group_does_not_hold_is_rejected_and_frees_nothing():
    pool = _pool()
    pool.allocate(0, 2)
    pool.allocate(1, 1)
    with pytest.raises(InvalidInputError, match="held by group 1"):
        pool.free(0, [0, 2])
    assert pool.owner(0) == 0
    with pytest.raises(InvalidInputError, match="is free"):
        pool.free(0, [9])
    with pytest.raises(InvalidInputError, match="out of range"):
        pool.free(2, [8])
    with pytest.raises(InvalidInputError, match="twice"):
        pool.free(0, [0, 0])
    with pytest.raises(InvalidInputError, match="group index"):
        pool.allocate(3, 1)


def test_tables_grow_with_the_request_and_share_the_pool():
    pool = _pool()
    taken = pool.reserve("a", 10)  # 3 pages of 4 tokens in each attention group, one state run
    assert {g: len(p) for g, p in taken.items()} == {0: 3, 1: 3, 2: 1}
    assert pool.block_table("a", 0) == [0, 1, 2] and pool.block_table("a", 1) == [3, 4, 5]
    assert pool.block_table("a", 2) == [7]
    assert pool.reserve("a", 12) == {}  # still 3 pages
    assert pool.reserve("a", 13) == {0: [6], 1: [7]}
    assert pool.num_tokens("a") == 13 and pool.requests == ("a",)
    assert pool.new_blocks_needed("a", 20) == 1 + 1
    assert pool.new_blocks_needed("b", 1) == 1 + 1 + 4


def test_sliding_window_pages_are_released_as_decoding_moves_on():
    pool = _pool()
    pool.reserve("a", 16)  # tokens 0..15: 4 pages per attention group
    # window 8: the next token (position 16) reads 9..16, so tokens 0..8 are done: pages 0 and 1
    assert pool.block_table("a", 1) == [4, 5, 6, 7]
    assert pool.release_stale("a", 16) == {1: [4, 5]}
    assert pool.block_table("a", 1)[:2] == [NULL_PAGE, NULL_PAGE]
    assert len(pool.live_pages("a", 0)) == 4  # full attention keeps everything
    assert pool.release_stale("a", 16) == {}
    taken = pool.reserve("a", 24)
    assert len(taken[1]) == 2 and len(pool.block_table("a", 1)) == 6
    pool.free_request("a")
    assert pool.num_free_blocks == 32 and pool.requests == ()


def test_releasing_past_the_reserved_tokens_is_an_error():
    pool = _pool()
    pool.reserve("a", 4)
    before = pool.block_table("a", 1)
    with pytest.raises(InvalidInputError, match=r"cannot have 40 computed tokens: its tables cover 4"):
        pool.release_stale("a", 40)  # tokens 4..39 were never reserved, so never computed
    assert pool.block_table("a", 1) == before
    taken = pool.reserve("a", 44)  # no holes: every entry the window reads is a page
    table = pool.block_table("a", 1)
    assert NULL_PAGE not in table and len(table) == 11 and len(taken[1]) == 10


def test_a_failed_reserve_takes_nothing():
    pool = _pool(num_blocks=12)
    pool.reserve("a", 8)  # 2 + 2 pages and one run of 4: 8 ids
    with pytest.raises(BlockPoolExhaustedError) as info:
        pool.reserve("b", 8)
    assert pool.num_free_blocks == 4 and pool.requests == ("a",)
    assert info.value.requested_blocks == 8 and "request 'b' needs 8 more block ids" in str(info.value)


def test_unknown_requests_and_bad_counts_are_rejected():
    pool = _pool()
    with pytest.raises(InvalidInputError, match="unknown request"):
        pool.free_request("x")
    with pytest.raises(InvalidInputError, match="num_tokens"):
        pool.reserve("x", -1)
    pool.reserve("x", 1)
    with pytest.raises(InvalidInputError, match="num_computed_tokens"):
        pool.release_stale("x", -3)


@pytest.mark.parametrize(
    ("spec", "n", "first"),
    [
        (full(), 1000, 0),
        (mla(), 1000, 0),
        (STATE, 1000, 0),
        (sliding(8), 0, 0),
        (sliding(8), 7, 0),  # next token 7 reads 0..7
        (sliding(8), 8, 1),  # next token 8 reads 1..8
        (sliding(8), 100, 93),
        (sliding(1), 5, 5),  # a window of one reads only itself
        (chunked(4), 3, 0),  # next token 3 is in chunk 0
        (chunked(4), 4, 4),  # next token 4 starts chunk 1
        (chunked(4), 7, 4),
    ],
)
def test_first_retained_token(spec, n, first):
    assert spec.first_retained_token(n) == first


@given(window=st.integers(1, 64), chunk=st.integers(1, 64), n=st.integers(0, 500))
def test_first_retained_token_never_passes_what_the_next_token_reads(window, chunk, n):
    for spec, reads_from in (
        (sliding(window), max(0, n - window + 1)),
        (chunked(chunk), n - n % chunk),
    ):
        first = spec.first_retained_token(n)
        assert first <= n and first == reads_from
        assert spec.first_retained_token(n + 1) >= first  # never decreases


def test_live_pages_of_the_builtin_kinds():
    spec = sliding(8, block_size=4)
    assert [spec.live_pages(n).stop for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert spec.live_pages(20, 16) == range(2, 5)  # token 9 is in page 2, token 19 in page 4
    assert [STATE.live_pages(n) for n in (0, 1, 1000)] == [range(0), range(1), range(1)]
    assert STATE.live_pages(10_000, 10_000) == range(1)
    assert full(block_size=4).live_pages(20, 16) == range(5)  # full attention frees nothing


def test_blocks_needed_comes_from_the_spec(registry):
    specs = {"f": full(block_size=16), "s": sliding(128, block_size=16)}
    plan = plan_kv_cache(
        specs, 2**30, SizingContext(max_model_len=4096, max_num_batched_tokens=256), registry=registry
    )
    pool = BlockPool(plan)
    per_group = {g.spec.kind: pool.blocks_needed(i, 4096) for i, g in enumerate(plan.groups)}
    assert per_group == {"full_attention": 256, "sliding_window": 25}  # ceil((127+256)/16)+1
    assert sum(per_group.values()) == plan.blocks_per_request()


@given(
    steps=st.lists(st.integers(1, 32), min_size=1, max_size=40),
    window=st.integers(1, 40),
    chunk=st.integers(1, 40),
    block=st.sampled_from([1, 2, 4, 8]),
)
def test_a_request_never_holds_more_pages_than_its_spec_promises(steps, window, chunk, block):
    context = SizingContext(max_model_len=512, max_num_batched_tokens=32)
    groups = [
        KVCacheGroup(layer_names=("full",), spec=full(block_size=block, **ATT)),
        KVCacheGroup(layer_names=("sw",), spec=sliding(window, block_size=block, **ATT)),
        KVCacheGroup(layer_names=("ch",), spec=chunked(chunk, block_size=block, **ATT)),
    ]
    pool = BlockPool(_plan(groups, 3 * 512, context))
    pool.reserve("r", 0)
    done = 0
    for step in steps:  # one engine step: free what the step no longer reads, then grow
        pool.release_stale("r", done)
        target = min(done + step, 512)
        pool.reserve("r", target)
        for index, group in enumerate(groups):
            held = len(pool.live_pages("r", index))
            assert held <= group.pages_per_request(context)
            # exactly the pages from the first one the step still reads to the last one it writes
            assert held == len(group.spec.live_pages(target, done))
        done = target
    pool.free_request("r")
    assert pool.num_free_blocks == pool.num_blocks


def test_a_fixed_size_kind_takes_exactly_its_pages_at_prefill_and_never_more(make_registry):
    # cross attention over 1,500 encoder tokens: 94 pages of 16 from the first token on, at any
    # length (the pool used to take ceil(n / 16): 1 page at prefill, 256 at 4,096 tokens)
    registry = make_registry(CrossAttentionPlugin())
    cross = CrossAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=64, dtype="bfloat16", encoder_len=1500
    )
    context = SizingContext(max_model_len=4096, max_num_batched_tokens=512)
    assert cross.max_num_blocks(context) == 94
    specs = {"self": full(block_size=16, heads=8, head_size=64), "cross": cross}
    plan = plan_kv_cache(specs, 2**20 * 256 * 2, context, registry=registry, policy="equal_groups")
    index = {g.spec.kind: i for i, g in enumerate(plan.groups)}["test.cross_attention"]
    assert plan.groups[index].pages_per_request(context) == 94
    pool = BlockPool(plan)
    assert len(pool.reserve("r", 10)[index]) == 94  # the whole encoder output at prefill
    done = 10
    while done < 4096:
        pool.release_stale("r", done)
        done = min(done + 512, 4096)
        assert index not in pool.reserve("r", done)  # never another page
        assert len(pool.live_pages("r", index)) == 94
    assert plan.fits(4096) and pool.num_free_blocks >= 0
    pool.free_request("r")
    assert pool.num_free_blocks == plan.num_blocks


def test_a_kind_capped_through_max_num_blocks_only_is_held_to_its_cap(make_registry):
    """The plan counts a capped kind at its cap (100 pages for 1,600 encoder tokens); the pool
    holds its tables to that cap however long the decoder runs (issue 38: it grew to 256 pages
    at 4,096 tokens, past what the plan counted)."""
    registry = make_registry(CrossAttentionPlugin())
    capped = CappedCrossAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=64, dtype="bfloat16", encoder_len=1600
    )
    context = SizingContext(max_model_len=4096, max_num_batched_tokens=512)
    specs = {"self": full(block_size=16, heads=8, head_size=64), "cross": capped}
    plan = plan_kv_cache(specs, 2**20 * 256 * 2, context, registry=registry, policy="equal_groups")
    index = {g.spec.kind: i for i, g in enumerate(plan.groups)}["test.capped_cross_attention"]
    assert plan.groups[index].pages_per_request(context) == 100
    pool = BlockPool(plan)
    pool.reserve("r", 0)
    done = 0
    while done < 4096:
        pool.release_stale("r", done)
        done = min(done + 512, 4096)
        pool.reserve("r", done)
        assert len(pool.live_pages("r", index)) == min(-(-done // 16), 100)
    assert len(pool.block_table("r", index)) == 100
    assert pool.num_blocks - pool.num_free_blocks == plan.blocks_per_request_by_pool(4096)[0]
    pool.free_request("r")
    assert pool.num_free_blocks == plan.num_blocks
    caching = BlockPool(plan, prefix_caching=True)  # its pages hold no prefix: nothing is cached
    assert not caching.prefix_caching
    assert "holds at most 100 pages (its max_num_blocks)" in caching.prefix_cache_stats.reason


@pytest.mark.parametrize("kind", ["full", "mla", "state", "cross"])
def test_the_plan_figure_is_the_most_the_pool_holds_for_kinds_that_free_nothing(kind):
    # max_num_blocks is read off live_pages: the pool reaches it exactly, at the longest request
    spec = {
        "full": full(block_size=4),
        "mla": mla(block_size=4),
        "state": STATE,
        "cross": CrossAttentionSpec(
            block_size=4, num_kv_heads=1, head_size=8, dtype="float32", encoder_len=30
        ),
    }[kind]
    for length, step in ((1, 1), (37, 5), (64, 64)):
        context = SizingContext(max_model_len=length, max_num_batched_tokens=step)
        held = max(
            len(spec.live_pages(n, c)) for c in range(length) for n in range(c + 1, min(c + step, length) + 1)
        )
        assert held == spec.max_num_blocks(context)


@given(
    window=st.integers(1, 40),
    block=st.integers(1, 17),
    step=st.integers(1, 40),
    length=st.integers(1, 120),
    chunked_kind=st.booleans(),
)
def test_the_plan_figure_of_a_window_or_chunk_is_at_most_one_page_above_what_the_pool_holds(
    window, block, step, length, chunked_kind
):
    spec = (chunked if chunked_kind else sliding)(window, block_size=block)
    context = SizingContext(max_model_len=length, max_num_batched_tokens=step)
    held = max(
        len(spec.live_pages(n, c)) for c in range(length) for n in range(c + 1, min(c + step, length) + 1)
    )
    assert held <= spec.max_num_blocks(context) <= held + 1
