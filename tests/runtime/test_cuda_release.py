"""``LocalExecutor.release()`` on a real CUDA device: the driver gets the memory back, and the
next profile sees it. Skipped without CUDA; tests/runtime/test_release.py runs the same code on
the CPU."""

from __future__ import annotations

import pytest
import torch

from kvcore import LocalExecutor, Registry, get_plugin_manager, initialize_kv_caches
from tests.runtime._kinds import ToyAttentionPlugin, ToyModel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MiB = 2**20


def test_release_gives_the_driver_the_memory_back_and_the_next_profile_sees_it(cuda):
    registry = Registry.from_plugin_manager(
        get_plugin_manager(autoload=False, plugins=[ToyAttentionPlugin()])
    )
    model = ToyModel().to(cuda)
    free_before = torch.cuda.mem_get_info(cuda)[0]
    executor = LocalExecutor(model, cuda, registry=registry, kv_cache_bytes=512 * MiB)
    plan = initialize_kv_caches(executor, registry=registry, max_model_len=4096)
    held = torch.cuda.mem_get_info(cuda)[0]
    assert free_before - held >= plan.kv_cache_bytes - 2 * MiB, "the cache is on the device"

    released = executor.release()

    assert released == plan.kv_cache_bytes
    assert torch.cuda.memory_reserved(cuda) < plan.kv_cache_bytes, "torch's cache was emptied too"
    free_after = torch.cuda.mem_get_info(cuda)[0]
    assert free_after - held >= plan.kv_cache_bytes - 2 * MiB, "the driver has the bytes back"

    # re-plan from a profile: the released bytes count as free again
    total = torch.cuda.mem_get_info(cuda)[1]
    share = min(1.0, (total - free_after + 256 * MiB) / total)
    again = LocalExecutor(model, cuda, registry=registry, utilization=share)
    second = initialize_kv_caches(again, registry=registry, max_model_len=4096)
    assert second.kv_cache_bytes >= 128 * MiB
    assert all(m.kv_cache is again.kv_caches[name] for name, m in again.bound.items())
    again.release()
