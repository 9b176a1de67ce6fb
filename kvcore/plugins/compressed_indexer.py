"""Built-in kind ``compressed_indexer``: DeepSeek-V4's Lightning-indexer key cache, one key per
``compress_ratio`` tokens.

On DeepSeek-V4's ratio-4 layers ("compressed sparse attention") an indexer scores the
compressed entries to pick the ``index_topk`` that attention reads; it caches one compressed
key per ``compress_ratio`` tokens, quantized as DeepSeek-V3.2's indexer keys are
(:mod:`kvcore.plugins.dsa_indexer`): ``index_head_dim`` fp8 elements and one float32 scale per
128, 128 + 4 = 132 bytes (vLLM 0.34, ``vllm/models/deepseek_v4/attention.py:977-993``: the
``k_cache_head_dim`` of the FP8 indexer cache, stored as uint8). vLLM's spec for it is an
``MLAAttentionSpec`` of one head of those bytes with ``tokens_per_state=compress_ratio``, pages
aligned to 576 bytes in the ``fp8_ds_mla`` layout and 512 otherwise (``attention.py:868-881``);
vLLM names the layer ``<attention>.indexer.k_cache``. (vLLM's MXFP4 indexer cache,
``indexer_kv_dtype="mxfp4"``, 68 bytes a key, is not the default and kvcore does not plan it.)

The page is the one of :class:`~kvcore.plugins.compressed_mla.CompressedSpec`: the entries of
a block's tokens, padded to ``page_alignment``; every entry stays, as in the compressed latent
it indexes, so the two share a retention key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import DType, to_dtype
from kvcore.hookspecs import hookimpl
from kvcore.plugins.compressed_mla import CompressedSpec, aligned_pages, entry_layout
from kvcore.plugins.dsa_indexer import INDEXER_SCALE_BLOCK, index_key_bytes
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.plugins.mla import check_scale_block
from kvcore.spec import KVCacheSpec
from kvcore.validators import non_negative_int, positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


@attrs.frozen(kw_only=True)
class CompressedIndexerSpec(CompressedSpec):
    """One indexer key per ``compress_ratio`` tokens: ``index_head_dim`` elements and their
    float32 scales.

    Attributes:
        index_head_dim: elements of a key (the config's ``index_head_dim``, 128).
        dtype: element type of a key (fp8 ``float8_e4m3fn`` in vLLM).
        scale_block_size: key elements per float32 scale (128, the default); ``0``: no scales.
    """

    kind = "compressed_indexer"
    page_fields = ("index_head_dim", "dtype", "scale_block_size", "page_alignment")
    #: the field ``scale_block_size`` divides
    scaled_field: ClassVar[str] = "index_head_dim"

    index_head_dim: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)
    scale_block_size: int = attrs.field(
        default=INDEXER_SCALE_BLOCK, validator=[non_negative_int, check_scale_block]
    )

    @property
    def bytes_per_entry(self) -> int:
        """Bytes one key takes: its elements and their scales (132 on DeepSeek-V4)."""
        return index_key_bytes(self.index_head_dim, self.dtype, self.scale_block_size)


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """The keys of a page as bytes, ``(num_blocks, entries_per_page, bytes_per_entry)`` uint8,
    as vLLM views the indexer's ``k_cache`` (``attention.py:864-866``)."""
    if not isinstance(spec, CompressedIndexerSpec):
        return None
    return entry_layout(spec, spec.index_head_dim, spec.dtype, packed=True)


def compressed_indexer_specs(
    *, block_sizes: SearchStrategy[int], dtypes: SearchStrategy[DType]
) -> SearchStrategy[CompressedIndexerSpec]:
    """A :class:`~kvcore.plugins.kind_hooks.SpecStrategy` for ``compressed_indexer`` specs
    around DeepSeek-V4's, drawn as :func:`~kvcore.plugins.compressed_mla.compressed_mla_specs`
    draws its (block sizes multiples of the ratio, alignments that pad nothing)."""
    from hypothesis import strategies as st

    def build(ratio: int) -> SearchStrategy[CompressedIndexerSpec]:
        # every head dim drawn divides by every scale block drawn
        return st.builds(
            CompressedIndexerSpec,
            block_size=st.one_of(block_sizes, st.sampled_from([1, 2])).map(lambda m: m * ratio),
            compress_ratio=st.just(ratio),
            index_head_dim=st.sampled_from([32, 64, 128]),
            dtype=dtypes,
            scale_block_size=st.sampled_from([0, 16, 32]),
        )

    return aligned_pages(st.sampled_from([1, 2, 4, 8]).flatmap(build))


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    CompressedIndexerSpec, compressed_indexer_specs
)
