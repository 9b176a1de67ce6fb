"""The runtime paths on a real CUDA device: profiling, allocation, out of memory, aliasing,
the engine workflow and ``kvcore allocate``. Skipped without CUDA; CI runs the same code on the
CPU through tests/runtime."""

from __future__ import annotations

import json

import pytest
import torch

from kvcore import (
    KVCacheAllocationError,
    LocalExecutor,
    Registry,
    SizingContext,
    allocate,
    determine_available_memory,
    get_plugin_manager,
    initialize_kv_caches,
    plan_kv_cache,
)
from kvcore.cli import main
from kvcore.runtime.memory import CudaMemory
from tests.helpers import full, mix, mla, sliding
from tests.runtime._kinds import ToyAttention, ToyAttentionPlugin, ToyModel, ToyStateSpec, toy_state_registry
from tests.runtime._workload import run_workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MiB, GiB = 2**20, 2**30


def test_the_probe_reads_the_device(cuda):
    sample = CudaMemory(cuda).sample()
    assert sample.total_bytes >= sample.free_bytes > 0
    assert sample.torch_reserved_bytes >= sample.process_bytes >= 0


def test_profiling_counts_the_weights_and_the_forward_peak(cuda):
    weights = torch.empty(256 * MiB, dtype=torch.uint8, device=cuda)
    total = torch.cuda.mem_get_info(cuda)[1]
    util = min(1.0, (total - torch.cuda.mem_get_info(cuda)[0] + 4 * GiB) / total)

    def forward():
        activations = torch.ones(512 * MiB, dtype=torch.uint8, device=cuda)
        activations.add_(1)

    profile = determine_available_memory(cuda, utilization=util, profile_fn=forward)
    assert profile.torch_peak_bytes >= 768 * MiB
    assert profile.kv_cache_bytes == profile.cap_bytes - profile.non_torch_bytes - profile.torch_peak_bytes
    assert 0 < profile.kv_cache_bytes <= profile.free_after_bytes
    del weights


def test_views_live_on_the_device_with_the_layout_shapes(cuda, registry):
    specs = mix(
        (4, full(heads=2, head_size=64)), (6, sliding(64, heads=2, head_size=64)), (2, mla(rank=64, rope=16))
    )
    plan = plan_kv_cache(specs, 64 * MiB, SizingContext(max_model_len=1024), registry=registry)
    views = allocate(plan, cuda, registry=registry)
    for name, group, _ in plan.iter_layers():
        view = views[name]
        assert view.device == cuda
        pages = plan.num_pages(group)
        expected = (
            (pages, group.spec.block_size, 80)
            if group.spec.kind == "mla"
            else (2, pages, group.spec.block_size, 2, 64)
        )
        assert view.shape == expected and view.eq(0).all()


def test_out_of_memory_releases_everything(cuda, registry):
    total = torch.cuda.mem_get_info(cuda)[1]
    spec = full()
    blocks = (total // 3) // spec.page_size_bytes  # each of four layers takes a third of the device
    specs = {f"l{i}": spec for i in range(4)}
    plan = plan_kv_cache(
        specs, 8 * total, SizingContext(max_model_len=1024), registry=registry, num_blocks=blocks
    )
    before = torch.cuda.memory_allocated(cuda)
    with pytest.raises(KVCacheAllocationError) as info:
        allocate(plan, cuda, registry=registry)
    err = info.value
    assert err.requested_bytes == plan.kv_cache_bytes and err.free_bytes is not None
    assert "out of memory" in str(err).lower() or "OutOfMemoryError" in str(err)
    del info, err
    assert torch.cuda.memory_allocated(cuda) == before


def test_live_pages_never_share_bytes_on_the_device(cuda):
    registry = toy_state_registry()
    specs = mix(
        (3, full(block_size=4, heads=1, head_size=8, dtype="float16")),
        (3, sliding(12, block_size=4, heads=2, head_size=8, dtype="bfloat16")),
        (2, mla(block_size=8, rank=16, rope=8, dtype="float8_e4m3fn")),
        (1, ToyStateSpec(block_size=1, conv=4, ssm=60, dtype="float32")),
    )
    context = SizingContext(max_model_len=96, max_num_batched_tokens=24)
    probe = plan_kv_cache(specs, GiB, context, registry=registry, num_blocks=1, check_fit=False)
    plan = plan_kv_cache(
        specs, GiB, context, registry=registry, num_blocks=3 * probe.blocks_per_request() + 3
    )
    ops = [("arrive", 24, 0), ("arrive", 10, 0), ("step", 0, 24), ("step", 1, 24), ("arrive", 5, 0)]
    ops += [("step", i, 1 + i % 24) for i in range(60)] + [
        ("finish", 0, 0),
        ("arrive", 24, 0),
        ("step", 2, 24),
    ]
    assert run_workload(plan, registry, ops, device=str(cuda)) == []


def test_the_engine_workflow_on_the_device(cuda):
    registry = Registry.from_plugin_manager(
        get_plugin_manager(autoload=False, plugins=[ToyAttentionPlugin()])
    )
    model = ToyModel().to(cuda)
    free, total = torch.cuda.mem_get_info(cuda)
    util = min(1.0, (total - free + GiB) / total)  # leave about 1 GiB for the KV cache
    executor = LocalExecutor(
        model,
        cuda,
        registry=registry,
        utilization=util,
        profile_fn=lambda m: m(torch.randn(2048, 32, device=cuda)),
        warmup_fn=lambda m: m(torch.randn(8, 32, device=cuda)),
    )
    plan = initialize_kv_caches(executor, registry=registry, max_model_len=4096)
    assert executor.memory_profile.cap_basis == "total"
    assert 0 < plan.kv_cache_bytes <= GiB + 64 * MiB  # about the 1 GiB left under the cap
    for name, module in model.named_modules():
        if isinstance(module, ToyAttention):
            group = plan.group_of(name)
            assert module.kv_cache.device == cuda
            assert module.kv_cache.shape[1] == plan.num_pages(group)
    assert model.model.layers[1].self_attn.kv_cache[:, 0].abs().sum() > 0


def test_allocate_command_on_the_device(cuda, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    layer = {
        "kind": "full_attention",
        "block_size": 16,
        "num_kv_heads": 8,
        "head_size": 128,
        "dtype": "bfloat16",
    }
    path = tmp_path / "specs.json"
    path.write_text(json.dumps({"layers": {f"l{i}": layer for i in range(4)}}))
    argv = ["allocate", "--specs", path, "--device", cuda, "--memory", "256MiB", "--max-model-len", "4096"]
    assert main([str(a) for a in argv]) == 0
    assert f"on {cuda} in 4 tensor(s)" in capsys.readouterr().out
