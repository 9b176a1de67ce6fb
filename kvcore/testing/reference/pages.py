"""A request's K and V in one attention layer's pages, written and read through a block table.

A layer's view is what :func:`kvcore.runtime.allocation.allocate` returned for it, used as is: the
default attention layout ``(2, num_pages, block_size, num_kv_heads, head_size)`` (K at index 0,
V at 1), or a layout with two parts named ``k`` and ``v`` of ``(num_pages, block_size,
num_kv_heads, head_size)`` each. Both are strided windows on the plan's memory (in a
``shared_buffer`` plan a page step is a whole block row), and :class:`LayerPages` only ever
indexes them, so every write lands in the bytes the plan gave the layer and every read comes
back from there: no K or V is kept anywhere else.

Token position ``p`` of a request lives in page ``table[p // block_size]`` at slot
``p % block_size``, where ``table`` is the request's block table for the layer's group
(:meth:`kvcore.BlockPool.block_table`).
"""

from __future__ import annotations

import attrs
import torch

from kvcore.dtypes import dtype_name
from kvcore.errors import InvalidInputError, KVCacheBindingError
from kvcore.plugins.attention import AttentionSpec
from kvcore.runtime.allocation import LayerView, PartViews
from kvcore.runtime.block_pool import NULL_PAGE
from kvcore.runtime.torch_dtypes import torch_dtype


def _describe(view: object) -> str:
    if isinstance(view, PartViews):
        parts = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(view.names, view, strict=True))
        return f"parts ({parts})"
    if isinstance(view, torch.Tensor):
        return f"a {dtype_name(view.dtype)} tensor {tuple(view.shape)}"
    return f"a {type(view).__name__}"


def _halves(view: LayerView) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The K and V halves of an attention view (no copies), or ``None`` for another layout."""
    if isinstance(view, PartViews):
        return (view.part("k"), view.part("v")) if set(view.names) == {"k", "v"} else None
    if isinstance(view, torch.Tensor) and view.dim() == 5 and view.shape[0] == 2:  # bound at run time
        return view[0], view[1]
    return None


@attrs.frozen(kw_only=True, eq=False)
class LayerPages:
    """The K and V pages of one attention layer: views of the allocated cache, never copies.

    Attributes:
        name: the layer name.
        keys: ``(num_pages, block_size, num_kv_heads, head_size)``, a view of the K half.
        values: the same for V.
    """

    name: str
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def block_size(self) -> int:
        """Tokens per page."""
        return int(self.keys.shape[1])

    @classmethod
    def from_view(cls, name: str, view: LayerView, spec: AttentionSpec, num_pages: int) -> LayerPages:
        """Split a layer's allocated view into its K and V pages, checking its shape.

        Args:
            name: the layer name (for messages).
            view: the layer's view, as :func:`kvcore.runtime.allocation.allocate` returned it.
            spec: the layer's group spec.
            num_pages: pages the plan gives the layer's group.

        Returns:
            The layer's pages.

        Raises:
            KVCacheBindingError: the view is not an attention view of ``spec`` over ``num_pages``
                pages (another layout, dtype or size).
        """
        wanted = (num_pages, spec.block_size, spec.num_kv_heads, spec.head_size)
        halves = _halves(view)
        dtype = torch_dtype(spec.dtype)
        if halves is None or any(tuple(t.shape) != wanted or t.dtype != dtype for t in halves):
            raise KVCacheBindingError(
                f"layer {name!r} is bound to {_describe(view)}, not an attention view of "
                f"(2, {', '.join(map(str, wanted))}) {dtype_name(spec.dtype)} (or parts 'k' and 'v' of "
                f"{wanted}); bind the views allocate() made for this plan"
            )
        return cls(name=name, keys=halves[0], values=halves[1])

    def locate(self, table: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pages and slots of token positions ``start .. end - 1``.

        Args:
            table: the request's block table for this layer's group (``int64``).
            start: first position.
            end: position after the last.

        Returns:
            ``(pages, slots)``, two ``int64`` tensors of ``end - start`` entries.

        Raises:
            InvalidInputError: a position lies past the table, or in an entry that was freed
                (:data:`~kvcore.runtime.block_pool.NULL_PAGE`): the pool let go of a page still in use.
        """
        positions = torch.arange(start, end, device=table.device)
        entries = positions // self.block_size
        if end > 0 and (end - 1) // self.block_size >= table.numel():
            raise InvalidInputError(
                f"layer {self.name!r}: token position {end - 1} needs block-table entry "
                f"{(end - 1) // self.block_size} but the table has {table.numel()}; reserve() the tokens "
                "first"
            )
        pages = table[entries]
        freed = pages == NULL_PAGE
        if bool(freed.any()):
            first = int(positions[freed][0])
            raise InvalidInputError(
                f"layer {self.name!r}: token position {first} is still read but its page (block-table "
                f"entry {first // self.block_size}) was freed; the pool released a page that a later "
                "token reads"
            )
        return pages.to(self.keys.device), (positions % self.block_size).to(self.keys.device)

    def write(self, table: torch.Tensor, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store the K and V of positions ``start .. start + T - 1`` in their pages.

        Args:
            table: the request's block table for this layer's group.
            start: position of the first token.
            keys: ``(T, num_kv_heads, head_size)``.
            values: the same for V.

        Raises:
            InvalidInputError: a position has no live page (see :meth:`locate`).
        """
        pages, slots = self.locate(table, start, start + keys.shape[0])
        self.keys[pages, slots] = keys.to(self.keys.dtype)
        self.values[pages, slots] = values.to(self.values.dtype)

    def read(self, table: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V of positions ``start .. end - 1``, gathered from their pages.

        Returns:
            ``(keys, values)``, each ``(end - start, num_kv_heads, head_size)``.

        Raises:
            InvalidInputError: a position has no live page (see :meth:`locate`).
        """
        pages, slots = self.locate(table, start, end)
        return self.keys[pages, slots], self.values[pages, slots]
