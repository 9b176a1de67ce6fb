"""vLLM 0.33's KV-cache specs and ``KVCacheConfig`` to kvcore's specs and plans, and back.

Imports vLLM (and so torch). The conversions are exact: a page has the same bytes on both sides,
a kvcore plan and the ``KVCacheConfig`` made from it name the same block ids, groups and byte
ranges, and a ``KVCacheConfig`` read back (:func:`plan_from_vllm_config`) is a checked kvcore
plan whose figures are vLLM's.

Layer names: vLLM names an attention layer's cache after its ``Attention`` module
(``model.layers.0.self_attn.attn``), kvcore after the layer's attention module
(``model.layers.0.self_attn``); :func:`vllm_layer_name` adds the ``.attn`` and
:func:`kvcore_layer_name` takes it off. A DSA indexer's keys are vLLM's
``model.layers.0.self_attn.indexer.k_cache`` and kvcore's ``model.layers.0.self_attn.indexer``
(``.k_cache`` added and taken off alike). State (Mamba) layers have one name on both sides.

DeepSeek-V3.2 (DSA) in vLLM 0.33: the MLA layer's spec is an ``MLAAttentionSpec`` of one
576-element head, with ``cache_dtype_str='fp8_ds_mla'``, dtype ``uint8`` and
``state_content_bytes=656`` when the cache is fp8 (``vllm/model_executor/layers/attention/
mla_attention.py:1371-1401``), kvcore's packed ``mla``; its indexer's keys are another
``MLAAttentionSpec``, of one ``index_head_dim + index_head_dim / 128 x 4`` = 132-byte uint8 head
with ``cache_role=SparseCacheRole.INDEXER`` (``vllm/model_executor/models/deepseek_v2.py:658-666``
and ``:731-735``), kvcore's ``dsa_indexer``. The MLA spec's ``topk_buffer_width`` and
``is_index_group_leader`` change neither page nor retention and are not kept: a spec made back
from kvcore's leaves them at their defaults, which only vLLM's HiSparse layout reads
(``vllm/v1/hisparse/layout.py:139-162``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch
from vllm.v1 import kv_cache_interface as vk

from kvcore.dtypes import dtype_name, to_dtype
from kvcore.integrations.vllm.rules import (
    VLLM_SPEC_CLASSES,
    VLLM_STATE_CACHE_MODES,
    VllmIntegrationError,
    check_runnable,
    page_span,
)
from kvcore.integrations.vllm.versions import mamba_state_alignment
from kvcore.plan import KVCacheGroup, KVCachePlan, KVCacheTensor
from kvcore.plugins.attention import AttentionSpec
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.dsa_indexer import INDEXER_DTYPE, INDEXER_SCALE_BLOCK, DSAIndexerSpec, dsa_latent
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.runtime.torch_dtypes import torch_dtype
from kvcore.simulation.profiles.vllm_groups import align_state_block
from kvcore.spec import KVCacheSpec, SizingContext, describe_spec

_STATE_NOTE = " (mamba_cache_mode 'none' or 'align', no speculative blocks)"

#: vLLM's spec classes kvcore converts, by the kvcore kind each becomes
#: (:data:`~kvcore.integrations.vllm.rules.VLLM_SPEC_CLASSES`, read the other way).
SUPPORTED_VLLM_SPECS = tuple(
    f"{cls}{_STATE_NOTE if kind == 'state' else ''} -> {kind}" for kind, cls in VLLM_SPEC_CLASSES.items()
)

#: Rotary part of an MLA latent that kvcore assumes when vLLM gives only the latent's size
#: (DeepSeek's 64; the page depends on the sum only).
MLA_ROPE_DIM = 64

_ATTENTION_SUFFIX = ".attn"
#: What vLLM appends to the indexer module's name for its key cache (``f"{prefix}.k_cache"``,
#: ``vllm/model_executor/models/deepseek_v2.py:733``).
_INDEXER_SUFFIX = ".k_cache"
#: vLLM's cache format of DeepSeek's packed fp8 latent (``flashmla_sparse.py:79-87``).
FP8_DS_MLA = "fp8_ds_mla"


def vllm_layer_name(name: str, spec: KVCacheSpec) -> str:
    """The name vLLM gives the cache of kvcore's layer ``name`` (attention: ``+ '.attn'``; a
    DSA indexer: ``+ '.k_cache'``)."""
    suffix = (
        _INDEXER_SUFFIX
        if isinstance(spec, DSAIndexerSpec)
        else _ATTENTION_SUFFIX
        if isinstance(spec, (AttentionSpec, MLAAttentionSpec))
        else ""
    )
    return name if not suffix or name.endswith(suffix) else name + suffix


def kvcore_layer_name(name: str) -> str:
    """kvcore's name for vLLM's cache layer ``name`` (``.attn`` or ``.k_cache`` taken off)."""
    for suffix in (_ATTENTION_SUFFIX, _INDEXER_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _unsupported(name: str, spec: object, why: str) -> VllmIntegrationError:
    return VllmIntegrationError(
        f"layer {name!r}: vLLM's {type(spec).__name__} has no kvcore form ({why}); kvcore converts "
        f"{'; '.join(SUPPORTED_VLLM_SPECS)}"
    )


def _plain_attention(
    name: str, spec: vk.AttentionSpec, *, head_size_v: int, padded: bool = False, packed: bool = False
) -> None:
    """Refuse an attention spec whose page kvcore's kinds cannot describe (``padded``: a page
    padded for placement is read as its content; ``packed``: an ``fp8_ds_mla`` latent, whose
    quantization and bytes per token the caller checks)."""
    odd = []
    if spec.head_size_v != head_size_v:
        odd.append(f"head_size_v {spec.head_size_v} != {head_size_v}")
    if spec.kv_quant_mode != vk.KVQuantMode.NONE and not packed:
        odd.append(f"kv_quant_mode {spec.kv_quant_mode.name}")
    if not padded and spec.page_size_padded not in (None, spec.unpadded_page_size_bytes):
        odd.append(f"page_size_padded {spec.page_size_padded}")
    if spec.num_head_slots is not None or (spec.state_content_bytes is not None and not packed):
        odd.append("a packed page (num_head_slots / state_content_bytes)")
    if spec.tokens_per_state != 1:
        odd.append(f"tokens_per_state {spec.tokens_per_state}")
    if odd:
        raise _unsupported(name, spec, ", ".join(odd))


def _attention_fields(name: str, spec: vk.AttentionSpec, *, padded: bool) -> dict[str, Any]:
    """The fields every kvcore attention kind takes, read from a plain vLLM attention spec (one
    whose K and V heads are alike; :func:`_plain_attention` refuses any other)."""
    _plain_attention(name, spec, head_size_v=spec.head_size, padded=padded)
    return {
        "block_size": spec.block_size,
        "num_kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size,
        "dtype": spec.dtype,
    }


def spec_from_vllm(
    name: str, spec: vk.KVCacheSpec, *, padded: bool = False, max_encoder_tokens: int = 0
) -> KVCacheSpec:
    """kvcore's spec for one of vLLM's per-layer specs (same page bytes, same worst case).

    Args:
        name: the layer (named in errors).
        spec: vLLM's spec, one of :data:`SUPPORTED_VLLM_SPECS` (exact classes: a subclass
            vLLM adds, e.g. ``HiddenStateCacheSpec``, is refused, not guessed).
        padded: accept a page vLLM padded (``page_size_padded``) and read its content only, as
            when reading vLLM's own plan, where padding is placement; a layer's spec as the
            model reports it has none.
        max_encoder_tokens: the longest encoder output a request brings, which a
            ``CrossAttentionSpec`` does not carry (vLLM sizes it from the scheduler's
            ``max_num_encoder_input_tokens``); needed for cross-attention layers only.

    Returns:
        The kvcore spec.

    Raises:
        VllmIntegrationError: the class, or a field of it (quantized or packed pages, Mamba
            prefix caching modes), has no kvcore form, or a cross-attention layer comes
            without ``max_encoder_tokens``; the message lists what converts.
    """
    cls = type(spec)
    if cls is vk.CrossAttentionSpec:
        fields = _attention_fields(name, spec, padded=padded)
        if max_encoder_tokens <= 0:
            raise VllmIntegrationError(
                f"layer {name!r}: vLLM's CrossAttentionSpec does not say how many encoder tokens a request "
                "caches; pass max_encoder_tokens (vLLM sizes it by the scheduler's "
                "max_num_encoder_input_tokens; Whisper's encoder gives 1500)"
            )
        return CrossAttentionSpec(**fields, max_encoder_tokens=max_encoder_tokens)
    if cls is vk.MLAAttentionSpec:
        return _mla_from_vllm(name, spec, padded=padded)
    if cls is vk.FullAttentionSpec:
        # a sliding or chunked layer vLLM promoted to full attention holds every token
        return FullAttentionSpec(**_attention_fields(name, spec, padded=padded))
    if cls is vk.SlidingWindowSpec:
        fields = _attention_fields(name, spec, padded=padded)
        if spec.extra_retained_tokens:
            raise _unsupported(
                name, spec, f"extra_retained_tokens {spec.extra_retained_tokens} (multi-module MTP)"
            )
        return SlidingWindowSpec(**fields, sliding_window=spec.sliding_window)
    if cls is vk.ChunkedLocalAttentionSpec:
        fields = _attention_fields(name, spec, padded=padded)
        return ChunkedLocalAttentionSpec(**fields, attention_chunk_size=spec.attention_chunk_size)
    if cls is vk.MambaSpec:
        return _state_from_vllm(name, spec)
    raise _unsupported(name, spec, "no kvcore kind holds it")


def _state_from_vllm(name: str, spec: vk.MambaSpec) -> StateSpec:
    """kvcore's ``state`` for vLLM's ``MambaSpec`` in ``mamba_cache_mode`` ``'none'`` or
    ``'align'``: its mode and prefill checkpoint fields kept
    (:class:`~kvcore.plugins.state.StateSpec` sizes them as vLLM does)."""
    if spec.mamba_cache_mode not in VLLM_STATE_CACHE_MODES:
        raise _unsupported(
            name,
            spec,
            f"mamba_cache_mode {spec.mamba_cache_mode!r}: vLLM keeps states in 'none' or 'align' only; "
            "start it with prefix caching on ('align') or off ('none')",
        )
    if (alignment := mamba_state_alignment(spec)) != 1:
        raise _unsupported(
            name,
            spec,
            f"each state tensor rounded up to {alignment} bytes (state_alignment, vLLM's FlashInfer "
            "ReplaySSM), where kvcore aligns a part to its element size",
        )
    if spec.num_speculative_blocks:
        raise _unsupported(
            name,
            spec,
            f"{spec.num_speculative_blocks} speculative blocks, which kvcore's plans for vLLM leave out; "
            "start vLLM without speculative decoding",
        )
    names = ("conv", "ssm") if len(spec.shapes) == 2 else tuple(f"part{i}" for i in range(len(spec.shapes)))
    parts = tuple(
        StatePart(name=part, shape=tuple(shape), dtype=dtype)
        for part, shape, dtype in zip(names, spec.shapes, spec.dtypes, strict=True)
    )
    # vLLM's padding (page_size_padded, to line a state page up with attention pages) is
    # placement, not content: the kvcore spec holds the state itself. The checkpoint blocks are
    # kept in either mode (a Mamba-2 mixer asks for one whatever the mode); only 'align' holds
    # them, in vLLM (MambaSpec.max_memory_usage_bytes) as in kvcore (StateSpec.live_pages).
    return StateSpec(
        block_size=spec.block_size,
        parts=parts,
        cache_mode=spec.mamba_cache_mode,
        checkpoint_slots=spec.num_prefill_checkpoint_blocks,
        checkpoint_alignment=spec.prefill_checkpoint_alignment or 0,
    )


def _state_to_vllm(spec: StateSpec, *, max_model_len: int | None, state_block: int | None) -> vk.MambaSpec:
    """vLLM's ``MambaSpec`` for a kvcore state (:func:`spec_to_vllm`)."""
    if spec.cache_mode not in VLLM_STATE_CACHE_MODES:
        raise VllmIntegrationError(
            f"{describe_spec(spec)}: vLLM has no state cache mode {spec.cache_mode!r} "
            "(CacheConfig.mamba_cache_mode is 'none' or 'align'); plan with state_cache_mode 'align'"
        )
    page = spec.page_size_bytes
    if spec.cache_mode == "align":
        # a state at every block boundary of the attention block (mamba_block_size = block_size)
        block = state_block or spec.block_size
        if spec.checkpoint_alignment and block % spec.checkpoint_alignment:
            raise VllmIntegrationError(
                f"{describe_spec(spec)}: state blocks of {block} tokens, but vLLM keeps align-mode blocks on "
                f"multiples of the layer's prefill checkpoint alignment, {spec.checkpoint_alignment} tokens "
                "(Platform._align_hybrid_block_size); plan with a block size that is a multiple of it"
            )
    else:
        # one block covers the whole request, as vLLM sets mamba_block_size without prefix caching
        block = max_model_len or spec.block_size
    return vk.MambaSpec(
        block_size=block,
        shapes=tuple(part.shape for part in spec.parts),
        dtypes=tuple(torch_dtype(part.dtype) for part in spec.parts),
        page_size_padded=page if page != spec.state_bytes else None,
        mamba_cache_mode=spec.cache_mode,
        num_prefill_checkpoint_blocks=spec.checkpoint_slots,
        prefill_checkpoint_alignment=spec.checkpoint_alignment or None,
    )


