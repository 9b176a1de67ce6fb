"""Prefix caching in the block pool, rollback (truncate) and honest frees, by hand-counted cases."""

from __future__ import annotations

import pytest

from kvcore import BlockPoolExhaustedError, InvalidInputError, SizingContext, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.runtime.block_pool import NULL_PAGE, BlockPool
from kvcore.runtime.prefix_cache import PrefixKey
from tests.helpers import full, mix, sliding
from tests.runtime.test_block_pool import _pool as _pool_with_state

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
SMALL = dict(heads=1, head_size=8)


def _plan(specs, num_blocks, length=128):
    context = SizingContext(max_model_len=length, max_num_batched_tokens=64)
    return plan_kv_cache(specs, 2**30, context, registry=REGISTRY, num_blocks=num_blocks)


def _full(num_blocks=40, length=128):
    return BlockPool(_plan(mix((2, full(block_size=4, **SMALL))), num_blocks, length), prefix_caching=True)


def _hybrid(num_blocks=60):
    specs = mix((2, full(block_size=4, **SMALL)), (2, sliding(8, block_size=4, **SMALL)))
    return BlockPool(_plan(specs, num_blocks), prefix_caching=True)


def _run(pool, request, tokens, upto=None):
    """Admit ``request`` with its cached prefix and compute it up to ``upto`` tokens."""
    hit = pool.attach_prefix(request, tokens)
    end = len(tokens) if upto is None else upto
    pool.reserve(request, end)
    pool.release_stale(request, end)
    return hit


def test_a_second_request_shares_the_first_ones_full_blocks():
    pool = _full()
    prompt = list(range(18))  # 4 full blocks of 4 and 2 tokens
    assert _run(pool, "a", prompt) == 0
    assert _run(pool, "b", [*prompt, 99, 98]) == 16  # every full block of a's prompt
    a, b = pool.block_table("a", 0), pool.block_table("b", 0)
    assert a[:4] == b[:4] and a[4] != b[4]
    assert [pool.ref_count(page) for page in a[:5]] == [2, 2, 2, 2, 1]
    assert all(pool.is_cached(page) for page in a[:4]) and not pool.is_cached(a[4])
    stats = pool.prefix_cache_stats
    assert (stats.lookups, stats.hits, stats.hit_tokens, stats.queried_tokens) == (2, 1, 16, 38)
    assert stats.hit_rate == 16 / 38


def test_at_least_the_last_prompt_token_is_computed():
    pool = _full()
    _run(pool, "a", list(range(16)))
    assert _run(pool, "b", list(range(16))) == 12  # 16 would leave nothing to compute


def test_a_chain_matches_only_equal_leading_tokens():
    pool = _full()
    _run(pool, "a", list(range(16)))
    assert _run(pool, "b", [7, *list(range(1, 17))]) == 0  # the first block differs: nothing after it counts


def test_freed_blocks_stay_cached_until_their_ids_are_needed_least_recently_used_first():
    pool = _full(num_blocks=12, length=48)
    _run(pool, "a", list(range(16)))  # 4 blocks, cached
    pool.free_request("a")
    assert pool.num_free_blocks == 12 and pool.num_evictable_blocks == 4
    _run(pool, "b", list(range(100, 128)))  # 7 blocks: takes 7 of the 8 free ids, evicts nothing
    assert pool.prefix_cache_stats.evictions == 0
    assert _run(pool, "c", [*list(range(16)), 5]) == 16
    pool.free_request("b")
    pool.free_request("c")
    _run(pool, "d", list(range(200, 248)))  # 12 blocks: every cached block goes
    assert pool.prefix_cache_stats.evictions == 11 and pool.num_evictable_blocks == 0  # b's 7, then c's 4
    pool.free_request("d")
    assert _run(pool, "e", [*list(range(16)), 5]) == 0


