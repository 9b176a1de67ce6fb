"""``LocalExecutor.release()``: kvcore's views come off the modules, its references go, the
memory is freed, and the executor plans again; ``timings`` always has ``warmup``."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kvcore import LocalExecutor, Registry, get_plugin_manager, initialize_kv_caches
from kvcore.runtime.allocation import allocation_sizes, empty_bytes
from tests.runtime._kinds import ToyAttention, ToyAttentionPlugin, ToyModel

#: release() and the buffer counts here collect garbage: the heap the worker holds is frozen for them
pytestmark = pytest.mark.usefixtures("frozen_heap")

MiB = 2**20


@pytest.fixture
def toy_registry():
    return Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=[ToyAttentionPlugin()]))


class _Tracking:
    """An allocator that keeps a weak reference to the storage of every buffer it hands out
    (torch's own ``StorageWeakRef``: it expires when the memory is freed)."""

    def __init__(self) -> None:
        self.refs: list[StorageWeakRef] = []

    def __call__(self, nbytes: int, device: torch.device) -> torch.Tensor:
        buffer = empty_bytes(nbytes, device)
        self.refs.append(StorageWeakRef(buffer.untyped_storage()))
        return buffer

    def alive(self) -> int:
        gc.collect()
        return sum(not ref.expired() for ref in self.refs)


def _executor(registry, allocator=None, **kwargs):
    return LocalExecutor(
        ToyModel(), "cpu", registry=registry, kv_cache_bytes=2 * MiB, allocator=allocator, **kwargs
    )


def _attention(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, ToyAttention)}


def test_release_frees_the_storage_and_gives_the_modules_back(toy_registry):
    allocator = _Tracking()
    executor = _executor(toy_registry, allocator)
    plan = initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    assert allocator.alive() == len(allocation_sizes(plan)) >= 1

    released = executor.release()

    assert released == sum(allocation_sizes(plan)) == plan.kv_cache_bytes
    assert allocator.alive() == 0, "no buffer survives the release"
    # ToyAttention starts with kv_cache = None: that is what it holds again
    assert all(module.kv_cache is None for module in _attention(executor.model).values())
    assert executor.plan is None and executor.kv_caches == {} and executor.bound == {}
    executor.model(torch.randn(4, 32))  # the model runs without caches, as before binding


def test_a_module_without_the_attribute_before_binding_loses_it(toy_registry):
    executor = _executor(toy_registry, attribute="paged_cache")
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    modules = _attention(executor.model)
    assert all(isinstance(m.paged_cache, torch.Tensor) for m in modules.values())
    executor.release()
    assert not any(hasattr(m, "paged_cache") for m in modules.values())


def test_a_view_the_engine_still_holds_keeps_its_buffer_until_dropped(toy_registry):
    allocator = _Tracking()
    executor = _executor(toy_registry, allocator)
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    kept = next(iter(executor.kv_caches.values()))
    executor.release()
    assert allocator.alive() == 1, "a view an engine keeps pins its buffer"
    del kept
    assert allocator.alive() == 0


def test_a_module_the_engine_rebound_is_left_alone(toy_registry):
    executor = _executor(toy_registry)
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    module = next(iter(_attention(executor.model).values()))
    own = torch.zeros(1)
    module.kv_cache = own
    executor.release()
    assert module.kv_cache is own


def test_planning_again_after_release_works_and_binds_fresh_views(toy_registry):
    allocator = _Tracking()
    executor = _executor(toy_registry, allocator)
    first = initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    executor.release()
    second = initialize_kv_caches(executor, registry=toy_registry, max_model_len=512)
    assert second.context.max_model_len == 512 and second != first
    assert allocator.alive() == len(allocation_sizes(second))
    for name, module in _attention(executor.model).items():
        assert module.kv_cache is executor.kv_caches[name]
    executor.release()
    assert allocator.alive() == 0


def test_releasing_twice_or_before_initializing_does_nothing(toy_registry):
    executor = _executor(toy_registry)
    assert executor.release() == 0
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    assert executor.release() > 0
    assert executor.release() == 0


def test_shared_layers_are_unbound_too(toy_registry):
    executor = _executor(toy_registry, kv_sharing={"model.layers.3.self_attn": "model.layers.1.self_attn"})
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    modules = _attention(executor.model)
    assert modules["model.layers.3.self_attn"].kv_cache is modules["model.layers.1.self_attn"].kv_cache
    executor.release()
    assert all(module.kv_cache is None for module in modules.values())


@pytest.mark.parametrize("warmup", [None, lambda m: m(torch.randn(2, 32))])
def test_timings_always_have_the_documented_keys(toy_registry, warmup):
    executor = _executor(toy_registry, warmup_fn=warmup)
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    assert set(executor.timings) == {"specs", "memory", "plan", "allocate", "bind", "warmup"}
    if warmup is None:
        assert executor.timings["warmup"] == 0.0
    assert all(seconds >= 0 for seconds in executor.timings.values())


def test_initializing_again_without_release_still_restores_the_first_values(toy_registry):
    executor = _executor(toy_registry)
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=256)
    initialize_kv_caches(executor, registry=toy_registry, max_model_len=128)
    executor.release()
    assert all(module.kv_cache is None for module in _attention(executor.model).values())
