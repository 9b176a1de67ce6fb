"""Built-in kind ``full_attention``: every token of a request stays in the cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from kvcore.plugins.attention import AttentionSpec, attention_specs
from kvcore.plugins.kind_hooks import kind_hooks

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


@attrs.frozen(kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Causal attention over the whole request: ``ceil(L / block_size)`` blocks per request.

    Every token stays: the defaults of :meth:`~kvcore.KVCacheSpec.live_pages` (entry ``k``
    holds tokens ``[k*B, (k+1)*B)``, none is freed) and of
    :meth:`~kvcore.KVCacheSpec.max_num_blocks` (``len(live_pages(L))``) are this kind's.
    """

    kind = "full_attention"


def full_attention_specs(**options: Any) -> SearchStrategy[FullAttentionSpec]:
    """A hypothesis strategy for ``full_attention`` specs; ``options`` as
    :func:`~kvcore.plugins.attention.attention_specs` takes them (``block_sizes``, ``dtypes``,
    ``max_heads``, ``max_head_size``)."""
    return attention_specs(FullAttentionSpec, **options)


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    FullAttentionSpec, full_attention_specs
)
