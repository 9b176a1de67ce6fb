# Frozen: kvcore-example-quantized's policy as written against kvcore 0.1 (git show
# bf23a0f^:examples/kvcore-example-quantized/src/kvcore_example_quantized/separate_regions.py),
# byte for byte but for this comment. Its layout(groups, num_blocks) cannot be expressed in
# 0.2's protocol, and its kvcore.Layout was removed in 0.3; tests/plugins/test_removed_in_0_3.py
# checks its import fails naming kvcore.BlockPlacement.
"""Policy ``example.separate_regions``: a baseline in which groups never share bytes.

Layers with equal specs form one group (one block table). The buffer is cut into regions, one
per layer, group after group; a layer's region holds its pages for every block id. Because a
block id belongs to one group at a time, the pages other groups keep for that id stay empty:
with ``g`` groups of similar size, about ``(g - 1) / g`` of the buffer idles. That is the cost
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
    KVCacheGroup,
    KVCacheSpec,
    KVCacheTensor,
    Layout,
    PlanOptions,
    SizingContext,
    hookimpl,
)
from kvcore.spec import cdiv


class SeparateRegionsPolicy:
    """One group per distinct spec; every layer its own region of one buffer."""

    name = "example.separate_regions"
    description = "baseline: one group per distinct spec, each layer its own region; groups never share bytes"

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

    def layout(self, groups: Sequence[KVCacheGroup], num_blocks: int) -> Layout:
        # One stride for every page size that is a multiple of every alignment, so each region
        # starts aligned whatever the regions before it hold.
        align = math.lcm(1, *(group.spec.alignment_bytes for group in groups))
        tensors = []
        offset = 0
        bytes_per_block = 0
        for group in groups:
            stride = cdiv(group.spec.page_size_bytes, align) * align
            pages = num_blocks // group.blocks_per_page
            for name in group.layer_names:
                tensors.append(
                    KVCacheTensor(size=pages * stride, offset=offset, page_stride=stride, shared_by=(name,))
                )
                offset += pages * stride
                bytes_per_block += cdiv(stride, group.blocks_per_page)
        return Layout(bytes_per_block=bytes_per_block, single_buffer=True, tensors=tuple(tensors))


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(SeparateRegionsPolicy())