def _mla_from_vllm(name: str, spec: vk.MLAAttentionSpec, *, padded: bool) -> KVCacheSpec:
    """kvcore's ``mla`` (plain or the packed ``fp8_ds_mla``) or ``dsa_indexer`` for one of
    vLLM's ``MLAAttentionSpec`` (module docstring)."""
    odd = []
    if spec.num_kv_heads != 1:
        odd.append(f"{spec.num_kv_heads} heads")
    if spec.alignment is not None or spec.model_version is not None or spec.tokens_per_state != 1:
        odd.append("DeepSeek-V4's compressed layout (alignment / model_version / tokens_per_state)")
    if odd:
        raise _unsupported(name, spec, ", ".join(odd))
    if spec.cache_role == vk.SparseCacheRole.INDEXER:
        _plain_attention(name, spec, head_size_v=0, padded=padded)
        # head_size = d + d / 128 x 4 uint8 bytes (deepseek_v2.py:731-735): d = head_size x 128 / 132
        per_scale = INDEXER_SCALE_BLOCK + 4
        dim = spec.head_size * INDEXER_SCALE_BLOCK // per_scale
        if (
            spec.dtype != torch.uint8
            or spec.head_size % per_scale
            or spec.cache_dtype_str not in (None, "auto")
        ):
            raise _unsupported(
                name,
                spec,
                f"an indexer cache of {spec.head_size} x {spec.dtype}, not fp8 keys with a float32 "
                f"scale per {INDEXER_SCALE_BLOCK} as uint8 (132 bytes for DeepSeek-V3.2)",
            )
        return DSAIndexerSpec(block_size=spec.block_size, index_head_dim=dim, dtype=INDEXER_DTYPE)
    rope = min(MLA_ROPE_DIM, spec.head_size - 1)
    if spec.cache_dtype_str == FP8_DS_MLA:
        _plain_attention(name, spec, head_size_v=0, padded=padded, packed=True)
        packed = dsa_latent(
            MLAAttentionSpec(
                block_size=spec.block_size,
                kv_lora_rank=spec.head_size - rope,
                qk_rope_head_dim=rope,
                dtype="fp8",
            )
        )
        if not packed.is_packed or packed.bytes_per_token != spec.state_content_bytes:
            raise _unsupported(
                name,
                spec,
                f"fp8_ds_mla of {spec.state_content_bytes} bytes a token, kvcore's packing of a "
                f"{spec.head_size}-element latent takes {packed.bytes_per_token}",
            )
        return packed
    if spec.state_content_bytes is not None:
        raise _unsupported(
            name,
            spec,
            f"cache format {spec.cache_dtype_str!r} packs {spec.state_content_bytes} bytes a token; "
            "kvcore packs an MLA latent only as fp8_ds_mla",
        )
    # a plain format ('auto', 'bfloat16', ...) quantizes nothing; the rest are refused here
    _plain_attention(name, spec, head_size_v=0, padded=padded)
    return MLAAttentionSpec(
        block_size=spec.block_size,
        kv_lora_rank=spec.head_size - rope,
        qk_rope_head_dim=rope,
        dtype=to_dtype(spec.dtype),
    )


