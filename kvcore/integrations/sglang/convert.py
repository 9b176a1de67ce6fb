"""kvcore plans <-> SGLang 0.5's memory pools (imports SGLang and torch).

:func:`specs_from_sglang` reads the layers SGLang's ``KVCacheConfigurator`` describes as kvcore
specs; :func:`memory_pool_config` turns a plan's :class:`~kvcore.integrations.sglang.rules.SglangPoolSizes`
into SGLang's own ``MemoryPoolConfig`` (``sglang/srt/model_executor/pool_configurator.py``);
:func:`build_pools` builds SGLang's pool classes (``MHATokenToKVPool``, ``MLATokenToKVPool``,
``SWAKVPool`` of ``sglang/srt/mem_cache/memory_pool.py`` and ``swa_memory_pool.py``) of those
sizes, as SGLang's model runner does, and :func:`build_mamba_pool` a Mamba hybrid's ``MambaPool``
of state slots (its layers read from ``Mamba2CacheParams`` by :func:`specs_from_sglang`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from sglang.srt.mem_cache.memory_pool import KVCache, MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig

from kvcore.dtypes import dtype_name
from kvcore.integrations.sglang.rules import SglangIntegrationError, SglangPoolSizes, check_specs, is_dsa
from kvcore.plugins.attention import AttentionSpec
from kvcore.plugins.dsa_indexer import INDEXER_DTYPE, DSAIndexerSpec, dsa_latent
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.spec import KVCacheSpec

#: What follows a layer's name for its DSA indexer's keys (SGLang keeps them in the same pool,
#: by the same layer id).
INDEXER_SUFFIX = ".indexer"


def layer_name(layer_id: int) -> str:
    """The kvcore name of SGLang's layer ``layer_id`` (SGLang indexes its pools by layer id)."""
    return f"model.layers.{layer_id}"


def specs_from_sglang(kvc: Any) -> dict[str, KVCacheSpec]:
    """The KV layers of an SGLang ``KVCacheConfigurator`` as kvcore specs, in layer order.

    Reads what SGLang's own configurators read (``DefaultPoolConfigurator`` and
    ``HybridSWAPoolConfigurator.__init__``): the layer ids of ``kvc.layer_info``, the head shape
    of ``kvc.model_config`` at the attention tensor-parallel size, ``kvc.kv_cache_dtype``,
    ``kvc.page_size`` and ``kvc.sliding_window_size``.

    Raises:
        SglangIntegrationError: K and V heads of different sizes (kvcore's attention specs
            have one head size).
    """
    from sglang.srt.configs.model_config import AttentionArch, is_deepseek_dsa
    from sglang.srt.runtime_context import get_parallel

    config = kvc.model_config
    dtype = dtype_name(kvc.kv_cache_dtype)
    page = int(kvc.page_size)
    info = kvc.layer_info
    mambaish = getattr(kvc, "mambaish_config", None)
    state_ids: list[int] = []
    if getattr(kvc, "is_hybrid_swa", False):
        full_ids, swa_ids = list(info.full_attention_layer_ids), list(info.swa_attention_layer_ids)
    elif mambaish is not None:
        # SGLang's Mamba hybrids: attention layers in the KV pool, the rest in its Mamba pool
        full_ids, swa_ids = list(mambaish.full_attention_layer_ids), []
        state_ids = list(mambaish.mamba2_cache_params.layers)
    else:
        full_ids, swa_ids = list(range(info.start_layer, info.end_layer)), []
    indexers: dict[int, KVCacheSpec] = {}
    if config.attention_arch == AttentionArch.MLA:
        full: KVCacheSpec = _mla_latent(kvc)
        if is_deepseek_dsa(config.hf_config):
            indexers = _dsa_indexers(kvc, full_ids)
    else:
        if config.head_dim != config.v_head_dim:
            raise SglangIntegrationError(
                f"K heads of {config.head_dim} and V heads of {config.v_head_dim}: kvcore's attention specs "
                "have one head size; unset KVCORE_SGLANG_POLICY to let SGLang size this model"
            )
        full = FullAttentionSpec(
            block_size=page,
            num_kv_heads=config.get_num_kv_heads(get_parallel().attn_tp_size),
            head_size=config.head_dim,
            dtype=dtype,
        )
    specs: dict[int, KVCacheSpec] = dict.fromkeys(full_ids, full)
    if swa_ids:
        sliding = SlidingWindowSpec(
            block_size=page,
            num_kv_heads=config.get_swa_num_kv_heads(get_parallel().attn_tp_size),
            head_size=config.swa_head_dim,
            dtype=dtype,
            sliding_window=int(kvc.sliding_window_size),
        )
        specs.update(dict.fromkeys(swa_ids, sliding))
    if state_ids:
        specs.update(dict.fromkeys(state_ids, state_spec(kvc.mambaish_config.mamba2_cache_params, page)))
    out: dict[str, KVCacheSpec] = {}
    for i in sorted(specs):
        out[layer_name(i)] = specs[i]
        if i in indexers:
            out[layer_name(i) + INDEXER_SUFFIX] = indexers[i]
    return out


