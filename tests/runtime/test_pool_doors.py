"""The block pool's own doors: ``free`` gives back only what ``allocate`` handed out (never a
page a request's table holds), no request grows past the plan's ``max_model_len`` (``reserve``
and ``attach_prefix`` alike, so a prefix key of 10**9 tokens is refused at once), and a request
id that cannot key a dict is an InvalidInputError, not a TypeError."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvcore import BlockPool, InvalidInputError, KVCachePlan, SizingContext, plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.runtime.prefix_cache import PrefixKey
from tests.helpers import full, mix, sliding

REGISTRY = Registry.default(autoload=False)
CTX = SizingContext(max_model_len=1024, max_num_batched_tokens=256)


def _plan(*parts: Any) -> KVCachePlan:
    return plan_kv_cache(mix(*parts), 2**30, CTX, registry=REGISTRY)


GEMMA_LIKE = ((1, full()), (5, sliding(256)))
SLIDING_ONLY = ((4, sliding(256)),)
TWO_POOLS = ((2, full()), (2, sliding(256, dtype="float32")))


@pytest.mark.parametrize("parts", [GEMMA_LIKE, SLIDING_ONLY])
@pytest.mark.parametrize("lowest_first", [True, False])
def test_free_refuses_a_page_a_request_holds_and_changes_nothing(parts: Any, lowest_first: bool) -> None:
    pool = BlockPool(_plan(*parts), lowest_first=lowest_first)
    pool.reserve("r", 100)
    held = pool.live_pages("r", 0)
    free_before = pool.num_free_blocks
    with pytest.raises(InvalidInputError, match=r"request 'r' holds it in its block table.*free_request"):
        pool.free(0, held)
    assert pool.num_free_blocks == free_before and pool.live_pages("r", 0) == held
    # the ids stay the request's: a second owner never gets them
    other = pool.allocate(0, pool.num_free_blocks)
    assert not set(other) & set(held)
    pool.free(0, other)  # what allocate() handed out goes back
    pool.free_request("r")
    assert pool.num_free_blocks == pool.plan.usable_blocks


def test_free_refuses_a_page_allocate_did_not_hand_out() -> None:
    pool = BlockPool(_plan(*GEMMA_LIKE))
    pages = pool.allocate(0, 3)
    pool.free(0, pages[:1])
    with pytest.raises(InvalidInputError, match=r"freed twice|is free"):
        pool.free(0, pages[:1])
    pool.free(0, pages[1:])


@pytest.mark.parametrize("parts", [GEMMA_LIKE, SLIDING_ONLY, TWO_POOLS])
def test_reserve_past_max_model_len_is_refused(parts: Any) -> None:
    pool = BlockPool(_plan(*parts))
    with pytest.raises(InvalidInputError, match="the plan's max_model_len is 1,024"):
        pool.reserve("r", CTX.max_model_len + 1)
    assert pool.requests == () and pool.num_free_blocks == pool.plan.usable_blocks
    pool.reserve("r", CTX.max_model_len)
    with pytest.raises(InvalidInputError, match="cannot reserve 1025 tokens of request 'r'"):
        pool.reserve("r", CTX.max_model_len + 1)
    assert pool.num_tokens("r") == CTX.max_model_len


@pytest.mark.parametrize("parts", [SLIDING_ONLY, GEMMA_LIKE, TWO_POOLS])
@pytest.mark.parametrize("caching", [True, False])
def test_attach_prefix_past_max_model_len_is_refused_at_once(parts: Any, caching: bool) -> None:
    pool = BlockPool(_plan(*parts), prefix_caching=caching)
    start = time.perf_counter()
    with pytest.raises(InvalidInputError, match="cannot attach 1000000000 tokens"):
        pool.attach_prefix("r", PrefixKey("system", 10**9))
    with pytest.raises(InvalidInputError, match="max_model_len is 1,024"):
        pool.attach_prefix("r", list(range(1025)))
    assert time.perf_counter() - start < 5  # (it ran 53 s before; no timing target, only no walk)
    assert pool.requests == ()
    # a key longer than the request is fine: the hit is bounded by the request's own tokens
    assert pool.attach_prefix("r", PrefixKey("system", 10**9), num_tokens=CTX.max_model_len) == 0


@pytest.mark.parametrize("parts", [GEMMA_LIKE, TWO_POOLS])
@pytest.mark.parametrize("request_id", [[1, 2], {"id": 1}, {3}, (1, [2])])
def test_an_unhashable_request_id_is_an_invalid_input_error(parts: Any, request_id: Any) -> None:
    pool = BlockPool(_plan(*parts), prefix_caching=True)
    calls = [
        lambda: pool.reserve(request_id, 16),
        lambda: pool.attach_prefix(request_id, [1, 2, 3]),
        lambda: pool.num_tokens(request_id),
        lambda: pool.block_table(request_id, 0),
        lambda: pool.free_request(request_id),
        lambda: pool.release_stale(request_id, 0),
        lambda: pool.truncate(request_id, 0),
        lambda: pool.new_blocks_needed(request_id, 16),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError, match="request ids must be hashable"):
            call()
    assert pool.requests == ()
