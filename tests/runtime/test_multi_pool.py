"""Plans of several block pools at run time: the pool, the plan check, allocation.

The property: for random plans of several pools (``kind_pools`` plans of mixes of several
retention kinds with mixed head counts, and plans built by hand through ``pools=``), driven
through ``BlockPool`` by random reserve / release / truncate / free steps,

- the bytes of all live pages of all layers are disjoint, across groups and across pools, and
  every page lies inside its pool's bytes;
- no request holds more pages of a group than ``group.pages_per_request(context)``;
- a failed reserve takes nothing in any pool, and the pool is empty at the end;
- allocated on the CPU, a random pattern written into every live page survives every step.

The check must also fail: plans broken on purpose (pools overlapping, a tensor of pool 1 over
pool 0's bytes, two layers of one group on the same bytes) are caught.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import attrs
import pytest
from hypothesis import event, given, settings, strategies as st

from kvcore import (
    BlockPool,
    BlockPoolExhaustedError,
    InvalidInputError,
    KVCachePlan,
    PlanValidationError,
    Registry,
    SizingContext,
    allocate,
    plan_kv_cache,
)
from kvcore.plan import KVCachePool, structural_problems
from kvcore.planning.invariants import plan_problems
from kvcore.runtime.block_pool import NULL_PAGE
from kvcore.testing import strategies as kst
from tests.helpers import full, sliding
from tests.runtime._workload import run_workload

REGISTRY = Registry.default(autoload=False)
CTX = SizingContext(max_model_len=64, max_num_batched_tokens=16)


def _gemma_like(**extra) -> KVCachePlan:
    """Two pools: full attention (two head counts: a mixed-page group) and a window of 16."""
    specs = {
        "model.layers.0": sliding(16, block_size=4, heads=1, head_size=8, dtype="float32"),
        "model.layers.1": full(block_size=4, heads=1, head_size=8, dtype="float32"),
        "model.layers.2": sliding(16, block_size=4, heads=1, head_size=8, dtype="float32"),
        "model.layers.3": full(block_size=4, heads=2, head_size=8, dtype="float32"),
    }
    return plan_kv_cache(specs, 2**20, CTX, registry=REGISTRY, policy="kind_pools", check_fit=False, **extra)


def _unchecked(plan: KVCachePlan, **changes) -> KVCachePlan:
    """``plan`` with ``changes``, built without the plan's own checks (to test what catches them)."""
    broken = object.__new__(type(plan))
    for field in attrs.fields(type(plan)):
        object.__setattr__(broken, field.name, changes.get(field.name, getattr(plan, field.name)))
    return broken


# -- the pool --------------------------------------------------------------------------------


def test_a_plan_of_several_pools_gets_a_pool_per_pool():
    plan = _gemma_like(num_blocks=(6, 9))
    assert len(plan.pools) == 2
    pool = BlockPool(plan)
    assert [p.num_blocks for p in pool.pools] == [6, 9]
    assert [p.members for p in pool.pools] == [plan.groups_in(0), plan.groups_in(1)]
    assert pool.num_free_blocks == 15
    assert [pool.num_free_blocks_in(p) for p in (0, 1)] == [6, 9]
    assert [pool.num_usable_blocks_in(p) for p in (0, 1)] == [6, 9]
    one = plan_kv_cache(
        {"model.layers.0": full(block_size=4)}, 2**20, CTX, registry=REGISTRY, policy="kind_pools"
    )
    assert len(BlockPool(one).pools) == 1  # one pool: a tuple of one, the same type


def test_block_ids_are_per_pool_and_group_indices_are_the_plans():
    plan = _gemma_like(num_blocks=(6, 9))
    pool = BlockPool(plan)
    taken = pool.reserve("a", 8)  # two pages in each group
    by_group = {index: pages for index, pages in taken.items()}
    assert set(by_group) == {0, 1}
    for index, pages in by_group.items():
        p = plan.groups[index].pool
        assert all(0 <= page < plan.pools[p].num_blocks for page in pages)
        assert all(pool.owner(page, p) == index for page in pages)
        assert pool.block_table("a", index) == pages
    assert by_group[0] == by_group[1] == [0, 1]  # the same ids, in different pools: both live
    assert pool.requests == ("a",)
    assert pool.num_tokens("a") == 8
    with pytest.raises(InvalidInputError):
        pool.owner(0, 2)


