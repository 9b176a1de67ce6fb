"""From a plan to tensors: allocate the backing memory and view it per layer.

A plan with ``single_buffer`` gets one ``uint8`` buffer of ``plan.kv_cache_bytes`` (a plan of
several pools lays them one after another in it, and its tensor offsets count from the
buffer's start); otherwise
each plan tensor is its own allocation of ``tensor.size`` bytes. A layer's view comes from its
own spec's page layout (the ``kvcore_cache_layout`` hook): for each part of a page, a typed
``as_strided`` view whose block dimension steps by the tensor's ``page_stride``, so page ``j``
of a layer lies at bytes ``tensor.offset + j * page_stride + part.offset_bytes`` onwards, exactly
where the plan put it. Views are checked before any memory is taken.

Allocation is all or nothing: if any allocation fails, everything allocated so far is released
and :class:`~kvcore.errors.KVCacheAllocationError` says how much was asked and how much is free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import attrs
import torch

from kvcore.dtypes import dtype_name, dtype_size
from kvcore.error_messages import with_message
from kvcore.errors import KVCacheAllocationError, KVCoreError, PlanValidationError
from kvcore.planning.invariants import check_plan
from kvcore.runtime.memory import check_device, device_memory
from kvcore.runtime.torch_dtypes import torch_dtype

if TYPE_CHECKING:
    from kvcore.cache_layout import CacheLayout, PagePart
    from kvcore.plan import KVCachePlan
    from kvcore.planning.registry import Registry
    from kvcore.spec import KVCacheSpec

#: Allocates ``nbytes`` bytes on ``device`` as a 1-D ``uint8`` tensor. Injectable, so a test
#: can fail the k-th allocation or an engine can allocate from its own memory pool.
Allocator = Callable[[int, torch.device], torch.Tensor]


def empty_bytes(nbytes: int, device: torch.device) -> torch.Tensor:
    """The default allocator: ``torch.empty(nbytes, dtype=torch.uint8, device=device)``."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


