"""Built-in kind ``sliding_window``: a layer that attends to the last ``sliding_window`` tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from kvcore.plugins.attention import AttentionSpec, attention_specs
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.spec import SizingContext, cdiv
from kvcore.validators import positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


@attrs.frozen(kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Attention over a window of ``sliding_window`` tokens (the token itself included).

    Worst case per request: while one engine step computes ``T`` new tokens (the context's
    ``max_tokens_per_step``), the earliest of them still needs the ``sliding_window - 1``
    tokens before it, so ``X = W - 1 + T`` consecutive positions are live, and they touch one
    more block when they start late in a block: once the window has slid ``s < B`` tokens
    past the request's start, it spans ``ceil((X + s) / B)`` blocks, most at ``s = B - 1``
    (or as far as the request goes). So ``ceil(min(X + min(B - 1, L - W), L) / B)`` pages
    (``ceil(L / B)`` when ``L <= W``), the exact worst case of
    :meth:`~kvcore.KVCacheSpec.max_num_blocks`: the most a block pool holds over the steps
    from ``c`` to ``n <= min(c + T, L)`` tokens. vLLM reserves ``ceil(X / B) + 1``, up to one
    page more (its rule is in :mod:`kvcore.integrations.vllm.rules`).

    Attributes:
        sliding_window: the window, in tokens.
    """

    kind = "sliding_window"

    sliding_window: int = attrs.field(validator=positive_int)

    def max_num_blocks(self, context: SizingContext) -> int:
        return window_max_blocks(self.sliding_window, self.block_size, context)

    def first_retained_token(self, num_tokens: int) -> int:
        """``max(0, num_tokens - sliding_window + 1)``: the window of the next token.

        The next token (position ``num_tokens``) reads ``[num_tokens - W + 1, num_tokens]``;
        later tokens read later windows, so nothing before that window is read again.
        """
        return max(0, num_tokens - self.sliding_window + 1)


def window_max_blocks(window: int, block_size: int, context: SizingContext) -> int:
    """The most blocks of ``block_size`` tokens a window of ``window`` tokens holds over a
    request of ``context``: :meth:`SlidingWindowSpec.max_num_blocks`, for every kind that keeps
    a sliding window of tokens in order (``sliding_window_mla`` too)."""
    length = context.max_model_len
    # how far past the start the window may slide before its blocks repeat: B - 1 at most
    slide = max(0, min(block_size - 1, length - window))
    return cdiv(min(window - 1 + context.max_tokens_per_step + slide, length), block_size)


def sliding_window_specs(*, max_window: int = 4096, **options: Any) -> SearchStrategy[SlidingWindowSpec]:
    """A hypothesis strategy for ``sliding_window`` specs of windows up to ``max_window``;
    ``options`` as for :func:`~kvcore.plugins.full_attention.full_attention_specs`."""
    from hypothesis import strategies as st

    return attention_specs(SlidingWindowSpec, sliding_window=st.integers(1, max_window), **options)


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    SlidingWindowSpec, sliding_window_specs
)