def test_a_reserve_takes_nothing_when_one_pool_is_short():
    plan = _gemma_like(num_blocks=(3, 40))
    pool = BlockPool(plan)
    pool.reserve("a", 8)
    before = [pool.num_free_blocks_in(p) for p in (0, 1)]
    short = next(p for p in (0, 1) if pool.num_free_blocks_in(p) < 2)
    with pytest.raises(BlockPoolExhaustedError, match=rf"of pool {short} .*nothing was taken in any pool"):
        pool.reserve("b", 8)
    assert [pool.num_free_blocks_in(p) for p in (0, 1)] == before
    assert pool.requests == ("a",)
    pool.free_request("a")
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_truncate_checks_every_pool_before_cutting_any():
    plan = _gemma_like(num_blocks=(30, 30))
    pool = BlockPool(plan)
    window = next(i for i, g in enumerate(plan.groups) if g.spec.kind == "sliding_window")
    pool.reserve("a", 40)
    pool.release_stale("a", 40)
    tables = [pool.block_table("a", g) for g in range(len(plan.groups))]
    with pytest.raises(InvalidInputError, match=rf"pool \d: .*group {window} \(sliding_window\)"):
        pool.truncate("a", 8)
    assert [pool.block_table("a", g) for g in range(len(plan.groups))] == tables
    freed = pool.truncate("a", 39)
    assert freed == {}  # same pages
    pool.free_request("a")
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_the_null_block_of_every_pool_is_never_handed_out():
    plan = _gemma_like(num_blocks=(5, 5), options=_null_options())
    pool = BlockPool(plan)
    assert [pool.num_usable_blocks_in(p) for p in (0, 1)] == [4, 4]
    pool.reserve("a", 16)
    assert all(0 not in pool.block_table("a", g) for g in range(len(plan.groups)))
    assert pool.owner(0, 0) is None and pool.owner(0, 1) is None


def _null_options():
    from kvcore import PlanOptions

    return PlanOptions(reserve_null_block=True)


def test_allocate_and_free_take_pool_local_ids():
    plan = _gemma_like(num_blocks=(4, 4))
    pool = BlockPool(plan)
    assert pool.allocate(0, 4) == [0, 1, 2, 3]
    assert pool.allocate(1, 4) == [0, 1, 2, 3]
    with pytest.raises(BlockPoolExhaustedError, match="pool 0: group 0"):
        pool.allocate(0, 1)
    pool.free(0, [2])
    assert pool.num_free_blocks_in(plan.groups[0].pool) == 1
    assert pool.num_free_pages(0) == 1 and pool.num_free_pages(1) == 0


def test_prefix_caching_hits_the_prefix_every_pool_has():
    plan = _gemma_like(num_blocks=(40, 40))
    pool = BlockPool(plan, prefix_caching=True)
    assert pool.prefix_caching and pool.prefix_cache_stats.enabled
    tokens = list(range(100, 140))
    assert pool.attach_prefix("a", tokens[:33]) == 0
    pool.reserve("a", 33)
    pool.release_stale("a", 33)
    hit = pool.attach_prefix("b", tokens)
    assert hit == 32  # every full block of "a", in both pools
    for g, group in enumerate(plan.groups):
        live = [page for page in pool.block_table("b", g) if page != NULL_PAGE]
        assert live == [page for page in pool.block_table("a", g) if page != NULL_PAGE][: len(live)]
        assert all(pool.is_cached(page, group.pool) for page in live)
        assert all(pool.ref_count(page, group.pool) == 2 for page in live)
    pool.reserve("b", 40)
    stats = pool.prefix_cache_stats
    assert (stats.lookups, stats.hits, stats.hit_tokens) == (2, 1, 32)
    pool.free_request("a")
    pool.free_request("b")
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_a_subclass_of_the_pool_serves_a_plan_of_several_pools():
    class Mine(BlockPool):
        pass

    pool = Mine(_gemma_like(num_blocks=(4, 4)))
    assert len(pool.pools) == 2 and pool.num_free_blocks == 8


