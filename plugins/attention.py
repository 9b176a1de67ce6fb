"""The shared base of the attention kinds (K and V per token per KV head) and their layout.

This plugin registers no kind of its own: it gives every :class:`AttentionSpec` subclass (the
built-in full, sliding-window and chunked kinds, and third-party ones that subclass it) the
default page layout ``(2, block_size, num_kv_heads, head_size)``, viewed over the blocks as
``(2, num_blocks, block_size, num_kv_heads, head_size)``.
"""

from __future__ import annotations

import attrs
import torch

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import dtype_size, to_dtype
from kvcore.errors import InvalidSpecError
from kvcore.hookspecs import hookimpl
from kvcore.spec import KVCacheSpec, positive_int


def _is_dtype(instance: object, attribute: attrs.Attribute[torch.dtype], value: object) -> None:
    if not isinstance(value, torch.dtype):  # pragma: no cover - the converter guarantees it
        raise InvalidSpecError(f"{attribute.name!r} must be a torch.dtype (got {value!r})")


@attrs.frozen(kw_only=True)
class AttentionSpec(KVCacheSpec):
    """Base of the attention kinds: a K and a V vector per token and KV head.

    Page size: ``2 (K and V) x block_size x num_kv_heads x head_size x dtype bytes``.

    Attributes:
        num_kv_heads: KV heads this worker holds (after tensor-parallel sharding).
        head_size: elements per head.
        dtype: element type of the cache (``torch.bfloat16``, ``torch.float8_e4m3fn``, ...);
            strings such as ``"bfloat16"`` or ``"fp8"`` are converted.
    """

    num_kv_heads: int = attrs.field(validator=positive_int)
    head_size: int = attrs.field(validator=positive_int)
    dtype: torch.dtype = attrs.field(converter=to_dtype, validator=_is_dtype)

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * dtype_size(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token takes in this layer (K and V, all KV heads)."""
        return 2 * self.num_kv_heads * self.head_size * dtype_size(self.dtype)

    @property
    def alignment_bytes(self) -> int:
        return dtype_size(self.dtype)


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """``(2, num_blocks, block_size, num_kv_heads, head_size)``: K at index 0, V at index 1."""
    if not isinstance(spec, AttentionSpec):
        return None
    return CacheLayout.single(
        "kv", (2, spec.block_size, spec.num_kv_heads, spec.head_size), spec.dtype, block_dim=1
    )
