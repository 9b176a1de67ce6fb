"""kvcore's SGLang plugin (entry point group ``sglang.srt.plugins``): kvcore sizes SGLang's pools.

SGLang runs every general plugin in each process it starts (``sglang.srt.plugins.load_plugins``).
:func:`register` does nothing unless ``KVCORE_SGLANG_POLICY`` names a kvcore policy; then it
wraps ``create_memory_pool_configurator`` (``sglang/srt/model_executor/pool_configurator.py``,
which ``KVCacheConfigurator.config_from_budget`` calls at start-up) through SGLang's
``HookRegistry`` with one that returns :class:`KVCorePoolConfigurator`: the profiled budget is
planned with that policy under SGLang's rules and the pools get the tokens kvcore's plan
promises. A model SGLang would size with a configurator kvcore does not model (DeepSeek V4's
compressed pools, Mamba/linear hybrids) or a plan SGLang cannot run raises
:class:`~kvcore.integrations.sglang.rules.SglangIntegrationError` naming why.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from sglang.srt.model_executor.pool_configurator import (
    DefaultPoolConfigurator,
    HybridSWAPoolConfigurator,
    MemoryPoolConfig,
    MemoryPoolConfigurator,
)

from kvcore.integrations.sglang.convert import memory_pool_config, specs_from_sglang
from kvcore.integrations.sglang.rules import (
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    SglangIntegrationError,
    SglangRules,
    check_specs,
    plan_for_sglang,
    pool_sizes,
    token_bytes,
)
from kvcore.planning.registry import Registry

#: The environment variable naming the kvcore policy that sizes SGLang's pools.
POLICY_VARIABLE = "KVCORE_SGLANG_POLICY"

#: The SGLang function the plugin replaces.
TARGET = "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator"


class KVCorePoolConfigurator(MemoryPoolConfigurator):  # type: ignore[misc]  # SGLang's class is Any to mypy
    """SGLang's memory-pool configurator, with kvcore's plan for the pool sizes.

    Args:
        kvc: SGLang's ``KVCacheConfigurator`` (what SGLang passes its own configurators).
        own: the configurator SGLang itself would use for ``kvc`` (checked with
            :func:`check_bytes`).
        policy: the kvcore policy.
        rules: SGLang's settings; read from ``kvc`` and SGLang's schedule config when omitted.
    """

    def __init__(
        self, kvc: Any, own: MemoryPoolConfigurator, policy: str, rules: SglangRules | None = None
    ) -> None:
        if getattr(kvc, "mambaish_config", None) is not None:
            raise SglangIntegrationError(
                f"{POLICY_VARIABLE}={policy}: SGLang sizes Mamba/linear-attention state pools before the KV "
                "pools, outside the configurator kvcore replaces; unset it to serve this model"
            )
        self.specs = specs_from_sglang(kvc)
        check_bytes(own, self.specs)
        self.policy = policy
        self.rules = rules or _rules_of(kvc)
        self.registry = Registry.default()

    def sizes(self, available_bytes: int) -> Any:
        """The pools of kvcore's plan for ``available_bytes`` (:class:`~.rules.SglangPoolSizes`)."""
        plan = plan_for_sglang(
            self.specs, available_bytes, self.rules, registry=self.registry, policy=self.policy
        )
        return pool_sizes(plan, self.specs)

    def calculate_pool_sizes(self, available_bytes: int, page_size: int) -> MemoryPoolConfig:
        """SGLang's profiling path: kvcore plans ``available_bytes``."""
        self._check_page(page_size)
        return memory_pool_config(self.sizes(int(available_bytes)))

    def calculate_pool_sizes_from_max_tokens(
        self, max_total_num_tokens: int, page_size: int
    ) -> MemoryPoolConfig:
        """SGLang's constraint path (``--max-total-tokens``): refused, kvcore sizes from bytes."""
        raise SglangIntegrationError(
            f"--max-total-tokens {max_total_num_tokens:,} caps SGLang's pools below kvcore's plan of "
            f"{self.policy!r}; give SGLang the budget instead (--mem-fraction-static) or unset "
            f"{POLICY_VARIABLE}"
        )

    def _check_page(self, page_size: int) -> None:
        if page_size != self.rules.page_size:
            raise SglangIntegrationError(
                f"SGLang asks for page_size {page_size}, kvcore planned {self.rules.page_size}"
            )


