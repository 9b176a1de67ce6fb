"""Built-in kind ``compressed_mla``: a latent cache of one entry per ``compress_ratio`` tokens
(DeepSeek-V4's compressed attention).

DeepSeek-V4's compressed layers do not cache one latent per token: a compressor folds every
``compress_ratio`` tokens (4 on its "compressed sparse attention" layers, 128 on its "heavily
compressed" ones) into one ``head_dim``-element entry, and attention reads those entries. vLLM
0.34 gives such a layer an ``MLAAttentionSpec`` of one head of ``head_dim`` elements with
``tokens_per_state=compress_ratio`` (``vllm/models/deepseek_v4/attention.py:817-840``), whose page
holds ``block_size // tokens_per_state`` entries (``num_states``,
``vllm/v1/kv_cache_interface.py:257-264``) of ``state_content_bytes`` each (``:596-605``), padded
up to a multiple of its ``alignment`` (``_apply_alignment_padding``, ``:731-738``):

- the ``fp8_ds_mla`` layout (FlashMLA, vLLM's default on CUDA: an ``auto`` or fp8 cache dtype
  becomes ``fp8_ds_mla``, ``attention.py:95-131``) packs an entry as 448 fp8 NoPE elements, the
  64 rotary elements in bfloat16 and 8 UE8M0 scale bytes (7 of them used, one per 64 NoPE
  elements): 584 bytes (``attention.py:838-839``; the layout in
  ``vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py:188-195``), pages aligned
  to 576 bytes;
- plain rows (vLLM's FlashInfer backends) store the ``head_dim`` elements in the cache dtype
  (``head_size_v=0``: no separate V, ``kv_cache_interface.py:741-753``), pages aligned to 512.

A request keeps every entry, as MLA keeps every token: page ``k`` holds the entries of tokens
``[k*B, (k+1)*B)`` (the entry of a group of ``compress_ratio`` tokens is written when its last
token is), so the default :meth:`~kvcore.KVCacheSpec.live_pages` is this kind's, and its
retention key is the one of full attention and MLA of the same block size. When the block size
is no multiple of ``compress_ratio`` (never in vLLM, whose DeepSeek-V4 pages are 256 tokens) a
page holds the at most ``ceil(B / compress_ratio)`` entries whose groups end in it.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar, TypeVar

import attrs

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import DType, dtype_size, to_dtype, uint8
from kvcore.hookspecs import hookimpl
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.spec import KVCacheSpec, cdiv
from kvcore.validators import non_negative_int, positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

#: A spec kind with a ``page_alignment`` field.
_C = TypeVar("_C", bound=KVCacheSpec)


def pad_to(size: int, alignment: int) -> int:
    """``size`` rounded up to a multiple of ``alignment`` (vLLM's ``round_up`` of a page)."""
    return cdiv(size, alignment) * alignment


@attrs.frozen(kw_only=True)
class CompressedSpec(KVCacheSpec):
    """The base of the kinds that cache one entry per ``compress_ratio`` tokens.

    Page size: ``ceil(block_size / compress_ratio) x`` :attr:`bytes_per_entry`, padded up to a
    multiple of ``page_alignment``. Not registered itself: :class:`CompressedMLASpec` and
    :class:`~kvcore.plugins.compressed_indexer.CompressedIndexerSpec` are.

    Attributes:
        compress_ratio: tokens one entry covers (4 or 128 on DeepSeek-V4).
        page_alignment: bytes a page is padded to a multiple of (vLLM's ``alignment``: 576 in
            the ``fp8_ds_mla`` layout, 512 otherwise); ``1``: no padding.
    """

    #: an entry page holds its block's tokens, written once: it may go to host and come back alone
    offload_unit = "block"
    #: padding changes the bytes of a page only
    page_fields: ClassVar[tuple[str, ...]] = ("page_alignment",)

    compress_ratio: int = attrs.field(validator=positive_int)
    page_alignment: int = attrs.field(default=1, validator=positive_int)

    @property
    @abc.abstractmethod
    def bytes_per_entry(self) -> int:
        """Bytes one entry takes."""

    @property
    def entries_per_page(self) -> int:
        """Entries one page holds: ``ceil(block_size / compress_ratio)`` (``block_size //
        compress_ratio`` in vLLM, whose block sizes are multiples of the ratio)."""
        return cdiv(self.block_size, self.compress_ratio)

    @property
    def page_size_bytes(self) -> int:
        return pad_to(self.entries_per_page * self.bytes_per_entry, self.page_alignment)


@attrs.frozen(kw_only=True)
class CompressedMLASpec(CompressedSpec):
    """A compressed latent: one ``head_dim``-element entry per ``compress_ratio`` tokens.

    Attributes:
        head_dim: latent elements of one entry (``head_dim``, 512 on DeepSeek-V4).
        dtype: element type of a plain entry; the fp8 dtype of a packed one.
        entry_bytes: bytes of one packed entry (584 in vLLM's ``fp8_ds_mla`` layout); ``0``:
            plain, ``head_dim x dtype`` bytes.
    """

    kind = "compressed_mla"
    page_fields = ("head_dim", "dtype", "entry_bytes", "page_alignment")

    head_dim: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)
    entry_bytes: int = attrs.field(default=0, validator=non_negative_int)

    @property
    def bytes_per_entry(self) -> int:
        return self.entry_bytes or self.head_dim * dtype_size(self.dtype)

    @property
    def alignment_bytes(self) -> int:
        size = 1 if self.entry_bytes else dtype_size(self.dtype)
        return size if self.page_size_bytes % size == 0 else 1


