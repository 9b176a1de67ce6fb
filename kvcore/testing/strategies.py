"""Hypothesis strategies for kvcore objects (public API, like ``hypothesis.extra``).

Every strategy is a function returning a ``SearchStrategy`` and takes keyword arguments to
narrow what it draws. Sizes stay small by default so that plans built from the draws allocate
in a test in milliseconds.

Example::

    from hypothesis import given
    from kvcore.testing import strategies as kst

    @given(specs=kst.layer_specs(), context=kst.sizing_contexts())
    def test_my_policy(specs, context): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from hypothesis import strategies as st

from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.spec import KVCacheSpec, SizingContext

#: Dtypes drawn for caches: the common ones, fp8 included.
CACHE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)

#: Block sizes drawn by default.
BLOCK_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


def dtypes() -> st.SearchStrategy[torch.dtype]:
    """A cache dtype from :data:`CACHE_DTYPES`."""
    return st.sampled_from(CACHE_DTYPES)


def block_sizes() -> st.SearchStrategy[int]:
    """A block size from :data:`BLOCK_SIZES`."""
    return st.sampled_from(BLOCK_SIZES)


def _attention_fields(max_heads: int, max_head_size: int) -> dict[str, st.SearchStrategy[object]]:
    return {
        "block_size": block_sizes(),
        "num_kv_heads": st.integers(1, max_heads),
        "head_size": st.sampled_from([d for d in (8, 16, 32, 64, 96, 128, 256) if d <= max_head_size] or [1]),
        "dtype": dtypes(),
    }


def full_attention_specs(
    *, max_heads: int = 8, max_head_size: int = 128
) -> st.SearchStrategy[FullAttentionSpec]:
    """A ``full_attention`` spec."""
    return st.builds(FullAttentionSpec, **_attention_fields(max_heads, max_head_size))


def sliding_window_specs(
    *, max_heads: int = 8, max_head_size: int = 128, max_window: int = 4096
) -> st.SearchStrategy[SlidingWindowSpec]:
    """A ``sliding_window`` spec."""
    return st.builds(
        SlidingWindowSpec,
        sliding_window=st.integers(1, max_window),
        **_attention_fields(max_heads, max_head_size),
    )


def chunked_local_attention_specs(
    *, max_heads: int = 8, max_head_size: int = 128, max_chunk: int = 8192
) -> st.SearchStrategy[ChunkedLocalAttentionSpec]:
    """A ``chunked_local_attention`` spec."""
    return st.builds(
        ChunkedLocalAttentionSpec,
        attention_chunk_size=st.integers(1, max_chunk),
        **_attention_fields(max_heads, max_head_size),
    )


def mla_specs() -> st.SearchStrategy[MLAAttentionSpec]:
    """An ``mla`` spec (latent sizes around DeepSeek's, scaled down)."""
    return st.builds(
        MLAAttentionSpec,
        block_size=block_sizes(),
        kv_lora_rank=st.sampled_from([16, 32, 64, 128, 512]),
        qk_rope_head_dim=st.sampled_from([8, 16, 32, 64]),
        dtype=dtypes(),
    )


#: Strategy factories for the built-in kinds, by kind name.
BUILTIN_SPEC_STRATEGIES: dict[str, Callable[[], st.SearchStrategy[KVCacheSpec]]] = {
    "full_attention": full_attention_specs,
    "sliding_window": sliding_window_specs,
    "chunked_local_attention": chunked_local_attention_specs,
    "mla": mla_specs,
}


def specs(kinds: Sequence[str] | None = None) -> st.SearchStrategy[KVCacheSpec]:
    """A spec of one of ``kinds`` (default: every built-in kind)."""
    names = list(kinds) if kinds is not None else list(BUILTIN_SPEC_STRATEGIES)
    return st.one_of([BUILTIN_SPEC_STRATEGIES[name]() for name in names])


@st.composite
def layer_specs(
    draw: st.DrawFn,
    *,
    min_layers: int = 1,
    max_layers: int = 24,
    max_distinct: int = 4,
    spec_strategy: st.SearchStrategy[KVCacheSpec] | None = None,
    prefix: str = "model.layers.",
) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` like a real model: a few distinct specs repeated over the layers.

    Args:
        min_layers: fewest layers.
        max_layers: most layers.
        max_distinct: most distinct specs (a hybrid model has 2-4).
        spec_strategy: where the distinct specs come from (default: :func:`specs`).
        prefix: layer names are ``f"{prefix}{i}"``.
    """
    source = spec_strategy if spec_strategy is not None else specs()
    distinct = draw(st.lists(source, min_size=1, max_size=max_distinct))
    n = draw(st.integers(min_layers, max_layers))
    choice = draw(st.lists(st.integers(0, len(distinct) - 1), min_size=n, max_size=n))
    return {f"{prefix}{i}": distinct[c] for i, c in enumerate(choice)}


def sizing_contexts(
    *,
    max_model_len: st.SearchStrategy[int] | None = None,
    max_num_batched_tokens: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[SizingContext]:
    """A :class:`SizingContext` (lengths up to 8192 by default)."""
    return st.builds(
        SizingContext,
        max_model_len=max_model_len if max_model_len is not None else st.integers(1, 8192),
        max_num_batched_tokens=max_num_batched_tokens
        if max_num_batched_tokens is not None
        else st.integers(1, 4096),
    )


def budgets(*, max_bytes: int = 64 * 2**20) -> st.SearchStrategy[int]:
    """A byte budget up to ``max_bytes`` (64 MiB by default)."""
    return st.integers(0, max_bytes)