def _mla_latent(kvc: Any) -> MLAAttentionSpec:
    """An MLA layer's latent as SGLang stores it: ``calculate_mla_kv_cache_dim`` elements of
    ``kvc.kv_cache_dtype`` a token, plain (``kv_lora_rank + qk_rope_head_dim``) or, on a DSA
    model with an fp8 cache and a scaled-layout backend, packed with float32 scales and a bfloat16
    rope part (:func:`~kvcore.plugins.dsa_indexer.dsa_latent`).

    Raises:
        SglangIntegrationError: a latent of bytes kvcore's packing does not give.
    """
    from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim

    config = kvc.model_config
    plain = MLAAttentionSpec(
        block_size=int(kvc.page_size),
        kv_lora_rank=config.kv_lora_rank,
        qk_rope_head_dim=config.qk_rope_head_dim,
        dtype=dtype_name(kvc.kv_cache_dtype),
    )
    dim = calculate_mla_kv_cache_dim(model_config=config, kv_cache_dtype=kvc.kv_cache_dtype)
    if dim == plain.latent_size:
        return plain
    packed = dsa_latent(plain)
    theirs = dim * kvc.kv_cache_dtype.itemsize
    if packed.bytes_per_token != theirs:
        raise SglangIntegrationError(
            f"SGLang stores this model's MLA latent in {theirs} bytes a token ({dim} x {plain.dtype}), which "
            "no kvcore mla spec packs; unset KVCORE_SGLANG_POLICY to let SGLang size this model"
        )
    return packed


def _dsa_indexers(kvc: Any, layer_ids: list[int]) -> dict[int, KVCacheSpec]:
    """The indexer key caches of a DSA model, by layer id: on each layer SGLang gives index keys
    (``dsa_layer_skips_topk`` false), ``get_dsa_index_head_dim`` fp8 elements and their float32
    scales (:class:`~kvcore.plugins.dsa_indexer.DSAIndexerSpec`).

    Raises:
        SglangIntegrationError: pooled index keys (``index_kpool`` > 1), which kvcore does not plan.
    """
    from sglang.srt.configs.model_config import (
        dsa_layer_skips_topk,
        get_dsa_index_head_dim,
        get_dsa_index_kpool,
    )

    hf_config = kvc.model_config.hf_config
    if get_dsa_index_kpool(hf_config) != 1:
        raise SglangIntegrationError(
            f"index_kpool {get_dsa_index_kpool(hf_config)}: SGLang pools the indexer keys of that many "
            "tokens, "
            "which kvcore does not plan; unset KVCORE_SGLANG_POLICY to let SGLang size this model"
        )
    indexer = DSAIndexerSpec(
        block_size=int(kvc.page_size), index_head_dim=get_dsa_index_head_dim(hf_config), dtype=INDEXER_DTYPE
    )
    return {i: indexer for i in layer_ids if not dsa_layer_skips_topk(hf_config, i)}


def state_spec(cache_params: Any, page: int) -> StateSpec:
    """One layer's slot of SGLang's Mamba pool (``Mamba2CacheParams``: its conv states and
    its temporal state, in their dtypes) as a kvcore state."""
    shape, dtypes = cache_params.shape, cache_params.dtype
    conv = [
        StatePart(name=f"conv{i}", shape=tuple(s), dtype=dtype_name(dtypes.conv))
        for i, s in enumerate(shape.conv)
    ]
    temporal = StatePart(name="temporal", shape=tuple(shape.temporal), dtype=dtype_name(dtypes.temporal))
    return StateSpec(block_size=page, parts=(*conv, temporal))


