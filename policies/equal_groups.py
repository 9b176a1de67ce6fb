"""Built-in policy ``equal_groups``: hybrids whose pages all have one size, laid out the way
most attention backends expect: one contiguous tensor per layer slot.

Every group gets the same number of layers ``g`` (a kind whose layer count ``g`` does not divide
gets padded: its last group is short). There are ``g`` tensors of ``num_blocks`` pages; tensor
``i`` is shared by layer ``i`` of every group, and each layer's view is contiguous
(``page_stride`` = page size). This is the layout vLLM's hybrid allocator uses. It wastes the
padded slots, where ``shared_buffer`` fills rows with enlarged blocks instead, but backends that
need a contiguous ``(num_blocks, ...)`` tensor per layer can use it directly; ``kvcore compare``
shows what it costs.

The group size is chosen like ``shared_buffer``'s row width: every ``g`` from 1 to the largest
layer count is scored by capacity against the ideal bound, and among those within
``grouping_tolerance`` of the best the one with the fewest groups wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvcore.hookspecs import hookimpl
from kvcore.plan import KVCacheGroup, KVCacheTensor
from kvcore.policy import AllocationPolicy, Layout, PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, specs_by_group_key
from kvcore.units import format_bytes


class EqualGroupsPolicy:
    """Equal-size groups over one page size; tensor ``i`` holds layer ``i`` of every group."""

    name = "equal_groups"
    description = "one page size: equal-size groups, a contiguous tensor per layer slot (vLLM-style)"

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        first: dict[int, str] = {}
        for name, spec in specs.items():
            first.setdefault(spec.page_size_bytes, name)
        if len(first) <= 1:
            return None
        (page_a, layer_a), (page_b, layer_b) = list(first.items())[:2]
        return (
            f"it needs every layer's page to have one size, but {layer_a!r} has pages of "
            f"{format_bytes(page_a)} and {layer_b!r} of {format_bytes(page_b)}; use the shared_buffer policy"
        )

    def group(
        self, specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
    ) -> Sequence[KVCacheGroup]:
        buckets = specs_by_group_key(specs)
        blocks = [spec.max_num_blocks(context) for spec, _ in buckets]
        need = sum(len(layers) * b for (_, layers), b in zip(buckets, blocks, strict=True))

        def score(size: int) -> tuple[int, float]:
            counts = [cdiv(len(layers), size) for _, layers in buckets]
            rows = sum(c * b for c, b in zip(counts, blocks, strict=True))
            return sum(counts), need / (size * rows) if rows else 1.0

        sizes = range(1, max(len(layers) for _, layers in buckets) + 1)
        scored = {size: score(size) for size in sizes}
        best = max(eff for _, eff in scored.values())
        floor = best * (1.0 - options.grouping_tolerance)
        size = min(
            (s for s, (_, eff) in scored.items() if eff >= floor),
            key=lambda s: (scored[s][0], -scored[s][1], -s),
        )
        position = {name: i for i, name in enumerate(specs)}
        groups: list[KVCacheGroup] = []
        for spec, layers in buckets:
            count = cdiv(len(layers), size)
            # strided: layer i of the kind goes to group i mod count, so each group reaches
            # across the model (pipeline stages hold a share of every group)
            groups.extend(KVCacheGroup(layer_names=tuple(layers[j::count]), spec=spec) for j in range(count))
        groups.sort(key=lambda g: position[g.layer_names[0]])
        return tuple(groups)

    def layout(self, groups: Sequence[KVCacheGroup], num_blocks: int) -> Layout:
        width = max((len(g.layer_names) for g in groups), default=0)
        page = next((g.spec.page_size_bytes for g in groups if g.layer_names), 0)
        tensors = tuple(
            KVCacheTensor(
                size=num_blocks * page,
                offset=0,
                page_stride=page,
                shared_by=tuple(g.layer_names[i] for g in groups if len(g.layer_names) > i),
            )
            for i in range(width)
        )
        return Layout(bytes_per_block=width * page, single_buffer=False, tensors=tensors)


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(EqualGroupsPolicy())
