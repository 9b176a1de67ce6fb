"""The shared base of the attention kinds (K and V per token per KV head) and their layout.

This plugin registers no kind of its own: it gives every :class:`AttentionSpec` subclass (the
built-in full, sliding-window and chunked kinds, and third-party ones that subclass it) the
default page layout ``(2, block_size, num_kv_heads, head_size)``, viewed over the blocks as
``(2, num_blocks, block_size, num_kv_heads, head_size)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeVar

import attrs

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import DType, dtype_size, to_dtype
from kvcore.hookspecs import hookimpl
from kvcore.spec import KVCacheSpec
from kvcore.validators import positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

_A = TypeVar("_A", bound="AttentionSpec")

#: Head sizes :func:`attention_specs` draws from (those up to its ``max_head_size``).
HEAD_SIZES: tuple[int, ...] = (8, 16, 32, 64, 96, 128, 256)


@attrs.frozen(kw_only=True)
class AttentionSpec(KVCacheSpec):
    """Base of the attention kinds: a K and a V vector per token and KV head.

    Page size: ``2 (K and V) x block_size x num_kv_heads x head_size x dtype bytes``.

    Attributes:
        num_kv_heads: KV heads this worker holds (after tensor-parallel sharding).
        head_size: elements per head.
        dtype: element type of the cache, a :class:`~kvcore.dtypes.DType`; names such as
            ``"bfloat16"`` or ``"fp8"`` and torch dtypes (``torch.bfloat16``) are converted.
    """

    #: heads, head size and dtype size a page, not which pages a request holds
    page_fields: ClassVar[tuple[str, ...]] = ("num_kv_heads", "head_size", "dtype")
    #: a page holds its block's tokens, written once: it may go to host and come back alone
    offload_unit: ClassVar[str] = "block"

    num_kv_heads: int = attrs.field(validator=positive_int)
    head_size: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)

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


def attention_specs(
    spec_cls: type[_A],
    *,
    block_sizes: SearchStrategy[int],
    dtypes: SearchStrategy[DType],
    max_heads: int = 8,
    max_head_size: int = 128,
    **fields: SearchStrategy[object],
) -> SearchStrategy[_A]:
    """A hypothesis strategy for an attention kind (tests only; imports hypothesis when called).

    Args:
        spec_cls: the attention kind to draw.
        block_sizes: see :class:`~kvcore.plugins.kind_hooks.SpecStrategy`, as for ``dtypes``.
        max_heads: most KV heads.
        max_head_size: largest head size, from :data:`HEAD_SIZES`.
        fields: strategies for the kind's own fields (``sliding_window=...``).

    Returns:
        A strategy drawing valid instances of ``spec_cls``.
    """
    from hypothesis import strategies as st

    return st.builds(
        spec_cls,
        block_size=block_sizes,
        num_kv_heads=st.integers(1, max_heads),
        head_size=st.sampled_from([d for d in HEAD_SIZES if d <= max_head_size] or [1]),
        dtype=dtypes,
        **fields,
    )