def test_the_free_ids_seam_is_asked_once_per_pool_and_sees_every_id_taken():
    from kvcore.runtime.free_blocks import FreeBlocks

    made, taken = [], []

    class Counting(FreeBlocks):
        def take(self, block, group):
            taken.append((group, block))
            super().take(block, group)

    def factory(num_blocks, spans):
        made.append((num_blocks, dict(spans)))
        return Counting(num_blocks, spans)

    plan = _gemma_like(num_blocks=(6, 9))
    pool = BlockPool(plan, free_blocks=factory)
    assert made == [
        (plan.pools[p].num_blocks, {i: plan.groups[i].blocks_per_page for i in plan.groups_in(p)})
        for p in (0, 1)
    ]
    grown = pool.reserve("a", 8)
    assert sorted(taken) == sorted((g, page) for g, pages in grown.items() for page in pages)
    pool.free_request("a")
    assert pool.num_free_blocks == pool.num_usable_blocks


# -- the plan check catches broken plans of several pools -------------------------------------


def test_pools_that_overlap_are_caught():
    plan = _gemma_like(num_blocks=(4, 4))
    moved = (plan.pools[0], attrs.evolve(plan.pools[1], offset=plan.pools[1].offset - 1))
    broken = _unchecked(plan, pools=moved)
    assert any("overlap" in p for p in structural_problems(broken))
    assert plan_problems(broken)
    with pytest.raises(PlanValidationError):
        attrs.evolve(plan, pools=moved)


def test_a_tensor_of_pool_1_over_pool_0s_bytes_is_caught():
    plan = _gemma_like(num_blocks=(4, 4))
    names = plan.groups[plan.groups_in(1)[0]].layer_names
    lane = plan.tensor_of(names[0])
    moved = attrs.evolve(lane, offset=plan.pools[0].offset)  # onto pool 0's first row
    tensors = tuple(moved if t is lane else t for t in plan.tensors)
    broken = _unchecked(plan, tensors=tensors)
    problems = plan_problems(broken)
    assert any("outside its pool's bytes" in p for p in problems), problems
    with pytest.raises(PlanValidationError, match="handed to allocate"):
        allocate(broken, "cpu", registry=REGISTRY)
    busy = [("arrive", 16, 0), ("arrive", 16, 0), ("step", 0, 16), ("step", 1, 16)]
    found = run_workload(broken, REGISTRY, busy)  # allocates without the check
    assert found and "was overwritten" in found[0]


def test_two_layers_of_one_group_on_the_same_bytes_are_caught_in_their_pool():
    plan = _gemma_like(num_blocks=(4, 4))
    group = plan.groups[1]
    first, second = group.layer_names
    a, b = plan.tensor_of(first), plan.tensor_of(second)
    moved = attrs.evolve(b, offset=a.offset)
    broken = _unchecked(plan, tensors=tuple(moved if t is b else t for t in plan.tensors))
    problems = plan_problems(broken)
    assert any(p.startswith(f"pool {group.pool}: ") and "group 1" in p for p in problems), problems


# -- the property ----------------------------------------------------------------------------

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 16), st.just(0)),
        st.tuples(st.just("step"), st.integers(0, 7), st.integers(1, 16)),
        st.tuples(st.just("truncate"), st.integers(0, 7), st.integers(0, 16)),
        st.tuples(st.just("finish"), st.integers(0, 7), st.just(0)),
    ),
    min_size=4,
    max_size=30,
)


