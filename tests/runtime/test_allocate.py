"""Allocation: view shapes from the layout hook, bytes where the plan says, all or nothing."""

from __future__ import annotations

import weakref

import attrs
import pytest
import torch

from kvcore import (
    KVCacheAllocationError,
    PartViews,
    PlanValidationError,
    SizingContext,
    allocate,
    plan_kv_cache,
)
from kvcore.runtime.allocation import allocation_sizes, empty_bytes, view_geometries
from tests.helpers import full, mix, mla, sliding
from tests.runtime._kinds import ToyStateSpec, toy_state_registry

CTX = SizingContext(max_model_len=1024)


@pytest.fixture
def state_registry():
    return toy_state_registry()


def _hybrid(registry, budget=2**24):
    specs = mix(
        (4, full(heads=2, head_size=64)),
        (6, sliding(64, heads=2, head_size=64)),
        (2, mla(rank=64, rope=16)),
    )
    return plan_kv_cache(specs, budget, CTX, registry=registry)


def test_uniform_views_have_the_attention_shape_one_tensor_per_layer(registry):
    plan = plan_kv_cache({"a": full(), "b": full()}, 2**24, CTX, registry=registry)
    views = allocate(plan, "meta", registry=registry)
    n = plan.num_blocks
    for view in views.values():
        assert view.shape == (2, n, 16, 8, 128) and view.dtype == torch.bfloat16 and view.is_meta
        assert view.is_contiguous() is False  # K and V of one block sit together in a page
        assert view.stride() == (16 * 8 * 128, 2 * 16 * 8 * 128, 8 * 128, 128, 1)
    assert allocation_sizes(plan) == [n * full().page_size_bytes] * 2


def test_shared_buffer_views_sit_at_the_planned_offsets_and_strides(registry):
    plan = _hybrid(registry)
    views = allocate(plan, "meta", registry=registry)
    assert list(views) == list(plan.layer_names)
    for name, group, tensor in plan.iter_layers():
        view = views[name]
        item = view.element_size()
        assert view.storage_offset() * item == tensor.offset
        pages = plan.num_pages(group)
        if group.spec.kind == "mla":
            assert view.shape == (pages, group.spec.block_size, 80)
            assert view.stride()[0] * item == tensor.page_stride
        else:
            assert view.shape == (2, pages, group.spec.block_size, 2, 64)
            assert view.stride()[1] * item == tensor.page_stride
    assert allocation_sizes(plan) == [plan.kv_cache_bytes]


def test_bytes_written_through_a_view_land_in_its_page(registry):
    plan = _hybrid(registry)
    views = allocate(plan, "cpu", registry=registry)
    for name, group, tensor in plan.iter_layers():
        view = views[name]
        page = plan.num_pages(group) - 1
        block_dim = 0 if group.spec.kind == "mla" else 1
        base = view.select(block_dim, page)
        buffer = torch.empty(0, dtype=torch.uint8).set_(view.untyped_storage())
        start = tensor.offset + page * tensor.page_stride
        before = buffer[start : start + group.spec.page_size_bytes].clone()
        base.fill_(1.0)
        written = buffer[start : start + group.spec.page_size_bytes]
        assert not torch.equal(before, written)
        assert written.view(view.dtype).eq(1.0).all()
        base.zero_()


def test_zero_fill(registry):
    plan = plan_kv_cache(
        {"a": full(heads=1, head_size=8)}, 2**16, SizingContext(max_model_len=64), registry=registry
    )
    dirty = [torch.full((n,), 7, dtype=torch.uint8) for n in allocation_sizes(plan)]
    views = allocate(plan, "cpu", registry=registry, allocator=lambda n, d: dirty.pop())
    assert views["a"].eq(0).all()
    dirty = [torch.full((n,), 7, dtype=torch.uint8) for n in allocation_sizes(plan)]
    views = allocate(plan, "cpu", registry=registry, zero=False, allocator=lambda n, d: dirty.pop())
    assert not views["a"].eq(0).any()


