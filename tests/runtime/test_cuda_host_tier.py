"""The host tier on a CUDA device: its memory is pinned, pages go out and come back bit for bit
(one batch per group), and into other pages. Skipped without CUDA; tests/runtime/test_host_tier.py
runs the same on the CPU with plain memory."""

from __future__ import annotations

import pytest
import torch

from kvcore import SizingContext, allocate, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.offload import with_host_memory
from kvcore.planning.registry import Registry
from kvcore.runtime.host_tier import HostTier
from tests.helpers import full, mix, sliding

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("policy", ["shared_buffer", "kind_pools"])
def test_pages_go_to_pinned_host_memory_and_come_back(policy):
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    specs = mix(
        (2, full(block_size=16, heads=2, head_size=64)),
        (4, sliding(64, block_size=16, heads=2, head_size=64)),
    )
    context = SizingContext(max_model_len=1024, max_num_batched_tokens=64)
    plan = with_host_memory(
        plan_kv_cache(specs, 64 << 20, context, registry=registry, policy=policy), 32 << 20
    )
    views = allocate(plan, "cuda", registry=registry)
    tier = HostTier(plan, views, registry=registry)
    assert tier.pin_memory and all(b.is_pinned() for b in tier.buffers if b.numel())
    generator = torch.Generator(device="cuda").manual_seed(0)
    for group in plan.groups:
        for name in group.layer_names:
            view = views[name]
            view.copy_(torch.randn(view.shape, device="cuda", generator=generator).to(view.dtype))
    for index, group in enumerate(plan.groups):
        pages = list(range(1, plan.num_pages(group), 3))[:64]
        kept = {name: views[name][:, pages].clone() for name in group.layer_names}
        slots = tier.offload(index, pages)
        for name in group.layer_names:
            views[name].zero_()
        back = [p + 1 for p in pages]  # into other pages, as a pool hands out on a hit
        tier.restore(index, slots, back)
        torch.cuda.synchronize()
        for name in group.layer_names:
            assert torch.equal(views[name][:, back], kept[name]), f"{policy}: {name} came back changed"
        tier.release(index, slots)