def _live_bytes(plan: KVCachePlan, pool: BlockPool) -> list[tuple[int, int, int, str]]:
    """``(start, end, memory, what)`` of every live page of every layer (a cached page several
    requests share counted once): ``memory`` is 0 for a single buffer, else the tensor's index
    (its own allocation)."""
    index = {id(t): i for i, t in enumerate(plan.tensors)}
    holders: dict[tuple[int, int], list[Hashable]] = {}
    for request in pool.requests:
        for g in range(len(plan.groups)):
            for page in pool.live_pages(request, g):
                holders.setdefault((g, page), []).append(request)
    out = []
    for (g, page), requests in holders.items():
        group = plan.groups[g]
        if len(requests) > 1:  # only a cached prefix block is in several tables
            assert pool.prefix_caching and pool.is_cached(page, group.pool), (
                f"page {page} of group {g} is in the tables of {requests} but not cached"
            )
        assert pool.ref_count(page, group.pool) == len(requests)
        pool_bytes = plan.pools[group.pool]
        for name in group.layer_names:
            tensor = plan.tensor_of(name)
            start = tensor.offset + page * tensor.page_stride
            end = start + group.spec_of(name).page_size_bytes
            what = f"page {page} of {name} (group {g}, pool {group.pool}, requests {requests})"
            if plan.single_buffer:
                assert pool_bytes.offset <= start and end <= pool_bytes.offset + pool_bytes.nbytes, (
                    f"{what} spans {start}..{end}, outside its pool"
                )
            else:
                assert end <= tensor.size, f"{what} spans {start}..{end}, outside its tensor"
            out.append((start, end, 0 if plan.single_buffer else index[id(tensor)], what))
    return out


def _check_disjoint(plan: KVCachePlan, pool: BlockPool) -> None:
    pages = sorted(_live_bytes(plan, pool), key=lambda x: (x[2], x[0]))
    for (_, e1, m1, w1), (s2, _, m2, w2) in itertools.pairwise(pages):
        assert m1 != m2 or e1 <= s2, f"{w1} and {w2} share bytes {s2}..{e1}"


#: The tokens of every request when the pool caches prefixes: all share them, so they hit.
CONTENT = list(range(1000, 1000 + CTX.max_model_len))


def _drive(plan: KVCachePlan, steps, caching: bool = False) -> None:
    pool = BlockPool(plan, prefix_caching=caching)
    context = plan.context
    tokens: dict[int, int] = {}
    fresh = 0
    pools = range(len(plan.pools))
    for kind, a, b in steps:
        live = sorted(tokens)
        if kind == "arrive":
            request, grow = fresh, a
            fresh += 1
            tokens[request] = 0
            if pool.prefix_caching:
                hit = pool.attach_prefix(request, CONTENT, num_tokens=min(len(CONTENT), a + 1))
                if hit:
                    event("a prefix hit in every pool")
                tokens[request] = hit
            try:
                pool.reserve(request, tokens[request])
            except BlockPoolExhaustedError:  # a state pool's slots are all held: not admitted
                event("an arrival found a pool short")
                if request in pool.requests:
                    pool.free_request(request)  # its prefix hit goes back
                del tokens[request]
                continue
        elif kind in ("step", "truncate") and live:
            request, grow = live[a % len(live)], b
        elif kind == "finish" and live:
            pool.free_request(live[a % len(live)])
            del tokens[live[a % len(live)]]
            grow = -1
        else:
            continue
        if grow >= 0:
            have = tokens[request]
            target = min(have + min(grow, context.max_num_batched_tokens), context.max_model_len)
            before = [pool.num_free_blocks_in(p) for p in pools]
            try:
                pool.reserve(request, target)
            except BlockPoolExhaustedError:
                event("a reserve found a pool short")
                assert [pool.num_free_blocks_in(p) for p in pools] == before, "a failed reserve took ids"
                target = have
            if kind == "truncate" and target > have:
                kept = have + (target - have) // 2  # reject half the step, before it is computed
                try:
                    pool.truncate(request, kept)
                    target = kept
                except InvalidInputError:  # ends inside a cached block others share: nothing changed
                    assert pool.prefix_caching
                    event("a truncate refused")
            tokens[request] = target
            for g, group in enumerate(plan.groups):
                held = len(pool.live_pages(request, g))
                assert held <= group.pages_per_request(context), (
                    f"request {request} holds {held} pages of group {g}, more than "
                    f"{group.pages_per_request(context)}"
                )
            _check_disjoint(plan, pool)
            pool.release_stale(request, target)
        for p in pools:
            held = {(g, page) for r in tokens for g in plan.groups_in(p) for page in pool.live_pages(r, g)}
            blocks = sum(plan.groups[g].blocks_per_page for g, _ in held)
            assert blocks == pool.num_usable_blocks_in(p) - pool.num_free_blocks_in(p)
        _check_disjoint(plan, pool)
        if sum(pool.num_free_blocks_in(p) < pool.num_usable_blocks_in(p) for p in pools) > 1:
            event("pages of several pools live at once")
    for request in list(tokens):
        pool.free_request(request)
    assert [pool.num_free_blocks_in(p) for p in pools] == [pool.num_usable_blocks_in(p) for p in pools]
    assert pool.requests == ()


