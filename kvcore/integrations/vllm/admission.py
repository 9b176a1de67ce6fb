"""vLLM's own ``KVCacheManager`` running a ``KVCacheConfig``, vLLM's own plan for the same
layers, and vLLM's allocation of a config on the meta device. Imports vLLM.

:func:`admitted` drives the manager (the scheduler's block allocator, pure Python) the way the
scheduler calls it: each request's prompt of ``max_model_len - 1`` tokens is prefilled in chunks
of ``max_num_batched_tokens`` through ``allocate_slots`` (the first call with vLLM's admission
gate, ``full_sequence_must_fit``), then one decode token takes it to ``max_model_len``. Every
request gets a full chunk every step, all at once: the worst case vLLM's pool sizing and
admission cap guard against (a real step shares one budget between its requests, so it never
holds more). With async scheduling the scheduler advances a request before the previous step's
output returns, so two chunks are in flight and a sliding window frees its blocks one step
later; the driver does the same (``Request.num_in_flight_tokens``).

vLLM's engine objects need a platform: without a GPU, set ``VLLM_TARGET_DEVICE=cpu`` before
vLLM is imported (:func:`vllm_config` does when it is unset).
"""

from __future__ import annotations

import contextlib
import math
import os
import types
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import attrs

from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules
from kvcore.spec import KVCacheSpec

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from vllm.config import DeviceConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1 import kv_cache_interface as vk
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_max_concurrency_for_kv_cache_config,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.request import Request, RequestStatus
from vllm.v1.worker.utils import allocate_kv_cache

from kvcore.integrations.vllm.convert import (
    plan_from_vllm_config,
    plan_to_vllm_config,
    spec_from_vllm,
    specs_to_vllm,
)
from kvcore.integrations.vllm.rules import plan_for_vllm
from kvcore.integrations.vllm.versions import VLLM_VERSIONS, request_block_hasher, vllm_kv_cache_configs
from kvcore.peaks import worst_step
from kvcore.plan import KVCachePlan
from kvcore.planning.registry import Registry
from kvcore.plugins.state import StateSpec

#: The page layout the conversions and :func:`allocate_on_meta` use: vLLM's FlashAttention
#: default (``NHD``). Any block-compact layout (L and B outermost) keeps a page one run of bytes.
DEFAULT_LAYOUT = "LBNHC"


def vllm_config(rules: VllmRules, *, layout: str = DEFAULT_LAYOUT, hybrid: bool = True) -> VllmConfig:
    """A ``VllmConfig`` with ``rules``' scheduler settings and no model, for vLLM's planning.

    vLLM's planning reads the model config only for ``max_model_len`` and whether the model
    groups its own layers; a stand-in gives those (``supports_kv_cache_grouping=False``).
    ``hybrid`` sets vLLM's hybrid allocator as a GPU, or vLLM's CPU build, would run it (on by
    default, off for chunked local attention unless
    ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``; see :func:`vllm_own_config`),
    whatever the platform vLLM detects here: a GPU wheel on a machine without a GPU finds no
    platform that supports it and would turn it off (``Platform.support_hybrid_kv_cache``; the
    CPU platform's returns True in 0.33, ``vllm/platforms/cpu.py``, and vLLM 0.32's CPU engine
    runs Gemma-2 in two groups).
    """
    config = VllmConfig(
        scheduler_config=SchedulerConfig(
            max_model_len=rules.max_model_len,
            is_encoder_decoder=False,
            max_num_batched_tokens=rules.max_num_batched_tokens,
            async_scheduling=rules.async_scheduling,
        ),
        device_config=DeviceConfig(device="cpu"),
    )
    config.scheduler_config.async_scheduling = rules.async_scheduling
    config.scheduler_config.disable_hybrid_kv_cache_manager = not hybrid
    config.cache_config.kv_cache_layout = layout
    if rules.state_cache_mode == "align":  # as vLLM sets it for a hybrid with prefix caching on
        config.cache_config.enable_prefix_caching = True
        config.cache_config.mamba_cache_mode = "align"
    model = types.SimpleNamespace(
        max_model_len=rules.max_model_len,
        original_max_model_len=rules.max_model_len,
        supports_kv_cache_grouping=False,
        use_mla=False,
    )
    object.__setattr__(config, "model_config", model)
    if config.max_in_flight_tokens != rules.max_in_flight_tokens:  # vLLM changed its rule
        raise VllmIntegrationError(
            f"vLLM counts {config.max_in_flight_tokens} tokens in flight where kvcore expects "
            f"{rules.max_in_flight_tokens}; this vLLM is not one kvcore supports ({VLLM_VERSIONS})"
        )
    return config


