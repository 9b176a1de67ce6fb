"""The host tier of a hybrid's prefix cache: evicted state checkpoints (a kind whose
``offload_unit`` is ``"checkpoint"``) go to the host as whole runs of rows and come back on a hit,
which is the longest prefix every group serves from the device or the host.

The property test replays random requests through a device pool small enough to evict and a
host tier large enough never to drop a page, so everything some request computed is kept on one
of the two: each hit must be the oracle's (what was computed, :class:`Oracle`) whenever the
device has room to bring the missing pages back, and the device's own hit otherwise. The twin is
a pool whose tier keeps token blocks but drops checkpoints (kvcore before checkpoints moved).
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from kvcore import PrefixKey, Registry, SizingContext, get_plugin_manager, plan_kv_cache
from kvcore.planning.offload import with_host_memory
from kvcore.plugins.state import StateSpec
from kvcore.runtime import one_pool
from kvcore.runtime.block_pool import NULL_PAGE, BlockPool
from kvcore.runtime.host_cache import HostCache
from kvcore.runtime.prefix_cache import block_key
from kvcore.runtime.request_tables import RequestRecord
from kvcore.spec import KVCacheSpec
from kvcore.testing.strategies import block_sizes
from tests.helpers import registering
from tests.runtime.test_state_checkpoints import MAX_LEN, Oracle, _jamba_like, _three_kinds

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))


@attrs.frozen(kw_only=True)
class RecurrentSpec(StateSpec):
    """A third-party state kind: a state's pages and cache modes under a kind of its own name
    (it moves to the host because its ``offload_unit`` says ``checkpoint``, not by its name)."""

    kind = "test.recurrent"


def _registry_with_recurrent() -> Registry:
    manager = get_plugin_manager(autoload=False)
    manager.register(registering("kvcore_register_spec_kinds", RecurrentSpec))
    return Registry.from_plugin_manager(manager)


def _plan(layers: dict[str, KVCacheSpec], mode: str, requests: int, host_rows: int, registry=REGISTRY):
    """A plan of ``requests`` requests' worst case of blocks and ``host_rows`` host rows."""
    context = SizingContext(max_model_len=MAX_LEN, max_num_batched_tokens=64, state_cache_mode=mode)
    sized = plan_kv_cache(layers, 2**36, context, registry=registry)
    plan = plan_kv_cache(
        layers, 2**36, context, registry=registry, num_blocks=requests * sized.blocks_per_request()
    )
    return with_host_memory(plan, host_rows * plan.pools[0].bytes_per_block) if host_rows else plan


def _state_group(pool: BlockPool) -> int:
    return next(i for i, g in enumerate(pool.groups) if g.spec.tokens_per_page is None)


def _cache_then_push_out(pool: BlockPool, key: PrefixKey) -> None:
    """Request ``a`` caches ``key``'s 4 blocks and the align checkpoint at 64 tokens; three
    requests of their own then fill the device, evicting every cached page."""
    pool.attach_prefix("a", key, 100)
    for computed in (64, 100):  # a step ends on the boundary at 64: its state is the checkpoint
        pool.reserve("a", computed)
        pool.release_stale("a", computed)
    pool.free_request("a")
    for r in range(3):
        pool.attach_prefix(f"x{r}", PrefixKey(f"own{r}", 0), MAX_LEN)
        pool.reserve(f"x{r}", MAX_LEN)
    assert pool.num_evictable_blocks == 0, "every cached page was evicted"
    for r in range(3):
        pool.free_request(f"x{r}")