@settings(deadline=None)
@given(plan=kst.multi_pool_plans(registry=REGISTRY, context=CTX), steps=STEPS, caching=st.booleans())
def test_live_pages_of_several_pools_never_share_bytes(plan, steps, caching):
    assert plan_problems(plan) == []
    event(f"planned by {plan.policy}")
    event("a mixed-page group" if any(g.layer_specs for g in plan.groups) else "no mixed-page group")
    _drive(plan, steps, caching)


@settings(deadline=None, max_examples=25)
@given(plan=kst.multi_pool_plans(registry=REGISTRY, context=CTX), steps=STEPS)
def test_allocated_pages_of_several_pools_keep_their_patterns(plan, steps):
    ops = [(k, a, b) for k, a, b in steps if k != "truncate"]
    assert run_workload(plan, REGISTRY, [("arrive", 16, 0), *ops]) == []


def test_a_corrupted_pool_is_caught_by_the_property():
    """The property must be able to fail: a pool that hands pool 1 the ids pool 0 holds, over
    one buffer where the pools' rows are laid as one, is caught."""
    plan = _gemma_like(num_blocks=(8, 8))
    overlapped = (plan.pools[0], attrs.evolve(plan.pools[1], offset=0))
    shift = plan.pools[1].offset
    tensors = tuple(
        attrs.evolve(t, offset=t.offset - shift) if t.offset >= shift else t for t in plan.tensors
    )
    broken = _unchecked(plan, pools=overlapped, tensors=tensors)
    assert plan_problems(broken)
    with pytest.raises(AssertionError):
        _drive(broken, [("arrive", 8, 0), ("arrive", 8, 0)])


def test_hand_built_plans_are_of_several_pools():
    @settings(max_examples=20)
    @given(plan=kst.hand_built_multi_pool_plans())
    def check(plan):
        assert len(plan.pools) >= 2 and isinstance(plan.pools[0], KVCachePool)
        assert plan_problems(plan) == []

    check()


# -- allocation ------------------------------------------------------------------------------


def test_allocate_views_each_layer_at_its_own_page_in_its_pools_bytes():
    plan = _gemma_like(num_blocks=(9, 16))  # one request of 64 tokens: 9 and 16 blocks
    views = allocate(plan, "cpu", registry=REGISTRY)
    for name, group, _ in plan.iter_layers():
        spec = group.spec_of(name)
        pages = plan.num_pages(group)
        assert tuple(views[name].shape) == (2, pages, spec.block_size, spec.num_kv_heads, spec.head_size)
    # a mixed-page group: two head counts in one group
    mixed = next(g for g in plan.groups if g.layer_specs)
    heads = {views[n].shape[3] for n in mixed.layer_names}
    assert heads == {1, 2}
    # pool p's page j of a layer lies in pool p's bytes
    base = views[plan.layer_names[0]].untyped_storage().data_ptr()
    for name, group, _ in plan.iter_layers():
        pool = plan.pools[group.pool]
        for half in views[name]:  # keys, values
            first, last = half[0], half[-1]
            start = first.data_ptr() - base
            end = last.data_ptr() - base + last.nbytes
            assert pool.offset <= start and end <= pool.offset + pool.nbytes


