"""SGLang's memory-pool rules, and planning under them with any kvcore policy (no SGLang needed).

SGLang 0.5 sizes its KV cache once at start-up: ``KVCacheConfigurator._resolve_memory_pool_config``
(``sglang/srt/mem_cache/kv_cache_configurator.py``) profiles the bytes left for the cache and
hands them to the configurator ``create_memory_pool_configurator`` picks
(``sglang/srt/model_executor/pool_configurator.py``), whose ``MemoryPoolConfig`` says how many
tokens each pool holds. The rules this module models, each from those files of sglang 0.5.23:

1. **The budget.** ``KVCacheConfigurator._profile_available_bytes``: the cache gets the memory
   free after the weights load less ``pre_model_load_memory x (1 - mem_fraction_static)`` of
   runtime slack, i.e. ``gpu x mem_fraction_static - weights`` (:func:`kv_budget`).
2. **One token pool per attention kind.** Full-attention (and MLA) layers share one token
   index; sliding-window layers share a second (``HybridSWAPoolConfigurator``); the two never
   share memory. A pool of ``size`` tokens allocates ``size + page_size`` rows: the first page
   is the padded slot that dummy tokens write to (``MHATokenToKVPool.__init__`` and
   ``_create_buffers`` in ``sglang/srt/mem_cache/memory_pool.py``).
3. **Sizing.** ``DefaultPoolConfigurator.calculate_pool_sizes``: ``budget // cell_size`` tokens,
   ``cell_size`` the bytes of one token over every layer, floored to a page.
   ``HybridSWAPoolConfigurator``: ``full = budget // (full_cell + swa_full_tokens_ratio x
   swa_cell)``, floored to a page, and ``swa = int(full x swa_full_tokens_ratio)``, floored to
   a page (ratio 0.8 unless ``--swa-full-tokens-ratio`` says otherwise:
   ``sglang/srt/arg_groups/fields/schedule.py``); an all-sliding model gets ``budget //
   swa_cell``. ``MemoryPoolConfigurator.validate_swa_pool_size`` refuses a sliding pool of at
   most ``sliding_window + page_size`` tokens.
4. **One page size, one window.** ``--page-size`` is one number for every pool, and the
   configurator reads one ``sliding_window_size``, so every sliding layer has the same window.
6. **DSA: the indexer's keys share the MLA pool's token index.** A DeepSeek sparse-attention
   model (``is_deepseek_dsa``: a DSA architecture with ``index_topk``,
   ``sglang/srt/configs/model_config.py:191-211``) runs one ``DSATokenToKVPool``
   (``sglang/srt/mem_cache/memory_pool.py:5279``): each layer's MLA latent and, on each layer
   that computes its own top-k (``dsa_layer_skips_topk``), ``index_head_dim`` fp8 bytes and a
   float32 scale per 128 of indexer keys (``mem_cache/index_key_cache.py:21-47``), both indexed
   by the one token slot, both ``size + page_size`` tokens. ``DefaultPoolConfigurator`` divides
   the budget by the latent's bytes plus the indexer's (``_compute_cell_size``,
   ``model_executor/pool_configurator.py:344-358``); with an fp8 cache the latent is packed,
   ``kv_lora_rank + kv_lora_rank / 128 x 4 + qk_rope_head_dim x 2`` bytes
   (``calculate_mla_kv_cache_dim``, ``mem_cache/kv_cache_configurator.py:3412-3478``). Its
   pages are 64 tokens (``DSA requires 64-token physical pages``, ``memory_pool.py:5357-5360``).
   In kvcore the pool is one group of ``mla`` and ``dsa_indexer`` layers, one block table with
   pages of two sizes (both keep every token).
5. **The Mamba state pool comes first.** A hybrid linear/Mamba model's state pool is sized
   before the configurator runs (``KVCacheConfigurator._handle_max_mamba_cache``, called from
   ``_profile_available_bytes``): unless ``--max-mamba-cache-size`` is given, it takes
   ``budget x r / (1 + r)`` (``r`` the ``--mamba-full-memory-ratio``, 0.9 unless set:
   ``sglang/srt/arg_groups/fields/schedule.py``), in ``K = (that - slot) // slot`` slots of
   ``slot`` bytes (every state layer's conv and temporal state:
   ``Mamba2CacheParams.mamba_cache_per_req`` in ``sglang/srt/configs/mamba_utils.py``), and
   the configurator gets what is left after ``(K + 1)`` slots (``MambaPool`` allocates a
   padding slot). The temporal state is kept in ``--mamba-ssm-dtype`` (float32 unless the
   model config says otherwise: ``mamba2_state_dtype``), and a running request holds
   ``_calculate_mamba_ratio()`` slots: 3 with the radix cache (2 with
   ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``), plus the extra buffer's tracking slots (2 with the
   overlap scheduler, 1 without or lazy), 1 without the radix cache
   (``resolve_max_num_reqs`` caps running requests at ``K // slots``).

A kvcore plan SGLang can run therefore gives each SGLang pool (the Mamba pool included) one
group of its own block pool,
all of one block size (SGLang's page), with block 0 of each pool kept back as SGLang's padded
page (``PlanOptions.reserve_null_block``); the tokens a pool holds are its usable blocks times
the page (:func:`pool_sizes`). :func:`plan_for_sglang` plans for that;
:func:`check_runnable` refuses, naming why, what SGLang cannot run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import attrs

from kvcore.dtypes import dtype_name
from kvcore.errors import KVCoreError
from kvcore.integrations.capabilities import EngineCapabilities
from kvcore.integrations.engine_rules import EngineRules, takes_engine_request
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.planning import planner
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest
from kvcore.plugins.dsa_indexer import INDEXER_DTYPE, INDEXER_SCALE_BLOCK, DSAIndexerSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.policy import PlanOptions
from kvcore.spec import DEFAULT_MAX_NUM_BATCHED_TOKENS, KVCacheSpec, SizingContext, describe_spec, map_specs
from kvcore.validators import positive_int

#: The SGLang releases this integration is written and tested against (pyproject's extra).
SGLANG_VERSIONS = ">=0.5.23,<0.6"

#: SGLang's default ``--swa-full-tokens-ratio`` (``sglang/srt/arg_groups/fields/schedule.py``:
#: the field's fallback).
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8

#: SGLang's default ``SGLANG_SWA_EVICTION_INTERVAL`` (``sglang/srt/environ.py``).
DEFAULT_SWA_EVICTION_INTERVAL = 128

#: SGLang's default ``--mamba-full-memory-ratio`` (``sglang/srt/arg_groups/fields/schedule.py``).
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9

#: SGLang's default ``--mamba-ssm-dtype`` (``mamba2_state_dtype`` in ``sglang/srt/configs/mamba_utils.py``).
DEFAULT_MAMBA_SSM_DTYPE = "float32"

#: SGLang's default ``--page-size`` (``ServerArgs.page_size`` resolves to 1 on most backends).
DEFAULT_PAGE_SIZE = 1

#: SGLang's pools, by the kvcore kind whose layers they hold (rule 2): ``full`` is the token
#: pool of ``MHATokenToKVPool``/``MLATokenToKVPool`` (``DefaultPoolConfigurator``, the full
#: side of ``HybridSWAPoolConfigurator``), ``swa`` the sliding side of ``SWAKVPool``.
POOL_OF_KIND: dict[str, str] = {
    "full_attention": "full",
    "mla": "full",
    # SGLang's DSATokenToKVPool indexes the indexer keys by the MLA latent's token slot (rule 6)
    "dsa_indexer": "full",
    "sliding_window": "swa",
    "state": "mamba",
}

#: kvcore kinds SGLang has a pool for but this integration does not convert, and why.
UNCONVERTED_KINDS: dict[str, str] = {
    "chunked_local_attention": (
        "SGLang runs Llama 4's chunked attention over the full token pool, so its pool sizes "
        "are not kvcore's chunked plan"
    ),
    "cross_attention": (
        "SGLang's encoder-decoder models keep their cross-attention cache outside the token pools"
    ),
}


#: The architectures SGLang runs with its sliding-window pool (``is_hybrid_swa_model`` in
#: ``sglang/srt/configs/model_config.py``, with its ``SWA_SINK_ARCHS`` and ``MIMO_V2_MODEL_ARCHS``).
#: Any other model's sliding layers keep every token in the full pool. The decision for a model
#: (this list, its two conditions, the config's opt-in and the overrides that turn it off) is
#: :func:`kvcore.integrations.sglang.model.runs_hybrid_swa`'s.
HYBRID_SWA_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "BeamForCausalLM",
        "Llama4ForConditionalGeneration",
        "DeepseekV4ForCausalLM",
        "DeepseekV4ForCausalLMNextN",
        "DeepseekV4ForCausalLMDSpark",
        "GptOssForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "IQuestQ1ForCausalLM",
        "IQuestQ1MTP",
        "MiMoV2ForCausalLM",
        "MiMoV2FlashForCausalLM",
        "MiMoV2MTP",
        "Step3p5ForCausalLM",
        "Step3p5MTP",
        "Step3p7ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "EmbeddingGemma2Model",
        "Gemma4UnifiedForConditionalGeneration",
        "DiffusionGemmaForBlockDiffusion",
        "LagunaForCausalLM",
        "MellumForCausalLM",
        "MuseGlimmerForCausalLM",
        "MuseGlimmerForConditionalGeneration",
        "InklingForConditionalGeneration",
        "InklingForConditionalGenerationMTP",
        "UnlimitedOCRForCausalLM",
    }
)


#: Bundled architectures SGLang 0.5.23 has no model class for (no ``sglang/srt/models/jamba.py``):
#: ``kvcore compare --engine sglang`` shows its rules applied to them, and says so.
NO_SGLANG_MODEL: frozenset[str] = frozenset({"JambaForCausalLM"})


#: The architectures SGLang runs with DeepSeek's sparse attention (DSA) when their config has an
#: ``index_topk`` (``is_deepseek_dsa`` in ``sglang/srt/configs/model_config.py``).
DSA_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
    }
)

#: DSA configs kvcore's model front end maps to SGLang's ``DSATokenToKVPool``: DeepSeek-V3.2's
#: (the deepseek family, :mod:`kvcore.plugins.models.deepseek`).
DSA_MODEL_TYPES: frozenset[str] = frozenset({"deepseek_v3", "deepseek_v32"})
#: SGLang's DSA page (rule 6: ``DSATokenToKVPool`` asserts 64-token physical pages on CUDA).
DSA_PAGE_SIZE = 64
#: The indexer key size ``DSATokenToKVPool`` asserts (``memory_pool.py:5338``).
DSA_INDEX_HEAD_DIM = 128
#: Why kvcore does not plan some DSA models for SGLang (the gaps follow it).
DSA_REFUSAL = (
    "SGLang runs this model with DeepSeek's sparse attention (DSA): its DSATokenToKVPool keeps, beside "
    "each layer's MLA latent, an indexer key cache on the layers dsa_layer_skips_topk leaves"
)


def dsa_gaps(config: Mapping[str, object]) -> list[str]:
    """What of a DSA config's ``DSATokenToKVPool`` kvcore does not plan (empty: it maps).

    kvcore's deepseek family reads DeepSeek-V3.2's fields (``index_head_dim``, and which layers
    skip the indexer by ``index_topk_freq`` / ``index_skip_topk_offset`` / ``index_topk_pattern``,
    as vLLM does); SGLang also reads GLM's ``indexer_types``, LongCat's ``cli_factor`` and
    pooled keys (``index_kpool``, ``dsa_layer_skips_topk`` and ``get_dsa_index_kpool`` in
    ``sglang/srt/configs/model_config.py``), which kvcore's specs do not hold.
    """
    gaps = []
    model_type = config.get("model_type")
    if model_type not in DSA_MODEL_TYPES:
        gaps.append(
            f"model type {model_type!r}: kvcore's model front end maps the indexer of "
            f"{', '.join(sorted(DSA_MODEL_TYPES))} configs only"
        )
    if (config.get("index_kpool") or 1) != 1:
        gaps.append(
            f"index_kpool {config.get('index_kpool')}: pooled indexer keys (one per index_kpool tokens)"
        )
    for field in ("indexer_types", "cli_factor"):
        if config.get(field) not in (None, 1):
            gaps.append(f"{field}: SGLang's own rule for the layers that skip the indexer")
    return gaps


def refuse_dsa(architectures: Sequence[str], config: Mapping[str, object], fix: str) -> None:
    """Raise for a model SGLang runs with DSA in a form kvcore does not plan (:func:`dsa_gaps`);
    DeepSeek-V3.2's DSA pool maps (rule 6). ``config`` is the ``config.json`` (its
    ``text_config`` is read too); ``fix`` says what to do."""
    text = config.get("text_config")
    fields = {**config, **text} if isinstance(text, Mapping) else config
    if fields.get("index_topk") is None or not any(a in DSA_ARCHITECTURES for a in architectures):
        return
    gaps = dsa_gaps(fields)
    if gaps:
        raise SglangIntegrationError(f"{DSA_REFUSAL}, and kvcore does not plan its {'; '.join(gaps)}; {fix}")


class SglangIntegrationError(KVCoreError, ValueError):
    """Something kvcore and SGLang cannot agree on: a kind SGLang has no pool for, a plan its
    memory-pool configuration cannot express, or SGLang missing or of another version."""


def mamba_slots_per_request(
    *,
    radix_cache: bool = True,
    extra_buffer: bool = False,
    overlap_schedule: bool = True,
    lazy: bool = False,
    skip_decode_lock: bool = False,
) -> int:
    """State slots SGLang keeps per running request of a Mamba hybrid (rule 5):
    ``KVCacheConfigurator._calculate_mamba_ratio`` with ``get_mamba_tracking_slots``
    (``sglang/srt/mem_cache/allocation_sizing.py``)."""
    if not radix_cache:
        return 1
    base = 3 - (1 if skip_decode_lock else 0)
    if extra_buffer:
        return base + (1 if lazy else 2 if overlap_schedule else 1)
    # the no-buffer mode under skip-decode-lock adds the dropped slot back
    return base + (1 if skip_decode_lock else 0)


def _ratio(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0 < value <= 1:
        raise SglangIntegrationError(
            f"swa_full_tokens_ratio must be in (0, 1], as SGLang checks (got {value}); "
            "pass --swa-full-tokens-ratio between 0 and 1"
        )


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise SglangIntegrationError(
            f"mamba_full_memory_ratio must be positive, as SGLang divides by it (got {value}); pass "
            "--mamba-full-memory-ratio above 0"
        )


@attrs.frozen(kw_only=True)
class SglangRules(EngineRules):
    """The server settings of an SGLang engine that its KV pools depend on.

    Attributes:
        context_len: the longest request (SGLang's ``--context-length``).
        page_size: tokens per page (``--page-size``), every pool's.
        chunked_prefill_size: tokens one prefill chunk computes (``--chunked-prefill-size``).
        overlap_schedule: whether the overlap scheduler runs (the default): two chunks in
            flight, as ``compute_swa_request_cap`` counts them (``chunks_in_flight``).
        swa_full_tokens_ratio: sliding-pool tokens per full-pool token in SGLang's own sizing.
        swa_eviction_interval: decode tokens between SGLang's evictions of a request's old
            sliding tokens (``SGLANG_SWA_EVICTION_INTERVAL``).
        mamba_full_memory_ratio: Mamba state bytes per full-attention byte in SGLang's own
            split (``--mamba-full-memory-ratio``).
        mamba_slots_per_request: state slots a running request holds
            (:func:`mamba_slots_per_request`; 3, the radix cache without the extra buffer).
        mamba_ssm_dtype: the dtype SGLang keeps the temporal (SSM) state in.
    """

    engine: ClassVar[str] = "SGLang"
    default_policy: ClassVar[str] = "kind_pools"  # SGLang's own layout: a pool per kind

    context_len: int = attrs.field(validator=positive_int)
    page_size: int = attrs.field(default=DEFAULT_PAGE_SIZE, validator=positive_int)
    chunked_prefill_size: int = attrs.field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS, validator=positive_int)
    overlap_schedule: bool = True
    swa_full_tokens_ratio: float = attrs.field(default=DEFAULT_SWA_FULL_TOKENS_RATIO, validator=_ratio)
    swa_eviction_interval: int = attrs.field(default=DEFAULT_SWA_EVICTION_INTERVAL, validator=positive_int)
    mamba_full_memory_ratio: float = attrs.field(default=DEFAULT_MAMBA_FULL_MEMORY_RATIO, validator=_positive)
    mamba_slots_per_request: int = attrs.field(default=3, validator=positive_int)
    mamba_ssm_dtype: str = DEFAULT_MAMBA_SSM_DTYPE

    def state_spec(self, spec: StateSpec) -> StateSpec:
        """``spec`` holding SGLang's slots per request: kvcore's state counts ``1 +
        speculative_slots`` states a request, SGLang ``mamba_slots_per_request`` (the radix
        cache's copies stand where draft states would)."""
        return attrs.evolve(spec, cache_mode="none", speculative_slots=self.mamba_slots_per_request - 1)

    @property
    def tokens_in_flight(self) -> int:
        """Tokens a sliding layer may hold past its window: the prefill chunks in flight, or,
        if more, the decode tokens SGLang lets pile up before it evicts (it frees a request's
        sliding tokens only every ``SGLANG_SWA_EVICTION_INTERVAL`` tokens, plus a page:
        ``ScheduleBatch.maybe_evict_swa`` in ``sglang/srt/managers/schedule_batch.py``)."""
        chunks = (2 if self.overlap_schedule else 1) * self.chunked_prefill_size
        return max(chunks, self.swa_eviction_interval + self.page_size)

    def context(self) -> SizingContext:
        """The sizing context of a plan SGLang runs: the chunks in flight stand for the step."""
        return SizingContext(max_model_len=self.context_len, max_num_batched_tokens=self.tokens_in_flight)

    def options(self, options: PlanOptions | None = None, *, dsa: bool = False) -> PlanOptions:
        """``options`` with block 0 of each pool kept back as SGLang's padded page (rule 2) and
        one spec per group (an SGLang pool has one head shape), or, for a DSA model (``dsa``),
        latents and indexer keys in one group of two page sizes (rule 6)."""
        return attrs.evolve(options or PlanOptions(), reserve_null_block=True, mixed_pages=dsa)


def kv_budget(gpu_bytes: int, weight_bytes: int, mem_fraction_static: float) -> int:
    """The bytes SGLang leaves its KV pools (rule 1): ``gpu x mem_fraction_static - weights``.

    ``KVCacheConfigurator._profile_available_bytes`` takes the memory free after loading
    (``gpu - weights`` on an otherwise idle device) less the slack ``gpu x (1 -
    mem_fraction_static)``.

    Raises:
        SglangIntegrationError: ``mem_fraction_static`` outside (0, 1], or weights that leave
            nothing (SGLang's "Not enough memory").
    """
    if not 0 < mem_fraction_static <= 1:
        raise SglangIntegrationError(f"mem_fraction_static must be in (0, 1] (got {mem_fraction_static})")
    budget = int(gpu_bytes * mem_fraction_static) - weight_bytes
    if budget <= 0:
        raise SglangIntegrationError(
            f"weights of {weight_bytes:,} bytes leave no KV pool within mem_fraction_static "
            f"{mem_fraction_static} of {gpu_bytes:,} bytes; raise --mem-fraction-static"
        )
    return budget


def window_of(spec: KVCacheSpec) -> int:
    """The window of a sliding-window layer (the one kind :data:`POOL_OF_KIND` puts in ``swa``)."""
    if not isinstance(spec, SlidingWindowSpec):
        raise SglangIntegrationError(f"a {spec.kind} layer has no sliding window")
    return spec.sliding_window


def token_bytes(spec: KVCacheSpec) -> int:
    """Bytes one token of a layer with ``spec`` takes in an SGLang pool (a page's bytes per
    token), or, for a state layer, one slot of SGLang's Mamba pool: its tensors, unpadded
    (``MambaPool`` keeps each in a tensor of its own)."""
    if isinstance(spec, StateSpec):
        return spec.state_bytes
    return spec.page_size_bytes // spec.block_size


def cell_bytes(specs: Mapping[str, KVCacheSpec], names: Sequence[str]) -> int:
    """Bytes of one token (one state slot for the Mamba pool) over the layers ``names``: what
    SGLang divides a pool's budget by."""
    return sum(token_bytes(specs[n]) for n in names)


def _pool_layers(specs: Mapping[str, KVCacheSpec]) -> dict[str, list[str]]:
    """The layers of ``specs`` by SGLang pool; raises for a kind SGLang's pools do not hold."""
    pools: dict[str, list[str]] = {}
    for name, spec in specs.items():
        pool = POOL_OF_KIND.get(spec.kind)
        if pool is None:
            why = UNCONVERTED_KINDS.get(spec.kind, "SGLang has no pool for it")
            raise SglangIntegrationError(
                f"layer {name!r} is of kind {spec.kind!r}, which kvcore does not convert for SGLang: {why}"
            )
        pools.setdefault(pool, []).append(name)
    return pools


def check_specs(specs: Mapping[str, KVCacheSpec]) -> dict[str, list[str]]:
    """The layers of ``specs`` by SGLang pool (``full``, ``swa``), checked against rules 2 and 4.

    Raises:
        SglangIntegrationError: a kind SGLang has no pool for, sliding layers of two different
            windows, or layers of one pool with different token shapes (SGLang's pools have
            one head count and head size each).
    """
    pools = _pool_layers(specs)
    if pools.get("mamba") and pools.get("swa"):
        raise SglangIntegrationError(
            "the model has state and sliding-window layers: SGLang 0.5 runs those (Inkling-class models) "
            "in its unified memory pool (--enable-unified-memory), one buffer whose sliding region is sized "
            "at run time, or in separate pools with the extra-buffer Mamba strategy, which needs a GPU; "
            "kvcore plans neither"
        )
    windows = sorted({window_of(specs[n]) for n in pools.get("swa", ())})
    if len(windows) > 1:
        raise SglangIntegrationError(
            f"sliding-window layers have windows {windows}, but SGLang reads one sliding_window_size "
            "for its sliding pool; SGLang cannot run this model with different windows"
        )
    for pool, names in pools.items():
        # a DSA pool holds latents and indexer keys: one shape for each (rule 6)
        for kind in sorted({specs[n].kind for n in names}):
            shapes = sorted({token_bytes(specs[n]) for n in names if specs[n].kind == kind})
            if len(shapes) > 1:
                raise SglangIntegrationError(
                    f"the {pool} pool's {kind} layers take {shapes} bytes per "
                    f"{'state' if pool == 'mamba' else 'token'}, but an SGLang pool has one "
                    + ("state shape" if pool == "mamba" else "head count and head size")
                    + " for all its layers"
                )
    _check_dsa(specs, pools.get("full", ()))
    return pools


def is_dsa(specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether ``specs`` hold a DSA indexer: SGLang runs them in a ``DSATokenToKVPool`` (rule 6)."""
    return any(isinstance(s, DSAIndexerSpec) for s in specs.values())


def _check_dsa(specs: Mapping[str, KVCacheSpec], full: Sequence[str]) -> None:
    """Raise unless the full pool's indexer layers are what ``DSATokenToKVPool`` holds: beside
    MLA layers, keys of 128 fp8 elements with a float32 scale per 128 (it asserts
    ``index_head_dim == 128``, ``memory_pool.py:5338``; ``quant_block_size = 128``)."""
    indexers = [specs[n] for n in full if isinstance(specs[n], DSAIndexerSpec)]
    if not indexers:
        return
    kinds = sorted({specs[n].kind for n in full} - {"dsa_indexer"})
    if kinds != ["mla"]:
        raise SglangIntegrationError(
            f"DSA indexer layers beside {kinds or 'no'} layers: SGLang's DSATokenToKVPool is an MLA pool"
        )
    for spec in {id(s): s for s in indexers}.values():
        assert isinstance(spec, DSAIndexerSpec)
        if (spec.index_head_dim, dtype_name(spec.dtype), spec.scale_block_size) != (
            DSA_INDEX_HEAD_DIM,
            INDEXER_DTYPE,
            INDEXER_SCALE_BLOCK,
        ):
            raise SglangIntegrationError(
                f"{describe_spec(spec)}: SGLang's DSATokenToKVPool keeps indexer keys of "
                f"{DSA_INDEX_HEAD_DIM} "
                f"{INDEXER_DTYPE} elements with a float32 scale per {INDEXER_SCALE_BLOCK}"
            )


def default_page_size(specs: Mapping[str, KVCacheSpec]) -> int:
    """SGLang's ``--page-size`` when none is given: 64 for a DSA model (``Setting page size to
    64 for DeepSeek DSA``, ``sglang/srt/arg_groups/model_overrides/deepseek_v2.py:171-173``, on
    CUDA), else :data:`DEFAULT_PAGE_SIZE`."""
    return DSA_PAGE_SIZE if is_dsa(specs) else DEFAULT_PAGE_SIZE


def check_dsa_page(specs: Mapping[str, KVCacheSpec], page_size: int) -> None:
    """Raise for a DSA model at a page SGLang's ``DSATokenToKVPool`` refuses (rule 6)."""
    if page_size != DSA_PAGE_SIZE and is_dsa(specs):
        raise SglangIntegrationError(
            f"--page-size {page_size}: SGLang's DSA pool requires {DSA_PAGE_SIZE}-token pages "
            f"(DSATokenToKVPool); serve this model with --page-size {DSA_PAGE_SIZE}"
        )


@attrs.frozen(kw_only=True)
class SglangPoolSizes:
    """What SGLang's ``MemoryPoolConfig`` takes, with the figures kvcore promises for it.

    Attributes:
        page_size: ``--page-size`` (every pool's).
        full_tokens: tokens of the full pool (``full_max_total_num_tokens``), 0 if none.
        swa_tokens: tokens of the sliding pool (``swa_max_total_num_tokens``), 0 if none.
        sliding_window: the one window of the sliding layers, or ``None``.
        mamba_states: state slots of the Mamba pool (``max_mamba_cache_size``), 0 if none.
    """

    page_size: int = attrs.field(validator=positive_int)
    full_tokens: int = 0
    swa_tokens: int = 0
    sliding_window: int | None = None
    mamba_states: int = 0

    @property
    def is_hybrid_swa(self) -> bool:
        """Whether SGLang runs a sliding pool (``KVCacheConfigurator.is_hybrid_swa``)."""
        return self.sliding_window is not None

    @property
    def max_total_num_tokens(self) -> int:
        """``MemoryPoolConfig.max_total_num_tokens``: the full pool's tokens, or the sliding
        pool's when the model has no full layer (``HybridSWAPoolConfigurator._solve_pool_sizes``)."""
        return self.full_tokens or self.swa_tokens


def _runnable_group(plan: KVCachePlan, group: KVCacheGroup, pool: str) -> None:
    # a DSA pool: latents and indexer keys share the token slot, pages of two sizes (rule 6)
    if group.layer_specs and {s.kind for s in group.specs} != {"mla", "dsa_indexer"}:
        raise SglangIntegrationError(
            f"policy {plan.policy!r} put layers of different page sizes in one group; an SGLang {pool} pool "
            "has one page shape; plan with PlanOptions(mixed_pages=False)"
        )
    sharing = [g for g in plan.groups if g.pool == group.pool]
    if len(sharing) > 1:
        raise SglangIntegrationError(
            f"policy {plan.policy!r} made {len(sharing)} groups draw from one block pool, but SGLang's "
            "full and sliding pools never share memory and every layer of a pool shares one token index; "
            "plan for SGLang with kind_pools (one pool per kind)"
        )


def check_runnable(plan: KVCachePlan, specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheGroup]:
    """The group of each SGLang pool, or raise for a plan SGLang's pools cannot hold.

    Raises:
        SglangIntegrationError: a kind or window SGLang cannot run (:func:`check_specs`), two
            groups for one SGLang pool or one block pool for two groups, a mixed-page group,
            block sizes that differ (SGLang has one page size), or no padded page (block 0
            not kept back).
    """
    by_pool = check_specs(specs)
    sizes = sorted({g.spec.block_size for g in plan.groups})
    if len(sizes) > 1:
        raise SglangIntegrationError(
            f"policy {plan.policy!r} planned block sizes {sizes}, but SGLang has one --page-size for "
            "every pool"
        )
    if plan.null_block is None:
        raise SglangIntegrationError(
            f"policy {plan.policy!r} planned without block 0 kept back, but every SGLang pool allocates a "
            "padded first page; plan with PlanOptions(reserve_null_block=True) (plan_for_sglang does)"
        )
    groups: dict[str, KVCacheGroup] = {}
    for pool, names in by_pool.items():
        owners = {id(plan.group_of(n)): plan.group_of(n) for n in names}
        if len(owners) > 1:
            raise SglangIntegrationError(
                f"policy {plan.policy!r} split the {pool} pool's layers into {len(owners)} groups, but "
                "SGLang keeps one token index for all of them; plan for SGLang with kind_pools"
            )
        (group,) = owners.values()
        if len(group.layer_names) != len(names):
            raise SglangIntegrationError(
                f"policy {plan.policy!r} put layers of another kind in the {pool} pool's group; SGLang keeps "
                "full and sliding layers in pools of their own; plan for SGLang with kind_pools"
            )
        _runnable_group(plan, group, pool)
        groups[pool] = group
    return groups


def pool_sizes(plan: KVCachePlan, specs: Mapping[str, KVCacheSpec]) -> SglangPoolSizes:
    """What SGLang's ``MemoryPoolConfig`` takes to run ``plan``: each pool's tokens are its
    group's usable blocks times the page (block 0 is SGLang's padded page).

    Raises:
        SglangIntegrationError: a plan SGLang cannot run (:func:`check_runnable`).
    """
    groups = check_runnable(plan, specs)
    tokens = {pool: plan.tokens_held(group) or 0 for pool, group in groups.items()}
    swa, mamba = groups.get("swa"), groups.get("mamba")
    return SglangPoolSizes(
        page_size=plan.groups[0].spec.block_size,
        full_tokens=tokens.get("full", 0),
        swa_tokens=tokens.get("swa", 0),
        sliding_window=window_of(swa.spec) if swa is not None else None,
        # a state takes one block; block 0 is SGLang's padding slot
        mamba_states=plan.usable_blocks_in(mamba.pool) if mamba is not None else 0,
    )


def own_mamba_split(budget: int, slot_bytes: int, rules: SglangRules) -> tuple[int, int]:
    """SGLang's own split of ``budget`` bytes between its Mamba pool and the KV pools (rule 5):
    ``(state slots, bytes left to the configurator)``, as ``_handle_max_mamba_cache`` works it
    out in GiB floats (``_profile_available_bytes`` turns the rest back into bytes).

    Raises:
        SglangIntegrationError: a budget of no slot (SGLang's "Not enough GPU memory for
            hybrid (mamba/linear-attention) state cache").
    """
    gib = 1 << 30
    rest = budget / gib
    ratio = rules.mamba_full_memory_ratio
    mamba_budget = rest * ratio / (1 + ratio) * gib
    slots = int((mamba_budget - slot_bytes) // slot_bytes)
    if slots <= 0:
        raise SglangIntegrationError(
            f"SGLang's Mamba share of {int(mamba_budget):,} bytes holds no state slot of "
            f"{slot_bytes:,} bytes; raise --mem-fraction-static or --mamba-full-memory-ratio"
        )
    return slots, int((rest - (slots + 1) * slot_bytes / gib) * gib)


def own_pool_sizes(specs: Mapping[str, KVCacheSpec], budget: int, rules: SglangRules) -> SglangPoolSizes:
    """The pools SGLang's own configurator sizes for ``specs`` in ``budget`` bytes (rule 3).

    ``DefaultPoolConfigurator`` without sliding layers, ``HybridSWAPoolConfigurator`` with
    them, each with SGLang's ``swa_full_tokens_ratio`` and ``page_size`` from ``rules``.

    Raises:
        SglangIntegrationError: layers SGLang cannot run (:func:`check_specs`), or a budget
            whose pools cannot hold one request (SGLang's own start-up errors).
    """
    pools = check_specs(specs)
    page = rules.page_size
    check_dsa_page(specs, page)
    states = 0
    if pools.get("mamba"):
        states, budget = own_mamba_split(budget, cell_bytes(specs, pools["mamba"]), rules)
    full_cell = cell_bytes(specs, pools.get("full", ()))
    swa_cell = cell_bytes(specs, pools.get("swa", ()))
    window = window_of(specs[pools["swa"][0]]) if pools.get("swa") else None
    if window is None:
        full = budget // full_cell // page * page if full_cell else 0
        swa = 0
    elif not full_cell:
        full, swa = 0, budget // swa_cell // page * page
    else:
        # SGLang's cell size is a float here (ratio x swa bytes) and divides with //
        full = int(budget // (full_cell + rules.swa_full_tokens_ratio * swa_cell)) // page * page
        swa = int(full * rules.swa_full_tokens_ratio) // page * page
        if window + page >= swa:
            raise SglangIntegrationError(
                f"SGLang's sliding pool of {swa:,} tokens cannot hold one request (window {window:,} + page "
                f"{page}); raise --swa-full-tokens-ratio or the budget"
            )
    if max(full, swa) <= 0 and (full_cell or swa_cell):
        raise SglangIntegrationError(
            f"a budget of {budget:,} bytes holds no page of SGLang's pools; raise --mem-fraction-static"
        )
    return SglangPoolSizes(
        page_size=page, full_tokens=full, swa_tokens=swa, sliding_window=window, mamba_states=states
    )


def pool_bytes(sizes: SglangPoolSizes, specs: Mapping[str, KVCacheSpec]) -> int:
    """Bytes SGLang's pools of ``sizes`` allocate, the padded page of each included (rule 2)."""
    pools = check_specs(specs)
    total = 0
    for pool, tokens in (("full", sizes.full_tokens), ("swa", sizes.swa_tokens)):
        if tokens and pools.get(pool):
            total += (tokens + sizes.page_size) * cell_bytes(specs, pools[pool])
    if sizes.mamba_states and pools.get("mamba"):
        # MambaPool's padding slot, as the padded page of the token pools
        total += (sizes.mamba_states + 1) * cell_bytes(specs, pools["mamba"])
    return total


@takes_engine_request
def plan_for_sglang(request: PlanRequest, rules: SglangRules, *, registry: Registry) -> KVCachePlan:
    """Plan ``request`` with a kvcore policy so that SGLang's pools hold what kvcore counts.

    The specs are re-blocked to SGLang's page size, planned for the chunks in flight
    (:meth:`SglangRules.context`) with block 0 of each pool kept back, and checked with
    :func:`check_runnable`.

    Args:
        request: the specs in model order, SGLang's KV budget in bytes (:func:`kv_budget`), the
            policy (:meth:`SglangRules.request` gives ``kind_pools``, SGLang's own layout,
            unless told) and its options (the padded page and one spec per group are forced);
            sized by the rules (:meth:`SglangRules.request` makes it).
        rules: SGLang's server settings.
        registry: where the policy is looked up.

    Returns:
        The plan, runnable by SGLang (:func:`pool_sizes` gives its ``MemoryPoolConfig``).

    Raises:
        InvalidInputError: a request not sized by ``rules`` (:meth:`SglangRules.check_request`).
        SglangIntegrationError: layers or a plan SGLang cannot run.
        PolicyNotApplicableError, InsufficientMemoryError: as :func:`~kvcore.planning.planner.plan`.
    """
    rules.check_request(request)
    specs = request.specs
    check_specs(specs)
    check_dsa_page(specs, rules.page_size)
    paged = sglang_specs(specs, rules)
    chosen = attrs.evolve(request, specs=paged, options=rules.options(request.options, dsa=is_dsa(specs)))
    made = planner.plan(chosen, registry=registry).plans[0]
    check_runnable(made, paged)
    return made


def as_sglang_runs(
    specs: Mapping[str, KVCacheSpec], hybrid_swa: bool, mamba_ssm_dtype: str = DEFAULT_MAMBA_SSM_DTYPE
) -> dict[str, KVCacheSpec]:
    """``specs`` as SGLang keeps them: without its sliding pool (``hybrid_swa`` false, see
    :func:`kvcore.integrations.sglang.model.runs_hybrid_swa`) a sliding layer keeps every
    token in the full pool, so it is planned as full attention of the same heads; a state's
    recurrent (non-conv) tensors are kept in ``mamba_ssm_dtype`` (rule 5)."""
    made: dict[int, KVCacheSpec] = {}
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        if isinstance(spec, StateSpec) and id(spec) not in made:
            made[id(spec)] = attrs.evolve(
                spec,
                parts=tuple(
                    p
                    if p.name.startswith("conv")
                    else StatePart(name=p.name, shape=p.shape, dtype=mamba_ssm_dtype)
                    for p in spec.parts
                ),
            )
        if not hybrid_swa and isinstance(spec, SlidingWindowSpec) and id(spec) not in made:
            made[id(spec)] = FullAttentionSpec(
                block_size=spec.block_size,
                num_kv_heads=spec.num_kv_heads,
                head_size=spec.head_size,
                dtype=spec.dtype,
            )
        out[name] = made.get(id(spec), spec)
    return out


def sglang_specs(specs: Mapping[str, KVCacheSpec], rules: SglangRules) -> dict[str, KVCacheSpec]:
    """``specs`` as a plan for SGLang takes them: SGLang's page as every block size, and each
    state holding SGLang's slots per request (:meth:`SglangRules.state_spec`)."""
    return map_specs(
        paged_specs(specs, rules.page_size),
        lambda spec: rules.state_spec(spec) if isinstance(spec, StateSpec) else spec,
    )


def paged_specs(specs: Mapping[str, KVCacheSpec], page_size: int) -> dict[str, KVCacheSpec]:
    """``specs`` with SGLang's page as every block size (equal specs stay one object)."""
    return map_specs(
        specs, lambda spec: spec if spec.block_size == page_size else spec.with_block_size(page_size)
    )


def capabilities() -> EngineCapabilities:
    """What SGLang runs of kvcore's plans, read from this module's tables and checks.

    The kinds are :data:`POOL_OF_KIND`'s; a built-in policy is listed when its plan of a
    reference model (full layers; a full and a sliding layer; a full and a state layer) passes
    :func:`check_runnable`.
    """
    registry = Registry.default(autoload=False)  # the built-in policies only
    rules = SglangRules(context_len=256, page_size=16, chunked_prefill_size=64)
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
    sliding = SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=64
    )
    state = StateSpec(block_size=16, parts=(StatePart(name="conv", shape=(3, 64), dtype="bfloat16"),))
    references: dict[str, dict[str, KVCacheSpec]] = {
        "full attention only": {"0": full, "1": full},
        "full and sliding layers": {"0": full, "1": sliding},
        "full and state layers": {"0": full, "1": state},
    }
    runs: dict[str, list[str]] = {}
    for model, reference in references.items():
        for name in registry.policies:
            try:
                plan_for_sglang(rules.request(reference, 1 << 24, policy=name), rules, registry=registry)
            except KVCoreError:
                continue
            runs.setdefault(name, []).append(model)
    partial = [
        f"{name}: runs on models of {' and '.join(models)}"
        for name, models in runs.items()
        if len(models) < len(references)
    ]
    return EngineCapabilities(
        engine="sglang",
        versions=SGLANG_VERSIONS,
        kinds=POOL_OF_KIND,
        policies=runs,
        # kind_pools is the only built-in policy of several pools
        several_pools="kind_pools" in runs,
        mixed_pages=rules.options().mixed_pages,
        prefix_caching=False,
        speculative_decoding=False,
        notes=(
            *(f"{kind}: not converted ({why})" for kind, why in UNCONVERTED_KINDS.items()),
            *partial,
            "state: SGLang's Mamba pool, its slots set by the plugin's hook on "
            "KVCacheConfigurator._handle_max_mamba_cache; not with speculative decoding, "
            "--max-mamba-cache-size or sliding layers beside state layers (SGLang runs those in its "
            "unified memory pool, sized at run time, or with the GPU-only extra Mamba buffer)",
            "dsa_indexer: in SGLang's DSATokenToKVPool with the MLA layers, one token index (one kvcore "
            "group of two page sizes), 64-token pages; DeepSeek-V3.2's indexer only (not GLM's "
            "indexer_types, LongCat's cli_factor or pooled index_kpool keys)",
            "one sliding window per model: SGLang reads one sliding_window_size",
            "one page size for every pool: SGLang's --page-size",
            "SGLang's radix cache runs over kvcore's pool sizes, but kvcore's plans do not size for it",
        ),
    )
