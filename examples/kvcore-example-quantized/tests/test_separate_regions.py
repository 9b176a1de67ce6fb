"""The baseline policy: kvcore's conformance suite and hand-computed plans."""

import pytest

from kvcore import SizingContext, efficiency, plan_kv_cache
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.testing.conformance import PolicyConformance
from kvcore_example_quantized import quantized, separate_regions


class TestSeparateRegionsPolicy(PolicyConformance):
    @pytest.fixture
    def policy_name(self):
        return "example.separate_regions"

    @pytest.fixture
    def kvcore_plugins(self):
        return (quantized, separate_regions)


def _hybrid():
    attention = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    full = FullAttentionSpec(**attention)
    sliding = SlidingWindowSpec(sliding_window=128, **attention)
    return {"layers.0": full, "layers.1": sliding, "layers.2": full, "layers.3": sliding}


def test_groups_never_share_bytes(make_kvcore_registry):
    registry = make_kvcore_registry(separate_regions)
    context = SizingContext(max_model_len=4096)
    plan = plan_kv_cache(_hybrid(), 2**30, context, registry=registry, policy="example.separate_regions")

    assert [g.layer_names for g in plan.groups] == [("layers.0", "layers.2"), ("layers.1", "layers.3")]
    assert plan.bytes_per_block == 4 * 65536  # every block id pays for a page of every layer
    assert plan.num_blocks == 2**30 // (4 * 65536) == 4096
    row = 4 * 65536  # one row per block id: a page of every layer, group after group
    assert [(t.shared_by, t.offset, t.page_stride) for t in plan.tensors] == [
        (("layers.0",), 0, row),
        (("layers.2",), 65536, row),
        (("layers.1",), 2 * 65536, row),
        (("layers.3",), 3 * 65536, row),
    ]
    # one request: 256 full blocks + min(ceil((128 - 1 + 2048) / 16) + 1, 256) = 137 sliding blocks
    assert plan.blocks_per_request() == 256 + 137
    # the ideal bound charges each layer only its own need; here half the buffer idles
    assert efficiency(plan, _hybrid()) == pytest.approx(0.5)


def test_shared_buffer_beats_the_baseline(make_kvcore_registry):
    registry = make_kvcore_registry(separate_regions)
    context = SizingContext(max_model_len=4096)
    base = plan_kv_cache(_hybrid(), 2**30, context, registry=registry, policy="example.separate_regions")
    shared = plan_kv_cache(_hybrid(), 2**30, context, registry=registry, policy="shared_buffer")
    assert shared.max_concurrency() > 1.9 * base.max_concurrency()


def test_one_spec_plans_like_uniform(make_kvcore_registry):
    registry = make_kvcore_registry(separate_regions)
    specs = {name: spec for name, spec in _hybrid().items() if spec.kind == "full_attention"}
    context = SizingContext(max_model_len=4096)
    base = plan_kv_cache(specs, 2**30, context, registry=registry, policy="example.separate_regions")
    uniform = plan_kv_cache(specs, 2**30, context, registry=registry, policy="uniform")
    assert (base.num_blocks, base.bytes_per_block) == (uniform.num_blocks, uniform.bytes_per_block)
    assert base.single_buffer and not uniform.single_buffer
