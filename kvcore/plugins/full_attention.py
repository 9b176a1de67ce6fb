"""Built-in kind ``full_attention``: every token of a request stays in the cache."""

from __future__ import annotations

import attrs

from kvcore.plugins.attention import AttentionSpec, attention_kind_specs
from kvcore.plugins.kind_hooks import kind_hooks


@attrs.frozen(kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Causal attention over the whole request: ``ceil(L / block_size)`` blocks per request.

    Every token stays: the defaults of :meth:`~kvcore.KVCacheSpec.live_pages` (entry ``k``
    holds tokens ``[k*B, (k+1)*B)``, none is freed) and of
    :meth:`~kvcore.KVCacheSpec.max_num_blocks` (``len(live_pages(L))``) are this kind's.
    """

    kind = "full_attention"


#: A hypothesis strategy for ``full_attention`` specs
#: (:func:`~kvcore.plugins.attention.attention_kind_specs`).
full_attention_specs = attention_kind_specs(FullAttentionSpec)


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    FullAttentionSpec, full_attention_specs
)