def check_bytes(own: MemoryPoolConfigurator, specs: dict[str, Any]) -> None:
    """Raise unless SGLang's own configurator ``own`` counts the bytes per token kvcore's
    ``specs`` do, pool by pool.

    SGLang adds bytes kvcore's kinds do not describe for a DSA indexer, an FP4/MXFP8 scale
    buffer, a speculative draft model's layers or a QSA cache (``DefaultPoolConfigurator
    ._compute_cell_size``, ``HybridSWAPoolConfigurator._recompute_cell_size``); a plan made
    without them would overrun the budget, so those models are refused. The figures are the
    configurators' own (private) fields of sglang 0.5.23.

    Raises:
        SglangIntegrationError: another configurator (DeepSeek V4's compressed pools) or other
            bytes per token.
    """
    pools = check_specs(specs)
    ours = {pool: sum(token_bytes(specs[n]) for n in names) for pool, names in pools.items()}
    if isinstance(own, HybridSWAPoolConfigurator):
        theirs = {"full": own._full_cell_bytes(), "swa": own._swa_cell_bytes()}
        # drafts and DFLASH are in the cell SGLang divides the budget by, beside the two pools
        if own._cell_size != own._full_cell_bytes() + own._swa_full_tokens_ratio * own._swa_cell_bytes():
            theirs["draft"] = int(own._cell_size)
    elif isinstance(own, DefaultPoolConfigurator):
        theirs = {"full": own._cell_size}
    else:
        raise SglangIntegrationError(
            f"SGLang sizes this model with {type(own).__name__}, whose pools kvcore does not plan; unset "
            f"{POLICY_VARIABLE} to serve it"
        )
    theirs = {pool: n for pool, n in theirs.items() if n}
    if theirs != ours:
        raise SglangIntegrationError(
            f"SGLang's pools take {theirs} bytes per token, kvcore's specs of its layers {ours} (an "
            "indexer, a scaled or quantized cache, or a draft model kvcore does not plan); unset "
            f"{POLICY_VARIABLE} to serve this model"
        )


def _rules_of(kvc: Any) -> SglangRules:
    """SGLang's settings as the running server resolved them (``get_schedule()``)."""
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_schedule

    schedule = get_schedule()
    chunk = schedule.chunked_prefill_size
    return SglangRules(
        context_len=int(kvc.model_config.context_len),
        page_size=int(kvc.page_size),
        # a disabled chunked prefill (-1) writes a whole prompt: size for the context
        chunked_prefill_size=int(chunk) if chunk and chunk > 0 else int(kvc.model_config.context_len),
        overlap_schedule=not bool(schedule.disable_overlap_schedule),
        swa_full_tokens_ratio=float(schedule.swa_full_tokens_ratio or DEFAULT_SWA_FULL_TOKENS_RATIO),
        swa_eviction_interval=max(1, envs.SGLANG_SWA_EVICTION_INTERVAL.get()),
    )


def create_memory_pool_configurator(sglangs: Callable[[Any], Any], kvc: Any) -> MemoryPoolConfigurator:
    """The hook around SGLang's ``create_memory_pool_configurator`` (``sglangs``) while the
    policy is set: kvcore's configurator, checked against the one SGLang would use."""
    return KVCorePoolConfigurator(kvc, sglangs(kvc), os.environ[POLICY_VARIABLE])


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: replace SGLang's configurator when
    ``KVCORE_SGLANG_POLICY`` is set (checked against kvcore's policies here, at start-up)."""
    policy = os.environ.get(POLICY_VARIABLE)
    if not policy:
        return
    registry = Registry.default()
    if policy != "auto" and policy not in registry.policies:
        raise SglangIntegrationError(
            f"{POLICY_VARIABLE}={policy!r} is not a kvcore policy; one of {sorted(registry.policies)} or auto"
        )
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # AROUND, not REPLACE: kvcore's configurator checks itself against SGLang's own
    HookRegistry.register(TARGET, create_memory_pool_configurator, HookType.AROUND)