class PartViews(tuple[torch.Tensor, ...]):
    """The views of a layer whose page holds several parts, in page order, with their names.

    It is a plain tuple of tensors (``k, v = views`` works) that also answers
    ``views.part("conv")``.
    """

    names: tuple[str, ...]

    def __new__(cls, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> PartViews:
        obj = super().__new__(cls, tensors)
        obj.names = tuple(names)
        return obj

    def part(self, name: str) -> torch.Tensor:
        """The view of the part called ``name`` (``KeyError`` listing the names otherwise)."""
        try:
            return self[self.names.index(name)]
        except ValueError:
            raise KeyError(f"no part {name!r}; this layer's parts are {list(self.names)}") from None


#: What a layer is bound to: one tensor, or one per part of its page.
LayerView: TypeAlias = torch.Tensor | PartViews


@attrs.frozen(kw_only=True)
class ViewGeometry:
    """Where one part of one layer lives: a typed strided window on an allocation.

    Attributes:
        layer: the layer name.
        part: the part name from the layout.
        allocation: index of the backing allocation (0 for a single buffer).
        dtype: element type of the view.
        shape: the view's shape (the page count inserted at the layout's block dimension).
        stride: the view's strides, in elements.
        storage_offset: where element 0 lies, in elements from the allocation's start.
    """

    layer: str
    part: str
    allocation: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int


def allocation_sizes(plan: KVCachePlan) -> list[int]:
    """Bytes of each backing allocation: one buffer, or one per plan tensor (none for a plan
    with nothing to cache)."""
    if not plan.tensors:
        return []
    if plan.single_buffer:
        return [plan.kv_cache_bytes]
    return [tensor.size for tensor in plan.tensors]


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


def part_start(part: PagePart, offset: int, page_stride: int, *, where: str, fix: str) -> tuple[int, int]:
    """The element size of ``part`` and the byte it starts at, in a page that starts ``offset``
    bytes into its buffer, pages ``page_stride`` bytes apart: a strided view of its elements
    needs both to be multiples of the element size.

    Args:
        where: what the message starts with (``"layer 'model.layers.0.self_attn'"``).
        fix: what the message ends with: how to make them multiples.

    Raises:
        PlanValidationError: naming the part, its start, the stride and the element size.
    """
    item = dtype_size(part.dtype)
    start = offset + part.offset_bytes
    if start % item or page_stride % item:
        raise PlanValidationError(
            [
                f"{where}: part {part.name!r} ({dtype_name(part.dtype)}, {item}-byte elements) "
                f"starts at byte {start} with a page stride of {page_stride} bytes, which are not both "
                f"multiples of {item}; {fix}"
            ]
        )
    return item, start


def _part_view(
    layer: str, part: PagePart, allocation: int, offset: int, page_stride: int, num_pages: int
) -> ViewGeometry:
    fix = "the policy must align pages to the spec's alignment_bytes"
    item, start = part_start(part, offset, page_stride, where=f"layer {layer!r}", fix=fix)
    inner = _contiguous_strides(part.shape)
    dim = part.block_dim
    return ViewGeometry(
        layer=layer,
        part=part.name,
        allocation=allocation,
        dtype=torch_dtype(part.dtype),
        shape=(*part.shape[:dim], num_pages, *part.shape[dim:]),
        stride=(*inner[:dim], page_stride // item, *inner[dim:]),
        storage_offset=start // item,
    )


def view_geometries(plan: KVCachePlan, *, registry: Registry) -> dict[str, tuple[ViewGeometry, ...]]:
    """Every layer's views as numbers, from the plan and the layout hook; no memory is touched.

    A layer's layout is its own spec's (``group.spec_of(layer)``: a mixed-page group's layers
    differ in page size), and its page count its group's pool's (``plan.num_pages(group)``).

    Args:
        plan: the plan.
        registry: whose ``kvcore_cache_layout`` hook gives each group spec's page layout.

    Returns:
        ``{layer name: one ViewGeometry per page part}``, in plan order.

    Raises:
        PlanValidationError: a part would start off its dtype's element boundary.
        PluginValidationError: no plugin gives a layout for a spec kind.
        InvalidSpecError: a layout does not fit in its page.
    """
    tensor_index = {name: i for i, tensor in enumerate(plan.tensors) for name in tensor.shared_by}
    out: dict[str, tuple[ViewGeometry, ...]] = {}
    layouts: dict[KVCacheSpec, CacheLayout] = {}
    for group in plan.groups:
        pages = plan.num_pages(group)
        for name in group.layer_names:
            # a mixed-page group's layer has a page (and page layout) of its own
            spec = group.spec_of(name)
            layout = layouts.get(spec)
            if layout is None:
                layout = layouts[spec] = registry.cache_layout(spec)
            index = tensor_index[name]
            tensor = plan.tensors[index]
            allocation = 0 if plan.single_buffer else index
            out[name] = tuple(
                _part_view(name, part, allocation, tensor.offset, tensor.page_stride, pages)
                for part in layout.parts
            )
    return out


def _materialize(spec: ViewGeometry, buffer: torch.Tensor) -> torch.Tensor:
    item = dtype_size(spec.dtype)
    usable = buffer.numel() - buffer.numel() % item
    typed = buffer[:usable].view(spec.dtype)
    return typed.as_strided(spec.shape, spec.stride, spec.storage_offset)


def build_views(
    specs: dict[str, tuple[ViewGeometry, ...]], buffers: Sequence[torch.Tensor]
) -> dict[str, LayerView]:
    """Turn :func:`view_geometries` into tensors over ``buffers``.

    Args:
        specs: what :func:`view_geometries` returned for the plan.
        buffers: the plan's allocations, in :func:`allocation_sizes` order.

    Returns:
        ``{layer name: view}``: one tensor, or a :class:`PartViews` for a page of several parts.
    """
    views: dict[str, LayerView] = {}
    for name, parts in specs.items():
        tensors = [_materialize(part, buffers[part.allocation]) for part in parts]
        views[name] = tensors[0] if len(tensors) == 1 else PartViews([p.part for p in parts], tensors)
    return views


def _free_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` after releasing cached blocks, or ``None`` where unknown."""
    try:
        probe = device_memory(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # hand the released blocks back to the driver
        return probe.sample().free_bytes
    except (KVCoreError, RuntimeError, OSError):
        return None


def allocate_buffers(
    sizes: Sequence[int], device: torch.device, *, zero: bool = True, allocator: Allocator | None = None
) -> list[torch.Tensor]:
    """Allocate one ``uint8`` tensor per size, all or nothing.

    Args:
        sizes: bytes of each allocation.
        device: where to allocate.
        zero: fill the memory with zeros (pages then read as 0.0, never as stale NaNs).
        allocator: ``(nbytes, device) -> uint8 tensor``; default :func:`empty_bytes`.

    Returns:
        The tensors, in the order of ``sizes``.

    Raises:
        KVCacheAllocationError: an allocation failed (out of memory included); everything
            allocated before it was released first.
    """
    alloc = allocator if allocator is not None else empty_bytes
    buffers: list[torch.Tensor] = []
    buffer: torch.Tensor | None = None
    failure: BaseException | None = None
    try:
        for nbytes in sizes:
            buffer = alloc(nbytes, device)
            _check_buffer(buffer, nbytes, device)
            if zero:
                buffer.zero_()
            buffers.append(buffer)
            buffer = None
    # torch OOM is a RuntimeError; a size past int64 a TypeError or OverflowError
    except (RuntimeError, MemoryError, TypeError, ValueError, OverflowError, KVCacheAllocationError) as exc:
        failure = exc
    if failure is None:
        return buffers
    # Drop every reference before the error is raised: its traceback keeps this frame alive.
    done = sum(b.numel() for b in buffers)
    buffers.clear()
    buffer = None
    asked = sum(sizes)
    free = _free_bytes(device)
    raise with_message(
        KVCacheAllocationError(
            requested_bytes=asked,
            allocated_bytes=done,
            free_bytes=free,
            device=str(device),
            num_allocations=len(sizes),
            failure=_one_line(failure),
        )
    ) from failure


def _check_buffer(buffer: torch.Tensor, nbytes: int, device: torch.device) -> None:
    if buffer.dtype != torch.uint8 or buffer.numel() != nbytes or buffer.device != device:
        raise KVCacheAllocationError(
            f"the allocator returned a {dtype_name(buffer.dtype)} tensor of {buffer.numel()} elements "
            f"on {buffer.device} for {nbytes} bytes on {device}; it must return a 1-D uint8 tensor of "
            "exactly that many bytes on that device",
            requested_bytes=nbytes,
            allocated_bytes=0,
            free_bytes=None,
        )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def allocate(
    plan: KVCachePlan,
    device: torch.device | str,
    *,
    registry: Registry,
    zero: bool = True,
    allocator: Allocator | None = None,
) -> dict[str, LayerView]:
    """Allocate ``plan`` on ``device`` and view it per layer.

    Args:
        plan: the plan to allocate.
        device: ``"cpu"``, ``"cuda:0"``, ``"meta"`` (shapes only, no memory), ...
        registry: whose layout hook shapes each view.
        zero: fill the memory with zeros.
        allocator: ``(nbytes, device) -> uint8 tensor``; default :func:`empty_bytes`.

    Returns:
        ``{layer name: view}`` in plan order: a tensor for a one-part page (attention:
        ``(2, num_pages, block_size, num_kv_heads, head_size)``; MLA:
        ``(num_pages, block_size, latent)``), a :class:`PartViews` for several parts.

    Raises:
        DeviceUnavailableError: the device does not exist here.
        PlanValidationError: the plan fails :func:`~kvcore.planning.invariants.check_plan`
            (pages that may be live at once share bytes, over its budget, ...), or a view
            would break its dtype's alignment; checked before any memory is taken.
        KVCacheAllocationError: an allocation failed; nothing stays allocated.
    """
    dev = check_device(device)
    check_plan(plan, source="handed to allocate()")
    specs = view_geometries(plan, registry=registry)
    buffers = allocate_buffers(allocation_sizes(plan), dev, zero=zero, allocator=allocator)
    return build_views(specs, buffers)
