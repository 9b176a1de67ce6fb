"""Built-in kind ``mla``: multi-head latent attention (DeepSeek V2/V3), one latent per token."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import DType, dtype_size, to_dtype
from kvcore.hookspecs import hookimpl
from kvcore.spec import KVCacheSpec
from kvcore.validators import positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


@attrs.frozen(kw_only=True)
class MLAAttentionSpec(KVCacheSpec):
    """One compressed latent vector per token, shared by every head (no separate V).

    Page size: ``block_size x (kv_lora_rank + qk_rope_head_dim) x dtype bytes``. The latent is
    not sharded by tensor parallelism: every rank holds all of it. Every token stays, as in full
    attention: the default :meth:`~kvcore.KVCacheSpec.live_pages` and
    :meth:`~kvcore.KVCacheSpec.max_num_blocks` (``ceil(L / block_size)``) are this kind's.

    Attributes:
        kv_lora_rank: size of the compressed KV latent (512 on DeepSeek-V3).
        qk_rope_head_dim: size of the decoupled rotary key (64 on DeepSeek-V3).
        dtype: element type of the cache (a name or a torch dtype is converted).
    """

    kind = "mla"
    #: a latent page holds its block's tokens, written once: it may go to host and come back alone
    offload_unit = "block"

    kv_lora_rank: int = attrs.field(validator=positive_int)
    qk_rope_head_dim: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)

    @property
    def latent_size(self) -> int:
        """Elements cached per token: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.latent_size * dtype_size(self.dtype)

    @property
    def alignment_bytes(self) -> int:
        return dtype_size(self.dtype)


@hookimpl
def kvcore_register_spec_kinds(register: Callable[[type[KVCacheSpec]], None]) -> None:
    register(MLAAttentionSpec)


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """``(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)``."""
    if not isinstance(spec, MLAAttentionSpec):
        return None
    return CacheLayout.single("latent", (spec.block_size, spec.latent_size), spec.dtype, block_dim=0)


def mla_specs(
    *, block_sizes: SearchStrategy[int], dtypes: SearchStrategy[DType]
) -> SearchStrategy[MLAAttentionSpec]:
    """A hypothesis strategy for ``mla`` specs: latent sizes around DeepSeek's, scaled down
    (tests only; imports hypothesis when called).

    Args:
        block_sizes: where ``block_size`` comes from (the testing kit's ``block_sizes()``).
        dtypes: where ``dtype`` comes from (the testing kit's ``dtypes()``).

    Returns:
        A strategy drawing valid :class:`MLAAttentionSpec` instances.
    """
    from hypothesis import strategies as st

    return st.builds(
        MLAAttentionSpec,
        block_size=block_sizes,
        kv_lora_rank=st.sampled_from([16, 32, 64, 128, 512]),
        qk_rope_head_dim=st.sampled_from([8, 16, 32, 64]),
        dtype=dtypes,
    )


@hookimpl
def kvcore_register_spec_strategies(
    register: Callable[[type[KVCacheSpec], SearchStrategy[KVCacheSpec]], None],
    block_sizes: SearchStrategy[int],
    dtypes: SearchStrategy[DType],
) -> None:
    register(MLAAttentionSpec, mla_specs(block_sizes=block_sizes, dtypes=dtypes))