def specs_from_vllm(
    vllm_specs: Mapping[str, vk.KVCacheSpec], *, rename: bool = True, max_encoder_tokens: int = 0
) -> dict[str, KVCacheSpec]:
    """kvcore specs for vLLM's ``{layer: KVCacheSpec}``, what
    ``model_executor.get_kv_cache_specs()`` returns for one worker.

    Equal vLLM specs become one kvcore spec object (planning looks each up once). With
    ``rename`` the layers get kvcore's names (:func:`kvcore_layer_name`); without, vLLM's.
    ``max_encoder_tokens`` sizes cross-attention layers (:func:`spec_from_vllm`).

    Raises:
        VllmIntegrationError: a layer's spec has no kvcore form (:func:`spec_from_vllm`).
    """
    made: dict[vk.KVCacheSpec, KVCacheSpec] = {}
    out: dict[str, KVCacheSpec] = {}
    for name, spec in vllm_specs.items():
        converted = made.get(spec)
        if converted is None:
            converted = made[spec] = spec_from_vllm(name, spec, max_encoder_tokens=max_encoder_tokens)
        out[kvcore_layer_name(name) if rename else name] = converted
    return out


def spec_to_vllm(
    spec: KVCacheSpec, *, max_model_len: int | None = None, state_block: int | None = None
) -> vk.KVCacheSpec:
    """vLLM's spec class for a kvcore spec, with the same page bytes and worst case.

    A state becomes a ``MambaSpec`` in its ``cache_mode`` with its checkpoint blocks. In
    ``'none'`` (one state per request, vLLM's mode without prefix caching) its block size is
    ``max_model_len``, as vLLM sets it then (one block covers the whole request); in ``'align'``
    (prefix caching) it is ``state_block``, the attention block a state is kept at the end of
    (:func:`~kvcore.simulation.profiles.vllm_groups.align_state_block` of the plan); without
    them it keeps its own.

    Raises:
        VllmIntegrationError: the kind has no vLLM class (a third-party kind), a state is in
            ``'all'`` mode (vLLM has none), or an align-mode state block is off the layer's
            checkpoint alignment.
    """
    if isinstance(spec, StateSpec):
        return _state_to_vllm(spec, max_model_len=max_model_len, state_block=state_block)
    if isinstance(spec, DSAIndexerSpec):
        if (spec.scale_block_size, dtype_name(spec.dtype)) != (INDEXER_SCALE_BLOCK, INDEXER_DTYPE):
            raise VllmIntegrationError(
                f"{describe_spec(spec)}: vLLM's indexer keeps fp8 keys with a float32 scale per "
                f"{INDEXER_SCALE_BLOCK} (deepseek_v2.py:723-735)"
            )
        return _vllm_bytes_page(spec.block_size, spec.bytes_per_token, cache_role=vk.SparseCacheRole.INDEXER)
    if isinstance(spec, MLAAttentionSpec):
        if spec.is_packed:
            if spec != _fp8_ds_mla_like(spec):  # vLLM has one packing: the one DSA's kernels read
                raise VllmIntegrationError(
                    f"{describe_spec(spec)}: vLLM packs an MLA latent only as fp8_ds_mla (fp8 with a "
                    f"float32 scale per {INDEXER_SCALE_BLOCK} and a bfloat16 rope part)"
                )
            return _vllm_bytes_page(
                spec.block_size,
                spec.latent_size,
                cache_dtype_str=FP8_DS_MLA,
                kv_quant_mode=vk.get_kv_quant_mode(FP8_DS_MLA),
                state_content_bytes=spec.bytes_per_token,
            )
        return vk.MLAAttentionSpec(
            block_size=spec.block_size,
            num_kv_heads=1,
            head_size=spec.latent_size,
            dtype=torch_dtype(spec.dtype),
        )
    if type(spec) in (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, CrossAttentionSpec):
        assert isinstance(spec, AttentionSpec)
        fields = {
            "block_size": spec.block_size,
            "num_kv_heads": spec.num_kv_heads,
            "head_size": spec.head_size,
            "dtype": torch_dtype(spec.dtype),
        }
        if isinstance(spec, SlidingWindowSpec):
            return vk.SlidingWindowSpec(**fields, sliding_window=spec.sliding_window)
        if isinstance(spec, ChunkedLocalAttentionSpec):
            return vk.ChunkedLocalAttentionSpec(**fields, attention_chunk_size=spec.attention_chunk_size)
        if isinstance(spec, CrossAttentionSpec):
            # vLLM's class holds no encoder length: its scheduler gives each request's
            return vk.CrossAttentionSpec(**fields)
        return vk.FullAttentionSpec(**fields)
    raise VllmIntegrationError(
        f"kvcore's kind {spec.kind!r} ({describe_spec(spec)}) has no vLLM spec class; vLLM runs "
        f"{', '.join(VLLM_SPEC_CLASSES)} layers"
    )


