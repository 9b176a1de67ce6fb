"""Available memory: the CUDA and host arithmetic through fake probes, the real host probe,
device checks, and the fixed-size bypass."""

from __future__ import annotations

import pytest
import torch

from kvcore import DeviceUnavailableError, InvalidInputError, MemoryProfile, MemoryProfilingError
from kvcore.runtime.memory import (
    DeviceMemory,
    HostMemory,
    check_device,
    determine_available_memory,
    device_memory,
)
from tests.runtime._fakes import FakeGpu, FakeHost

GiB = 2**30


def test_fakes_follow_the_protocol():
    assert isinstance(FakeGpu(1, 0, 0), DeviceMemory)
    assert isinstance(FakeHost(1, 1, 0), DeviceMemory)
    assert isinstance(HostMemory(), DeviceMemory)


def test_cuda_budget_is_cap_minus_memory_outside_torch_minus_the_torch_peak():
    gpu = FakeGpu(total=80 * GiB, other=2 * GiB, weights=16 * GiB, cached=3 * GiB)
    profile = determine_available_memory(gpu, utilization=0.9, profile_fn=lambda: gpu.run(4 * GiB))
    # cap 72 GiB; outside torch 2 GiB; peak 16 GiB weights + 4 GiB activations
    assert profile.cap_bytes == int(80 * GiB * 0.9)
    assert profile.non_torch_bytes == 2 * GiB
    assert profile.torch_peak_bytes == 20 * GiB
    assert profile.kv_cache_bytes == int(80 * GiB * 0.9) - 22 * GiB
    assert profile.free_before_bytes == 80 * GiB - 2 * GiB - 16 * GiB  # cached memory was returned first
    assert profile.cap_basis == "total" and profile.source == "profiled"
    assert gpu.calls.index("reset_peak") < gpu.calls.index("run")


def test_cuda_memory_outside_torch_that_grows_during_the_run_counts():
    gpu = FakeGpu(total=80 * GiB, other=1 * GiB, weights=10 * GiB)
    profile = determine_available_memory(
        gpu, utilization=0.5, profile_fn=lambda: gpu.run(GiB, other_grows_by=GiB)
    )
    assert profile.non_torch_bytes == 2 * GiB  # e.g. a cuBLAS workspace created by the forward pass
    assert profile.kv_cache_bytes == 40 * GiB - 2 * GiB - 11 * GiB


def test_other_processes_holding_more_than_the_cap_leaves_is_a_clear_error():
    gpu = FakeGpu(total=80 * GiB, other=60 * GiB, weights=16 * GiB)
    with pytest.raises(MemoryProfilingError) as info:
        determine_available_memory(gpu, utilization=0.9, profile_fn=lambda: gpu.run(GiB))
    message = str(info.value)
    assert "other processes" in message
    assert "60.00 GiB" in message and "8.00 GiB" in message  # held, and what 0.9 of 80 GiB leaves them
    assert "utilization" in message


def test_a_profile_run_larger_than_the_cap_is_a_clear_error():
    gpu = FakeGpu(total=80 * GiB, other=1 * GiB, weights=60 * GiB)
    with pytest.raises(MemoryProfilingError) as info:
        determine_available_memory(gpu, utilization=0.9, profile_fn=lambda: gpu.run(12 * GiB))
    message = str(info.value)
    assert "peaked at 72.00 GiB" in message and "cap of 72.00 GiB" in message


def test_a_budget_larger_than_the_free_memory_is_a_clear_error():
    # utilization 1.0 with 2 GiB the caching allocator cannot return: the budget is not free
    gpu = FakeGpu(total=80 * GiB, other=1 * GiB, weights=10 * GiB, fragmentation=2 * GiB)
    with pytest.raises(MemoryProfilingError, match="free after profiling"):
        determine_available_memory(gpu, utilization=1.0)


def test_host_budget_is_a_share_of_available_memory_minus_the_run_growth():
    host = FakeHost(total=64 * GiB, available=40 * GiB, rss=3 * GiB)
    profile = determine_available_memory(
        host, utilization=0.5, profile_fn=lambda: host.run(2 * GiB, kept=GiB)
    )
    assert profile.cap_basis == "available"
    assert profile.cap_bytes == 20 * GiB
    assert profile.torch_peak_bytes == 2 * GiB
    assert profile.non_torch_bytes == 0
    assert profile.kv_cache_bytes == 18 * GiB
    assert profile.free_after_bytes == 39 * GiB


