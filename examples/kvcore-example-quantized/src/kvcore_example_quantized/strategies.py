"""A hypothesis strategy for ``example.quantized_kv`` specs (imported by tests only).

The plugin registers it through the ``kvcore_register_spec_strategies`` hook, importing this
module only when a test asks for it (``quantized.py``), so the plugin runs without hypothesis.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvcore.testing import strategies as kst
from kvcore_example_quantized.quantized import PAYLOAD_DTYPES, SCALE_DTYPES, QuantizedKVSpec


def quantized_specs(
    *, max_heads: int = 8, block_sizes: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[QuantizedKVSpec]:
    """A valid ``example.quantized_kv`` spec: a scale group that divides the head size."""

    def with_head_size(head_size: int) -> st.SearchStrategy[QuantizedKVSpec]:
        return st.builds(
            QuantizedKVSpec,
            block_size=block_sizes if block_sizes is not None else kst.block_sizes(),
            num_kv_heads=st.integers(1, max_heads),
            head_size=st.just(head_size),
            payload_dtype=st.sampled_from(PAYLOAD_DTYPES),
            scale_dtype=st.sampled_from(SCALE_DTYPES),
            scale_group_size=st.sampled_from([g for g in range(1, head_size + 1) if head_size % g == 0]),
        )

    return st.sampled_from([3, 24, 64, 96, 128]).flatmap(with_head_size)