#: The kernel block alignment vLLM's FlashAttention backend asks of an attention block size
#: (its supported kernel block sizes are multiples of 16).
KERNEL_BLOCK_ALIGNMENT = 16


def vllm_layer_specs(specs: Mapping[str, KVCacheSpec], rules: VllmRules) -> dict[str, vk.KVCacheSpec]:
    """What vLLM 0.33's layers report for kvcore's specs on a GPU with FlashAttention
    (:func:`~kvcore.integrations.vllm.convert.specs_to_vllm`), after the config hook vLLM runs
    for attention + Mamba hybrids (``Platform._align_hybrid_block_size``): the attention block
    size is raised to the smallest multiple of 16 (in align mode, of the least common multiple
    of 16 and the layers' prefill checkpoint alignments) whose page holds a Mamba state, and the
    state page is padded to that page. The states are in the rules' ``state_cache_mode``
    (``'none'`` unless given, prefix caching off): a state's block is ``max_model_len`` in
    ``'none'`` and the attention block in ``'align'`` (``mamba_block_size = block_size``).
    """
    mode = rules.state_cache_mode or "none"
    # converted in 'none' mode, then given the mode and, in 'align', the block found below
    specs = {
        name: attrs.evolve(spec, cache_mode="none") if isinstance(spec, StateSpec) else spec
        for name, spec in specs.items()
    }
    out = specs_to_vllm(specs, max_model_len=rules.max_model_len)
    states = [s for s in out.values() if isinstance(s, vk.MambaSpec)]
    attention = [s for s in out.values() if isinstance(s, vk.AttentionSpec)]
    if not states or not attention:
        return out
    state_page = max(s.page_size_bytes for s in states)
    per_token = attention[0].copy_with_new_block_size(1).page_size_bytes
    alignment = KERNEL_BLOCK_ALIGNMENT
    if mode == "align":  # internal prefill checkpoints land on block boundaries
        alignment = math.lcm(alignment, *(s.prefill_checkpoint_alignment or 1 for s in states))
    block = alignment * -(-state_page // (alignment * per_token))
    block = max(block, attention[0].block_size)
    page = block * per_token
    fixed: dict[vk.KVCacheSpec, vk.KVCacheSpec] = {}
    for name, spec in out.items():
        if spec not in fixed:
            if isinstance(spec, vk.MambaSpec):
                fixed[spec] = replace(
                    spec,
                    page_size_padded=page if page != spec.page_size_bytes else None,
                    block_size=block if mode == "align" else spec.block_size,
                    mamba_cache_mode=mode,
                )
            else:
                fixed[spec] = spec.copy_with_new_block_size(block)
        out[name] = fixed[spec]
    return out


def vllm_own_config(
    vllm_specs: Mapping[str, vk.KVCacheSpec], available_bytes: int, rules: VllmRules
) -> vk.KVCacheConfig:
    """vLLM's own ``KVCacheConfig`` for one worker's layers and budget (its grouping and
    placement: :func:`~kvcore.integrations.vllm.versions.vllm_kv_cache_configs`), with the
    hybrid allocator on or off as vLLM decides on a GPU: off for chunked local attention
    (vLLM 0.33's default, unless ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``),
    which then treats those layers as full attention.

    Raises:
        ValueError: vLLM's own errors (e.g. the budget holds no request of max_model_len).
    """
    specs = dict(vllm_specs)
    chunked = any(isinstance(spec, vk.ChunkedLocalAttentionSpec) for spec in specs.values())
    allowed = os.environ.get("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "0") == "1"
    config = vllm_config(rules, hybrid=not chunked or allowed)
    return vllm_kv_cache_configs(config, [specs], [available_bytes])[0]


@attrs.frozen(kw_only=True)
class AdmissionRun:
    """What :func:`run_requests` saw.

    Attributes:
        requests: requests started at once.
        completed: whether every one reached ``max_model_len`` tokens with every
            ``allocate_slots`` call granted.
        refused_at: ``(request index, tokens computed)`` of the first refused call, else ``None``.
        peak_blocks: most block ids held at once (null block not counted).
    """

    requests: int
    completed: bool
    refused_at: tuple[int, int] | None
    peak_blocks: int


def _block_sizes(config: vk.KVCacheConfig, rules: VllmRules, *, enable_caching: bool) -> tuple[int, int]:
    """The scheduler's block size and the hashes' for ``config``, as the engine core resolves
    them (see :func:`make_manager`)."""
    scheduler_config = generate_scheduler_kv_cache_config([config])
    sizes = [g.kv_cache_spec.block_size for g in scheduler_config.kv_cache_groups]
    block = hash_block = math.lcm(*sizes) if sizes else 1
    if enable_caching:
        engine = vllm_config(rules)
        engine.cache_config.enable_prefix_caching = True
        engine.cache_config.block_size = block  # what a one-group config is resolved from
        block, hash_block = resolve_kv_cache_block_sizes(scheduler_config, engine)
    return block, hash_block


def block_hasher(config: vk.KVCacheConfig, rules: VllmRules) -> Any:
    """The block hasher the engine core gives each request when prefix caching is on (its
    ``EngineCore.__init__``): the configured hash function at the resolved hash block size."""
    engine = vllm_config(rules)
    hash_fn = get_hash_fn_by_name(engine.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    _, hash_block = _block_sizes(config, rules, enable_caching=True)
    return request_block_hasher(hash_block, hash_fn, engine)


def make_manager(
    config: vk.KVCacheConfig, rules: VllmRules, *, enable_caching: bool = False, log_stats: bool = False
) -> KVCacheManager:
    """vLLM's ``KVCacheManager`` for ``config`` as the engine core makes it: from the
    scheduler's copy of the config (``generate_scheduler_kv_cache_config``, which gives a
    ``UniformTypeKVCacheSpecs`` group its first layer's spec), with the block sizes the engine
    core resolves (``resolve_kv_cache_block_sizes``: the least common multiple of the groups'
    for scheduling; with prefix caching, ``enable_caching``, hashing at their greatest common
    divisor). With ``log_stats`` (the engine's ``log_stats``) the manager keeps the prefix-cache
    statistics the scheduler records (``record_prefix_cache_stats``)."""
    block, hash_block = _block_sizes(config, rules, enable_caching=enable_caching)
    scheduler_config = generate_scheduler_kv_cache_config([config])
    return KVCacheManager(
        kv_cache_config=scheduler_config,
        max_model_len=rules.max_model_len,
        scheduler_block_size=block,
        hash_block_size=hash_block,
        max_in_flight_tokens=rules.max_in_flight_tokens,
        enable_caching=enable_caching,
        log_stats=log_stats,
    )


def encoder_tokens(config: vk.KVCacheConfig, rules: VllmRules) -> int:
    """Encoder tokens each request brings to the config's cross-attention groups: ``0``
    without any, else ``rules.max_encoder_tokens`` (the longest, the worst case).

    Raises:
        VllmIntegrationError: the config has cross-attention groups but the rules no
            ``max_encoder_tokens``.
    """
    if not any(isinstance(g.kv_cache_spec, vk.CrossAttentionSpec) for g in config.kv_cache_groups):
        return 0
    if not rules.max_encoder_tokens:
        raise VllmIntegrationError(
            "the config has cross-attention groups, whose blocks vLLM allocates for each request's encoder "
            "tokens; give VllmRules(max_encoder_tokens=...) (Whisper's encoder gives 1500)"
        )
    return rules.max_encoder_tokens


def first_chunks(config: vk.KVCacheConfig, rules: VllmRules) -> tuple[int, ...]:
    """First-chunk sizes that together meet every group's worst case (later chunks are full).

    The groups together hold the most (their joint peak, :func:`kvcore.peaks.worst_step`) when
    a step starts at one position, which a first chunk of that position modulo the chunk
    reaches. A sliding window alone holds one block more than its tokens need when it starts one token
    before a block boundary. A step's chunk starts ``first + k x max_num_batched_tokens``
    tokens in, so a first chunk of ``window - 2`` tokens modulo the block size puts every later
    window start there; the largest such first chunk also ends the last full chunk as late in
    the prompt as it goes, where full attention holds the most. A full chunk first is always
    tried too.
    """
    chunk = rules.max_num_batched_tokens
    sizes = {chunk}
    weighted = []
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        if isinstance(spec, vk.SlidingWindowSpec):
            size = chunk - (chunk - (spec.sliding_window - 2)) % spec.block_size
            if size > 0:
                sizes.add(size)
        with contextlib.suppress(VllmIntegrationError):  # a kind kvcore does not model: no hint
            weighted.append((spec_from_vllm(group.layer_names[0], spec, padded=True), 1))
    # the step where the groups together hold the most starts c tokens in (its tokens in flight
    # counted as kvcore's step, VllmRules.context): chunks that start at c + k x chunk reach it
    sizes.add(worst_step(weighted, rules.context()) % chunk or chunk)
    return tuple(sorted(sizes))


def run_requests(
    config: vk.KVCacheConfig,
    rules: VllmRules,
    count: int,
    *,
    first_chunk: int | None = None,
    enable_caching: bool = False,
) -> AdmissionRun:
    """Start ``count`` requests of ``max_model_len - 1`` prompt tokens at once and run them to
    ``max_model_len`` tokens through a fresh ``KVCacheManager`` (see the module docstring).

    A request of an encoder-decoder model brings :func:`encoder_tokens` encoder tokens: its
    first call asks for their cross-attention blocks (``num_encoder_tokens``), as vLLM's
    scheduler does when it schedules the request's encoder input.

    Args:
        config: the config vLLM runs.
        rules: vLLM's settings.
        count: requests started at once.
        first_chunk: tokens of each request's first chunk (default: a full
            ``max_num_batched_tokens``); later chunks are full.
        enable_caching: run the manager with prefix caching on (the prompts share no prefix).

    Returns:
        Whether they all completed, and where the first refusal came.
    """
    manager = make_manager(config, rules, enable_caching=enable_caching)
    encoder = encoder_tokens(config, rules)
    length = rules.max_model_len
    prompt = length - 1
    chunk = rules.max_num_batched_tokens
    lag = rules.max_concurrent_batches - 1  # steps between scheduling a chunk and its output
    hasher = block_hasher(config, rules) if enable_caching else None  # the engine core hashes each request
    requests = []
    for i in range(count):
        # distinct tokens, so that no two prompts share a prefix
        tokens = [(i * prompt + j) % 50_000 + 1 for j in range(prompt)]
        params = SamplingParams(max_tokens=length - prompt)
        requests.append(Request(f"r{i}", tokens, params, None, block_hasher=hasher))
    sent: list[list[int]] = [[] for _ in requests]  # chunks in flight per request, oldest first
    total = manager.block_pool.get_num_free_blocks()
    peak = 0
    started = [False] * count
    while True:
        active = [i for i, r in enumerate(requests) if r.num_computed_tokens < length]
        if not active:
            return AdmissionRun(requests=count, completed=True, refused_at=None, peak_blocks=peak)
        for i in active:
            request = requests[i]
            done = request.num_computed_tokens
            if done >= prompt and request.num_tokens < length:
                request.append_output_token_ids(1)  # the token the prefill sampled
            step = first_chunk if done == 0 and first_chunk else chunk
            new = min(step, prompt - done) if done < prompt else 1
            first = not started[i]
            blocks = manager.allocate_slots(
                request,
                new,
                num_encoder_tokens=encoder if first else 0,
                full_sequence_must_fit=first,
                has_scheduled_reqs=i > 0,
            )
            if blocks is None:
                return AdmissionRun(requests=count, completed=False, refused_at=(i, done), peak_blocks=peak)
            if first:
                started[i] = True
                request.status = RequestStatus.RUNNING
            request.num_computed_tokens += new
            request.num_in_flight_tokens += new
            sent[i].append(new)
        peak = max(peak, total - manager.block_pool.get_num_free_blocks())
        for i in active:  # the outputs of the step `lag` steps ago come back
            while len(sent[i]) > lag:
                requests[i].num_in_flight_tokens -= sent[i].pop(0)


def runs_all(config: vk.KVCacheConfig, rules: VllmRules, count: int, *, enable_caching: bool = False) -> bool:
    """Whether ``count`` requests complete whatever their first chunk (:func:`first_chunks`),
    with prefix caching on where ``enable_caching`` (:func:`run_requests`)."""
    return all(
        run_requests(config, rules, count, first_chunk=first, enable_caching=enable_caching).completed
        for first in first_chunks(config, rules)
    )


def admitted(
    config: vk.KVCacheConfig, rules: VllmRules, *, start: int = 1, enable_caching: bool = False
) -> int:
    """The most requests of ``max_model_len`` tokens vLLM's ``KVCacheManager`` runs at once on
    ``config`` however their chunks fall (:func:`runs_all`), searching up from ``start`` (or
    down, when ``start`` requests already fail)."""
    count = max(start, 1)

    def runs(requests: int) -> bool:
        return runs_all(config, rules, requests, enable_caching=enable_caching)

    if not runs(count):
        while count > 0 and not runs(count):
            count -= 1
        return count
    while runs(count + 1):
        count += 1
    return count


def allocate_on_meta(config: vk.KVCacheConfig, *, layout: str = DEFAULT_LAYOUT) -> dict[str, torch.Tensor]:
    """vLLM's worker allocation of ``config`` (``vllm.v1.worker.utils.allocate_kv_cache``) on
    the meta device: one backing buffer and a view per layer, no memory."""
    views: dict[str, torch.Tensor] = allocate_kv_cache(config, torch.device("meta"), KVCacheLayout[layout])
    return views


def view_pages(view: torch.Tensor) -> tuple[int, int, int]:
    """``(first byte of page 0, bytes from one page to the next, bytes one page spans)`` of a
    per-layer view vLLM made over its backing buffer (dimension 0 is the block; bytes count
    from the start of the backing)."""
    itemsize = view.element_size()
    inner = sum((size - 1) * stride for size, stride in zip(view.shape[1:], view.stride()[1:], strict=True))
    return int(view.storage_offset()) * itemsize, view.stride(0) * itemsize, (inner + 1) * itemsize


def promised(plan: KVCachePlan) -> int:
    """Whole requests of the plan's ``max_model_len`` its usable blocks hold at once."""
    need = plan.blocks_per_request()
    return plan.usable_blocks // need if need else 0


def logged_concurrency(config: vk.KVCacheConfig, rules: VllmRules) -> float:
    """The "Maximum concurrency" vLLM logs at start-up for ``config``
    (``get_max_concurrency_for_kv_cache_config``, which counts the null block as usable)."""
    return float(get_max_concurrency_for_kv_cache_config(vllm_config(rules), config))


@attrs.frozen(kw_only=True)
class AdmissionFigures:
    """One policy's plan for one model, as kvcore promises it and as vLLM runs it.

    Attributes:
        policy: the kvcore policy.
        rules: vLLM's settings (the scheduling mode among them).
        promise: whole requests of ``max_model_len`` kvcore's plan holds (:func:`promised`).
        manager: requests vLLM's ``KVCacheManager`` runs at once on the converted plan
            (:func:`admitted`).
        own: requests vLLM's manager runs at once on vLLM's own plan for the same layers.
        own_logged: the concurrency vLLM logs for its own plan.
    """

    policy: str
    rules: VllmRules
    promise: int
    manager: int
    own: int
    own_logged: float


def measure(
    specs: Mapping[str, KVCacheSpec],
    available_bytes: int,
    rules: VllmRules,
    *,
    registry: Registry,
    policy: str,
) -> AdmissionFigures:
    """Plan ``specs`` with ``policy`` under vLLM's rules, run the plan and vLLM's own through
    vLLM's ``KVCacheManager``, and report both beside kvcore's promise.

    Raises:
        KVCoreError: the policy cannot plan the layers (``PolicyNotApplicableError``) or the
            budget holds no request.
    """
    plan = plan_for_vllm(rules.request(specs, available_bytes, policy=policy), rules, registry=registry)
    promise = promised(plan)
    manager = admitted(plan_to_vllm_config(plan), rules, start=promise)
    own_config = vllm_own_config(vllm_layer_specs(specs, rules), available_bytes, rules)
    own_plan = plan_from_vllm_config(own_config, rules.context(), available_bytes)
    own = admitted(own_config, rules, start=promised(own_plan))
    return AdmissionFigures(
        policy=plan.policy,
        rules=rules,
        promise=promise,
        manager=manager,
        own=own,
        own_logged=logged_concurrency(own_config, rules),
    )
