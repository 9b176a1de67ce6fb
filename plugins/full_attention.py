"""Built-in kind ``full_attention``: every token of a request stays in the cache."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from kvcore.hookspecs import hookimpl
from kvcore.plugins.attention import AttentionSpec
from kvcore.spec import KVCacheSpec, SizingContext, cdiv


@attrs.frozen(kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Causal attention over the whole request: ``ceil(L / block_size)`` blocks per request."""

    kind = "full_attention"

    def max_num_blocks(self, context: SizingContext) -> int:
        return cdiv(context.max_model_len, self.block_size)


@hookimpl
def kvcore_register_spec_kinds(register: Callable[[type[KVCacheSpec]], None]) -> None:
    register(FullAttentionSpec)
