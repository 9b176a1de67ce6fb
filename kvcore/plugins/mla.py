"""Built-in kind ``mla``: multi-head latent attention (DeepSeek V2/V3), one latent per token.

The latent is stored plain (every element in ``dtype``) or, as DeepSeek-V3.2's sparse-attention
kernels read it, packed: the ``kv_lora_rank`` part quantized with one float32 scale per
``scale_block_size`` elements and the rotary part kept in ``rope_dtype``. vLLM calls that packed
page ``fp8_ds_mla``: 512 fp8 + 4 x 4 float32 scales + 64 bfloat16 = 656 bytes a token
(vllm 0.33 ``vllm/v1/attention/backends/mla/flashmla_sparse.py:79-87``; the spec's
``state_content_bytes=656`` in ``vllm/model_executor/layers/attention/mla_attention.py:1386``),
and SGLang 0.5.23 sizes the same bytes for an fp8 DSA cache (``kv_lora_rank + kv_lora_rank // 128
x 4 + qk_rope_head_dim x 2``: ``calculate_mla_kv_cache_dim``,
``sglang/srt/mem_cache/kv_cache_configurator.py:3468-3476``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import DType, dtype_size, to_dtype, uint8
from kvcore.errors import InvalidSpecError
from kvcore.hookspecs import hookimpl
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.spec import OMIT_IF_DEFAULT, KVCacheSpec
from kvcore.validators import non_negative_int, positive_int

#: Bytes of one quantization scale of a packed latent (a float32).
SCALE_BYTES = 4


def scale_bytes(elements: int, scale_block_size: int) -> int:
    """Bytes of the float32 scales of ``elements`` quantized in blocks of ``scale_block_size``
    (``0``: not quantized, no scales)."""
    return elements // scale_block_size * SCALE_BYTES if scale_block_size else 0


def check_scale_block(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    """A ``scale_block_size`` must divide the elements it scales (the field the kind's
    ``scaled_field`` class attribute names)."""
    field: str = type(instance).scaled_field
    scaled = getattr(instance, field)
    if value and scaled % value:
        raise InvalidSpecError(
            f"{attribute.name!r} {value} must divide {field} {scaled}: one float32 scale covers a whole "
            "block of elements (DeepSeek's kernels use 128)"
        )


def _optional_dtype(value: object) -> DType | None:
    return None if value is None else to_dtype(value)  # type: ignore[arg-type]


if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


@attrs.frozen(kw_only=True)
class MLAAttentionSpec(KVCacheSpec):
    """One compressed latent vector per token, shared by every head (no separate V).

    Page size: ``block_size x`` :attr:`bytes_per_token`, plain ``(kv_lora_rank +
    qk_rope_head_dim) x dtype bytes``; packed (a ``scale_block_size`` or a ``rope_dtype``),
    ``kv_lora_rank x dtype bytes + kv_lora_rank / scale_block_size x 4 + qk_rope_head_dim x
    rope_dtype bytes`` (656 for DeepSeek-V3.2's fp8 cache, vLLM's ``fp8_ds_mla``). The latent is
    not sharded by tensor parallelism: every rank holds all of it. Every token stays, as in full
    attention: the default :meth:`~kvcore.KVCacheSpec.live_pages` and
    :meth:`~kvcore.KVCacheSpec.max_num_blocks` (``ceil(L / block_size)``) are this kind's.

    Attributes:
        kv_lora_rank: size of the compressed KV latent (512 on DeepSeek-V3).
        qk_rope_head_dim: size of the decoupled rotary key (64 on DeepSeek-V3).
        dtype: element type of the cache (a name or a torch dtype is converted); of the
            ``kv_lora_rank`` part when the latent is packed.
        scale_block_size: ``kv_lora_rank`` elements per float32 scale stored beside them
            (128 in ``fp8_ds_mla``); ``0``, the default: no scales.
        rope_dtype: element type of the ``qk_rope_head_dim`` part when it differs from
            ``dtype`` (bfloat16 in ``fp8_ds_mla``); ``None``, the default: ``dtype``.
    """

    kind = "mla"
    #: a latent page holds its block's tokens, written once: it may go to host and come back alone
    offload_unit = "block"
    #: the field ``scale_block_size`` divides
    scaled_field: ClassVar[str] = "kv_lora_rank"

    kv_lora_rank: int = attrs.field(validator=positive_int)
    qk_rope_head_dim: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)
    scale_block_size: int = attrs.field(
        default=0, validator=[non_negative_int, check_scale_block], metadata={OMIT_IF_DEFAULT: True}
    )
    rope_dtype: DType | None = attrs.field(
        default=None, converter=_optional_dtype, metadata={OMIT_IF_DEFAULT: True}
    )

    @property
    def latent_size(self) -> int:
        """Elements cached per token: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def is_packed(self) -> bool:
        """Whether the latent is stored with scales or a rotary part of its own dtype."""
        return bool(self.scale_block_size) or (self.rope_dtype is not None and self.rope_dtype != self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's latent takes: its two parts and the scales of the first."""
        rope = self.dtype if self.rope_dtype is None else self.rope_dtype
        return (
            self.kv_lora_rank * dtype_size(self.dtype)
            + scale_bytes(self.kv_lora_rank, self.scale_block_size)
            + self.qk_rope_head_dim * dtype_size(rope)
        )

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    @property
    def alignment_bytes(self) -> int:
        if not self.is_packed:
            return dtype_size(self.dtype)
        # a packed page is seen as bytes; its widest element is a float32 scale or the rope part
        rope = self.dtype if self.rope_dtype is None else self.rope_dtype
        widest = max(dtype_size(self.dtype), dtype_size(rope), SCALE_BYTES if self.scale_block_size else 1)
        return widest if self.bytes_per_token % widest == 0 else 1


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """``(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)``; a packed latent as bytes,
    ``(num_blocks, block_size, bytes_per_token)`` uint8, as vLLM views an ``fp8_ds_mla`` cache
    (``STR_DTYPE_TO_TORCH_DTYPE["fp8_ds_mla"]`` is ``torch.uint8``, vllm 0.33
    ``vllm/utils/torch_utils.py:54``)."""
    if not isinstance(spec, MLAAttentionSpec):
        return None
    if spec.is_packed:
        return CacheLayout.single("latent", (spec.block_size, spec.bytes_per_token), uint8, block_dim=0)
    return CacheLayout.single("latent", (spec.block_size, spec.latent_size), spec.dtype, block_dim=0)


def mla_specs(
    *, block_sizes: SearchStrategy[int], dtypes: SearchStrategy[DType]
) -> SearchStrategy[MLAAttentionSpec]:
    """A :class:`~kvcore.plugins.kind_hooks.SpecStrategy` for ``mla`` specs: latent sizes around
    DeepSeek's, scaled down, the dtype drawn for the rotary part too."""
    from hypothesis import strategies as st

    # every rank drawn divides by the scale blocks drawn; a packed latent is drawn one time in three
    return st.builds(
        MLAAttentionSpec,
        block_size=block_sizes,
        kv_lora_rank=st.sampled_from([16, 32, 64, 128, 512]),
        qk_rope_head_dim=st.sampled_from([8, 16, 32, 64]),
        dtype=dtypes,
        scale_block_size=st.sampled_from([0, 0, 16]),
        rope_dtype=st.one_of(st.none(), st.none(), dtypes),
    )


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(MLAAttentionSpec, mla_specs)
