"""The host tier for real: host memory that holds pages moved off the device, and the copies.

A plan's :class:`~kvcore.plan.OffloadTier` gives each pool host bytes, counted in the pool's
block ids: pool ``p`` gets ``plan.host_blocks_in(p)`` host *rows* of ``bytes_per_block`` bytes.
:class:`HostTier` allocates them (pinned memory when the views are on a CUDA device, so the
copies can use DMA; plain memory on the CPU) and moves pages between the device views and the
rows with batched index copies: for every part of every layer of the group, one
``index_select`` over the pages and one ``index_copy_`` into the other side, whatever the
number of pages in the batch.

On the host, whatever the device layout, a group's pages sit in rows the way the row rule of
``shared_buffer`` lays them on the device: a page of a group whose page spans ``s`` block ids
takes an aligned run of ``s`` rows, and the group's layers are packed one after another in it
(largest alignment first, so no layer needs padding). They fit: every page of a group may be
live at once, so in a sound plan one page of every layer of a group takes at most ``s`` block
ids' bytes. Groups of one pool share its rows, as they share its block ids on the device.

Which pages may go out is the kind's answer (:attr:`~kvcore.spec.KVCacheSpec.offload_unit`):
a kind that says ``"none"`` is refused. When a page goes out and when it comes back is the
caller's (a block pool evicting cached blocks, a test); this module moves bytes and keeps
the rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from kvcore.errors import HostTierError, InvalidInputError, PlanValidationError
from kvcore.plan import KVCachePlan, OffloadTier
from kvcore.runtime.allocation import LayerView, allocate_buffers, part_start
from kvcore.runtime.host_rows import HostRows
from kvcore.spec import KVCacheSpec, describe_spec
from kvcore.units import format_bytes

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry


@attrs.frozen(kw_only=True, eq=False)
class _PartCopy:
    """One part of one layer: its device view and its view over the host rows, both with the
    page dimension first (an index copy along the first dimension takes torch's fast path; along
    an inner one of a strided view, CPU ``index_select`` is hundreds of times slower)."""

    device: torch.Tensor
    host: torch.Tensor


class HostTier:
    """A plan's host tier, allocated, and the batched copies between it and the device views.

    Args:
        plan: the plan the views were allocated for.
        views: ``{layer: view}`` as :func:`~kvcore.runtime.allocation.allocate` returned them
            (or the views bound to an engine's modules).
        registry: whose ``kvcore_cache_layout`` hook gives each layer's page parts.
        tier: the host bytes per pool; default the plan's :attr:`~kvcore.plan.KVCachePlan.offload_tier`.
        pin_memory: allocate page-locked host memory; default: when the views are on CUDA
            (page-locked memory needs CUDA, and only helps copies to and from a GPU).

    Raises:
        InvalidInputError: no tier (the plan has none and none was given), or a planned layer
            has no view.
        PlanValidationError: the tier does not fit the plan (the plan check's host-tier rule),
            or a group's page is larger than its rows (a plan that is not sound).
        KVCacheAllocationError: the host memory could not be allocated; nothing stays allocated.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        views: Mapping[str, LayerView],
        *,
        registry: Registry,
        tier: OffloadTier | None = None,
        pin_memory: bool | None = None,
    ) -> None:
        from kvcore.planning.invariants import check_plan

        chosen = tier if tier is not None else plan.offload_tier
        if chosen is None:
            raise InvalidInputError(
                "the plan has no offload tier; give it one (kvcore.planning.offload.with_host_memory) "
                "or pass tier="
            )
        self.plan = plan.with_offload_tier(chosen)
        check_plan(self.plan, source="HostTier()", structure=False, capacity=False)
        self.device = _device_of(views, plan)
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory
        if self.pin_memory and not torch.cuda.is_available():
            raise InvalidInputError("pin_memory=True needs CUDA, and CUDA is not available here")
        rows = [self.plan.host_blocks_in(p) for p in range(len(plan.pools))]
        sizes = [n * pool.bytes_per_block for n, pool in zip(rows, plan.pools, strict=True)]
        host = torch.device("cpu")
        allocator = _pinned_bytes if self.pin_memory else None
        #: the host memory, one ``uint8`` buffer per pool (empty for a pool without rows)
        self.buffers: list[torch.Tensor] = allocate_buffers(sizes, host, zero=True, allocator=allocator)
        self._rows = [
            HostRows(n, (g.blocks_per_page for g in plan.groups if g.pool == p)) for p, n in enumerate(rows)
        ]
        self._parts = [self._group_parts(index, views, registry) for index in range(len(plan.groups))]
        self._owner: dict[tuple[int, int], int] = {}  # (pool, first row) -> group holding it

    @property
    def nbytes(self) -> int:
        """Host bytes allocated, every pool together."""
        return sum(buffer.numel() for buffer in self.buffers)

    def num_free_rows(self, pool: int = 0) -> int:
        """Host rows (block ids' worth) of pool ``pool`` holding no page."""
        return self._rows[pool].num_free

    def free_pages(self, group: int) -> int:
        """Pages of ``group`` that could still go out, if no other group takes rows first
        (a page of a state group takes an aligned run of rows; a lower bound of what fits)."""
        chosen = self.plan.groups[group]
        return self._rows[chosen.pool].free_runs(chosen.blocks_per_page)

    def offload(self, group: int, pages: Sequence[int]) -> list[int]:
        """Copy pages of ``group`` from the device into free host rows, in one batch.

        The device pages keep their bytes (the caller frees or reuses them); the rows stay
        taken until :meth:`release`.

        Args:
            group: the plan group the pages belong to.
            pages: block-table entries of the group (its block ids, for a group of one block
                id per page), distinct.

        Returns:
            The host slots, one per page in order: the first host row each page took; hand
            them to :meth:`restore` and :meth:`release`.

        Raises:
            HostTierError: the group's kind keeps its pages on the device (``offload_unit``
                ``"none"``), or the host tier has no room for every page (none is taken then).
            InvalidInputError: a page is outside the group's pages, or repeated.
        """
        spec, pool, span = self._group_facts(group)
        if spec.offload_unit == "none":
            raise HostTierError(
                f"group {group} ({describe_spec(spec)}): its kind's offload_unit is 'none', so its pages "
                "stay on the device; a kind opts in by naming its unit (block, checkpoint, request)"
            )
        device_pages = self._check_pages(group, pages, "pages")
        rows = self._rows[pool]
        taken: list[int] = []
        for _ in device_pages:
            start = rows.take(span)
            if start is None:
                for back in taken:
                    rows.give_back(back, span)
                raise HostTierError(
                    f"the host tier of pool {pool} has no room for {len(device_pages)} page(s) of group "
                    f"{group} ({span} row(s) of {format_bytes(self.plan.pools[pool].bytes_per_block)} each): "
                    f"{rows.num_free:,} of its {rows.rows:,} rows are free; release host slots first"
                )
            taken.append(start)
        for start in taken:
            self._owner[(pool, start)] = group
        if device_pages:
            self._copy_out(group, device_pages, [start // span for start in taken])
        return taken

    def restore(self, group: int, host_slots: Sequence[int], pages: Sequence[int]) -> None:
        """Copy host slots of ``group`` back into device pages, in one batch; the slots stay
        held (the host copy may serve again) until :meth:`release`.

        Args:
            group: the group the slots were offloaded from.
            host_slots: slots :meth:`offload` returned for this group.
            pages: the block-table entries to write, one per slot (the pages they came from, or
                others the caller took for them), distinct.

        Raises:
            InvalidInputError: the counts differ, a page is outside the group's pages or
                repeated, or a slot is not held by this group.
        """
        _, pool, span = self._group_facts(group)
        if len(host_slots) != len(pages):
            raise InvalidInputError(
                f"restore needs one page per host slot (got {len(host_slots)} slots and {len(pages)} pages)"
            )
        self._check_slots(group, pool, host_slots)
        device_pages = self._check_pages(group, pages, "pages")
        if device_pages:
            self._copy_in(group, [slot // span for slot in host_slots], device_pages)

    def release(self, group: int, host_slots: Iterable[int]) -> None:
        """Give host slots of ``group`` back (their pages are dropped from the host).

        Raises:
            InvalidInputError: a slot is not held by this group.
        """
        _, pool, span = self._group_facts(group)
        slots = list(host_slots)
        self._check_slots(group, pool, slots)
        for slot in slots:
            del self._owner[(pool, slot)]
            self._rows[pool].give_back(slot, span)

    # -- internals ---------------------------------------------------------------------------

    def _group_facts(self, group: int) -> tuple[KVCacheSpec, int, int]:
        groups = self.plan.groups
        if not 0 <= group < len(groups):
            raise InvalidInputError(f"there is no group {group}; the plan has {len(groups)}")
        chosen = groups[group]
        return chosen.spec, chosen.pool, chosen.blocks_per_page

    def _check_pages(self, group: int, pages: Sequence[int], what: str) -> list[int]:
        limit = self.plan.num_pages(self.plan.groups[group])
        out = list(pages)
        bad = [p for p in out if type(p) is not int or not 0 <= p < limit]
        if bad:
            raise InvalidInputError(f"{what} {bad[:5]} of group {group} are outside its pages 0..{limit - 1}")
        if len(set(out)) != len(out):
            raise InvalidInputError(f"{what} of group {group} repeat an entry ({out[:8]}...)")
        return out

    def _check_slots(self, group: int, pool: int, slots: Sequence[int]) -> None:
        wrong = [s for s in slots if self._owner.get((pool, s)) != group]
        if wrong:
            raise InvalidInputError(
                f"host slots {wrong[:5]} are not held by group {group} (offload its pages first; a slot "
                "serves the group that offloaded into it until it is released)"
            )
        if len(set(slots)) != len(slots):
            raise InvalidInputError(f"host slots of group {group} repeat an entry")

    def _copy_out(self, group: int, device_pages: list[int], host_pages: list[int]) -> None:
        source = torch.tensor(device_pages, dtype=torch.long, device=self.device)
        target = torch.tensor(host_pages, dtype=torch.long)
        for part in self._parts[group]:
            # one gather on the device, one copy across, one scatter into the rows
            gathered = part.device.index_select(0, source)
            part.host.index_copy_(0, target, gathered.to("cpu"))

    def _copy_in(self, group: int, host_pages: list[int], device_pages: list[int]) -> None:
        source = torch.tensor(host_pages, dtype=torch.long)
        target = torch.tensor(device_pages, dtype=torch.long, device=self.device)
        for part in self._parts[group]:
            gathered = part.host.index_select(0, source)
            part.device.index_copy_(0, target, gathered.to(self.device, non_blocking=self.pin_memory))

    def _group_parts(self, index: int, views: Mapping[str, LayerView], registry: Registry) -> list[_PartCopy]:
        """The device and host views of every part of every layer of group ``index``."""
        plan = self.plan
        group = plan.groups[index]
        if group.spec.offload_unit == "none":
            return []
        pool = plan.pools[group.pool]
        span = group.blocks_per_page
        stride = span * pool.bytes_per_block  # host bytes from one page of the group to the next
        host_pages = plan.host_blocks_in(group.pool) // span
        buffer = self.buffers[group.pool]
        layers = sorted(group.layer_names, key=lambda name: -group.spec_of(name).alignment_bytes)
        packed = sum(group.spec_of(name).page_size_bytes for name in layers)
        if packed > stride:
            raise PlanValidationError(
                [
                    f"group {index}: one page of each of its {len(layers)} layers takes {packed:,} bytes "
                    f"but its page spans {span} block id(s) of {pool.bytes_per_block:,} bytes; the plan is "
                    "not sound"
                ]
            )
        parts: list[_PartCopy] = []
        offset = 0
        for name in layers:
            spec = group.spec_of(name)
            view = views.get(name)
            if view is None:
                raise InvalidInputError(f"planned layer {name!r} has no view; pass every layer's view")
            layout = registry.cache_layout(spec)
            device_views = (view,) if isinstance(view, torch.Tensor) else tuple(view)
            for part, device in zip(layout.parts, device_views, strict=True):
                item, start = part_start(
                    part,
                    offset,
                    stride,
                    where=f"group {index}: layer {name!r}",
                    fix="host rows of the group's page size cannot hold its elements whole",
                )
                shape = list(device.shape)
                shape[part.block_dim] = host_pages
                strides = list(device.stride())
                strides[part.block_dim] = stride // item
                # copied as integers of the element's size: the bits move unchanged, and index
                # copies exist for every integer type (not for float8 and other narrow floats)
                bits = _BITS[item]
                typed = buffer[: buffer.numel() - buffer.numel() % item].view(bits)
                # no rows for this pool: an empty view, which no page ever reaches
                host = typed.as_strided(shape, strides, start // item if host_pages else 0)
                dim = part.block_dim
                parts.append(_PartCopy(device=device.view(bits).movedim(dim, 0), host=host.movedim(dim, 0)))
            offset += spec.page_size_bytes
        return parts


#: The integer type of each element size, which a part is copied as.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _device_of(views: Mapping[str, LayerView], plan: KVCachePlan) -> torch.device:
    for group in plan.groups:
        for name in group.layer_names:
            view = views.get(name)
            if view is not None:
                return view.device if isinstance(view, torch.Tensor) else view[0].device
    raise InvalidInputError("no planned layer has a view; pass the views allocate() returned")


def _pinned_bytes(nbytes: int, device: torch.device) -> torch.Tensor:
    """Page-locked host bytes (``pin_memory=True``): copies to and from a GPU go by DMA."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=True)
