"""Built-in kind ``chunked_local_attention`` (Llama 4's local layers): attention within a chunk."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from kvcore.hookspecs import hookimpl
from kvcore.plugins.attention import AttentionSpec, attention_specs
from kvcore.spec import KVCacheSpec, SizingContext, cdiv
from kvcore.validators import positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from kvcore.dtypes import DType


@attrs.frozen(kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Attention over the current chunk: position ``p`` sees ``[floor(p / C) * C, p]``.

    Worst case per request: a step of ``T`` new tokens may start late in a chunk, so it needs
    up to ``C - 1`` earlier tokens of that chunk plus the ``T`` new ones. When ``C`` is not a
    multiple of the block size a chunk starts mid-block, which costs one more block. Never more
    than a full-attention layer: ``min(ceil(min(C - 1 + T, L) / B) + [C % B != 0], ceil(L / B))``,
    never below the largest ``len(live_pages(n, c))`` over the steps from ``c`` to
    ``n <= min(c + T, L)`` tokens, which the block pool holds, and at most one page above it.

    Attributes:
        attention_chunk_size: the chunk, in tokens.
    """

    kind = "chunked_local_attention"

    attention_chunk_size: int = attrs.field(validator=positive_int)

    def max_num_blocks(self, context: SizingContext) -> int:
        length = context.max_model_len
        live = min(self.attention_chunk_size - 1 + context.max_tokens_per_step, length)
        misaligned = 1 if self.attention_chunk_size % self.block_size else 0
        return min(cdiv(live, self.block_size) + misaligned, cdiv(length, self.block_size))

    def first_retained_token(self, num_tokens: int) -> int:
        """``(num_tokens // C) * C``: the start of the chunk the next token falls in.

        The next token (position ``num_tokens``) reads its own chunk from its start; earlier
        chunks are never read again.
        """
        return num_tokens // self.attention_chunk_size * self.attention_chunk_size


@hookimpl
def kvcore_register_spec_kinds(register: Callable[[type[KVCacheSpec]], None]) -> None:
    register(ChunkedLocalAttentionSpec)


def chunked_local_attention_specs(
    *,
    block_sizes: SearchStrategy[int],
    dtypes: SearchStrategy[DType],
    max_heads: int = 8,
    max_head_size: int = 128,
    max_chunk: int = 8192,
) -> SearchStrategy[ChunkedLocalAttentionSpec]:
    """A hypothesis strategy for ``chunked_local_attention`` specs of chunks up to ``max_chunk``
    (see :func:`~kvcore.plugins.attention.attention_specs`)."""
    from hypothesis import strategies as st

    return attention_specs(
        ChunkedLocalAttentionSpec,
        block_sizes=block_sizes,
        dtypes=dtypes,
        max_heads=max_heads,
        max_head_size=max_head_size,
        attention_chunk_size=st.integers(1, max_chunk),
    )


@hookimpl
def kvcore_register_spec_strategies(
    register: Callable[[type[KVCacheSpec], SearchStrategy[KVCacheSpec]], None],
    block_sizes: SearchStrategy[int],
    dtypes: SearchStrategy[DType],
) -> None:
    register(ChunkedLocalAttentionSpec, chunked_local_attention_specs(block_sizes=block_sizes, dtypes=dtypes))