def build_mamba_pool(
    sizes: SglangPoolSizes, cache_params: Any, layer_ids: list[int], device: str = "cpu"
) -> Any:
    """SGLang's ``MambaPool`` of ``sizes.mamba_states`` slots (and its padding slot) for the
    state layers ``layer_ids``, as ``HybridReqToTokenPool`` builds it without speculative
    decoding."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    return MambaPool(
        size=sizes.mamba_states,
        spec_state_size=0,
        cache_params=cache_params,
        mamba_layer_ids=layer_ids,
        device=device,
    )


def memory_pool_config(sizes: SglangPoolSizes) -> MemoryPoolConfig:
    """SGLang's ``MemoryPoolConfig`` for ``sizes``: the same fields its own configurators fill
    (``DefaultPoolConfigurator`` only ``max_total_num_tokens``; ``HybridSWAPoolConfigurator``
    the full and sliding pools too)."""
    if not sizes.is_hybrid_swa:
        return MemoryPoolConfig(max_total_num_tokens=sizes.max_total_num_tokens)
    return MemoryPoolConfig(
        max_total_num_tokens=sizes.max_total_num_tokens,
        full_max_total_num_tokens=sizes.full_tokens,
        swa_max_total_num_tokens=sizes.swa_tokens,
    )


def _torch_dtype(spec: AttentionSpec | MLAAttentionSpec) -> torch.dtype:
    dtype = getattr(torch, dtype_name(spec.dtype))
    if not isinstance(dtype, torch.dtype):
        raise SglangIntegrationError(f"{dtype_name(spec.dtype)} is not a torch dtype SGLang's pools take")
    return dtype


def _attention(spec: KVCacheSpec) -> AttentionSpec:
    if not isinstance(spec, AttentionSpec):
        raise SglangIntegrationError(f"SGLang's MHA pools hold attention layers, not {spec.kind}")
    return spec


def _pool_args(size: int, page: int, layers: int, device: str) -> dict[str, Any]:
    """What every SGLang token-to-KV pool kvcore builds takes: ``size`` tokens in pages of
    ``page``, ``layers`` layers, on ``device``, without SGLang's memory saver."""
    return {
        "size": size,
        "page_size": page,
        "layer_num": layers,
        "device": device,
        "enable_memory_saver": False,
    }


def _dsa_pool(
    specs: Mapping[str, KVCacheSpec], names: list[str], size: int, page: int, device: str
) -> KVCache:
    """SGLang's ``DSATokenToKVPool`` of ``size`` tokens for a DSA model's full pool: its MLA
    layers (the latent plain or packed, ``kv_cache_dim`` elements) and, on the layers that have
    one, their indexer keys."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    latents = [n for n in names if isinstance(specs[n], MLAAttentionSpec)]
    latent = specs[latents[0]]
    assert isinstance(latent, MLAAttentionSpec)
    indexer = next(s for s in specs.values() if isinstance(s, DSAIndexerSpec))
    dtype = _torch_dtype(latent)
    return DSATokenToKVPool(
        **_pool_args(size, page, len(latents), device),
        kv_lora_rank=latent.kv_lora_rank,
        dtype=dtype,
        qk_rope_head_dim=latent.qk_rope_head_dim,
        index_head_dim=indexer.index_head_dim,
        # SGLang's kv_cache_dim counts elements of the cache dtype (calculate_mla_kv_cache_dim)
        kv_cache_dim=latent.bytes_per_token // dtype.itemsize,
        skip_topk_layers=[n + INDEXER_SUFFIX not in specs for n in latents],
    )


def _full_pool(spec: KVCacheSpec, size: int, page: int, layers: int, device: str) -> KVCache:
    common = _pool_args(size, page, layers, device)
    if isinstance(spec, MLAAttentionSpec):
        return MLATokenToKVPool(
            **common,
            dtype=_torch_dtype(spec),
            kv_lora_rank=spec.kv_lora_rank,
            qk_rope_head_dim=spec.qk_rope_head_dim,
        )
    mha = _attention(spec)
    return MHATokenToKVPool(
        **common, dtype=_torch_dtype(mha), head_num=mha.num_kv_heads, head_dim=mha.head_size
    )


def build_pools(sizes: SglangPoolSizes, specs: Mapping[str, KVCacheSpec], device: str = "cpu") -> KVCache:
    """SGLang's token-to-KV pool of ``sizes`` for the layers ``specs`` (in layer order), as its
    model runner builds it: one ``MHATokenToKVPool`` or ``MLATokenToKVPool``, or an
    ``SWAKVPool`` of a full and a sliding ``MHATokenToKVPool`` for a sliding model.

    Raises:
        SglangIntegrationError: layers SGLang cannot run (:func:`~.rules.check_specs`).
    """
    pools = check_specs(specs)
    order = list(specs)
    full_names, swa_names = pools.get("full", []), pools.get("swa", [])
    if not sizes.is_hybrid_swa:
        if is_dsa(specs):
            return _dsa_pool(specs, full_names, sizes.full_tokens, sizes.page_size, device)
        # a Mamba hybrid's KV pool holds its attention layers only (build_mamba_pool the rest)
        return _full_pool(specs[full_names[0]], sizes.full_tokens, sizes.page_size, len(full_names), device)
    swa, full = _attention(specs[swa_names[0]]), specs[full_names[0]] if full_names else None
    if isinstance(full, MLAAttentionSpec):
        raise SglangIntegrationError("kvcore builds SGLang's sliding pools of MHA layers only")
    return SWAKVPool(
        size=sizes.full_tokens,
        size_swa=sizes.swa_tokens,
        page_size=sizes.page_size,
        dtype=_torch_dtype(swa),
        head_num=swa.num_kv_heads,
        head_dim=swa.head_size,
        swa_attention_layer_ids=[order.index(n) for n in swa_names],
        full_attention_layer_ids=[order.index(n) for n in full_names],
        device=device,
        enable_memory_saver=False,
    )
