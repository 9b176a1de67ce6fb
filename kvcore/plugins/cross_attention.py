"""Built-in kind ``cross_attention``: a decoder layer's keys and values of the encoder's output.

An encoder-decoder model (Whisper) or a vision-language model with cross-attention layers
(Llama-3.2-Vision) caches, in each cross-attention layer, the K and V of the encoder's tokens:
audio frames or image tokens. They are computed once, when the request is prefilled, and read
by every decoded token, so a request holds ``ceil(E / block_size)`` pages from its first token
to its last, whatever its own length (vLLM sizes ``CrossAttentionSpec`` the same way, from the
scheduler's ``max_num_encoder_input_tokens``). ``E`` is the longest encoder output the engine
admits: the model family reads it from the config, and a sizing context's
``max_encoder_tokens`` replaces it (:meth:`CrossAttentionSpec.sized_for`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.limits import MAX_TOKENS, check_at_most
from kvcore.plugins.attention import AttentionSpec, attention_specs
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.spec import SizingContext, cdiv
from kvcore.validators import positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


def _at_most_tokens(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    check_at_most(
        value,
        MAX_TOKENS,
        f"cross_attention: {attribute.name!r}",
        "no encoder output is that long",
        error=InvalidSpecError,
    )


@attrs.frozen(kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """K and V of a fixed encoder output: ``ceil(max_encoder_tokens / block_size)`` pages per
    request, all taken at the request's first token and kept to its end.

    Page ``k`` holds encoder tokens ``[k*B, (k+1)*B)``. The worst case does not depend on
    ``max_model_len``: it is :meth:`live_pages` of any length (``len(live_pages(L))``).

    Attributes:
        max_encoder_tokens: the longest encoder output a request brings (1500 audio frames for
            Whisper, 6404 image tokens for Llama-3.2-11B-Vision).
    """

    kind = "cross_attention"
    #: the pages hold the request's encoder output, not its tokens: they go and come back together
    offload_unit = "request"

    max_encoder_tokens: int = attrs.field(validator=[positive_int, _at_most_tokens])

    @property
    def encoder_pages(self) -> int:
        """Pages the encoder output fills: ``ceil(max_encoder_tokens / block_size)``."""
        return cdiv(self.max_encoder_tokens, self.block_size)

    def live_pages(self, num_tokens: int, num_computed_tokens: int = 0) -> range:
        """Every page of the encoder output from the request's first token on; none is freed."""
        return range(self.encoder_pages if num_tokens > 0 else 0)

    def sized_for(self, context: SizingContext) -> CrossAttentionSpec:
        """The context's ``max_encoder_tokens``, where set, instead of the spec's own."""
        wanted = context.max_encoder_tokens
        if not wanted or wanted == self.max_encoder_tokens:
            return self
        return attrs.evolve(self, max_encoder_tokens=wanted)

    def max_num_blocks(self, context: SizingContext) -> int:
        """``ceil(E / block_size)`` with ``E`` the context's ``max_encoder_tokens`` when set, else
        the spec's: independent of ``max_model_len``."""
        return self.sized_for(context).encoder_pages


def cross_attention_specs(
    *, max_encoder_tokens: int = 8192, **options: Any
) -> SearchStrategy[CrossAttentionSpec]:
    """A hypothesis strategy for ``cross_attention`` specs of encoder outputs up to
    ``max_encoder_tokens``; ``options`` as for
    :func:`~kvcore.plugins.full_attention.full_attention_specs`."""
    from hypothesis import strategies as st

    encoder = st.integers(1, max_encoder_tokens)
    return attention_specs(CrossAttentionSpec, max_encoder_tokens=encoder, **options)


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    CrossAttentionSpec, cross_attention_specs
)
