"""The host tier of the block pool's prefix cache: evicted blocks kept on the host and brought
back on a hit, by hand-counted cases and random programs."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from kvcore import SizingContext, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.offload import with_host_memory
from kvcore.planning.registry import Registry
from kvcore.runtime.block_pool import NULL_PAGE, BlockPool
from kvcore.runtime.prefix_cache import PrefixKey, block_key
from kvcore.runtime.request_tables import RequestRecord
from tests.helpers import full, mix, sliding

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
SMALL = dict(heads=1, head_size=8)


def _plan(specs, num_blocks, host_blocks, length=128):
    context = SizingContext(max_model_len=length, max_num_batched_tokens=64)
    plan = plan_kv_cache(specs, 2**30, context, registry=REGISTRY, num_blocks=num_blocks)
    return with_host_memory(plan, host_blocks * plan.pools[0].bytes_per_block) if host_blocks else plan


def _full_plan(num_blocks=12, host_blocks=8, length=48):
    return _plan(mix((2, full(block_size=4, **SMALL))), num_blocks, host_blocks, length)


def _run(pool, request, tokens):
    hit = pool.attach_prefix(request, tokens)
    pool.reserve(request, len(tokens))
    pool.release_stale(request, len(tokens))
    return hit


def test_an_evicted_block_goes_to_the_host_and_comes_back_on_a_hit():
    plan = _full_plan()
    pool = BlockPool(plan, prefix_caching=True)
    assert pool.host_tier_stats.enabled and pool.host_tier_stats.host_blocks == 8
    _run(pool, "a", list(range(16)))  # 4 blocks cached
    pool.free_request("a")
    _run(pool, "b", list(range(100, 148)))  # 12 blocks: a's 4 are evicted, to the host
    pool.free_request("b")
    stats = pool.host_tier_stats
    assert (stats.offloaded_blocks, stats.held_blocks, stats.restored_blocks) == (4, 4, 0)
    per_block = plan.pools[0].bytes_per_block
    assert stats.offloaded_bytes == 4 * per_block
    assert _run(pool, "c", [*range(16), 7]) == 16  # every block back from the host
    stats = pool.host_tier_stats
    assert (stats.host_hits, stats.host_hit_tokens, stats.device_hit_tokens) == (1, 16, 0)
    assert (stats.restored_blocks, stats.restored_bytes) == (4, 4 * per_block)
    assert stats.held_blocks == 8  # the host keeps its copies, and took 4 of b's evicted blocks
    assert all(pool.is_cached(b) for b in pool.block_table("c", 0)[:4])
    # without a tier the same requests find nothing
    plain = BlockPool(plan, prefix_caching=True, host_tier=False)
    _run(plain, "a", list(range(16)))
    plain.free_request("a")
    _run(plain, "b", list(range(100, 148)))
    plain.free_request("b")
    assert _run(plain, "c", [*range(16), 7]) == 0
    assert not plain.host_tier_stats.enabled


def test_a_full_tier_drops_its_oldest_block_and_a_known_block_is_not_copied_again():
    pool = BlockPool(_full_plan(host_blocks=2), prefix_caching=True)
    _run(pool, "a", list(range(16)))
    pool.free_request("a")
    _run(pool, "b", list(range(100, 148)))
    pool.free_request("b")
    stats = pool.host_tier_stats
    # a's 4 blocks went out last first (a request's last blocks are evicted first): the tier
    # kept the newest 2, blocks 0 and 1
    assert (stats.offloaded_blocks, stats.host_evictions, stats.held_blocks) == (4, 2, 2)
    assert _run(pool, "c", [*range(16), 7]) == 8
    pool.free_request("c")
    before = pool.host_tier_stats.offloaded_blocks
    _run(pool, "d", list(range(200, 248)))  # evicts c's blocks again: 0 and 1 are on the host already
    assert pool.host_tier_stats.offloaded_blocks - before == 2 + 9  # c's 2 new ones, then d's pushes


def test_a_hit_is_cut_to_what_the_device_has_ids_for():
    pool = BlockPool(_full_plan(host_blocks=8), prefix_caching=True)
    _run(pool, "a", list(range(16)))
    pool.free_request("a")
    _run(pool, "b", list(range(100, 144)))  # 11 blocks: a's last 3 go to the host
    assert pool.host_tier_stats.offloaded_blocks == 3 and pool.num_free_blocks == 1
    # a's 4 blocks are kept (1 on the device, 3 on the host), but b holds every other id:
    # the hit is the device's block alone
    assert pool.attach_prefix("c", [*range(16), 7]) == 4
    assert pool.host_tier_stats.restored_blocks == 0
    pool.free_request("c")
    pool.free_request("b")  # b's ids become evictable: all 3 come back
    assert _run(pool, "d", [*range(16), 7]) == 16
    assert pool.host_tier_stats.restored_blocks == 3


def test_a_sliding_window_hybrid_brings_back_only_the_window():
    specs = mix((2, full(block_size=4, **SMALL)), (2, sliding(8, block_size=4, **SMALL)))
    plan = _plan(specs, 40, 40, length=64)
    pool = BlockPool(plan, prefix_caching=True)
    _run(pool, "a", list(range(32)))
    pool.free_request("a")
    for other in ("b", "x"):  # push every block of a out of the device
        _run(pool, other, list(range(100, 164)) if other == "b" else list(range(200, 264)))
        pool.free_request(other)
    assert _run(pool, "c", [*range(32), 7]) == 32
    stats = pool.host_tier_stats
    assert (stats.host_hits, stats.host_hit_tokens) == (1, 32)
    window = [i for i, g in enumerate(plan.groups) if g.spec.kind != "full_attention"]
    for index in window:  # the window's blocks came back, the ones before it stay empty
        table = pool.block_table("c", index)
        assert table[:6] == [NULL_PAGE] * 6 and NULL_PAGE not in table[6:8]
    # blocks brought back: every full-attention block of the 32 tokens, and the window's 2
    full_groups = len(plan.groups) - len(window)
    assert stats.restored_blocks == 8 * full_groups + 2 * len(window)


# -- random programs ---------------------------------------------------------------------------


def _holders_are_single(pool: BlockPool) -> None:
    """Every device id is free, or cached and/or held by requests with the right count; the
    host rows never exceed the tier."""
    for one in pool.pools:
        cache = one.cache
        assert cache is not None
        holders = [0] * one.num_blocks
        for request in pool.requests:
            for index in one.members:
                for block in pool.block_table(request, index):
                    if block != NULL_PAGE:
                        holders[block] += 1
        cached = [b for table in cache.cache.values() for b in table.values()]
        assert len(cached) == len(set(cached)), "a block id cached under two keys"
        for block in range(one.num_blocks):
            if block == pool.plan.null_block:
                continue
            assert holders[block] == cache.ref[block]
            is_free = one.free.owner[block] < 0
            assert is_free == (holders[block] == 0 and cache.key[block] is None)
        host = cache.host
        if host is not None:
            held = sum(host.spans[g] for g, kept in host.where.items() for _ in kept)
            assert held == host.held_blocks <= host.rows.rows == pool.plan.host_blocks_in(one.index)


def _present(pool: BlockPool, content: PrefixKey, limit: int) -> int:
    """The tokens of ``content``'s prefix present on the device or the host (full attention,
    one group: the leading blocks whose keys one of them holds), at most ``limit``."""
    one = pool.pools[0]
    cache, host, per_page = one.cache, one.cache.host, one.paged[0]
    record = RequestRecord(len(pool.groups))
    n = 0
    while (n + 1) * per_page <= limit:
        key = block_key(record, content, per_page, n)
        if key not in cache.cache[0] and not (host is not None and host.holds(0, key)):
            break
        n += 1
    return n * per_page


PROGRAMS = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.booleans()), min_size=1, max_size=30)


@settings(deadline=None)
@given(
    program=PROGRAMS,
    host_blocks=st.integers(1, 96),
    num_blocks=st.integers(21, 32),
    hybrid=st.booleans(),
)
def test_random_programs_hit_at_least_as_much_with_the_tier_and_keep_holders_single(
    program, host_blocks, num_blocks, hybrid
):
    if hybrid:  # full attention and an 8-token window: the window's blocks come back alone
        specs = mix((2, full(block_size=4, **SMALL)), (2, sliding(8, block_size=4, **SMALL)))
        plan = _plan(specs, num_blocks + 16, host_blocks, length=48)
    else:
        plan = _full_plan(num_blocks=num_blocks, host_blocks=host_blocks)
    tiered = BlockPool(plan, prefix_caching=True)
    plain = BlockPool(plan, prefix_caching=True, host_tier=False)
    # 4 prefixes of 10 blocks a group: a tier of that many blocks never drops one (a smaller
    # tier may drop a block the device without a tier still has, so a hit can be shorter)
    big = plan.host_blocks_in(0) >= 40 * len(plan.groups)
    live: list[int] = []
    for step, (prefix, tokens, finish) in enumerate(program):
        content = PrefixKey(prefix, 40)
        if len(live) > 1 or (finish and live):  # at most 2 at once: they fit the pool together
            for pool in (tiered, plain):
                pool.free_request(live[0])
            live.pop(0)
        # full attention: the prefix kept on the device or the host, every block of it
        expected = tokens if hybrid else _present(tiered, content, tokens - 1)
        fits = tiered.num_free_blocks - tiered.num_evictable_blocks >= expected // 4 * len(plan.groups)
        device = tiered._agreed_hit(RequestRecord(len(plan.groups)), content, tokens - 1, with_host=False)
        hit = tiered.attach_prefix(step, content, tokens)
        if fits and not hybrid:  # with ids free for every restored block, the hit is all the prefix kept
            assert hit == expected
        assert hit <= expected
        plain_hit = plain.attach_prefix(step, content, tokens)
        for pool in (tiered, plain):
            pool.reserve(step, tokens)
            pool.release_stale(step, tokens)
        live.append(step)
        _holders_are_single(tiered)
        _holders_are_single(plain)
        assert hit >= device  # the tier only adds to what the device has
        if big and fits:  # a tier that never drops a block finds all the device alone would
            assert hit >= plain_hit
    if big:
        assert tiered.prefix_cache_stats.hit_tokens >= plain.prefix_cache_stats.hit_tokens
