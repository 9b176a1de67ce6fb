"""Prefix caching on hybrids: a state group keeps checkpoints as its cache mode says, a sliding
group the blocks of the last window, and a hit is the longest prefix every group serves.

The property test replays random requests through a pool large enough that nothing is evicted
and checks each hit against an oracle that knows only what was computed: a token block is kept
once some request computed past its end, an ``all`` checkpoint once some request computed past
its boundary, an ``align`` checkpoint once some request ended a step exactly on its boundary.
The twin runs the same check on a pool that drops one checkpoint, and the check must fail.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from kvcore import InvalidInputError, PrefixKey, SizingContext, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.runtime.block_pool import NULL_PAGE, BlockPool
from kvcore.runtime.prefix_cache import PrefixCache, block_key, checkpoint_mode
from kvcore.spec import KVCacheSpec
from kvcore.testing.mixes import state
from kvcore.testing.strategies import block_sizes
from tests.helpers import full, mix, sliding

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))

MAX_LEN = 512


def _plan(layers: dict[str, KVCacheSpec], mode: str, *, requests: int = 40, speculative: int = 0):
    context = SizingContext(
        max_model_len=MAX_LEN,
        max_num_batched_tokens=64,
        state_cache_mode=mode,
        num_speculative_tokens=speculative,
    )
    sized = plan_kv_cache(layers, 2**36, context, registry=REGISTRY)
    return plan_kv_cache(
        layers, 2**36, context, registry=REGISTRY, num_blocks=requests * sized.blocks_per_request()
    )


def _jamba_like(block: int) -> dict[str, KVCacheSpec]:
    return mix((7, state()), (1, full(block_size=block)))


def _three_kinds(block: int) -> dict[str, KVCacheSpec]:
    """State, sliding-window and full-attention layers (a Jamba with Gemma's windows)."""
    return mix((4, state()), (2, sliding(64, block_size=block)), (2, full(block_size=block)))


class Oracle:
    """What a pool that evicts nothing must have kept, from what the requests computed."""

    def __init__(self, pool: BlockPool) -> None:
        self.groups = pool.groups
        self.step = pool.hit_step
        #: per group: kept keys, (prefix id, tokens the block or checkpoint ends at)
        self.kept: list[set[tuple[object, int]]] = [set() for _ in pool.groups]

    def computed(self, key: PrefixKey, before: int, after: int) -> None:
        """A request of ``key`` computed tokens ``[before, after)`` in one step."""
        known = min(after, key.num_tokens)
        for index, group in enumerate(self.groups):
            spec = group.spec
            unit = spec.tokens_per_page or spec.block_size
            if checkpoint_mode(spec) == "align":  # only the boundary the step ends on
                if after % unit == 0 and after <= key.num_tokens and after:
                    self.kept[index].add((key.prefix_id, after))
                continue
            for end in range(unit, known + 1, unit):
                self.kept[index].add((key.prefix_id, end))

    def hit(self, key: PrefixKey, prompt: int) -> int:
        """The longest prefix every group serves, at most ``prompt - 1`` tokens."""
        limit = min(prompt - 1, key.num_tokens)
        for h in range(limit // self.step * self.step, 0, -self.step):
            if all(self._serves(index, key, h) for index in range(len(self.groups))):
                return h
        return 0

    def _serves(self, index: int, key: PrefixKey, h: int) -> bool:
        spec, kept = self.groups[index].spec, self.kept[index]
        if spec.tokens_per_page is None:  # a state: the checkpoint at exactly h
            return (key.prefix_id, h) in kept
        unit = spec.tokens_per_page
        live = spec.live_pages(h, h)
        return all((key.prefix_id, (k + 1) * unit) in kept for k in live)


requests_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # the shared prefix
        st.integers(1, 300),  # its tokens
        st.integers(1, 160),  # the request's own tokens after it
        st.lists(st.sampled_from([16, 32, 48, 64, 5, 23, 61]), min_size=1, max_size=6),  # chunk sizes
        st.booleans(),  # freed when done (else it keeps its pages while the next ones run)
    ),
    min_size=1,
    max_size=10,
)


def _replay(pool: BlockPool, requests, oracle: Oracle) -> list[tuple[int, int]]:
    """Run ``requests`` one after another; ``(hit, oracle's hit)`` of each."""
    hits = []
    for r, (prefix, shared, own, chunks, free) in enumerate(requests):
        key = PrefixKey(prefix, shared)
        prompt = min(shared + own, MAX_LEN)
        hit = pool.attach_prefix(r, key, prompt)
        hits.append((hit, oracle.hit(key, prompt)))
        computed, at = hit, 0
        while computed < prompt:
            after = min(prompt, computed + chunks[at % len(chunks)])
            at += 1
            pool.reserve(r, after)
            pool.release_stale(r, after)
            oracle.computed(key, computed, after)
            computed = after
        if free:
            pool.free_request(r)
    assert pool.prefix_cache_stats.evictions == 0, "the oracle knows no eviction: plan more blocks"
    return hits


