"""Built-in policy ``kind_pools``: one block pool per retention kind, one block table each.

TRT-LLM sizes a pool per attention window and SGLang keeps its full and sliding-window pools
apart; this is kvcore's form of that layout:

- Layers are bucketed by :attr:`~kvcore.spec.KVCacheSpec.retention_key`: layers that hold the
  same block-table entries for every request (full attention and MLA of one block size; the
  sliding-window layers of one window; the states of one cache mode). Each bucket is **one
  group** whose layers keep their own page sizes side by side in the group's row (a
  mixed-page group), so no bucket is ever padded.
- Each group draws from **its own pool**: pool ``p``'s block id ``b`` is row ``b`` of the pool's
  own region of the buffer, as wide as its layers' pages together. Pools never share bytes.
- kvcore splits the budget between the pools in proportion to what one request of
  ``max_model_len`` needs of each (:func:`~kvcore.planning.capacity.split_budget`), so for
  requests of that length every pool runs out together and the plan holds the ideal number
  of them, with as many block tables as there are retention kinds.
- A split of your own, for the traffic rather than the worst case, is
  :attr:`PlanOptions.pool_split <kvcore.policy.PlanOptions.pool_split>`: one fraction of the
  budget per pool (:func:`kvcore.tuning.split.workload_split` derives it from a workload;
  ``kvcore tune`` searches it).

What it costs: pools are not fungible. A workload of requests shorter than ``max_model_len``
leaves the pool of full-attention layers with room while a sliding-window pool (whose need
does not shrink with the request) runs out first, where ``shared_buffer`` lets either kind take
any free row. ``docs/explanation/pools.md`` measures both with the workload simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

from kvcore.hookspecs import hookimpl
from kvcore.plan import KVCacheGroup
from kvcore.policy import AllocationPolicy, BlockPlacement, PlanOptions, TensorPlacement
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, specs_by_group_key


def retention_buckets(specs: Mapping[str, KVCacheSpec]) -> list[list[str]]:
    """The layers of ``specs`` bucketed by retention key, buckets in the order their first
    layer appears, layers in model order (each distinct spec object's key is computed once).

    Args:
        specs: ``{layer: spec}``.

    Returns:
        The layer names of each bucket.
    """
    keys: dict[int, Hashable] = {}
    buckets: dict[Hashable, list[str]] = {}
    for name, spec in specs.items():
        key = keys.get(id(spec))
        if key is None:
            key = keys[id(spec)] = spec.retention_key
        buckets.setdefault(key, []).append(name)
    return list(buckets.values())


def mixed_group(specs: Mapping[str, KVCacheSpec], layers: Sequence[str], pool: int = 0) -> KVCacheGroup:
    """One group of ``layers`` (one retention key), the first layer's spec as the group's and
    the others' recorded where their page differs.

    Args:
        specs: ``{layer: spec}``.
        layers: the group's layers, in model order.
        pool: the pool the group draws from.

    Returns:
        The group.
    """
    first = specs[layers[0]]
    differ = {name: specs[name] for name in layers if specs[name] is not first and specs[name] != first}
    return KVCacheGroup(layer_names=tuple(layers), spec=first, pool=pool, layer_specs=differ)


def _slot(spec: KVCacheSpec) -> int:
    """Bytes a page takes in a row: its size rounded up to its alignment."""
    return cdiv(spec.page_size_bytes, spec.alignment_bytes) * spec.alignment_bytes


class KindPoolsPolicy:
    """A pool and a mixed-page group per retention kind; the budget split by worst-case need."""

    name = "kind_pools"
    description = "one block pool and one block table per retention kind, sized by worst-case need"
    #: ``auto`` never picks it: pools are not fungible, so it is chosen by name (``kvcore
    #: compare`` shows when it wins).
    auto_priority = None

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        return None

    def group(
        self, specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
    ) -> Sequence[KVCacheGroup]:
        buckets = retention_buckets(specs)
        if not options.mixed_pages:  # one spec per group: each spec its own pool
            buckets = [layers for _, layers in specs_by_group_key(specs)]
        options.check_group_count(self.name, len(buckets))
        return tuple(mixed_group(specs, layers, pool) for pool, layers in enumerate(buckets))

    def layout(self, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
        pools = max((g.pool for g in groups), default=0) + 1
        rows = [0] * pools
        aligns = [1] * pools
        placed: list[tuple[int, int, str]] = []  # (pool, offset in the row, layer)
        for group in groups:
            for name in group.layer_names:
                spec = group.spec_of(name)
                align = spec.alignment_bytes
                aligns[group.pool] = math.lcm(aligns[group.pool], align)
                start = cdiv(rows[group.pool], align) * align
                placed.append((group.pool, start, name))
                rows[group.pool] = start + _slot(spec)
        # Pools lie end to end, so a pool starts where the blocks before it end: with every
        # row a multiple of every pool's alignment, each pool starts aligned for its layers.
        common = math.lcm(*aligns)
        rows = [cdiv(row, common) * common for row in rows]
        tensors = tuple(TensorPlacement(offset, rows[pool], (name,)) for pool, offset, name in placed)
        if pools == 1:
            return BlockPlacement(bytes_per_block=rows[0], single_buffer=True, tensors=tensors)
        return BlockPlacement(pool_bytes_per_block=tuple(rows), single_buffer=True, tensors=tensors)


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(KindPoolsPolicy())
