"""The built-in policies pass the same conformance suite a third-party policy does."""

import pytest
from hypothesis import settings, strategies as st

from kvcore import Registry
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.testing import strategies as kst
from kvcore.testing.conformance import PolicyConformance

BUILTIN_POLICIES = tuple(Registry.default(autoload=False).policies)


@st.composite
def _one_page_size_mixes(draw):
    """Hybrid attention mixes (full, sliding, chunked) that share one page geometry."""
    geometry = {
        "block_size": draw(kst.block_sizes()),
        "num_kv_heads": draw(st.integers(1, 4)),
        "head_size": draw(st.sampled_from([8, 16, 64])),
        "dtype": draw(kst.dtypes()),
    }
    kinds = [
        FullAttentionSpec(**geometry),
        SlidingWindowSpec(**geometry, sliding_window=draw(st.integers(1, 512))),
        ChunkedLocalAttentionSpec(**geometry, attention_chunk_size=draw(st.integers(1, 512))),
    ]
    return draw(kst.layer_specs(max_layers=12, max_distinct=3, spec_strategy=st.sampled_from(kinds)))


class TestBuiltinPolicies(PolicyConformance):
    # tests/planning/test_plan_properties.py runs the plan invariants at the full profile; 25 per check here
    hypothesis_settings = settings(max_examples=25)

    @pytest.fixture(params=BUILTIN_POLICIES)
    def policy_name(self, request):
        return request.param

    @pytest.fixture
    def layer_maps(self, policy_name, kvcore_registry):
        # uniform plans one spec for every layer, equal_groups one page size; what they refuse
        # is tested in tests/policies
        if policy_name == "equal_groups":
            return _one_page_size_mixes()
        distinct = 1 if policy_name == "uniform" else 4
        return kst.layer_specs(
            max_layers=12, max_distinct=distinct, spec_strategy=kst.specs(registry=kvcore_registry)
        )


def test_every_builtin_policy_is_covered():
    assert set(BUILTIN_POLICIES) == {"uniform", "shared_buffer", "equal_groups", "kind_pools", "unified_pool"}