def _vllm_bytes_page(block_size: int, head_size: int, **fields: Any) -> vk.MLAAttentionSpec:
    """vLLM's ``MLAAttentionSpec`` of a page its kernels read as bytes: one uint8 head of
    ``head_size``, the same on every tensor-parallel rank (the DSA indexer's keys, an
    ``fp8_ds_mla`` latent), with the class's other ``fields``."""
    return vk.MLAAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=head_size,
        dtype=torch.uint8,
        **fields,
    )


def _fp8_ds_mla_like(spec: MLAAttentionSpec) -> MLAAttentionSpec:
    """``spec``'s latent packed as vLLM's ``fp8_ds_mla``: what a packed latent must equal to convert."""
    return dsa_latent(attrs.evolve(spec, dtype="fp8", scale_block_size=0, rope_dtype=None))


def specs_to_vllm(
    specs: Mapping[str, KVCacheSpec], max_model_len: int | None = None
) -> dict[str, vk.KVCacheSpec]:
    """``{vLLM layer name: vLLM spec}`` for kvcore's specs (:func:`spec_to_vllm`)."""
    made: dict[int, vk.KVCacheSpec] = {}
    out: dict[str, vk.KVCacheSpec] = {}
    for name, spec in specs.items():
        converted = made.get(id(spec))
        if converted is None:
            converted = made[id(spec)] = spec_to_vllm(spec, max_model_len=max_model_len)
        out[vllm_layer_name(name, spec)] = converted
    return out


