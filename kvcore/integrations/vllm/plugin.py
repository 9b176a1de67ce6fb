"""kvcore's vLLM plugin: vLLM's engine core takes its ``KVCacheConfig`` from a kvcore policy.

Registered under vLLM's general-plugin entry point (``vllm.general_plugins``, name ``kvcore``),
which vLLM loads in every process it starts. :func:`register` does nothing unless the
environment variable ``KVCORE_VLLM_POLICY`` names a kvcore policy (``shared_buffer``,
``equal_groups``, ``uniform``, ``auto`` or a plugin's); then it replaces one name,
``vllm.v1.engine.core.get_kv_cache_configs``, the function ``EngineCore._initialize_kv_caches``
calls to turn the workers' layer specs and profiled memory into one ``KVCacheConfig`` per
worker. The replacement (:func:`kvcore_kv_cache_configs`):

- converts each worker's specs to kvcore's (:func:`~kvcore.integrations.vllm.convert.specs_from_vllm`;
  an encoder-decoder model's cross-attention layers cache the scheduler's
  ``max_num_encoder_input_tokens``, the length vLLM sizes its ``CrossAttentionSpec`` by),
- plans them with the policy under vLLM's rules
  (:func:`~kvcore.integrations.vllm.rules.plan_for_vllm`: null block, tokens in flight from the
  scheduler config, one block id per page), honouring ``num_gpu_blocks_override``,
- gives every worker the smallest block count of them all (vLLM's rule), and
- converts each plan to vLLM's ``KVCacheConfig`` (vLLM's spec classes, its layer names, one
  backing allocation).

Everything after it is vLLM's own: the scheduler, the ``KVCacheManager``, the workers'
allocation and the attention backends run the config as they run vLLM's. With
``--max-model-len auto`` (``original_max_model_len == -1``) vLLM's own function runs instead, as
kvcore does not fit the length for vLLM.

Tested against vLLM 0.32 (the CPU build), 0.33 and 0.34
(:data:`kvcore.integrations.vllm.versions.VLLM_VERSIONS`; where their APIs differ,
:mod:`~kvcore.integrations.vllm.versions` says how); another version is refused at start-up
with a message rather than patched blindly. kvcore's lines are logged under ``kvcore.vllm``
through vLLM's own handlers, so they show in vLLM's log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcore.integrations.vllm.rules import VllmRules
    from kvcore.plan import KVCachePlan

#: The environment variable that turns the plugin on and names the policy.
POLICY_ENV = "KVCORE_VLLM_POLICY"

_log = logging.getLogger("kvcore.vllm")


def register() -> None:
    """vLLM's entry point: patch vLLM's KV-cache planning when ``KVCORE_VLLM_POLICY`` is set.

    Raises:
        VllmIntegrationError: the installed vLLM is not one this plugin supports
            (:data:`~kvcore.integrations.vllm.versions.VLLM_VERSIONS`).
    """
    policy = os.environ.get(POLICY_ENV, "").strip()
    if not policy:
        return
    from kvcore.integrations.vllm import versions
    from kvcore.integrations.vllm.rules import VllmIntegrationError

    try:
        versions.installed_minor()
    except VllmIntegrationError as error:
        raise VllmIntegrationError(f"{POLICY_ENV}={policy}: {error}") from None
    _log_through_vllm()

    def plan(vllm_config: Any, kv_cache_specs: list[dict[str, Any]], available_memory: list[int]) -> Any:
        if vllm_config.model_config.original_max_model_len == -1:
            _log.info("kvcore: max_model_len 'auto' (original_max_model_len -1): vLLM plans the cache")
            return None
        return kvcore_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, policy)

    versions.wrap_engine_planning(plan)


class _ThroughVllmHandlers(logging.Handler):
    """Hands each record to the handlers vLLM's ``vllm`` logger has when the record is logged
    (vLLM may configure its logging after the plugin loads, and again in each process)."""

    def emit(self, record: logging.LogRecord) -> None:
        for handler in logging.getLogger("vllm").handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


def _log_through_vllm() -> None:
    """Show kvcore's log lines in vLLM's log.

    vLLM configures only its own ``vllm`` logger (``vllm.logger``, ``propagate`` off), so a line
    logged under ``kvcore.*`` would reach no handler inside vLLM and be dropped. The ``kvcore``
    logger gets a handler that writes through vLLM's, at INFO; it still propagates, so an
    application that configured the root logger (``VLLM_CONFIGURE_LOGGING=0``) gets it there.
    """
    kvcore_log = logging.getLogger("kvcore")
    if any(isinstance(h, _ThroughVllmHandlers) for h in kvcore_log.handlers):
        return
    kvcore_log.addHandler(_ThroughVllmHandlers())
    if kvcore_log.level == logging.NOTSET or kvcore_log.level > logging.INFO:
        kvcore_log.setLevel(logging.INFO)


def kvcore_kv_cache_configs(
    vllm_config: Any,
    kv_cache_specs: Sequence[dict[str, Any]],
    available_memory: Sequence[int],
    policy: str,
    *,
    make_registry: Callable[[], Any] | None = None,
) -> list[Any]:
    """One ``KVCacheConfig`` per worker, planned by kvcore's ``policy`` (what replaces
    ``get_kv_cache_configs``; see the module docstring): :func:`kvcore_plans`, converted.

    Returns:
        The configs, every one with the same ``num_blocks``.
    """
    from kvcore.integrations.vllm.convert import plan_to_vllm_config
    from kvcore.integrations.vllm.versions import installed_version, kv_cache_groups_tp_replicas

    plans = kvcore_plans(vllm_config, kv_cache_specs, available_memory, policy, make_registry=make_registry)
    configs = [plan_to_vllm_config(plan, names={}) for plan in plans]
    for config in configs:
        config.kv_tp_replicas = kv_cache_groups_tp_replicas(
            config.kv_cache_groups,
            vllm_config.parallel_config.tensor_parallel_size,
            vllm_config.parallel_config.decode_context_parallel_size,
        )
    first = plans[0]
    _log.info(
        "kvcore: policy %s planned %d blocks (null block included) in %d groups; %.2f requests of %d tokens "
        "(vLLM %s)",
        first.policy,
        first.num_blocks,
        len(first.groups),
        first.max_concurrency(),
        first.context.max_model_len,
        installed_version(),
    )
    _say_whose_concurrency(vllm_config, configs, first.max_concurrency())
    return configs


def kvcore_plans(
    vllm_config: Any,
    kv_cache_specs: Sequence[dict[str, Any]],
    available_memory: Sequence[int],
    policy: str,
    *,
    make_registry: Callable[[], Any] | None = None,
) -> list[KVCachePlan]:
    """kvcore's plan per worker for vLLM's layer specs and budgets, under vLLM's rules (what
    :func:`kvcore_kv_cache_configs` converts; a test reads it to hold the engine to the plan).

    Args:
        vllm_config: vLLM's ``VllmConfig`` (model, scheduler and cache settings).
        kv_cache_specs: each worker's ``{layer name: KVCacheSpec}``.
        available_memory: each worker's KV-cache budget in bytes.
        policy: the kvcore policy name.
        make_registry: where policies come from (default: ``Registry.default()``, entry points
            included).

    Returns:
        The plans, every one with the same ``num_blocks`` (vLLM's rule: the smallest of them).

    Raises:
        VllmIntegrationError: a spec has no kvcore form, the layout cannot hold kvcore's pages,
            or vLLM's scheduler counts tokens in flight differently.
        KVCoreError: the policy cannot plan the layers or the budget holds no request.
    """
    from kvcore.integrations.vllm.convert import specs_from_vllm
    from kvcore.integrations.vllm.rules import plan_for_vllm
    from kvcore.planning.registry import Registry

    rules = _engine_rules(vllm_config, kv_cache_specs)
    registry = (make_registry or Registry.default)()
    override = vllm_config.cache_config.num_gpu_blocks_override
    workers = [
        specs_from_vllm(specs, rename=False, max_encoder_tokens=rules.max_encoder_tokens)
        for specs in kv_cache_specs
    ]

    def plan_all(num_blocks: int | None) -> list[KVCachePlan]:
        return [
            plan_for_vllm(
                rules.request(specs, memory, policy=policy, num_blocks=num_blocks), rules, registry=registry
            )
            for specs, memory in zip(workers, available_memory, strict=True)
        ]

    plans = plan_all(override)
    fewest = min(plan.num_blocks for plan in plans)
    if any(plan.num_blocks != fewest for plan in plans):
        plans = plan_all(fewest)
    if rules.state_cache_mode == "align":
        _check_state_block(vllm_config, plans[0])
    return plans


def _check_state_block(vllm_config: Any, plan: KVCachePlan) -> None:
    """Refuse an align-mode plan whose state block is not the engine's ``mamba_block_size``.

    In ``mamba_cache_mode='align'`` a state is kept at the end of every state block, and the
    state block is the attention block of kvcore's plan (the one the converted ``MambaSpec``
    gets). vLLM's model runner, though, places the states it copies and the prefill checkpoints
    by the cache config's ``mamba_block_size`` (``vllm/v1/worker/gpu/model_states/
    mamba_hybrid.py``, ``model_executor/layers/mamba/checkpoint.py``), so the two must agree.
    """
    from kvcore.integrations.vllm.rules import VllmIntegrationError
    from kvcore.simulation.profiles.vllm_groups import align_state_block

    wanted = vllm_config.cache_config.mamba_block_size
    block = align_state_block(plan)
    if wanted is not None and block and block != wanted:
        raise VllmIntegrationError(
            f"policy {plan.policy!r} keeps Mamba states every {block} tokens (its attention block), but "
            f"vLLM's model runner keeps them every mamba_block_size = {wanted} tokens in mamba_cache_mode "
            f"'align'; start vLLM with block_size={block} (its cache config's), or with prefix caching "
            "off (mamba_cache_mode 'none')"
        )


def _engine_rules(vllm_config: Any, kv_cache_specs: Sequence[dict[str, Any]]) -> VllmRules:
    """vLLM's rules as this engine runs them, or an error where kvcore cannot plan for it (a
    layout that splits pages, tokens in flight counted differently); warns of lookahead slots."""
    from vllm.v1 import kv_cache_interface as vk

    from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules

    layout = vllm_config.cache_config.kv_cache_layout
    if layout is not None and layout not in ("LBHNC", "LBNHC", "BLHNC", "BLNHC"):
        raise VllmIntegrationError(
            f"kvcore lays each page out as one run of bytes, which vLLM's KV cache layout {layout} splits; "
            "set VLLM_KV_CACHE_LAYOUT=LBNHC"
        )
    scheduler = vllm_config.scheduler_config
    cross = any(
        isinstance(spec, vk.CrossAttentionSpec) for specs in kv_cache_specs for spec in specs.values()
    )
    states = any(isinstance(spec, vk.MambaSpec) for specs in kv_cache_specs for spec in specs.values())
    rules = VllmRules(
        max_model_len=vllm_config.model_config.max_model_len,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        async_scheduling=bool(scheduler.async_scheduling),
        # vLLM's CrossAttentionSpec.max_memory_usage_bytes sizes for this many encoder tokens
        max_encoder_tokens=scheduler.max_num_encoder_input_tokens if cross else 0,
        # every Mamba layer is sized by the engine's mode ('align' with prefix caching, vLLM
        # 0.33's default for hybrids; MambaSpec.max_memory_usage_bytes reads the cache config's)
        state_cache_mode=str(vllm_config.cache_config.mamba_cache_mode) if states else None,
    )
    if vllm_config.max_in_flight_tokens != rules.max_in_flight_tokens:
        raise VllmIntegrationError(
            f"vLLM counts {vllm_config.max_in_flight_tokens} tokens in flight (pipeline parallelism or a "
            f"model runner kvcore does not model), kvcore {rules.max_in_flight_tokens}; unset {POLICY_ENV}"
        )
    lookahead = int(getattr(vllm_config, "num_lookahead_tokens", 0) or 0)
    if lookahead:  # the engine matrix's "speculative decoding: no", said where it matters
        _log.warning(
            "kvcore: vLLM reserves %d speculative lookahead slots per step, which kvcore's plan does "
            "not count; a request near max_model_len may find fewer blocks than the plan says",
            lookahead,
        )
    return rules


def _say_whose_concurrency(vllm_config: Any, configs: Sequence[Any], promised: float) -> None:
    """Where vLLM's own "Maximum concurrency" line will disagree with kvcore's promise, say which
    one the engine runs by.

    vLLM logs its figure from a formula over the groups (``get_max_concurrency_for_kv_cache_config``)
    that assumes its own layout; on kvcore's plan (groups sharing one buffer, say) that formula
    under- or over-counts, while the scheduler admits requests by the block pool the plan built,
    whose capacity is kvcore's figure.
    """
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_max_concurrency_for_kv_cache_config,
    )

    vllms = get_max_concurrency_for_kv_cache_config(vllm_config, generate_scheduler_kv_cache_config(configs))
    if abs(vllms - promised) < 0.005:  # the two print the same to two decimals
        return
    _log.info(
        "kvcore: vLLM's \"Maximum concurrency\" line will read %.2fx, its formula for vLLM's own layout; "
        "the scheduler admits by kvcore's block pool, which holds %.2f requests of %d tokens",
        vllms,
        promised,
        vllm_config.model_config.max_model_len,
    )
