"""The host tier on the CPU: pages of every built-in policy's plan go out and come back byte for
byte, the rows are counted and refused when short, and bad calls get typed errors. The decode
tests (tokens with pages that went out and came back) are in tests/engine/decode/test_host_tier_decode.py."""

from __future__ import annotations

import pytest
import torch

from kvcore import SizingContext, allocate, plan_kv_cache
from kvcore.errors import HostTierError, InvalidInputError, PlanValidationError
from kvcore.plan import OffloadTier
from kvcore.planning.offload import with_host_memory
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.runtime.host_tier import HostTier
from kvcore.spec import KVCacheSpec
from tests.helpers import full, sliding

CONTEXT = SizingContext(max_model_len=256, max_num_batched_tokens=32)


def _state(block_size: int = 16) -> StateSpec:
    return StateSpec(
        block_size=block_size,
        parts=(
            StatePart(name="conv", shape=(3, 8), dtype="float32"),
            StatePart(name="ssm", shape=(8, 4), dtype="bfloat16"),
        ),
        cache_mode="all",
    )


def _specs() -> dict[str, KVCacheSpec]:
    """Four kinds, three dtypes: pages of different sizes and alignments share the host rows."""
    return {
        "l0": full(block_size=16, heads=2, head_size=8, dtype="float32"),
        "l1": sliding(32, block_size=16, heads=2, head_size=8, dtype="float16"),
        "l2": _state(),
        "l3": full(block_size=16, heads=2, head_size=8, dtype="float32"),
        "l4": CrossAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=8, dtype="float32", max_encoder_tokens=40
        ),
    }


class _Raw:
    """The bytes under every view (one buffer for a single-buffer plan), as uint8 tensors that
    alias them: ``snapshot()`` copies them, ``equals()`` compares."""

    def __init__(self, buffers):
        self.buffers = buffers

    def snapshot(self):
        return [b.clone() for b in self.buffers]

    def equals(self, snapshot):
        return all(torch.equal(a, b) for a, b in zip(self.buffers, snapshot, strict=True))


def _raw(views) -> _Raw:
    storages = {}
    for view in views.values():
        for tensor in (view,) if isinstance(view, torch.Tensor) else view:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage
    return _Raw([torch.empty(0, dtype=torch.uint8).set_(s) for s in storages.values()])


def _parts(views, name):
    view = views[name]
    return (view,) if isinstance(view, torch.Tensor) else tuple(view)


def _setup(registry, policy, host=1 << 18, specs=None):
    plan = plan_kv_cache(specs or _specs(), 1 << 20, CONTEXT, registry=registry, policy=policy)
    plan = with_host_memory(plan, host)
    views = allocate(plan, "cpu", registry=registry)
    raw = _raw(views)
    generator = torch.Generator().manual_seed(5)
    for buffer in raw.buffers:
        buffer.copy_(torch.randint(0, 256, buffer.shape, dtype=torch.uint8, generator=generator))
    return plan, views, raw, HostTier(plan, views, registry=registry)


@pytest.mark.parametrize("policy", ["shared_buffer", "kind_pools"])
def test_pages_come_back_byte_for_byte(registry, policy):
    plan, views, raw, tier = _setup(registry, policy)
    assert not tier.pin_memory  # plain memory on the CPU
    assert tier.nbytes == sum(
        plan.host_blocks_in(p) * pool.bytes_per_block for p, pool in enumerate(plan.pools)
    )
    before = raw.snapshot()
    for index, group in enumerate(plan.groups):
        last = plan.num_pages(group) - 1
        pages = [last, 1, 3]
        slots = tier.offload(index, pages)
        for name in group.layer_names:
            for tensor, part in zip(
                _parts(views, name), registry.cache_layout(group.spec_of(name)).parts, strict=True
            ):
                tensor.index_fill_(part.block_dim, torch.tensor(pages), 0)
        assert not raw.equals(before)  # the pages really were overwritten
        tier.restore(index, slots, pages)
        assert raw.equals(before), f"group {index} ({group.spec.kind}) came back changed"
        tier.release(index, slots)
    assert [tier.num_free_rows(p) for p in range(len(plan.pools))] == [
        plan.host_blocks_in(p) for p in range(len(plan.pools))
    ]