@settings(max_examples=60, deadline=None)
@given(
    layers=st.sampled_from([_jamba_like, _three_kinds]),
    block=block_sizes().filter(lambda b: b <= 64),
    mode=st.sampled_from(["align", "all"]),
    speculative=st.sampled_from([0, 2]),  # states for draft tokens besides the checkpoints
    requests=requests_strategy,
)
def test_hit_tokens_are_exactly_those_whose_pages_and_state_were_kept(
    layers, block, mode, speculative, requests
):
    pool = BlockPool(_plan(layers(block), mode, speculative=speculative), prefix_caching=True)
    assert pool.prefix_caching
    for hit, expected in _replay(pool, requests, Oracle(pool)):
        assert hit == expected


def _drop_checkpoint_at(monkeypatch: pytest.MonkeyPatch, tokens: int) -> None:
    """Make every pool forget the state checkpoint after ``tokens`` tokens once it caches it
    (a broken pool)."""
    register = PrefixCache._register_checkpoints

    def forgetful(self, record, content, computed, fixed, let_go=None):
        due = register(self, record, content, computed, fixed, let_go)
        for index, unit, _ in self.checkpoints:
            page = self.cache[index].pop(block_key(record, content, unit, tokens // unit - 1), None)
            if page is not None:
                self.key[page * self.spans[index]] = None
        return due

    monkeypatch.setattr(PrefixCache, "_register_checkpoints", forgetful)


@pytest.mark.parametrize("mode", ["align", "all"])
def test_the_twin_fails_when_a_checkpoint_is_dropped(monkeypatch, mode):
    requests = [("a", 200, 40, [64, 64, 64, 48], False), ("a", 200, 10, [64], True)]
    pool = BlockPool(_plan(_jamba_like(16), mode), prefix_caching=True)
    hits = _replay(pool, requests, Oracle(pool))
    assert hits[1] == (192, 192)  # the checkpoint at 192: a step ended there (align), or computed past it
    _drop_checkpoint_at(monkeypatch, 192)
    broken = BlockPool(_plan(_jamba_like(16), mode), prefix_caching=True)
    hit, expected = _replay(broken, requests, Oracle(broken))[1]
    with pytest.raises(AssertionError):
        assert hit == expected


# -- hand-made cases -----------------------------------------------------------------------------


def test_align_keeps_the_state_of_each_boundary_a_step_ends_on_and_the_request_holds_two():
    pool = BlockPool(_plan(_jamba_like(16), "align"), prefix_caching=True)
    state_group = next(i for i, g in enumerate(pool.groups) if g.spec.kind == "state")
    key = PrefixKey("system", 100)
    pool.attach_prefix("a", key, 130)
    for computed in (40, 96):  # 96 is a boundary a step ends on, 40 is not
        pool.reserve("a", computed)
        pool.release_stale("a", computed)
    table = pool.block_table("a", state_group)
    assert len(table) == 1  # the checkpoint at 96; the next reserve takes the running state's page
    pool.reserve("a", 130)
    pool.release_stale("a", 130)  # not a boundary: nothing changes
    assert len(pool.block_table("a", state_group)) == 2 and pool.block_table("a", state_group)[0] == table[0]
    assert pool.is_cached(pool.blocks_of(state_group, table[0])[-1])  # every id of the run reads as cached
    pool.free_request("a")
    assert pool.attach_prefix("b", key, 130) == 96
    assert pool.attach_prefix("c", PrefixKey("system", 90), 130) == 0  # no checkpoint at 80
    pool.reserve("b", 130)
    stats = pool.prefix_cache_stats
    assert {k.kind: (k.hits, k.pages) for k in stats.by_kind} == {"state": (1, 1), "full_attention": (1, 6)}


def test_all_keeps_a_state_per_block_and_a_hit_holds_only_the_last():
    pool = BlockPool(_plan(_jamba_like(16), "all"), prefix_caching=True)
    state_group = next(i for i, g in enumerate(pool.groups) if g.spec.kind == "state")
    key = PrefixKey("system", 100)
    pool.attach_prefix("a", key, 130)
    pool.reserve("a", 130)
    pool.release_stale("a", 130)
    hit = 100 // pool.hit_step * pool.hit_step  # the attention block may be larger than the state's
    assert hit and pool.attach_prefix("b", key, 120) == hit
    pool.reserve("b", 120)
    table, last = pool.block_table("b", state_group), hit // 16 - 1  # the state after the hit's last block
    assert table[:last] == [NULL_PAGE] * last and table[last] == pool.block_table("a", state_group)[last]
    assert len(table) == math.ceil(120 / 16) and NULL_PAGE not in table[last:]


def test_none_caches_nothing_and_says_how_to_cache():
    pool = BlockPool(_plan(_jamba_like(16), "none"), prefix_caching=True)
    reason = pool.prefix_cache_stats.reason
    assert not pool.prefix_caching and "cache_mode 'none'" in reason and "'align' or 'all'" in reason


def test_a_checkpoint_no_request_holds_is_evicted_as_a_whole_run():
    plan = _plan(_jamba_like(16), "align", requests=3)
    pool = BlockPool(plan, prefix_caching=True)
    pool.attach_prefix("a", PrefixKey("system", 64), 100)
    pool.reserve("a", 64)
    pool.release_stale("a", 64)
    pool.free_request("a")
    assert pool.num_evictable_blocks > 0 and pool.num_free_blocks == pool.num_usable_blocks
    for r in range(3):  # requests of their own fill the pool and evict the cached pages
        pool.attach_prefix(f"x{r}", PrefixKey(f"own{r}", 0), MAX_LEN)
        pool.reserve(f"x{r}", MAX_LEN)
    assert pool.prefix_cache_stats.evictions > 0 and pool.num_evictable_blocks == 0
    for r in range(3):
        pool.free_request(f"x{r}")
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert pool.attach_prefix("b", PrefixKey("system", 64), 100) == 0


@pytest.mark.parametrize("mode", ["align", "all"])
def test_block_tables_follow_the_state_tables_through_checkpoints_and_hits(mode):
    from kvcore.runtime.block_tables import BlockTables

    pool = BlockPool(_plan(_jamba_like(16), mode), prefix_caching=True)
    tables = BlockTables(pool, max_requests=2)
    key = PrefixKey("system", 200)

    def row_matches(request):
        for group in range(len(pool.groups)):
            table = pool.block_table(request, group)
            pad = tables.pad_pages[group]
            written = tables.tensors[group][tables.row(request)].tolist()
            assert written[: len(table)] == [pad if page == NULL_PAGE else page for page in table]
            assert set(written[len(table) :]) <= {pad}

    for request in ("a", "b"):
        pool.attach_prefix(request, key, 250)
        computed = pool.num_tokens(request)
        tables.update(request)  # the first update copies what the hit attached
        for chunk in (64, 64, 64, 64):
            after = min(250, computed + chunk)
            tables.update(request, pool.reserve(request, after))
            changes = pool.release_stale(request, after)
            tables.update(request, changes)
            row_matches(request)
            computed = after
    stats = pool.prefix_cache_stats
    assert stats.hit_tokens == 192 // pool.hit_step * pool.hit_step > 0  # b found a's checkpoint


def test_release_stale_names_the_checkpoint_an_align_table_lets_go_of():
    pool = BlockPool(_plan(_jamba_like(16), "align"), prefix_caching=True)
    group = next(i for i, g in enumerate(pool.groups) if g.spec.kind == "state")
    pool.attach_prefix("a", PrefixKey("system", 200), 250)
    pool.reserve("a", 64)
    first = pool.block_table("a", group)
    assert pool.release_stale("a", 64) == {group: [first[0]]}  # entry 0 held no checkpoint yet
    pool.reserve("a", 128)
    second = pool.block_table("a", group)
    assert second[0] == first[1] and pool.release_stale("a", 128) == {group: [first[1]]}
    assert pool.is_cached(pool.blocks_of(group, first[1])[0])  # let go, still cached (evictable)
    assert pool.release_stale("a", 128) == {}  # the same boundary again changes nothing


def test_truncating_inside_a_cached_all_checkpoint_uncaches_it_or_refuses_when_shared():
    pool = BlockPool(_plan(_jamba_like(16), "all"), prefix_caching=True)
    group = next(i for i, g in enumerate(pool.groups) if g.spec.kind == "state")
    pool.attach_prefix("a", PrefixKey("system", 200), 250)
    pool.reserve("a", 250)
    pool.release_stale("a", 250)
    state_after_112 = pool.block_table("a", group)[6]  # entry k: the state after (k+1) * 16 tokens
    first_id = pool.blocks_of(group, state_after_112)[0]
    assert pool.is_cached(first_id)
    pool.truncate("a", 100)  # the state after 112 will be written again from token 100
    assert not pool.is_cached(first_id) and pool.block_table("a", group)[6] == state_after_112
    hit = pool.attach_prefix("b", PrefixKey("system", 200), 250)
    assert hit == 96 // pool.hit_step * pool.hit_step  # the blocks the cut ends in were uncached
    pool.reserve("b", 250)
    pool.release_stale("b", 250)
    with pytest.raises(InvalidInputError, match="cannot truncate request 'b' to 170 tokens"):
        pool.attach_prefix("c", PrefixKey("system", 200), 250)
        pool.reserve("c", 250)
        pool.truncate("b", 170)  # inside blocks c shares with b (attention and the state after 176)
