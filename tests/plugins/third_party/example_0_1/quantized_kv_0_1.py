# Frozen: kvcore-example-quantized's spec kind as written against kvcore 0.1 (git show
# bf23a0f^:examples/kvcore-example-quantized/src/kvcore_example_quantized/quantized.py), kept
# byte for byte but for this comment, so that tests/plugins/test_removed_in_0_3.py proves a 0.1
# plugin fails where it compares torch dtypes, naming kvcore.dtypes. Do not update it.
"""Spec kind ``example.quantized_kv``: a quantized KV cache with per-block scales.

K and V are stored as one-byte numbers (int8 or fp8), and each group of ``scale_group_size``
elements of a head gets one scale to dequantize it (``scale_group_size == head_size``: one scale
per token per head). Scales live in the same page as the numbers they scale, so a block id
brings its scales along and the page size counts them:

    payload  2 x block_size x num_kv_heads x head_size              x payload bytes
    scales   2 x block_size x num_kv_heads x (head_size / group)    x scale bytes

The payload comes first; the scales start at the next multiple of the scale size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
from kvcore import CacheLayout, InvalidSpecError, KVCacheSpec, PagePart, SizingContext, hookimpl
from kvcore.dtypes import dtype_name, dtype_size, to_dtype
from kvcore.spec import cdiv, positive_int

#: Element types of the quantized numbers: one byte each.
PAYLOAD_DTYPES: tuple[torch.dtype, ...] = (torch.int8, torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2)
#: Element types of the scales.
SCALE_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)


def _one_of(allowed: tuple[torch.dtype, ...]) -> Callable[[Any, attrs.Attribute[Any], torch.dtype], None]:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: torch.dtype) -> None:
        if value not in allowed:
            names = ", ".join(dtype_name(d) for d in allowed)
            raise InvalidSpecError(
                f"example.quantized_kv: {attribute.name!r} must be one of {names} (got {dtype_name(value)})"
            )

    return check


def _divides_head_size(instance: QuantizedKVSpec, attribute: attrs.Attribute[int], value: int) -> None:
    if instance.head_size % value:
        divisors = [d for d in (16, 32, 64, 128) if instance.head_size % d == 0] or [instance.head_size]
        raise InvalidSpecError(
            f"example.quantized_kv: 'scale_group_size' must divide 'head_size' {instance.head_size} "
            f"(got {value}); use e.g. {divisors[-1]}"
        )


@attrs.frozen(kw_only=True)
class QuantizedKVSpec(KVCacheSpec):
    """Full attention over one-byte K and V with a scale per group of elements.

    Attributes:
        num_kv_heads: KV heads this worker holds.
        head_size: elements per head.
        payload_dtype: element type of K and V (one byte: int8, uint8, fp8).
        scale_dtype: element type of the scales.
        scale_group_size: elements of a head that share one scale; defaults to ``head_size``
            (one scale per token per head) and must divide it.
    """

    kind = "example.quantized_kv"

    num_kv_heads: int = attrs.field(validator=positive_int)
    head_size: int = attrs.field(validator=positive_int)
    payload_dtype: torch.dtype = attrs.field(converter=to_dtype, validator=_one_of(PAYLOAD_DTYPES))
    scale_dtype: torch.dtype = attrs.field(converter=to_dtype, validator=_one_of(SCALE_DTYPES))
    scale_group_size: int = attrs.field(
        default=attrs.Factory(lambda self: self.head_size, takes_self=True),
        validator=[positive_int, _divides_head_size],
    )

    @property
    def scales_per_head(self) -> int:
        """Scales one token of one head carries."""
        return self.head_size // self.scale_group_size

    @property
    def payload_bytes(self) -> int:
        """Bytes of the quantized K and V in one page."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * dtype_size(self.payload_dtype)

    @property
    def scale_offset_bytes(self) -> int:
        """Where the scales start in a page: after the payload, aligned to the scale size."""
        return cdiv(self.payload_bytes, dtype_size(self.scale_dtype)) * dtype_size(self.scale_dtype)

    @property
    def scale_bytes(self) -> int:
        """Bytes of the scales in one page."""
        return 2 * self.block_size * self.num_kv_heads * self.scales_per_head * dtype_size(self.scale_dtype)

    @property
    def page_size_bytes(self) -> int:
        return self.scale_offset_bytes + self.scale_bytes

    @property
    def alignment_bytes(self) -> int:
        return max(dtype_size(self.payload_dtype), dtype_size(self.scale_dtype))

    def max_num_blocks(self, context: SizingContext) -> int:
        return cdiv(context.max_model_len, self.block_size)


@hookimpl
def kvcore_register_spec_kinds(register: Callable[[type[KVCacheSpec]], None]) -> None:
    register(QuantizedKVSpec)


@hookimpl
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """Two parts per page: ``payload`` (2, B, H, D) then ``scale`` (2, B, H, D / group)."""
    if not isinstance(spec, QuantizedKVSpec):
        return None
    block, heads = spec.block_size, spec.num_kv_heads
    return CacheLayout(
        parts=(
            PagePart(
                name="payload",
                shape=(2, block, heads, spec.head_size),
                dtype=spec.payload_dtype,
                block_dim=1,
            ),
            PagePart(
                name="scale",
                shape=(2, block, heads, spec.scales_per_head),
                dtype=spec.scale_dtype,
                offset_bytes=spec.scale_offset_bytes,
                block_dim=1,
            ),
        )
    )
