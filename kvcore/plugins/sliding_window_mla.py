"""Built-in kind ``sliding_window_mla``: one latent vector per token over a sliding window
(DeepSeek-V4's sliding-window cache and its compressors' states).

Every DeepSeek-V4 layer attends to the last ``sliding_window`` tokens (128) besides its
compressed entries, and caches them as one ``head_dim``-element latent per token with no
separate V. vLLM 0.34 gives that cache (``<attention>.swa_cache``) a ``SlidingWindowMLASpec``
(``vllm/v1/attention/backends/mla/sparse_swa.py:120-147``): blocks of 64 tokens
(``sparse_swa.py:85`` and ``:109-111``), one head of ``head_dim`` elements and no V
(``head_size_v=0``, ``vllm/v1/kv_cache_interface.py:1022-1034``), packed as 584 bytes a token in the
``fp8_ds_mla`` layout (pages aligned to 576 bytes) or plain rows in the cache dtype (pages
aligned to 512); the page is padded up to that alignment (``_apply_alignment_padding``,
``kv_cache_interface.py:731-738``).

The compressors keep their unfinished groups the same way: a ``CompressorStateCache`` is a
``SlidingWindowMLASpec`` of float32 rows of ``2 x coff x head_dim`` elements (the running KV and
score states) over a window of ``coff x compress_ratio`` tokens, ``coff`` 2 on the overlapping
ratio-4 compressors and 1 on the ratio-128 ones, in blocks of 4 (ratio 4) or 8 (ratio 128)
tokens (``vllm/models/deepseek_v4/compressor.py:139-192`` and ``:297-302``).

Which pages a request holds is the sliding window's (:mod:`kvcore.plugins.sliding_window`): the
window of the next token and one step of new tokens, freed as decoding moves on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import DType, dtype_size, to_dtype, uint8
from kvcore.hookspecs import hookimpl
from kvcore.plugins.compressed_mla import aligned_pages, pad_to
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.plugins.sliding_window import window_max_blocks
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.validators import non_negative_int, positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


@attrs.frozen(kw_only=True)
class SlidingWindowMLASpec(KVCacheSpec):
    """One ``head_dim``-element row per token, over a window of ``sliding_window`` tokens.

    Page size: ``block_size x`` :attr:`bytes_per_token`, padded up to a multiple of
    ``page_alignment``. Worst case and freeing: those of
    :class:`~kvcore.plugins.sliding_window.SlidingWindowSpec`.

    Attributes:
        sliding_window: the window, in tokens (the token itself included).
        head_dim: elements of one token's row (the latent's ``head_dim``, 512; a compressor
            state's ``2 x coff x head_dim``).
        dtype: element type of a plain row; the fp8 dtype of a packed one.
        entry_bytes: bytes of one packed row (584 in vLLM's ``fp8_ds_mla`` layout); ``0``:
            plain, ``head_dim x dtype`` bytes.
        page_alignment: bytes a page is padded to a multiple of (vLLM's ``alignment``: 576 in
            the ``fp8_ds_mla`` layout, 512 otherwise); ``1``: no padding.
    """

    kind = "sliding_window_mla"
    #: these change the bytes of a page only, not which pages a request holds
    page_fields = ("head_dim", "dtype", "entry_bytes", "page_alignment")

    sliding_window: int = attrs.field(validator=positive_int)
    head_dim: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)
    entry_bytes: int = attrs.field(default=0, validator=non_negative_int)
    page_alignment: int = attrs.field(default=1, validator=positive_int)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's row takes."""
        return self.entry_bytes or self.head_dim * dtype_size(self.dtype)

    @property
    def page_size_bytes(self) -> int:
        return pad_to(self.block_size * self.bytes_per_token, self.page_alignment)

    @property
    def alignment_bytes(self) -> int:
        size = 1 if self.entry_bytes else dtype_size(self.dtype)
        return size if self.page_size_bytes % size == 0 else 1

    def max_num_blocks(self, context: SizingContext) -> int:
        return window_max_blocks(self.sliding_window, self.block_size, context)

    def first_retained_token(self, num_tokens: int) -> int:
        """``max(0, num_tokens - sliding_window + 1)``: the window of the next token."""
        return max(0, num_tokens - self.sliding_window + 1)


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """``(num_blocks, block_size, head_dim)`` in the dtype, or a packed row's bytes as uint8,
    as vLLM views the cache (``[B, H=1, N, C]`` squeezed, ``sparse_swa.py:116-118``)."""
    if not isinstance(spec, SlidingWindowMLASpec):
        return None
    if spec.entry_bytes or spec.page_size_bytes % dtype_size(spec.dtype):
        return CacheLayout.single("rows", (spec.block_size, spec.bytes_per_token), uint8)
    return CacheLayout.single("rows", (spec.block_size, spec.head_dim), spec.dtype)


def sliding_window_mla_specs(
    *, block_sizes: SearchStrategy[int], dtypes: SearchStrategy[DType], max_window: int = 1024
) -> SearchStrategy[SlidingWindowMLASpec]:
    """A :class:`~kvcore.plugins.kind_hooks.SpecStrategy` for ``sliding_window_mla`` specs of
    windows up to ``max_window``, packed or plain rows, alignments that pad nothing
    (:func:`~kvcore.plugins.compressed_mla.aligned_pages`)."""
    from hypothesis import strategies as st

    return aligned_pages(
        st.builds(
            SlidingWindowMLASpec,
            block_size=st.one_of(block_sizes, st.sampled_from([4, 8, 64])),
            sliding_window=st.integers(1, max_window),
            head_dim=st.sampled_from([16, 64, 512, 2048]),
            dtype=dtypes,
            entry_bytes=st.sampled_from([0, 0, 584]),
        )
    )


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    SlidingWindowMLASpec, sliding_window_mla_specs
)