def test_a_page_comes_back_into_another_page(registry):
    """A prefix hit restores into whatever page the pool took: page 5's bytes land in page 9."""
    plan, views, _, tier = _setup(registry, "kind_pools")
    group = next(i for i, g in enumerate(plan.groups) if g.spec.kind == "full_attention")
    name = plan.groups[group].layer_names[0]
    (kv,) = _parts(views, name)
    kv = kv.view(torch.int32)  # random bytes as floats hold NaNs, which never compare equal
    page5 = kv[:, 5].clone()
    (slot,) = tier.offload(group, [5])
    kv.zero_()
    tier.restore(group, [slot], [9])
    assert torch.equal(kv[:, 9], page5)
    assert not kv[:, 5].any()


def test_a_state_page_takes_an_aligned_run_of_rows(registry):
    plan, _, _, tier = _setup(registry, "shared_buffer")
    spans = {g.blocks_per_page for g in plan.groups}
    assert len(spans) > 1  # attention pages span several small block ids beside the state's
    for index, group in enumerate(plan.groups):
        (slot,) = tier.offload(index, [0])
        assert slot % group.blocks_per_page == 0
        tier.release(index, [slot])


def test_a_full_tier_takes_nothing_and_says_so(registry):
    plan, _, _, tier = _setup(registry, "kind_pools")
    group = next(i for i, g in enumerate(plan.groups) if g.spec.kind == "full_attention")
    pool = plan.groups[group].pool
    rows = plan.host_blocks_in(pool)
    assert plan.num_pages(plan.groups[group]) > rows
    with pytest.raises(
        HostTierError, match=rf"0 of its {rows:,} rows are free|{rows:,} of its {rows:,} rows"
    ):
        tier.offload(group, list(range(rows + 1)))
    assert tier.num_free_rows(pool) == rows  # all or nothing
    slots = tier.offload(group, list(range(rows)))
    assert tier.num_free_rows(pool) == 0
    with pytest.raises(HostTierError, match="no room"):
        tier.offload(group, [rows])
    tier.release(group, slots[:1])
    assert tier.offload(group, [rows]) == slots[:1]


def test_a_kind_that_stays_on_the_device_is_refused(registry, make_registry):
    import attrs

    from kvcore.hookspecs import hookimpl
    from kvcore.plugins.full_attention import FullAttentionSpec

    @attrs.frozen(kw_only=True)
    class Pinned(FullAttentionSpec):
        kind = "test.pinned"
        offload_unit = "none"

    class Plugin:
        @hookimpl
        def kvcore_register_spec_kinds(self, register):
            register(Pinned)

    reg = make_registry(Plugin())
    specs = {"a": Pinned(block_size=16, num_kv_heads=1, head_size=8, dtype="float32")}
    _, _, _, tier = _setup(reg, "uniform", specs=specs)
    with pytest.raises(HostTierError, match="offload_unit is 'none'"):
        tier.offload(0, [0])