@pytest.mark.parametrize("third_party", [False, True])
def test_an_evicted_checkpoint_goes_to_the_host_as_a_whole_run_and_comes_back_on_a_hit(third_party):
    layers = _jamba_like(16)
    registry = REGISTRY
    if third_party:
        layers = {
            name: RecurrentSpec(**attrs.asdict(spec, recurse=False)) if spec.kind == "state" else spec
            for name, spec in layers.items()
        }
        registry = _registry_with_recurrent()
    plan = _plan(layers, "align", requests=3, host_rows=1024, registry=registry)
    pool = BlockPool(plan, prefix_caching=True)
    index = _state_group(pool)
    span, per_block = pool.groups[index].blocks_per_page, plan.pools[0].bytes_per_block
    assert span > 1 and pool.groups[index].spec.kind == ("test.recurrent" if third_party else "state")
    key = PrefixKey("system", 64)
    _cache_then_push_out(pool, key)
    stats = pool.host_tier_stats
    # out: the 4 attention blocks of the prefix and the one checkpoint, a run of `span` rows
    assert (stats.offloaded_blocks, stats.offloaded_bytes) == (4 + span, (4 + span) * per_block)
    host = pool.pools[0].cache.host
    checkpoint = block_key(RequestRecord(len(pool.groups)), key, 16, 64 // 16 - 1)
    assert host.holds(index, checkpoint) and host.where[index][checkpoint] % span == 0  # an aligned run
    assert pool.attach_prefix("b", key, 100) == 64
    pool.reserve("b", 100)
    stats = pool.host_tier_stats
    # back: exactly what went out, byte for byte
    assert (stats.host_hits, stats.host_hit_tokens, stats.device_hit_tokens) == (1, 64, 0)
    assert (stats.restored_blocks, stats.restored_bytes) == (4 + span, stats.offloaded_bytes)
    page = pool.block_table("b", index)[0]
    assert page != NULL_PAGE and pool.pools[0].cache.cache[index][checkpoint] == page
    assert all(pool.is_cached(b) and pool.ref_count(b) == 1 for b in pool.blocks_of(index, page))


def test_the_twin_that_drops_checkpoints_finds_no_hit(monkeypatch):
    """A tier that keeps token blocks but not checkpoints (kvcore before they moved) has the
    prefix's attention blocks on the host but no state at 64: nothing hits."""
    monkeypatch.setattr(one_pool, "TIERED_UNITS", ("block",))
    pool = BlockPool(_plan(_jamba_like(16), "align", requests=3, host_rows=1024), prefix_caching=True)
    _cache_then_push_out(pool, PrefixKey("system", 64))
    assert pool.host_tier_stats.offloaded_blocks == 4
    assert pool.attach_prefix("b", PrefixKey("system", 64), 100) == 0


def test_a_checkpoint_is_not_brought_back_without_a_free_aligned_run():
    pool = BlockPool(_plan(_jamba_like(16), "align", requests=3, host_rows=1024), prefix_caching=True)
    key = PrefixKey("system", 64)
    _cache_then_push_out(pool, key)
    for r in range(3):  # every run of the device held again: no room for the checkpoint
        pool.attach_prefix(f"y{r}", PrefixKey(f"mine{r}", 0), MAX_LEN)
        pool.reserve(f"y{r}", MAX_LEN)
    one = pool.pools[0]
    span = pool.groups[_state_group(pool)].blocks_per_page
    assert one.free.runs[span].full == 0
    assert pool.attach_prefix("b", key, 100) == 0  # the hit is the device's: none
    assert pool.host_tier_stats.restored_blocks == 0


# -- random programs ---------------------------------------------------------------------------

#: requests of four shared prefixes taking turns on a device of two requests' worst case, so
#: that each pushes the others' pages out (to the host)
REQUESTS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),  # the shared prefix
        st.integers(1, 400),  # its tokens
        st.integers(1, 160),  # the request's own tokens after it
        st.lists(st.sampled_from([16, 32, 48, 64, 5, 23, 61]), min_size=1, max_size=6),  # chunk sizes
        st.booleans(),  # freed when done (else it keeps its pages while the next one runs)
    ),
    min_size=1,
    max_size=14,
)


def _pages_are_counted_once(pool: BlockPool) -> None:
    """Every page the tables hold is counted (at its first id) by its holders; a cached key
    names one page; host rows held are exactly the pages the tier keeps, each copied once."""
    one = pool.pools[0]
    cache = one.cache
    holders: dict[int, int] = {}
    for request in pool.requests:
        for index in one.members:
            span = pool.groups[index].blocks_per_page
            for page in pool.block_table(request, index):
                if page != NULL_PAGE:
                    holders[page * span] = holders.get(page * span, 0) + 1
    for first, count in holders.items():
        assert cache.ref[first] == count
    for index, table in cache.cache.items():
        span = pool.groups[index].blocks_per_page
        assert len(set(table.values())) == len(table)
        assert all(cache.key[page * span] == key for key, page in table.items())
    host = cache.host
    held = sum(host.spans[g] for g, kept in host.where.items() for _ in kept)
    assert held == host.held_blocks == host.offloaded_blocks  # a tier that never drops copies once


def _room(pool: BlockPool, hit: int) -> bool:
    """Whether the device has free ids (not merely evictable ones) for every page of a hit of
    ``hit`` tokens, and a free aligned run for each checkpoint of several ids."""
    one, runs = pool.pools[0], {}
    ids = 0
    for group in pool.groups:
        count = len(group.spec.live_pages(hit, hit)) if group.spec.tokens_per_page else 1
        ids += count * group.blocks_per_page
        if group.blocks_per_page > 1:
            runs[group.blocks_per_page] = runs.get(group.blocks_per_page, 0) + count
    return one.free.num_free >= ids and all(one.free.runs[s].full >= n for s, n in runs.items())