def test_an_evicted_block_passes_through_on_evict_before_its_id_is_handed_out_again():
    seen = []
    plan = _plan(mix((2, full(block_size=4, **SMALL))), 12, 48)
    pool = BlockPool(plan, prefix_caching=True, on_evict=lambda p, block, key: seen.append((p, block, key)))
    _run(pool, "a", list(range(16)))  # 4 blocks, cached
    cached = pool.block_table("a", 0)
    pool.free_request("a")
    assert seen == []  # freed, still cached: nothing evicted yet
    _run(pool, "b", list(range(100, 140)))  # 10 blocks: 8 free ids, then a's 2 least recent
    assert [p for p, _, _ in seen] == [0, 0] and pool.prefix_cache_stats.evictions == 2
    assert [block for _, block, _ in seen] == cached[::-1][:2]  # a request's last blocks go first
    assert set(pool.block_table("b", 0)) >= {block for _, block, _ in seen}  # and b holds their ids
    assert len({key for _, _, key in seen}) == 2


def test_a_request_that_cannot_start_counts_no_lookup():
    pool = _full(num_blocks=10, length=40)
    _run(pool, "a", list(range(16)))
    pool.reserve("x", 16)
    hit = pool.attach_prefix("b", list(range(16)) + list(range(50, 70)))
    assert hit == 16
    with pytest.raises(BlockPoolExhaustedError, match="needs 5 more block ids"):
        pool.reserve("b", 36)
    pool.free_request("b")
    assert pool.prefix_cache_stats.lookups == 1  # a's only
    assert pool.num_free_blocks == 2 and pool.ref_count(pool.block_table("a", 0)[0]) == 1


def test_a_sliding_window_group_needs_only_its_last_window_cached():
    pool = _hybrid()
    prompt = list(range(40))
    _run(pool, "a", prompt)
    window = pool.block_table("a", 1)
    assert window[:7] == [NULL_PAGE] * 7  # blocks before token 33 freed (window 8)
    assert _run(pool, "b", [*prompt, 1]) == 40
    b_window = pool.block_table("b", 1)
    assert b_window[:8] == [NULL_PAGE] * 8 and b_window[8:10] == window[8:10]  # entries 8, 9 hold 33..39
    assert pool.block_table("b", 0)[:10] == pool.block_table("a", 0)  # full attention: all of it


def test_a_sliding_hit_survives_the_eviction_of_blocks_before_its_window():
    pool = _hybrid(num_blocks=66)
    prompt = list(range(40))
    _run(pool, "a", prompt)
    pool.free_request("a")
    assert pool.num_evictable_blocks == 20  # 10 full-attention blocks, 10 sliding ones
    pool.reserve("x", 104)  # 52 ids: the 46 free ones, then the 6 least recently freed (sliding 7..2)
    assert pool.prefix_cache_stats.evictions == 6
    assert _run(pool, "b", [*prompt, 7]) == 40  # the window of token 40 needs sliding blocks 8 and 9 only
    pool.free_request("x")
    pool.free_request("b")
    pool.reserve("y", 128)  # 64 ids: every cached block goes
    pool.free_request("y")
    assert _run(pool, "c", [*prompt, 7]) == 0


def test_a_group_that_cannot_cache_turns_caching_off_and_says_why():
    pool = BlockPool(_pool_with_state().plan, prefix_caching=True)
    stats = pool.prefix_cache_stats
    assert not pool.prefix_caching and not stats.enabled and "per-request state" in stats.reason
    assert pool.attach_prefix("a", list(range(40))) == 0
    pool.reserve("a", 40)
    assert pool.prefix_cache_stats.lookups == 1 and pool.prefix_cache_stats.hit_tokens == 0


def test_prefix_keys_share_the_blocks_inside_the_prefix_only():
    pool = _full()
    _run(pool, "a", PrefixKey("system", 10), upto=30)
    assert pool.attach_prefix("b", PrefixKey("system", 10), 30) == 8  # 2 full blocks of the 10 tokens
    assert pool.attach_prefix("c", PrefixKey("other", 10), 30) == 0


