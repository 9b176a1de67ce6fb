"""Family ``deepseek_v4``: DeepSeek-V4's sliding-window latents, compressed latents, compressor
states and Lightning-indexer keys, laid out as vLLM 0.34 caches them.

Every layer attends to its last ``sliding_window`` tokens (128) and, unless it is a plain
sliding layer, to compressed entries of ``compress_ratio`` tokens each. A layer's type comes
from ``layer_types`` (transformers 5.24's ``DeepseekV4Config``: ``sliding_attention``,
``compressed_sparse_attention``, ``heavily_compressed_attention``) and its ratio from
``compress_rates`` (default ``{"compressed_sparse_attention": 4,
"heavily_compressed_attention": 128}``; a sliding layer has none); a config of the published
checkpoints' older form lists the ratios per layer instead (``compress_ratios``: 0, 4 or 128,
one per layer, the MTP layer's after them), and one with neither gets transformers' default
schedule: two ratio-128 layers, then ratio 128 and 4 in turn
(``transformers/models/deepseek_v4/configuration_deepseek_v4.py:264-274``). vLLM reads the ratio
the same way (``max(1, config.compress_rates.get(layer_type, 0))``,
``vllm/models/deepseek_v4/attention.py:238-243``).

What each layer ``model.layers.{i}.attn`` caches, under vLLM's layer names (vLLM 0.34):

- ``.swa_cache``: the window, one latent row of ``head_dim`` elements per token in blocks of
  64 tokens (:class:`~kvcore.plugins.sliding_window_mla.SlidingWindowMLASpec`;
  ``vllm/v1/attention/backends/mla/sparse_swa.py:76-147``);
- on a compressed layer, the layer itself: one ``head_dim`` entry per ``compress_ratio`` tokens
  in blocks of 256 tokens (:class:`~kvcore.plugins.compressed_mla.CompressedMLASpec`;
  ``attention.py:817-840``; 256 is the only kernel block size of vLLM's DeepSeek-V4 sparse MLA
  backend, ``vllm/models/deepseek_v4/sparse_mla.py:59-61``, and its CPU backend forces it,
  ``vllm/platforms/cpu.py:298-308``), and ``.compressor.state_cache``: the compressor's float32
  states over ``coff x ratio`` tokens (``coff`` 2 at ratio 4, 1 at ratio 128) in blocks of 4 or
  8 tokens (``vllm/models/deepseek_v4/compressor.py:139-192``, ``:297-302``);
- on a ratio-4 layer ("only C4A uses sparse attention and hence has indexer",
  ``attention.py:304``), ``.indexer.k_cache``: one 132-byte key per 4 tokens
  (:class:`~kvcore.plugins.compressed_indexer.CompressedIndexerSpec`, ``attention.py:868-881``
  and ``:977-993``) and ``.indexer.compressor.state_cache``, the indexer compressor's states
  (``index_head_dim`` rows, same rule).

SGLang sizes the same bytes (``python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py`` at
commit ``007bddd``): a token or compressed entry of ``qk_nope_head_dim`` fp8 bytes,
``qk_rope_head_dim`` bfloat16 elements, one scale byte per 64 NoPE elements and one byte of
padding, 584 bytes, pages padded to multiples of 576 (``DeepSeekV4SingleKVPool
.get_bytes_per_token`` and ``.create_buffer``); indexer keys of ``index_head_dim + index_head_dim
/ 128 x 4`` bytes (``get_dsv4_indexer_bytes_per_token``); compressor states kept for 8 tokens at
ratio 4 and 128 at ratio 128 (``get_compress_state_ring_size``: ``coff x ratio``) and the window
for ``sliding_window`` tokens (``get_swa_ring_size``). It pages its pools in its own units
(compressed entries, ring slots), so only the bytes a token or entry compare, not the blocks.

The cache dtype picks the layout, as vLLM's backends do (``_resolve_dsv4_kv_cache_dtype``,
``attention.py:95-131``): an fp8 cache (``--kv-cache-dtype fp8``; vLLM's FlashMLA backend, its
default on CUDA, turns ``auto`` into it too) is the packed ``fp8_ds_mla`` layout, 448 fp8 NoPE
elements, 64 bfloat16 rotary ones and 8 UE8M0 scale bytes, 584 bytes a token or entry, pages
padded to multiples of 576 bytes; any other is plain bfloat16 rows (vLLM's plain-row backends
store ``auto`` and ``bfloat16`` so), pages padded to multiples of 512 bytes. The indexer keys
are fp8 whatever the cache dtype and the compressor states float32. Nothing is sharded by
tensor parallelism (one head, ``max_tp_shards=1``). The block sizes are vLLM's own for this
model and ``block_size`` does not change them. vLLM's MTP layer (``num_nextn_predict_layers``)
is not planned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.dtypes import DType, bfloat16, dtype_size, float32
from kvcore.errors import ModelConfigError
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.compressed_indexer import CompressedIndexerSpec
from kvcore.plugins.compressed_mla import CompressedMLASpec
from kvcore.plugins.dsa_indexer import INDEXER_DTYPE, INDEXER_SCALE_BLOCK
from kvcore.plugins.models.kit import SLIDING, ConfigFields, family_hook, heads_refusal
from kvcore.plugins.sliding_window_mla import SlidingWindowMLASpec
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("deepseek_v4",)
#: A compressed-sparse-attention layer (ratio 4, with an indexer).
CSA = "compressed_sparse_attention"
#: A heavily-compressed-attention layer (ratio 128).
HCA = "heavily_compressed_attention"
#: transformers 5.24's ``DeepseekV4Config.default_compress_rates``.
DEFAULT_COMPRESS_RATES = {CSA: 4, HCA: 128}
#: The legacy per-layer ratios' layer types (``_COMPRESS_RATIO_TO_LAYER_TYPE`` in
#: transformers 5.24's ``configuration_deepseek_v4.py``).
RATIO_LAYER_TYPES = {0: SLIDING, 4: CSA, 128: HCA}
#: The compress ratios vLLM builds (``assert compress_ratio in [4, 128]``,
#: ``compressor.py:158``); the ratio-4 compressor overlaps two groups (``coff`` 2).
RATIOS = (4, 128)
#: The ratio whose layers have a Lightning indexer (``attention.py:304``).
INDEXED_RATIO = 4

#: Block sizes vLLM 0.34 gives DeepSeek-V4's caches (module docstring): the compressed latents
#: and indexer keys, the sliding window, and the compressor states of ratio 4 and 128.
COMPRESSED_BLOCK = 256
WINDOW_BLOCK = 64
STATE_BLOCKS = {4: 4, 128: 8}

#: The ``fp8_ds_mla`` packing of one token or entry: fp8 NoPE elements, bfloat16 rotary
#: elements and one UE8M0 scale byte per 64 NoPE elements plus one byte of padding (7 + 1 on
#: DeepSeek-V4: ``vllm/models/deepseek_v4/common/ops/cache_utils.py:60-68``).
NOPE_PER_SCALE = 64
SCALE_PADDING = 1
#: vLLM's page alignments: the ``fp8_ds_mla`` layout's, every other layout's
#: (``attention.py:834``, ``sparse_swa.py:141``, ``compressor.py:191``).
PACKED_ALIGNMENT = 576
PLAIN_ALIGNMENT = 512


def packed_bytes(head_dim: int, rope_dim: int) -> int:
    """Bytes of one ``fp8_ds_mla`` row: ``(head_dim - rope_dim)`` fp8 + ``rope_dim`` bfloat16 +
    ``(head_dim - rope_dim) / 64 + 1`` scale bytes (584 for 512 and 64: vLLM's
    ``state_content_bytes=584``, ``attention.py:837-839``; SGLang's
    ``DeepSeekV4SingleKVPool.get_bytes_per_token``, the same sum)."""
    nope = head_dim - rope_dim
    return nope + rope_dim * dtype_size(bfloat16) + nope // NOPE_PER_SCALE + SCALE_PADDING


def layer_ratios(cfg: ConfigFields, n: int) -> list[int]:
    """Each layer's compress ratio (``0``: a sliding layer), read as the module docstring says."""
    types = cfg.layer_types(n)
    if types is None:
        ratios = cfg.integers("compress_ratios")
        if ratios is not None:
            if len(ratios) < n:
                raise cfg.error(
                    "compress_ratios",
                    f"lists {len(ratios)} ratios but 'num_hidden_layers' is {n}; give one per layer",
                )
            types = []
            for i, ratio in enumerate(ratios[:n]):
                if ratio not in RATIO_LAYER_TYPES:
                    raise cfg.error(
                        "compress_ratios", f"has {ratio} at layer {i}; DeepSeek-V4 layers use 0, 4 or 128"
                    )
                types.append(RATIO_LAYER_TYPES[ratio])
        else:
            types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    rates = cfg.data.get("compress_rates")
    if rates is None:
        rates = DEFAULT_COMPRESS_RATES
    elif not isinstance(rates, Mapping):
        raise cfg.error("compress_rates", f"must map layer types to ratios (got {rates!r})")
    out = []
    for i, layer_type in enumerate(types):
        if layer_type not in (SLIDING, CSA, HCA):
            raise cfg.error(
                "layer_types",
                f"has {layer_type!r} at layer {i}; DeepSeek-V4 layers are {SLIDING!r}, {CSA!r} or {HCA!r}",
            )
        ratio = rates.get(layer_type, 0)
        if not isinstance(ratio, int) or isinstance(ratio, bool) or (ratio > 1 and ratio not in RATIOS):
            raise cfg.error(
                "compress_rates",
                f"gives {layer_type!r} the ratio {ratio!r}; vLLM builds DeepSeek-V4 compressors of "
                f"ratio {' or '.join(map(str, RATIOS))} only (a sliding layer has none)",
            )
        out.append(ratio if ratio > 1 else 0)
    return out


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a DeepSeek-V4 config (module docstring)."""
    cfg = ConfigFields(config, "deepseek_v4")
    n = cfg.layer_count()
    if cfg.has("num_attention_heads"):
        refusal = heads_refusal(cfg, "num_attention_heads", cfg.integer("num_attention_heads"), options)
        if refusal is not None:
            raise refusal
    head_dim = cfg.integer("head_dim", 512)
    rope_dim = rope_head_dim(cfg, head_dim)
    window = cfg.integer("sliding_window", 128)
    index_head_dim = cfg.integer("index_head_dim", 128)
    ratios = layer_ratios(cfg, n)

    dtype: DType = options.cache_dtype(cfg.dtype())
    packed = dtype_size(dtype) == 1
    if packed:
        row_dtype, row_bytes, alignment = dtype, packed_bytes(head_dim, rope_dim), PACKED_ALIGNMENT
    else:
        row_dtype, row_bytes, alignment = bfloat16, 0, PLAIN_ALIGNMENT

    window_spec = SlidingWindowMLASpec(
        block_size=WINDOW_BLOCK,
        sliding_window=window,
        head_dim=head_dim,
        dtype=row_dtype,
        entry_bytes=row_bytes,
        page_alignment=alignment,
    )
    latents = {
        ratio: CompressedMLASpec(
            block_size=COMPRESSED_BLOCK,
            compress_ratio=ratio,
            head_dim=head_dim,
            dtype=row_dtype,
            entry_bytes=row_bytes,
            page_alignment=alignment,
        )
        for ratio in RATIOS
    }

    def state(ratio: int, dim: int) -> SlidingWindowMLASpec:
        coff = 2 if ratio == INDEXED_RATIO else 1
        return SlidingWindowMLASpec(
            block_size=STATE_BLOCKS[ratio],
            sliding_window=coff * ratio,
            head_dim=2 * coff * dim,
            dtype=float32,
            page_alignment=alignment,
        )

    states = {ratio: state(ratio, head_dim) for ratio in RATIOS}
    indexer = CompressedIndexerSpec(
        block_size=COMPRESSED_BLOCK,
        compress_ratio=INDEXED_RATIO,
        index_head_dim=index_head_dim,
        dtype=INDEXER_DTYPE,
        scale_block_size=INDEXER_SCALE_BLOCK if index_head_dim % INDEXER_SCALE_BLOCK == 0 else 0,
        page_alignment=alignment,
    )
    indexer_state = state(INDEXED_RATIO, index_head_dim)

    specs: dict[str, KVCacheSpec] = {}
    for i, ratio in enumerate(ratios):
        attn = f"model.layers.{i}.attn"
        if ratio:
            specs[attn] = latents[ratio]
        specs[f"{attn}.swa_cache"] = window_spec
        if ratio:
            specs[f"{attn}.compressor.state_cache"] = states[ratio]
        if ratio == INDEXED_RATIO:
            specs[f"{attn}.indexer.k_cache"] = indexer
            specs[f"{attn}.indexer.compressor.state_cache"] = indexer_state
    return specs


def rope_head_dim(cfg: ConfigFields, head_dim: int) -> int:
    """The rotary part of ``head_dim``: ``qk_rope_head_dim`` when given (transformers sets it
    from ``partial_rotary_factor``), else ``head_dim x partial_rotary_factor`` (default 64/512).

    Raises:
        ModelConfigError: the rotary part is not within ``head_dim``.
    """
    if cfg.has("qk_rope_head_dim"):
        rope = cfg.integer("qk_rope_head_dim")
    else:
        factor = cfg.data.get("partial_rotary_factor")
        if factor is None:
            factor = 64 / 512
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
            raise cfg.error("partial_rotary_factor", f"must be a number in (0, 1] (got {factor!r})")
        rope = int(head_dim * factor)
    if rope > head_dim:
        raise ModelConfigError(
            f"deepseek_v4 config: the rotary part ({rope}) exceeds head_dim {head_dim}; check "
            "qk_rope_head_dim / partial_rotary_factor"
        )
    return rope


#: The config class's max_position_embeddings (transformers 5.24.0,
#: transformers/models/deepseek_v4/configuration_deepseek_v4.py:142).
CONFIG_DEFAULTS = {"deepseek_v4": {"max_position_embeddings": 1_048_576}}
#: The family as registered.
FAMILY = ModelFamily(
    name="deepseek_v4", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
