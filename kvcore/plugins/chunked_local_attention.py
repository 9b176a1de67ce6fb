"""Built-in kind ``chunked_local_attention`` (Llama 4's local layers): attention within a chunk."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.plugins.attention import AttentionSpec, attention_specs
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.spec import SizingContext, cdiv
from kvcore.validators import positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


@attrs.frozen(kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Attention over the current chunk: position ``p`` sees ``[floor(p / C) * C, p]``.

    Worst case per request: a step of ``T`` new tokens (the context's ``max_tokens_per_step``)
    that starts at the last position of chunk ``k`` needs that chunk from its start, so it
    holds the blocks from ``floor(kC / B)`` to ``ceil(min((k+1)C - 1 + T, L) / B)``: for a
    chunk the step does not cut short, ``ceil((kC mod B + C - 1 + T) / B)``, largest for the
    chunk that starts latest in its block (``kC mod B`` takes every multiple of
    ``gcd(C, B)`` below ``B``, one per chunk in turn); for the first chunk whose step reaches
    the request's end, ``ceil(L / B) - floor(kC / B)``. The largest over the chunks is the
    exact worst case (:meth:`~kvcore.KVCacheSpec.max_num_blocks`); vLLM's rule
    (:mod:`kvcore.integrations.vllm.rules`), ``ceil((C - 1 + T) / B) + [C % B != 0]``, may
    reserve one page more.

    Attributes:
        attention_chunk_size: the chunk, in tokens.
    """

    kind = "chunked_local_attention"

    attention_chunk_size: int = attrs.field(validator=positive_int)

    def max_num_blocks(self, context: SizingContext) -> int:
        length, per_step = context.max_model_len, context.max_tokens_per_step
        chunk, block = self.attention_chunk_size, self.block_size
        chunks = cdiv(length, chunk)
        # chunks whose step from their last position stays inside the request: k < whole
        whole = min(chunks, max(0, (length - per_step + 1) // chunk))
        best = 0
        if whole:
            step = math.gcd(chunk, block)
            # after B / gcd chunks every offset kC mod B came, the latest B - gcd among them
            cycled = whole >= block // step
            offset = block - step if cycled else max(k * chunk % block for k in range(whole))
            best = cdiv(offset + chunk - 1 + per_step, block)
        if whole < chunks:  # the first chunk whose step reaches the end holds the most of the rest
            best = max(best, cdiv(length, block) - whole * chunk // block)
        return best

    def first_retained_token(self, num_tokens: int) -> int:
        """``(num_tokens // C) * C``: the start of the chunk the next token falls in.

        The next token (position ``num_tokens``) reads its own chunk from its start; earlier
        chunks are never read again.
        """
        return num_tokens // self.attention_chunk_size * self.attention_chunk_size


def chunked_local_attention_specs(
    *, max_chunk: int = 8192, **options: Any
) -> SearchStrategy[ChunkedLocalAttentionSpec]:
    """A hypothesis strategy for ``chunked_local_attention`` specs of chunks up to ``max_chunk``
    tokens; ``options`` as for :func:`~kvcore.plugins.full_attention.full_attention_specs`."""
    from hypothesis import strategies as st

    chunks = st.integers(1, max_chunk)
    return attention_specs(ChunkedLocalAttentionSpec, attention_chunk_size=chunks, **options)


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    ChunkedLocalAttentionSpec, chunked_local_attention_specs
)