def test_several_parts_give_named_views(state_registry):
    specs = {
        "l0": full(heads=1, head_size=8),
        "l1": ToyStateSpec(block_size=1, conv=6, ssm=40, dtype="float32"),
    }
    plan = plan_kv_cache(specs, 2**20, SizingContext(max_model_len=64), registry=state_registry)
    views = allocate(plan, "cpu", registry=state_registry)
    state = views["l1"]
    assert isinstance(state, PartViews) and state.names == ("conv", "ssm")
    pages = plan.num_pages(plan.group_of("l1"))
    conv, ssm = state
    assert conv.shape == (pages, 6) and ssm.shape == (pages, 40)
    assert state.part("ssm") is ssm
    ssm[0].fill_(3.0)
    assert conv[0].eq(0).all()  # the parts of one page do not overlap
    assert (ssm.storage_offset() - conv.storage_offset()) * 4 == 6 * 4
    with pytest.raises(KeyError, match="conv"):
        state.part("kv")


def test_a_misaligned_tensor_fails_before_any_memory_is_taken(registry):
    specs = mix((2, full(dtype="float32")), (2, sliding(64, dtype="float32")))
    plan = plan_kv_cache(specs, 2**26, CTX, registry=registry)
    lane = next(t for t in plan.tensors if t.offset > 0)
    broken = attrs.evolve(
        plan, tensors=[attrs.evolve(t, offset=t.offset - 2) if t is lane else t for t in plan.tensors]
    )
    calls = []
    with pytest.raises(PlanValidationError, match="handed to allocate"):
        allocate(
            broken, "cpu", registry=registry, allocator=lambda n, d: calls.append(n) or empty_bytes(n, d)
        )
    assert calls == []
    # the views' own check words the misalignment
    with pytest.raises(PlanValidationError, match="multiples of 4"):
        view_geometries(broken, registry=registry)


class FailAt:
    """An allocator that fails the k-th allocation; keeps weak references to what it handed out."""

    def __init__(self, k, error=torch.OutOfMemoryError):
        self.k, self.error, self.count, self.handed = k, error, 0, []

    def __call__(self, nbytes, device):
        self.count += 1
        if self.count == self.k:
            raise self.error("CUDA out of memory. Tried to allocate 64.00 MiB")
        tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.handed.append(weakref.ref(tensor))
        return tensor


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("error", [torch.OutOfMemoryError, RuntimeError, MemoryError])
def test_a_failed_allocation_leaves_nothing_referenced(registry, k, error):
    specs = {f"model.layers.{i}": full(heads=1, head_size=8) for i in range(8)}
    plan = plan_kv_cache(specs, 2**20, SizingContext(max_model_len=64), registry=registry)
    assert len(allocation_sizes(plan)) == 8
    allocator = FailAt(k, error)
    with pytest.raises(KVCacheAllocationError) as info:
        allocate(plan, "cpu", registry=registry, allocator=allocator)
    err = info.value
    assert err.requested_bytes == plan.kv_cache_bytes
    assert err.allocated_bytes == (k - 1) * plan.kv_cache_bytes // 8
    assert err.free_bytes is not None and err.free_bytes > 0
    assert "out of memory" in str(err).lower() or error is not torch.OutOfMemoryError
    assert "everything was released" in str(err)
    assert isinstance(err, MemoryError) and isinstance(err.__cause__, error)
    del info, err  # no gc.collect(): the partial tensors must die by reference counting alone
    assert len(allocator.handed) == k - 1
    assert all(ref() is None for ref in allocator.handed), "a partial allocation is still referenced"


def test_the_error_says_how_much_was_asked_and_how_much_is_free(registry):
    plan = plan_kv_cache({"a": full()}, 2**24, CTX, registry=registry)
    with pytest.raises(KVCacheAllocationError) as info:
        allocate(plan, "cpu", registry=registry, allocator=FailAt(1))
    message = str(info.value)
    assert "16.00 MiB" in message and "is free now" in message and "on cpu" in message


def test_an_allocator_returning_the_wrong_tensor_is_rejected(registry):
    plan = plan_kv_cache({"a": full()}, 2**24, CTX, registry=registry)
    with pytest.raises(KVCacheAllocationError, match="1-D uint8 tensor"):
        allocate(
            plan, "cpu", registry=registry, allocator=lambda n, d: torch.empty(n // 2, dtype=torch.int16)
        )


def test_view_specs_need_no_memory(registry):
    plan = _hybrid(registry, budget=2**40)
    specs = view_geometries(plan, registry=registry)
    assert set(specs) == set(plan.layer_names)
    assert all(len(parts) == 1 for parts in specs.values())