def _host_only(pool: BlockPool, key: PrefixKey, hit: int) -> int:
    """Block ids' worth of the pages a hit of ``hit`` tokens needs that only the host keeps."""
    cache, record, total = pool.pools[0].cache, RequestRecord(len(pool.groups)), 0
    for index, group in enumerate(pool.groups):
        unit = group.spec.tokens_per_page or group.spec.block_size
        pages = group.spec.live_pages(hit, hit) if group.spec.tokens_per_page else [hit // unit - 1]
        for k in pages:
            if block_key(record, key, unit, k) not in cache.cache[index]:
                total += group.blocks_per_page
    return total


@settings(max_examples=60, deadline=None)
@given(
    layers=st.sampled_from([_jamba_like, _three_kinds]),
    block=block_sizes().filter(lambda b: b <= 64),
    mode=st.sampled_from(["align", "all"]),
    requests=REQUESTS,
)
def test_hits_are_what_device_and_host_keep_and_never_fewer_than_without_the_tier(
    layers, block, mode, requests
):
    plan = _plan(layers(block), mode, requests=2, host_rows=0)
    # every page four prefixes of up to 400 tokens could cache: a tier that never drops one
    pages = 4 * (400 // block) * sum(group.blocks_per_page for group in plan.groups)
    plan = with_host_memory(plan, pages * plan.pools[0].bytes_per_block)
    tiered = BlockPool(plan, prefix_caching=True)
    plain = BlockPool(plan, prefix_caching=True, host_tier=False)
    oracle, per_block = Oracle(tiered), plan.pools[0].bytes_per_block
    live: list[int] = []
    for r, (prefix, shared, own, chunks, free) in enumerate(requests):
        if live:  # at most two requests at once: they fit the device together
            for pool in (tiered, plain):
                pool.free_request(live[0])
            live.pop(0)
        key = PrefixKey(prefix, shared)
        prompt = min(shared + own, MAX_LEN)
        kept = oracle.hit(key, prompt)  # all that was computed is on the device or the host
        record = RequestRecord(len(plan.groups))
        device = tiered._agreed_hit(record, key, min(prompt - 1, shared), with_host=False)
        fits = kept == device or tiered.pools[0].cache.restores_fit(record, key, kept)
        assert fits or not _room(tiered, kept), "free ids for every page, yet the restore was refused"
        moving = _host_only(tiered, key, kept) if kept > device and fits else 0
        before = tiered.host_tier_stats
        hit = tiered.attach_prefix(r, key, prompt)
        plain_hit = plain.attach_prefix(r, key, prompt)
        assert hit == (kept if fits else device)
        assert plain_hit <= kept  # a pool without a tier keeps less of what was computed
        if fits:  # with room to bring pages back, the tier finds all the device alone would
            assert hit >= plain_hit
        after = tiered.host_tier_stats
        assert after.restored_blocks - before.restored_blocks == moving
        assert after.restored_bytes - before.restored_bytes == moving * per_block
        computed, at, ends = hit, 0, [hit]
        while computed < prompt:
            after_step = min(prompt, computed + chunks[at % len(chunks)])
            at += 1
            tiered.reserve(r, after_step)
            tiered.release_stale(r, after_step)
            oracle.computed(key, computed, after_step)
            computed = after_step
            ends.append(after_step)
        # the plain pool's steps end where the tiered pool's did (or at its hit, which the
        # oracle keeps): an align checkpoint it caches is one the oracle knows
        plain_computed = plain_hit
        for after_step in ends:
            if after_step > plain_computed:
                plain.reserve(r, after_step)
                plain.release_stale(r, after_step)
                plain_computed = after_step
        _pages_are_counted_once(tiered)
        if free:
            for pool in (tiered, plain):
                pool.free_request(r)
        else:
            live.append(r)
    assert tiered.host_tier_stats.host_evictions == 0, "the oracle knows no dropped page: give more rows"


def test_a_tier_that_drops_checkpoints_fails_the_oracle(monkeypatch):
    """The twin: the same check on a pool whose tier drops checkpoints must fail."""
    monkeypatch.setattr(one_pool, "TIERED_UNITS", ("block",))
    # two prefixes of 192 tokens take turns on a device of two requests: each evicts the other
    programs = [("a", 192, 40, [64], True), ("b", 192, 40, [64], True)] * 3
    with pytest.raises(AssertionError):
        test_hits_are_what_device_and_host_keep_and_never_fewer_than_without_the_tier.hypothesis.inner_test(
            _jamba_like, 16, "align", programs
        )


def test_the_program_of_the_twin_passes_with_checkpoints_in_the_tier():
    programs = [("a", 192, 40, [64], True), ("b", 192, 40, [64], True)] * 3
    test_hits_are_what_device_and_host_keep_and_never_fewer_than_without_the_tier.hypothesis.inner_test(
        _jamba_like, 16, "align", programs
    )


def test_a_checkpoint_takes_an_aligned_run_of_rows_and_a_full_tier_drops_its_oldest_pages_for_it():
    host = HostCache(4, {0: 1, 1: 2}, bytes_per_block=10)
    for key in "abcd":  # four blocks fill the rows 0 to 3
        assert host.put(0, key)
    assert host.put(1, "state")  # drops a and b, the oldest, which free the run at row 0
    assert host.where[1]["state"] == 0 and sorted(host.where[0]) == ["c", "d"]
    assert (host.host_evictions, host.held_blocks, host.offloaded_blocks) == (2, 4, 6)
    assert not host.put(1, "state")  # kept already: refreshed, not copied again
    small = HostCache(1, {0: 1, 1: 2}, bytes_per_block=10)
    assert small.put(0, "a")
    assert not small.put(1, "state")  # no run of two rows exists: nothing is dropped for it
    assert small.holds(0, "a") and small.host_evictions == 0
