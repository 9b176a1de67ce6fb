"""Built-in policy ``uniform``: one group, one tensor per layer.

For models whose layers all have the same spec (Llama, Qwen3, DeepSeek-V3, ...). Every layer
gets its own allocation of ``num_blocks x page_size_bytes`` bytes and all layers share one block
table, so ``num_blocks = available // sum of page sizes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvcore.hookspecs import hookimpl
from kvcore.plan import KVCacheGroup, KVCacheTensor
from kvcore.policy import AllocationPolicy, Layout, PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext, describe_spec, is_kv_cache_type_uniform


class UniformPolicy:
    """One block table for all layers; each layer's cache is a separate contiguous tensor."""

    name = "uniform"
    description = "all layers share one spec: one group, one tensor of num_blocks pages per layer"

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        if is_kv_cache_type_uniform(specs):
            return None
        first_name, first = next(iter(specs.items()))
        other_name, other = next((n, s) for n, s in specs.items() if s.group_key != first.group_key)
        distinct = len({s.group_key for s in specs.values()})
        return (
            f"it needs every layer to have the same spec, but the layers have {distinct} different "
            f"specs (e.g. {first_name!r} is {describe_spec(first)} and {other_name!r} is "
            f"{describe_spec(other)}); use the shared_buffer policy"
        )

    def group(
        self, specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
    ) -> Sequence[KVCacheGroup]:
        spec = next(iter(specs.values())).merge(list(specs.values()))
        return (KVCacheGroup(layer_names=tuple(specs), spec=spec),)

    def layout(self, groups: Sequence[KVCacheGroup], num_blocks: int) -> Layout:
        tensors = []
        per_block = 0
        for group in groups:
            page = group.spec.page_size_bytes
            per_block += page * len(group.layer_names)
            for name in group.layer_names:
                tensors.append(
                    KVCacheTensor(size=num_blocks * page, offset=0, page_stride=page, shared_by=(name,))
                )
        return Layout(bytes_per_block=per_block, single_buffer=False, tensors=tuple(tensors))


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(UniformPolicy())
