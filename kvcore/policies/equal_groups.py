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
layer count that can win is scored by capacity against the ideal bound, and among those within
``grouping_tolerance`` of the best the one with the fewest groups wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from kvcore.hookspecs import hookimpl
from kvcore.plan import KVCacheGroup
from kvcore.policy import AllocationPolicy, BlockPlacement, PlanOptions, TensorPlacement
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, specs_by_group_key
from kvcore.units import format_bytes


def _sizes_worth_scoring(layer_counts: Sequence[int]) -> list[int]:
    """The group sizes ``g`` that can win, out of 1 .. the largest layer count.

    While ``g`` grows and no kind's group count ``cdiv(n, g)`` drops, the rows a request needs
    stay the same and the efficiency only falls, so only the smallest ``g`` of each such run can
    win. Those are ``cdiv(n, q)`` for the counts ``q``; the ones for ``q`` above ``sqrt(n)`` are
    all at most ``sqrt(n) + 1``, so scoring every ``g`` up to there and ``cdiv(n, q)`` for the
    smaller ``q`` covers them: O(sqrt(n)) sizes instead of ``n``.
    """
    sizes: set[int] = set()
    for n in layer_counts:
        root = math.isqrt(n) + 1
        sizes.update(range(1, min(n, root) + 1))
        sizes.update(cdiv(n, q) for q in range(1, min(n, root) + 1))
    return sorted(sizes)


class EqualGroupsPolicy:
    """Equal-size groups over one page size; tensor ``i`` holds layer ``i`` of every group."""

    name = "equal_groups"
    description = "one page size: equal-size groups, a contiguous tensor per layer slot (vLLM-style)"
    #: ``auto`` asks it last: ``shared_buffer`` plans the same layers with at least its capacity.
    auto_priority = 0

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        first: dict[int, str] = {}
        asked: set[int] = set()  # each spec object once
        for name, spec in specs.items():
            if id(spec) not in asked:
                asked.add(id(spec))
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

        scored = {size: score(size) for size in _sizes_worth_scoring([len(layers) for _, layers in buckets])}
        floor = max(eff for _, eff in scored.values()) * (1.0 - options.grouping_tolerance)
        if options.max_groups is not None:
            # the largest size scored puts each kind in one group: the fewest there are
            options.check_group_count(self.name, min(groups for groups, _ in scored.values()))
            scored = {s: v for s, v in scored.items() if v[0] <= options.max_groups}
            # a bound the usual choice keeps changes nothing; else the tolerance is counted
            # from the best layout within the bound
            within = max(eff for _, eff in scored.values())
            if within < floor:
                floor = within * (1.0 - options.grouping_tolerance)
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

    def layout(self, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
        width = max((len(g.layer_names) for g in groups), default=0)
        page = next((g.spec.page_size_bytes for g in groups if g.layer_names), 0)
        slots: list[list[str]] = [[] for _ in range(width)]  # slot i: layer i of every group
        for group in groups:
            for slot, name in zip(slots, group.layer_names, strict=False):
                slot.append(name)
        tensors = tuple(TensorPlacement(0, page, slot) for slot in slots)
        return BlockPlacement(bytes_per_block=width * page, single_buffer=False, tensors=tensors)


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(EqualGroupsPolicy())
