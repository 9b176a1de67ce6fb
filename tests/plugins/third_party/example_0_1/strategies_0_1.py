# Frozen: the 0.1 strategy of the same plugin (git show
# bf23a0f^:examples/kvcore-example-quantized/src/kvcore_example_quantized/strategies.py), its
# own import renamed to this folder's module; otherwise byte for byte. Do not update it.
"""A hypothesis strategy for ``example.quantized_kv`` specs (imported by tests only).

Register it for a test session from ``conftest.py``::

    from kvcore.testing.strategies import register_spec_strategy
    from kvcore_example_quantized import QuantizedKVSpec
    from kvcore_example_quantized.strategies import quantized_specs

    register_spec_strategy(QuantizedKVSpec, quantized_specs())
"""

from __future__ import annotations

from hypothesis import strategies as st
from kvcore.testing import strategies as kst

from tests.plugins.third_party.example_0_1.quantized_kv_0_1 import PAYLOAD_DTYPES, SCALE_DTYPES, QuantizedKVSpec


def quantized_specs(*, max_heads: int = 8) -> st.SearchStrategy[QuantizedKVSpec]:
    """A valid ``example.quantized_kv`` spec: a scale group that divides the head size."""

    def with_head_size(head_size: int) -> st.SearchStrategy[QuantizedKVSpec]:
        return st.builds(
            QuantizedKVSpec,
            block_size=kst.block_sizes(),
            num_kv_heads=st.integers(1, max_heads),
            head_size=st.just(head_size),
            payload_dtype=st.sampled_from(PAYLOAD_DTYPES),
            scale_dtype=st.sampled_from(SCALE_DTYPES),
            scale_group_size=st.sampled_from([g for g in range(1, head_size + 1) if head_size % g == 0]),
        )

    return st.sampled_from([3, 24, 64, 96, 128]).flatmap(with_head_size)
