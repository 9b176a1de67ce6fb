"""The stacked pool the simulator drives (``BlockPool(plan, lowest_first=False)``) holds exactly
what the default pool holds; only which block ids it hands out differs."""

from __future__ import annotations

from hypothesis import given, strategies as st

from kvcore import NULL_PAGE, BlockPool, BlockPoolExhaustedError, SizingContext, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from tests.helpers import chunked, full, mix, sliding

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
PLAN = plan_kv_cache(
    mix((2, full()), (4, sliding(48)), (2, chunked(64))),
    2**36,
    SizingContext(max_model_len=512, max_num_batched_tokens=32),
    registry=REGISTRY,
    num_blocks=200,
)

ops = st.lists(
    st.tuples(st.sampled_from(["reserve", "release", "free"]), st.integers(0, 5), st.integers(0, 80)),
    max_size=80,
)


def _shape(table):
    return [page == NULL_PAGE for page in table]


@given(ops)
def test_a_stacked_pool_holds_what_the_default_pool_holds(steps):
    plain, stacked = BlockPool(PLAN), BlockPool(PLAN, lowest_first=False)
    tokens = {}
    for action, request, amount in steps:
        if action == "reserve":
            want = tokens.get(request, 0) + amount
            outcomes = []
            for pool in (plain, stacked):
                try:
                    taken = pool.reserve(request, want)
                    outcomes.append({group: len(pages) for group, pages in taken.items()})
                except BlockPoolExhaustedError:
                    outcomes.append("exhausted")
            assert outcomes[0] == outcomes[1]
            if outcomes[0] != "exhausted":
                tokens[request] = want
        elif request in tokens:
            if action == "release":
                done = min(tokens[request], amount * 4)
                freed = [pool.release_stale(request, done) for pool in (plain, stacked)]
                assert {g: len(p) for g, p in freed[0].items()} == {g: len(p) for g, p in freed[1].items()}
            else:
                for pool in (plain, stacked):
                    pool.free_request(request)
                del tokens[request]
        assert plain.num_free_blocks == stacked.num_free_blocks
        assert plain.requests == stacked.requests
        for r in plain.requests:
            for group in range(len(PLAN.groups)):
                assert _shape(plain.block_table(r, group)) == _shape(stacked.block_table(r, group))
                for page in stacked.live_pages(r, group):
                    assert stacked.owner(page) == group
    held = [p for r in stacked.requests for g in range(len(PLAN.groups)) for p in stacked.live_pages(r, g)]
    assert len(held) == len(set(held)) == stacked.num_blocks - stacked.num_free_blocks
