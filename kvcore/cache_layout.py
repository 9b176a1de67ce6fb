"""How one page of a layer is seen as tensors: the answer of the ``kvcore_cache_layout`` hook.

A page is the bytes one block of one layer takes. Its layout lists the tensors (*parts*) the
page holds, each with its shape for one block, its dtype and its byte offset inside the page.
A layer's view over ``num_blocks`` pages inserts the block dimension at ``block_dim``; e.g. an
attention page with one part of shape ``(2, block_size, num_kv_heads, head_size)`` and
``block_dim=1`` gives the view ``(2, num_blocks, block_size, num_kv_heads, head_size)``.

Every part must lie inside the page: block ``b`` of a layer touches only page ``b``'s bytes,
which is what lets layers of different groups share memory safely.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from kvcore.dtypes import DType, DTypeLike, dtype_size, to_dtype
from kvcore.errors import InvalidSpecError
from kvcore.validators import is_int


def _shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise InvalidSpecError(f"'shape' must be a tuple of ints (got {value!r})")
    return tuple(value)


@attrs.frozen(kw_only=True)
class PagePart:
    """One tensor inside a page.

    Attributes:
        name: a label (``"kv"``, ``"latent"``, ``"conv"``, ``"ssm"``, ...).
        shape: the part's shape for one block, without the block dimension.
        dtype: element type of the view (a name such as ``"bfloat16"`` or a ``torch.dtype``
            is converted).
        offset_bytes: where the part starts inside the page; a multiple of the dtype size.
        block_dim: where the ``num_blocks`` dimension goes in the view (0 ... ``len(shape)``).
    """

    name: str
    shape: tuple[int, ...] = attrs.field(converter=_shape)
    dtype: DType = attrs.field(converter=to_dtype)
    offset_bytes: int = 0
    block_dim: int = 0

    def __attrs_post_init__(self) -> None:
        if any(not is_int(d) or d < 1 for d in self.shape):
            raise InvalidSpecError(
                f"part {self.name!r}: every dimension must be an int >= 1 (got {self.shape})"
            )
        if not 0 <= self.block_dim <= len(self.shape):
            raise InvalidSpecError(
                f"part {self.name!r}: 'block_dim' must be in 0..{len(self.shape)} (got {self.block_dim})"
            )
        if self.offset_bytes < 0 or self.offset_bytes % dtype_size(self.dtype):
            raise InvalidSpecError(
                f"part {self.name!r}: 'offset_bytes' must be a non-negative multiple of "
                f"{dtype_size(self.dtype)} (got {self.offset_bytes})"
            )

    @property
    def nbytes(self) -> int:
        """Bytes this part takes in one page."""
        return math.prod(self.shape) * dtype_size(self.dtype)


def _parts(value: Iterable[PagePart]) -> tuple[PagePart, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class CacheLayout:
    """The parts of one page, in page order."""

    parts: tuple[PagePart, ...] = attrs.field(converter=_parts)

    def check_fits(self, page_size_bytes: int, what: str) -> None:
        """Raise :class:`InvalidSpecError` unless every part lies inside a page of that size."""
        for part in self.parts:
            end = part.offset_bytes + part.nbytes
            if end > page_size_bytes:
                raise InvalidSpecError(
                    f"{what}: layout part {part.name!r} ends at byte {end} but a page has only "
                    f"{page_size_bytes} bytes; a layout must keep each block inside its page"
                )

    @classmethod
    def single(cls, name: str, shape: tuple[int, ...], dtype: DTypeLike, block_dim: int = 0) -> CacheLayout:
        """A layout with one part at the start of the page."""
        return cls(parts=(PagePart(name=name, shape=shape, dtype=dtype, block_dim=block_dim),))