# -- block tables and the simulator ----------------------------------------------------------


def test_block_tables_of_several_pools_hold_pool_local_ids():
    from kvcore.runtime.block_tables import BlockTables

    plan = _gemma_like(num_blocks=(6, 9), options=_null_options())
    pool = BlockPool(plan)
    tables = BlockTables(pool, max_requests=2)
    assert tables.pad_pages == (0, 0)  # each pool's own null block
    tables.update("a", pool.reserve("a", 10))
    tables.update("b", pool.reserve("b", 5))
    slots = tables.slot_mapping([("a", 0, 10), ("b", 0, 5)])
    for g in range(len(plan.groups)):
        row = tables.tensors[g][tables.row("a")].tolist()
        table = pool.block_table("a", g)
        assert row[: len(table)] == table
        want = [
            pool.block_table(r, g)[p // 4] * 4 + p % 4 for r, n in (("a", 10), ("b", 5)) for p in range(n)
        ]
        assert slots[g] is not None and slots[g].tolist() == want
        assert max(want) < plan.pools[plan.groups[g].pool].num_blocks * 4


def test_the_simulator_reports_the_fullest_pools_usage():
    from kvcore import Request, Workload, simulate

    plan = _gemma_like(num_blocks=(40, 8))  # the window's pool of 40 ids, full attention's of 8
    assert [plan.pool_of(g).num_blocks for g in plan.groups] == [40, 8]
    workload = Workload(tuple(Request(i, 20, 4, 0) for i in range(3)), name="three")
    result = simulate(plan, workload, scheduler="kvcore")
    # step 0 computes 16 tokens of request 0: 4 pages in each group, 4 of 40 and 4 of 8 ids
    assert result.pool_usage[0] == 0.5
    assert all(0.0 <= usage <= 1.0 for usage in result.pool_usage)
    assert result.preemptions > 0  # full attention's 8 ids hold one request of 24 tokens (6 pages) at a time


def test_a_mixed_page_layers_larger_page_over_its_neighbour_is_caught():
    """The check must size each layer's page by its own spec: layer 3's page (two heads) is
    twice the group spec's (layer 1's, one head), and here layer 1 sits on its second half."""
    plan = _gemma_like(num_blocks=(4, 4))
    group = plan.groups[1]
    assert group.spec_of("model.layers.3").page_size_bytes == 2 * group.spec.page_size_bytes
    one, three = plan.tensor_of("model.layers.1"), plan.tensor_of("model.layers.3")
    half = group.spec.page_size_bytes
    start = min(one.offset, three.offset)
    tensors = tuple(
        attrs.evolve(t, offset=start + half)
        if t is one
        else attrs.evolve(t, offset=start)
        if t is three
        else t
        for t in plan.tensors
    )
    broken = _unchecked(plan, tensors=tensors)
    assert list(structural_problems(broken)) == []
    problems = plan_problems(broken)
    assert any("model.layers.1" in p and "model.layers.3" in p for p in problems), problems


def test_prefix_caching_is_refused_with_the_reason_when_one_pool_cannot_cache():
    from kvcore import model_layer_specs

    specs = model_layer_specs("ai21labs/AI21-Jamba-1.5-Mini", REGISTRY)
    plan = plan_kv_cache(
        specs, 2**34, SizingContext(max_model_len=2048), registry=REGISTRY, policy="kind_pools"
    )
    state = next(i for i, g in enumerate(plan.groups) if g.spec.kind == "state")
    pool = BlockPool(plan, prefix_caching=True)
    assert not pool.prefix_caching
    stats = pool.prefix_cache_stats
    assert not stats.enabled
    assert stats.reason.startswith(f"pool {plan.groups[state].pool}: group {state} (state)")
    assert pool.attach_prefix("a", list(range(40))) == 0
    pool.reserve("a", 40)
    assert pool.prefix_cache_stats.lookups == 1