def test_without_prefix_caching_nothing_is_shared_or_kept():
    pool = BlockPool(_plan(mix((2, full(block_size=4, **SMALL))), 40))
    assert not pool.prefix_caching and "not asked" in pool.prefix_cache_stats.reason
    _run(pool, "a", list(range(16)))
    assert _run(pool, "b", list(range(16))) == 0
    pool.free_request("a")
    assert pool.num_evictable_blocks == 0


def test_allocate_and_free_refuse_a_caching_pool():
    pool = _full()
    with pytest.raises(InvalidInputError, match="allocate\\(\\) is for pools without prefix caching"):
        pool.allocate(0, 1)
    with pytest.raises(InvalidInputError, match="free\\(\\) is for pools without prefix caching"):
        pool.free(0, [0])


def test_attach_prefix_comes_first():
    pool = _full()
    pool.reserve("a", 4)
    with pytest.raises(InvalidInputError, match="already has tables"):
        pool.attach_prefix("a", [1, 2, 3])
    with pytest.raises(InvalidInputError, match="token ids or a PrefixKey"):
        pool.attach_prefix("b", "text")  # type: ignore[arg-type]


# -- rollback and honest frees -----------------------------------------------------------------


@pytest.mark.parametrize("caching", [False, True])
def test_truncate_frees_the_pages_past_the_kept_tokens(caching):
    pool = BlockPool(_plan(mix((2, full(block_size=4, **SMALL))), 40), prefix_caching=caching)
    pool.reserve("a", 10)
    pool.release_stale("a", 10)
    pool.reserve("a", 18)  # 8 draft tokens, pages 3 and 4
    table = pool.block_table("a", 0)
    assert pool.truncate("a", 12) == {0: table[3:5]}  # 2 accepted: tokens 0..11 stay
    assert pool.block_table("a", 0) == table[:3] and pool.num_tokens("a") == 12
    assert pool.num_free_blocks == pool.num_usable_blocks - 3
    assert pool.truncate("a", 12) == {}
    pool.reserve("a", 13)  # grows again from there
    assert len(pool.block_table("a", 0)) == 4


def test_a_shrinking_reserve_is_an_error_that_names_truncate():
    pool = _full()
    pool.reserve("a", 10)
    with pytest.raises(InvalidInputError, match=r"already cover 10; .*truncate\(request, 6\)"):
        pool.reserve("a", 6)
    assert pool.reserve("a", 10) == {}  # the same count is fine


def test_truncate_refuses_to_go_back_past_freed_window_pages():
    pool = _hybrid()
    pool.reserve("a", 40)
    pool.release_stale("a", 40)  # sliding pages before token 33 are gone
    with pytest.raises(InvalidInputError, match="already freed its entries before 8"):
        pool.truncate("a", 20)
    assert pool.num_tokens("a") == 40
    with pytest.raises(InvalidInputError, match="still read entry 7"):
        pool.truncate("a", 37)  # token 37's window starts at 30, on the freed page 7
    pool.truncate("a", 39)  # token 39's window starts at 32, on page 8, still held
    with pytest.raises(InvalidInputError, match="covers 39"):
        pool.truncate("a", 40)


def test_truncate_into_a_shared_cached_block_is_refused_and_into_an_own_one_uncaches_it():
    pool = _full()
    prompt = list(range(16))
    _run(pool, "a", prompt)
    _run(pool, "b", [*prompt, 1, 2, 3])
    shared = pool.block_table("b", 0)[3]
    with pytest.raises(InvalidInputError, match="cached block 1 other request"):
        pool.truncate("b", 14)
    pool.free_request("a")
    pool.truncate("b", 14)  # b alone holds it now: it leaves the cache, b writes tokens 14.. again
    assert not pool.is_cached(shared) and pool.block_table("b", 0)[3] == shared
    pool.free_request("b")
    assert pool.num_free_blocks == pool.num_usable_blocks