def entry_layout(spec: CompressedSpec, elements: int, dtype: DType, packed: bool) -> CacheLayout:
    """``(num_blocks, entries_per_page, elements)`` in ``dtype``, or a packed entry's bytes as
    uint8, as vLLM views such a cache (``[B, H=1, N, C]`` squeezed to ``[B, N, C]``,
    ``attention.py:810-812``); padding, if any, follows the entries."""
    if packed or spec.page_size_bytes % dtype_size(dtype):
        return CacheLayout.single("entries", (spec.entries_per_page, spec.bytes_per_entry), uint8)
    return CacheLayout.single("entries", (spec.entries_per_page, elements), dtype)


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """A compressed latent's entries (:func:`entry_layout`)."""
    if not isinstance(spec, CompressedMLASpec):
        return None
    return entry_layout(spec, spec.head_dim, spec.dtype, packed=bool(spec.entry_bytes))


def aligned_pages(spec_strategy: SearchStrategy[_C]) -> SearchStrategy[_C]:
    """``spec_strategy``'s specs, each given a ``page_alignment`` its page is already a multiple
    of (1, 64, 512 or 576), so padding never changes the drawn page.

    A page padded at one block size can hold more tokens a byte at a larger one (padding 1,168
    bytes to 1,728 wastes a third; 2,336 to 2,880 a fifth), so a policy that enlarges the block
    would beat the ideal bound, which is measured at the spec's own block size. The drawn specs
    keep that bound exact; padding itself is tested on DeepSeek-V4's real pages.
    """
    from hypothesis import strategies as st

    def with_alignment(spec: _C) -> SearchStrategy[_C]:
        page = spec.page_size_bytes
        fitting = [a for a in (1, 64, 512, 576) if page % a == 0]
        # every kind drawn through here has the field; mypy sees only the bound, KVCacheSpec
        return st.sampled_from(fitting).map(lambda a: attrs.evolve(spec, **{"page_alignment": a}))

    return spec_strategy.flatmap(with_alignment)


def compressed_mla_specs(
    *, block_sizes: SearchStrategy[int], dtypes: SearchStrategy[DType]
) -> SearchStrategy[CompressedMLASpec]:
    """A :class:`~kvcore.plugins.kind_hooks.SpecStrategy` for ``compressed_mla`` specs: ratios
    around DeepSeek-V4's, block sizes that are multiples of them as in vLLM (a block of a
    fraction of an entry rounds its page up, so a larger block would hold more a byte), packed
    or plain entries, pages whose alignment pads nothing (:func:`aligned_pages`)."""
    from hypothesis import strategies as st

    def build(ratio: int) -> SearchStrategy[CompressedMLASpec]:
        return st.builds(
            CompressedMLASpec,
            block_size=st.one_of(block_sizes, st.sampled_from([1, 2])).map(lambda m: m * ratio),
            compress_ratio=st.just(ratio),
            head_dim=st.sampled_from([16, 64, 128, 512]),
            dtype=dtypes,
            entry_bytes=st.sampled_from([0, 0, 584, 72]),
        )

    return aligned_pages(st.sampled_from([1, 2, 4, 8, 128]).flatmap(build))


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
    CompressedMLASpec, compressed_mla_specs
)
