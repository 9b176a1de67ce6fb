"""vLLM 0.33's grouping of a model's layers into KV-cache groups, modelled on kvcore specs
(rules from vLLM's ``get_kv_cache_groups``; see the research notes on vLLM, section 3), for
the benchmarks' vLLM-style columns.

1. Every layer one spec: one group; ``num_blocks = budget // (page x layers)``.
2. Every layer of one retention kind (vLLM: all full-attention-derived, MLA included, or all
   sliding windows of one window, ...) and one block size, pages of different sizes: ONE
   group of per-layer pages (``UniformTypeKVCacheSpecs``); ``num_blocks = budget // sum of the
   pages``, a request holds ``max`` over layers of its blocks.
3. Otherwise (hybrid): page sizes are unified to the largest page ``P``: a smaller
   attention page that divides ``P`` gets its block size raised by the ratio, one that does
   not is padded to ``P`` (vLLM refuses that for MLA: reported as ``None``), a state page is
   padded to ``P``. Layers are then bucketed by spec; the group size is the smallest bucket's
   layer count (its largest when that is below 1.5x the smallest); each bucket is cut into
   ``ceil(n / size)`` groups (padded slots cost memory); ``num_blocks = budget // (P x size)``
   and a request holds the blocks of every group, each group's worst case by vLLM's own rule
   (its ``max_admission_blocks_per_request``, summed over groups: what its scheduler admits
   by). Beside states (SSM), the attention block size is first raised until an attention page
   holds the largest state, as vLLM's platform code does before grouping (the factor is the
   least that does; vLLM also rounds it to a kernel's block-size multiple, which this leaves
   out).

Not modelled: vLLM's packed groups for block-outermost layouts (newer builds, mixed pages
only), hidden-state and draft layers, the null block (kvcore's figures beside it do not reserve
one either). Concurrency is requests of ``max_model_len`` held at once.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import NamedTuple

from kvcore.integrations.vllm.rules import VllmRules, vllm_pages_per_request
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.spec import KVCacheSpec, SizingContext, cdiv


def _at_least(spec: KVCacheSpec, page: int) -> KVCacheSpec:
    """``spec`` with its block size raised by the least factor that makes its page >= ``page``."""
    return spec.with_block_size(spec.block_size * cdiv(page, spec.page_size_bytes))


class VllmGroups(NamedTuple):
    """vLLM's grouping of a model: bytes per block id and its groups.

    Attributes:
        row_bytes: bytes one block id takes (every group's pages of it together).
        groups: ``{spec: groups of that spec}`` (specs as unified to one page size).
        one_table: one group of per-layer pages (rule 2): a request holds the most any of
            its layers holds, not the sum.
    """

    row_bytes: int
    groups: dict[KVCacheSpec, int]
    one_table: bool = False


class VllmStyle(NamedTuple):
    """vLLM-style grouping of a model: concurrency (``None``: vLLM refuses) and group count."""

    concurrency: float | None
    groups: int


def vllm_groups(specs: Mapping[str, KVCacheSpec]) -> VllmGroups | None:
    """vLLM's grouping of ``specs`` (see the module doc); ``None`` where vLLM refuses (an MLA
    page it would have to pad)."""
    values = list(specs.values())
    if len({s.group_key for s in values}) == 1:
        return VllmGroups(values[0].page_size_bytes * len(values), {values[0]: 1})
    retention: set[Hashable] = {(s.retention_key, s.block_size) for s in values}
    if len(retention) == 1 and all(s.page_scales_with_block_size for s in values):
        return VllmGroups(sum(s.page_size_bytes for s in values), dict.fromkeys(values, 1), one_table=True)
    states = [s.page_size_bytes for s in values if not s.page_scales_with_block_size]
    if states:
        # the platform raises the attention block size until a page holds the largest state
        values = [_at_least(s, max(states)) if s.page_scales_with_block_size else s for s in values]
    largest = max(s.page_size_bytes for s in values)
    unified: list[KVCacheSpec] = []
    for spec in values:
        page = spec.page_size_bytes
        if page == largest or not spec.page_scales_with_block_size:
            unified.append(spec)  # a state page is padded to the largest
        elif largest % page == 0:
            unified.append(spec.with_block_size(spec.block_size * largest // page))
        elif isinstance(spec, MLAAttentionSpec):
            return None  # vLLM: MLA pages cannot be padded
        else:
            unified.append(spec)  # padded to the largest page
    buckets: dict[KVCacheSpec, int] = {}
    for spec in unified:
        buckets[spec] = buckets.get(spec, 0) + 1
    counts = list(buckets.values())
    size = max(counts) if max(counts) < 1.5 * min(counts) else min(counts)
    return VllmGroups(largest * size, {spec: cdiv(n, size) for spec, n in buckets.items()})


def vllm_pages(grouping: VllmGroups, context: SizingContext) -> int:
    """Block ids vLLM admits one request of ``context.max_model_len`` for: each group's own
    worst case by vLLM's rule (:func:`kvcore.integrations.vllm.rules.vllm_pages_per_request`,
    synchronous scheduling: ``context.max_num_batched_tokens`` tokens in flight), summed."""
    rules = VllmRules(
        max_model_len=context.max_model_len,
        max_num_batched_tokens=context.max_tokens_per_step,
        async_scheduling=False,
    )
    pages = [(vllm_pages_per_request(spec, rules), n) for spec, n in grouping.groups.items()]
    if grouping.one_table:
        return max(p for p, _ in pages)
    return sum(p * n for p, n in pages)


def vllm_style(specs: Mapping[str, KVCacheSpec], budget: int, context: SizingContext) -> VllmStyle:
    """The concurrency and group count of vLLM's grouping of ``specs`` (see the module doc).

    Args:
        specs: ``{layer: spec}``.
        budget: KV-cache bytes.
        context: the request length and step size.

    Returns:
        The figures.
    """
    grouping = vllm_groups(specs)
    if grouping is None:
        return VllmStyle(None, 0)
    blocks = budget // grouping.row_bytes
    groups = 1 if grouping.one_table else sum(grouping.groups.values())
    return VllmStyle(blocks / vllm_pages(grouping, context), groups)
