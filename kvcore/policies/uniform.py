"""Built-in policy ``uniform``: one group, one tensor per layer.

For models whose layers all have the same spec (Llama, Qwen3, DeepSeek-V3, ...). Every layer
gets its own allocation of ``num_blocks x page_size_bytes`` bytes and all layers share one block
table, so ``num_blocks = available // sum of page sizes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvcore.hookspecs import hookimpl
from kvcore.plan import KVCacheGroup
from kvcore.policy import AllocationPolicy, BlockPlacement, PlanOptions, TensorPlacement
from kvcore.spec import KVCacheSpec, SizingContext, describe_spec, specs_by_group_key


class UniformPolicy:
    """One block table for all layers; each layer's cache is a separate contiguous tensor."""

    name = "uniform"
    description = "all layers share one spec: one group, one tensor of num_blocks pages per layer"
    #: ``auto`` asks it first: it plans only layers that all have one spec.
    auto_priority = 200

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        buckets = specs_by_group_key(specs)
        if len(buckets) <= 1:
            return None
        (first, first_layers), (other, other_layers) = buckets[:2]
        return (
            f"it needs every layer to have the same spec, but the layers have {len(buckets)} different "
            f"specs (e.g. {first_layers[0]!r} is {describe_spec(first)} and {other_layers[0]!r} is "
            f"{describe_spec(other)}); use the shared_buffer policy"
        )

    def group(
        self, specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
    ) -> Sequence[KVCacheGroup]:
        distinct = list({id(spec): spec for spec in specs.values()}.values())  # each spec object once
        spec = distinct[0].merge(distinct)
        return (KVCacheGroup(layer_names=tuple(specs), spec=spec),)

    def layout(self, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
        tensors: list[TensorPlacement] = []
        per_block = 0
        for group in groups:
            page = group.spec.page_size_bytes
            per_block += page * len(group.layer_names)
            tensors.extend(TensorPlacement(0, page, (name,)) for name in group.layer_names)
        return BlockPlacement(bytes_per_block=per_block, single_buffer=False, tensors=tuple(tensors))


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(UniformPolicy())
