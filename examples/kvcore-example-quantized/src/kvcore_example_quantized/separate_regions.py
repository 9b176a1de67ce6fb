"""Policy ``example.separate_regions``: a baseline in which groups never share bytes.

Layers with equal specs form one group (one block table). The buffer is one row per block id,
and every layer has its own slot in each row, group after group. Because a block id belongs to
one group at a time, the slots other groups keep in that row stay empty: with ``g`` groups of
similar size, about ``(g - 1) / g`` of the buffer idles. That is the cost
``shared_buffer`` removes by letting groups share rows; compare the two with
``kvcore plan --policy``.

For models whose layers all have one spec it plans exactly what ``uniform`` plans, in one
buffer instead of one allocation per layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

from kvcore import (
    AllocationPolicy,
    BlockPlacement,
    KVCacheGroup,
    KVCacheSpec,
    PlanOptions,
    SizingContext,
    TensorPlacement,
    hookimpl,
)
from kvcore.spec import cdiv


class SeparateRegionsPolicy:
    """One group per distinct spec; every layer its own slot in each row of one buffer."""

    name = "example.separate_regions"
    description = "baseline: one group per distinct spec, each layer its own slot; groups never share bytes"
    auto_priority = None  # a baseline: `auto` never picks it, name it to compare

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        return None  # any mix of kinds can be laid out side by side

    def group(
        self, specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
    ) -> Sequence[KVCacheGroup]:
        buckets: dict[Hashable, list[str]] = {}
        for name, spec in specs.items():
            buckets.setdefault(spec.group_key, []).append(name)
        return tuple(
            KVCacheGroup(layer_names=names, spec=type(specs[names[0]]).merge([specs[n] for n in names]))
            for names in buckets.values()
        )

    def layout(self, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
        # One row per block id, a page of every layer side by side. Each slot is the page
        # rounded up to a multiple of every alignment, so every page starts aligned whatever
        # the slots before it hold. (Its groups take one block id per page.)
        align = math.lcm(1, *(group.spec.alignment_bytes for group in groups))
        slots = []
        row = 0
        for group in groups:
            slot = cdiv(group.spec.page_size_bytes, align) * align
            for name in group.layer_names:
                slots.append((name, row))
                row += slot
        tensors = [
            TensorPlacement(offset=offset, page_stride=row, shared_by=(name,)) for name, offset in slots
        ]
        return BlockPlacement(bytes_per_block=row, single_buffer=True, tensors=tensors)


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(SeparateRegionsPolicy())