def test_host_run_larger_than_the_cap_is_a_clear_error():
    host = FakeHost(total=64 * GiB, available=4 * GiB, rss=GiB)
    with pytest.raises(MemoryProfilingError, match=r"peaked at 3\.00 GiB"):
        determine_available_memory(host, utilization=0.5, profile_fn=lambda: host.run(3 * GiB))


def test_a_fixed_size_bypasses_profiling_and_the_cap():
    gpu = FakeGpu(total=80 * GiB, other=70 * GiB, weights=0)  # 10 GiB free, but 0.9 of 80 leaves 2
    ran = []
    profile = determine_available_memory(gpu, kv_cache_bytes=5 * GiB, profile_fn=lambda: ran.append(1))
    assert ran == [] and "reset_peak" not in gpu.calls
    assert profile.source == "fixed" and profile.kv_cache_bytes == 5 * GiB and profile.utilization is None
    assert "fixed at 5.00 GiB" in str(profile)


def test_a_fixed_size_above_the_free_memory_is_refused_before_allocating():
    gpu = FakeGpu(total=80 * GiB, other=58 * GiB, weights=0)  # 22 GiB free
    with pytest.raises(MemoryProfilingError) as info:
        determine_available_memory(gpu, kv_cache_bytes=23 * GiB)
    message = str(info.value)
    assert "23.00 GiB" in message and "22.00 GiB free" in message and "nothing was allocated" in message
    assert "give at most 22.00 GiB" in message


def test_a_fixed_size_works_on_the_meta_device():
    profile = determine_available_memory("meta", kv_cache_bytes=GiB)
    assert profile.kv_cache_bytes == GiB and profile.total_bytes == 0 and profile.device == "meta"


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True, "0.9"])
def test_utilization_out_of_range_is_rejected(bad):
    with pytest.raises(InvalidInputError, match="utilization"):
        determine_available_memory(FakeHost(1, 1, 0), utilization=bad)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_a_fixed_size_must_be_a_positive_int(bad):
    with pytest.raises(InvalidInputError, match="kv_cache_bytes"):
        determine_available_memory(FakeHost(1, 1, 0), kv_cache_bytes=bad)


def test_profile_renders_every_figure():
    gpu = FakeGpu(total=80 * GiB, other=2 * GiB, weights=16 * GiB)
    profile = determine_available_memory(gpu, utilization=0.9, profile_fn=lambda: gpu.run(4 * GiB))
    text = str(profile)
    for figure in ("80.00 GiB", "72.00 GiB", "2.00 GiB", "20.00 GiB", "50.00 GiB", "cap (0.9 of total)"):
        assert figure in text
    assert isinstance(profile, MemoryProfile) and text.startswith("memory on cuda:0")


def test_the_real_host_probe_sees_a_profile_run_grow_the_resident_set(frozen_heap):  # it collects garbage
    size = 64 * 2**20
    profile = determine_available_memory(
        "cpu", utilization=0.5, profile_fn=lambda: torch.ones(size, dtype=torch.uint8)
    )
    assert profile.total_bytes >= profile.free_before_bytes > 0
    assert profile.torch_peak_bytes >= 0.95 * size  # the 64 MiB the run touched (less what it freed)
    assert profile.kv_cache_bytes == profile.cap_bytes - profile.torch_peak_bytes
    assert profile.cap_bytes == int(profile.free_before_bytes * 0.5)


def test_host_probe_reads_positive_numbers():
    sample = HostMemory().sample()
    assert sample.total_bytes >= sample.free_bytes > 0
    assert sample.process_bytes > 0 and sample.torch_reserved_bytes == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is absent")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_a_clear_error(device):
    with pytest.raises(DeviceUnavailableError, match="needs a CUDA GPU"):
        check_device(device)
    with pytest.raises(DeviceUnavailableError):
        determine_available_memory(device)


def test_unreadable_device_text_is_invalid_input():
    with pytest.raises(InvalidInputError, match="cannot read device"):
        check_device("gpu0")


def test_devices_without_a_probe_ask_for_a_fixed_size():
    with pytest.raises(DeviceUnavailableError, match="fixed"):
        device_memory("meta")
