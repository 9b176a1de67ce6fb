"""Built-in kind ``dsa_indexer``: the key cache of DeepSeek's sparse attention (DSA) indexer.

DeepSeek-V3.2's *lightning indexer* scores every earlier token to pick the ``index_topk`` the MLA
layer attends to, so beside its MLA latent each layer caches one indexer key per token: one head
of ``index_head_dim`` elements, quantized to fp8 with one float32 scale per 128 elements. That
is 128 + 4 = 132 bytes a token for DeepSeek-V3.2, in both engines:

- vLLM 0.33 makes the layer ``DeepseekV32IndexerCache(head_dim=head_dim + head_dim //
  quant_block_size * 4, dtype=torch.uint8)`` with ``quant_block_size = 128``
  (``vllm/model_executor/models/deepseek_v2.py:723`` and ``:731-735``), whose spec is an
  ``MLAAttentionSpec`` of one head of that many bytes with ``cache_role=SparseCacheRole.INDEXER``
  (``deepseek_v2.py:658-666``), named ``<attention>.indexer.k_cache`` (kvcore names the layer
  after its module, ``<attention>.indexer``, as transformers' ``DeepseekV32Indexer`` is);
- SGLang 0.5.23 sizes ``index_head_dim + index_head_dim // 128 x 4`` uint8 a token and layer
  (``DSATokenToKVPool.quant_block_size = 128``, ``index_k_with_scale_buffer_dtype = torch.uint8``:
  ``sglang/srt/mem_cache/memory_pool.py:5279-5282``; ``DefaultPoolConfigurator
  ._compute_dsa_indexer_cell_size``, ``sglang/srt/model_executor/pool_configurator.py:560-634``).

The indexer reads every earlier token, so its cache keeps every token like full attention and
MLA: the default :meth:`~kvcore.KVCacheSpec.live_pages`, and one retention key with them, so a
planner may put indexer and MLA layers in one block table with pages of two sizes (vLLM does:
``UniformTypeKVCacheSpecs``). The key is not sharded by tensor parallelism (one head, replicated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs

from kvcore.cache_layout import CacheLayout
from kvcore.dtypes import DType, bfloat16, dtype_size, to_dtype, uint8
from kvcore.hookspecs import hookimpl
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.plugins.mla import SCALE_BYTES, MLAAttentionSpec, check_scale_block, scale_bytes
from kvcore.spec import KVCacheSpec
from kvcore.validators import non_negative_int, positive_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

#: Elements per float32 scale of DeepSeek's indexer keys (vLLM's ``quant_block_size``,
#: SGLang's ``DSATokenToKVPool.quant_block_size``; cited in the module docstring).
INDEXER_SCALE_BLOCK = 128
#: The indexer keys' dtype: fp8, whatever the cache dtype (vLLM stores them as uint8 fp8 bytes,
#: ``deepseek_v2.py:727-735``; SGLang's GPU sizing assumes fp8 too, ``pool_configurator.py:574``).
INDEXER_DTYPE = "float8_e4m3fn"


def index_key_bytes(index_head_dim: int, dtype: DType, scale_block_size: int) -> int:
    """Bytes one indexer key takes: its elements and their scales (one per
    ``scale_block_size`` elements; none at 0). DeepSeek-V3.2's and DeepSeek-V4's indexers share it."""
    return index_head_dim * dtype_size(dtype) + scale_bytes(index_head_dim, scale_block_size)


@attrs.frozen(kw_only=True)
class DSAIndexerSpec(KVCacheSpec):
    """One indexer key per token: ``index_head_dim`` elements and their float32 scales.

    Page size: ``block_size x`` :attr:`bytes_per_token` ``= index_head_dim x dtype bytes +
    index_head_dim / scale_block_size x 4`` (132 for DeepSeek-V3.2: 128 fp8 and one scale).
    Every token stays, as in full attention and MLA.

    Attributes:
        index_head_dim: elements of the key (the config's ``index_head_dim``, 128).
        dtype: element type of the key (fp8 ``float8_e4m3fn`` on GPUs).
        scale_block_size: key elements per float32 scale (128, the default); ``0``: no scales
            (a key stored unquantized, as SGLang's NPU pool keeps a bfloat16 one).
    """

    kind = "dsa_indexer"
    #: an index-key page holds its block's tokens, written once: it may go to host and come back alone
    offload_unit = "block"
    #: the field ``scale_block_size`` divides
    scaled_field: ClassVar[str] = "index_head_dim"

    index_head_dim: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)
    scale_block_size: int = attrs.field(
        default=INDEXER_SCALE_BLOCK, validator=[non_negative_int, check_scale_block]
    )

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's key takes: its elements and their scales."""
        return index_key_bytes(self.index_head_dim, self.dtype, self.scale_block_size)

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    @property
    def alignment_bytes(self) -> int:
        # the page is seen as bytes; its widest element is a float32 scale when it has scales
        widest = max(dtype_size(self.dtype), SCALE_BYTES if self.scale_block_size else 1)
        return widest if self.bytes_per_token % widest == 0 else 1


def dsa_latent(spec: MLAAttentionSpec) -> MLAAttentionSpec:
    """A DSA model's MLA latent as its sparse kernels store it: an fp8 cache packed with a
    float32 scale per 128 elements and a bfloat16 rotary part (vLLM's ``fp8_ds_mla``, 656 bytes
    on DeepSeek-V3.2; :mod:`kvcore.plugins.mla`); a cache of any other dtype stays plain."""
    if dtype_size(spec.dtype) != 1 or spec.kv_lora_rank % INDEXER_SCALE_BLOCK:
        return spec
    return attrs.evolve(spec, scale_block_size=INDEXER_SCALE_BLOCK, rope_dtype=bfloat16)


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """``(num_blocks, block_size, bytes_per_token)`` uint8, the view vLLM gives the indexer's
    ``k_cache`` (a 3-D block-major uint8 cache, ``deepseek_v2.py:653-656``); the indexer kernels
    read the bytes of a block as its keys and their scales."""
    if not isinstance(spec, DSAIndexerSpec):
        return None
    return CacheLayout.single("index_k", (spec.block_size, spec.bytes_per_token), uint8, block_dim=0)


def dsa_indexer_specs(
    *, block_sizes: SearchStrategy[int], dtypes: SearchStrategy[DType]
) -> SearchStrategy[DSAIndexerSpec]:
    """A :class:`~kvcore.plugins.kind_hooks.SpecStrategy` for ``dsa_indexer`` specs around
    DeepSeek's."""
    from hypothesis import strategies as st

    # every head dim drawn divides by every scale block drawn
    return st.builds(
        DSAIndexerSpec,
        block_size=block_sizes,
        index_head_dim=st.sampled_from([32, 64, 128, 256]),
        dtype=dtypes,
        scale_block_size=st.sampled_from([0, 16, 32]),
    )


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(DSAIndexerSpec, dsa_indexer_specs)