def plan_to_vllm_config(
    plan: KVCachePlan, *, names: Mapping[str, str] | None = None, state_cache_mode: str | None = None
) -> vk.KVCacheConfig:
    """vLLM's ``KVCacheConfig`` for a kvcore plan made under vLLM's rules.

    Groups keep their layers (by vLLM's names), order and spec (vLLM's class, the group's
    block size); a mixed-page group becomes one ``UniformTypeKVCacheSpecs`` (one block table,
    each layer its own spec and page), the form vLLM gives layers of one kind whose pages
    differ. Every layer gets one ``KVCacheTensor`` over one backing allocation of
    ``plan.kv_cache_bytes``: page ``b`` of a layer starts at the same byte as in the kvcore plan
    (a plan of separate tensors is laid end to end in the backing). Layers that share a kvcore
    tensor get tensors with equal offsets, which vLLM treats as aliases. ``num_blocks`` counts
    the null block, as vLLM's block pool does.

    Args:
        plan: a plan with ``null_block == 0`` and every page one block id, as
            :func:`kvcore.integrations.vllm.rules.plan_for_vllm` makes.
        names: ``{plan layer: vLLM layer}``; a layer it does not name keeps its name. Default:
            :func:`vllm_layer_name` for every layer.
        state_cache_mode: the ``mamba_cache_mode`` the state groups run in (``None``: each
            group's own, the mode the plan was sized for). vLLM derives the mode from prefix
            caching whatever a plan was sized for, so a driver of its scheduler gives it. In
            ``'align'`` a state block is the plan's attention block
            (:func:`~kvcore.simulation.profiles.vllm_groups.align_state_block`), as vLLM sets
            ``mamba_block_size`` to the cache's ``block_size`` then.

    Returns:
        The config; the engine core sets its ``kv_cache_layout`` as for its own.

    Raises:
        VllmIntegrationError: the plan keeps no null block, has a page spanning several block
            ids, has several block pools or a mixed-page group vLLM cannot run
            (:func:`~kvcore.integrations.vllm.rules.check_runnable`), has layers sharing
            another layer's cache (vLLM names those itself), or has states vLLM cannot keep
            (:func:`spec_to_vllm`).
    """
    _check_vllm_form(plan)
    if names is None:
        names = {
            name: vllm_layer_name(name, group.spec) for group in plan.groups for name in group.layer_names
        }
    else:
        names = {name: names.get(name, name) for name in plan.layer_names}
    pages = {name: group.spec_of(name).page_size_bytes for group in plan.groups for name in group.layer_names}
    length = plan.context.max_model_len
    state_block = align_state_block(plan) or None
    groups = [
        vk.KVCacheGroupSpec(
            layer_names=[names[n] for n in group.layer_names],
            kv_cache_spec=_group_to_vllm(group, names, length, state_block, state_cache_mode),
        )
        for group in plan.groups
    ]
    backing = plan.kv_cache_bytes
    tensors = []
    base = 0
    for tensor in plan.tensors:
        start = tensor.offset if plan.single_buffer else base + tensor.offset
        for name in tensor.shared_by:
            tensors.append(
                vk.KVCacheTensor(
                    size=backing,
                    layers=[names[name]],
                    # one layer per tensor: the layer stride only has to be below the block
                    # stride where pages are not dense, which keeps vLLM from splitting them
                    # into kernel blocks (a split needs dense pages)
                    layer_stride=pages[name],
                    block_stride=tensor.page_stride,
                    offset=start,
                )
            )
        base += tensor.size
    return vk.KVCacheConfig(num_blocks=plan.num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def _check_vllm_form(plan: KVCachePlan) -> None:
    """Refuse a plan :func:`plan_to_vllm_config` has no vLLM form for (its Raises)."""
    check_runnable(plan)
    if plan.null_block != 0:
        raise VllmIntegrationError(
            "vLLM keeps block 0 as its null block, but this plan serves requests from it; plan with "
            "PlanOptions(reserve_null_block=True) (plan_for_vllm does)"
        )
    if page_span(plan) != 1:
        raise VllmIntegrationError(
            f"a page of this plan spans {page_span(plan)} block ids, but vLLM gives a page one block id; "
            "plan with plan_for_vllm, which re-plans with larger attention blocks"
        )
    if plan.kv_sharing:
        raise VllmIntegrationError(
            f"layers {sorted(plan.kv_sharing)} share another layer's cache; vLLM finds KV sharing from the "
            "model itself, so plan without them"
        )


def _group_to_vllm(
    group: KVCacheGroup,
    names: Mapping[str, str],
    max_model_len: int,
    state_block: int | None,
    state_cache_mode: str | None,
) -> vk.KVCacheSpec:
    """vLLM's spec of one kvcore group: its spec's class (a state in ``state_cache_mode``
    where given), or for a mixed-page group a ``UniformTypeKVCacheSpecs`` of every layer's own
    (equal specs converted once; kvcore puts no state in one)."""
    if not group.layer_specs:
        spec = group.spec
        if isinstance(spec, StateSpec) and state_cache_mode is not None:
            spec = attrs.evolve(spec, cache_mode=state_cache_mode)
        return spec_to_vllm(spec, max_model_len=max_model_len, state_block=state_block)
    made: dict[int, vk.KVCacheSpec] = {}
    layers: dict[str, vk.KVCacheSpec] = {}
    for name in group.layer_names:
        spec = group.spec_of(name)
        converted = made.get(id(spec))
        if converted is None:
            converted = made[id(spec)] = spec_to_vllm(spec, max_model_len=max_model_len)
        layers[names[name]] = converted
    uniform = vk.UniformTypeKVCacheSpecs.from_specs(layers)
    if uniform is None:  # the kinds' table and vLLM disagree: refuse rather than mis-group
        raise VllmIntegrationError(
            f"vLLM does not take the layers {list(layers)[:3]}... of kinds "
            f"{sorted({s.kind for s in group.specs})} as one type (UniformTypeKVCacheSpecs.is_uniform_type); "
            "plan with PlanOptions(mixed_pages=False)"
        )
    return uniform


def _group_from_vllm(group: vk.KVCacheGroupSpec, context: SizingContext) -> KVCacheGroup:
    """kvcore's group for one of vLLM's: its spec, or for a ``UniformTypeKVCacheSpecs`` of
    different specs a mixed-page group whose spec is its first layer's."""
    layer_names = tuple(kvcore_layer_name(n) for n in group.layer_names)
    encoder = context.max_encoder_tokens

    def convert(name: str, spec: vk.KVCacheSpec) -> KVCacheSpec:
        return spec_from_vllm(name, spec, padded=True, max_encoder_tokens=encoder)

    spec = group.kv_cache_spec
    if not isinstance(spec, vk.UniformTypeKVCacheSpecs):
        return KVCacheGroup(
            layer_names=layer_names, spec=convert(group.layer_names[0] if group.layer_names else "?", spec)
        )
    made: dict[vk.KVCacheSpec, KVCacheSpec] = {}
    specs = {}
    for vllm_name, name in zip(group.layer_names, layer_names, strict=True):
        layer_spec = spec.kv_cache_specs[vllm_name]
        converted = made.get(layer_spec)
        if converted is None:
            converted = made[layer_spec] = convert(vllm_name, layer_spec)
        specs[name] = converted
    first = specs[layer_names[0]]
    return KVCacheGroup(
        layer_names=layer_names,
        spec=first,
        layer_specs={name: s for name, s in specs.items() if s != first},
    )


def plan_from_vllm_config(
    config: vk.KVCacheConfig,
    context: SizingContext,
    available_bytes: int | None = None,
    *,
    policy: str = "vllm",
) -> KVCachePlan:
    """vLLM's ``KVCacheConfig`` read as a kvcore plan (block 0 its null block).

    Groups, specs and byte ranges are vLLM's (a ``UniformTypeKVCacheSpecs`` group of
    different specs becomes a mixed-page group): each vLLM tensor's layer ``l`` becomes a kvcore
    tensor at ``offset + l * layer_stride`` with vLLM's block stride, and layers vLLM places at
    one offset and stride share it. Its figures (``max_concurrency()``, ``usable_blocks``) are
    what vLLM's own plan holds, by kvcore's count.

    Args:
        config: a worker's (or the scheduler's) config.
        context: what the plan holds is measured against (``VllmRules.context()``); its
            ``max_encoder_tokens`` sizes cross-attention layers.
        available_bytes: the budget it was made for (default: its backing allocation).
        policy: the name the plan records.

    Returns:
        The plan, checked like any kvcore plan.

    Raises:
        VllmIntegrationError: a spec has no kvcore form (or a cross-attention layer has no
            ``context.max_encoder_tokens``), or the tensors do not share one backing allocation.
        PlanValidationError: the config is not a sound plan by kvcore's rules.
    """
    sizes = {t.size for t in config.kv_cache_tensors}
    if len(sizes) > 1:
        raise VllmIntegrationError(
            f"vLLM's tensors have {len(sizes)} different backing sizes; vLLM 0.33 uses one"
        )
    backing = sizes.pop() if sizes else 0
    groups = tuple(_group_from_vllm(g, context) for g in config.kv_cache_groups)
    lanes: dict[tuple[int, int], list[str]] = {}
    for tensor in config.kv_cache_tensors:
        for index, name in enumerate(tensor.layers):
            key = (tensor.offset + index * tensor.layer_stride, tensor.block_stride)
            lanes.setdefault(key, []).append(kvcore_layer_name(name))
    page_of = {name: g.spec_of(name).page_size_bytes for g in groups for name in g.layer_names}
    num_blocks = config.num_blocks
    tensors = tuple(
        KVCacheTensor(
            size=(num_blocks - 1) * stride + max(page_of[n] for n in shared) if num_blocks else 0,
            offset=offset,
            page_stride=stride,
            shared_by=tuple(shared),
        )
        for (offset, stride), shared in lanes.items()
    )
    per_block = backing // num_blocks if num_blocks else 0
    return KVCachePlan(
        policy=policy,
        num_blocks=num_blocks,
        bytes_per_block=per_block,
        single_buffer=True,
        groups=groups,
        tensors=tensors,
        context=context,
        available_memory_bytes=backing if available_bytes is None else available_bytes,
        null_block=0,
    )