def test_bad_calls(registry):
    plan, views, _, tier = _setup(registry, "kind_pools")
    pages = plan.num_pages(plan.groups[0])
    with pytest.raises(InvalidInputError, match="outside its pages"):
        tier.offload(0, [pages])
    with pytest.raises(InvalidInputError, match="repeat"):
        tier.offload(0, [1, 1])
    with pytest.raises(InvalidInputError, match="no group 9"):
        tier.offload(9, [0])
    (slot,) = tier.offload(0, [1])
    with pytest.raises(InvalidInputError, match="one page per host slot"):
        tier.restore(0, [slot], [1, 2])
    with pytest.raises(InvalidInputError, match="not held by group 1"):
        tier.restore(1, [slot], [1])
    tier.release(0, [slot])
    with pytest.raises(InvalidInputError, match="not held"):
        tier.release(0, [slot])
    with pytest.raises(InvalidInputError, match="no offload tier"):
        HostTier(plan.with_offload_tier(None), views, registry=registry)
    with pytest.raises(PlanValidationError, match="cannot hold one of its pages"):
        HostTier(plan, views, registry=registry, tier=OffloadTier(pool_bytes=(10,) * len(plan.pools)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is missing")
def test_pinned_memory_needs_cuda(registry):
    plan = with_host_memory(plan_kv_cache(_specs(), 1 << 20, CONTEXT, registry=registry), 1 << 18)
    views = allocate(plan, "cpu", registry=registry)
    with pytest.raises(InvalidInputError, match="needs CUDA"):
        HostTier(plan, views, registry=registry, pin_memory=True)


@pytest.mark.parametrize("policy", ["shared_buffer", "kind_pools"])
def test_any_sequence_of_moves_keeps_every_held_page_and_counts_every_row(registry, policy):
    """Random offloads, restores and releases over groups whose pages span different runs of
    rows: every held slot still gives back the bytes it took (no two held pages share a row), and
    the free rows are the rows less those held."""
    from hypothesis import given, settings, strategies as st

    plan, views, _, tier = _setup(registry, policy, host=1 << 16)
    layouts = {
        name: registry.cache_layout(g.spec_of(name)).parts for g in plan.groups for name in g.layer_names
    }

    def page_bytes(group, page):
        out = []
        for name in plan.groups[group].layer_names:
            for tensor, part in zip(_parts(views, name), layouts[name], strict=True):
                out.append(tensor.select(part.block_dim, page).contiguous().view(torch.uint8).clone())
        return out

    @settings(max_examples=15, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10**6), st.integers(1, 6)), max_size=40))
    def run(ops):
        held: dict[tuple[int, int], list[torch.Tensor]] = {}  # (group, slot) -> bytes it took
        for action, seed, count in ops:
            group = seed % len(plan.groups)
            pages = plan.num_pages(plan.groups[group])
            if action == 0:  # offload a few distinct pages
                chosen = sorted({(seed * 7919 + k * 104_729) % pages for k in range(count)})
                wanted = len(chosen) * plan.groups[group].blocks_per_page
                try:
                    slots = tier.offload(group, chosen)
                except HostTierError:
                    assert (
                        tier.free_pages(group) < len(chosen)
                        or tier.num_free_rows(plan.groups[group].pool) < wanted
                    )
                    continue
                for slot, page in zip(slots, chosen, strict=True):
                    held[(group, slot)] = page_bytes(group, page)
            elif held:
                (g, slot), kept = sorted(held.items())[seed % len(held)]
                if action == 1:  # restore into some page, and compare
                    target = seed % plan.num_pages(plan.groups[g])
                    tier.restore(g, [slot], [target])
                    assert all(torch.equal(a, b) for a, b in zip(page_bytes(g, target), kept, strict=True))
                else:
                    tier.release(g, [slot])
                    del held[(g, slot)]
        for p in range(len(plan.pools)):
            spans = sum(plan.groups[g].blocks_per_page for g, _ in held if plan.groups[g].pool == p)
            assert tier.num_free_rows(p) == plan.host_blocks_in(p) - spans
        rows = [
            (plan.groups[g].pool, row)
            for g, slot in held
            for row in range(slot, slot + plan.groups[g].blocks_per_page)
        ]
        assert len(rows) == len(set(rows)), "two held pages share a host row"
        for g, slot in list(held):
            tier.release(g, [slot])

    run()


def test_host_rows_hand_out_aligned_runs_and_take_them_back():
    """The torch-free row count the simulator shares: runs of 1 and 4 rows in 10 rows."""

    from kvcore.runtime.host_rows import HostRows

    rows = HostRows(10, [1, 4])
    assert rows.take(4) == 0 and rows.take(4) == 4
    assert rows.take(4) is None  # rows 8-9 are no whole run of 4
    assert rows.take(1) == 8 and rows.take(1) == 9 and rows.take(1) is None
    assert rows.num_free == 0 and rows.free_runs(1) == 0
    rows.give_back(4, 4)
    assert rows.num_free == 4 and rows.free_runs(4) == 1
    assert {rows.take(1), rows.take(1)} <= {4, 5, 6, 7}  # single rows come from the run given back
    assert rows.take(4) is None
    with pytest.raises(InvalidInputError, match="spans >= 1"):
        HostRows(4, [0])
