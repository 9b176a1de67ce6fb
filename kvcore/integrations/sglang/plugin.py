"""kvcore's SGLang plugin (entry point group ``sglang.srt.plugins``): kvcore sizes SGLang's pools.

SGLang runs every general plugin in each process it starts (``sglang.srt.plugins.load_plugins``).
:func:`register` does nothing unless ``KVCORE_SGLANG_POLICY`` names a kvcore policy; then it
wraps ``create_memory_pool_configurator`` (``sglang/srt/model_executor/pool_configurator.py``,
which ``KVCacheConfigurator.config_from_budget`` calls at start-up) through SGLang's
``HookRegistry`` with one that returns :class:`KVCorePoolConfigurator`: the profiled budget is
planned with that policy under SGLang's rules and the pools get the tokens kvcore's plan
promises. For a Mamba/linear hybrid it also wraps ``KVCacheConfigurator._handle_max_mamba_cache``
(where SGLang splits the budget between its Mamba state pool and the KV pools, before the
configurator runs): kvcore plans the whole budget there, sets ``max_mamba_cache_size`` to the
plan's state slots and leaves the configurator the rest. A model SGLang would size with a
configurator kvcore does not model (DeepSeek V4's compressed pools, a DSA indexer other than
DeepSeek-V3.2's: pooled or GLM-style shared keys) or a plan SGLang cannot run raises
:class:`~kvcore.integrations.sglang.rules.SglangIntegrationError` naming why.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
from sglang.srt.model_executor.pool_configurator import (
    DefaultPoolConfigurator,
    HybridSWAPoolConfigurator,
    MemoryPoolConfig,
    MemoryPoolConfigurator,
)

from kvcore.integrations.sglang.convert import memory_pool_config, specs_from_sglang
from kvcore.integrations.sglang.model import runs_hybrid_swa
from kvcore.integrations.sglang.rules import (
    DEFAULT_MAMBA_FULL_MEMORY_RATIO,
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    SglangIntegrationError,
    SglangRules,
    check_specs,
    plan_for_sglang,
    pool_bytes,
    pool_sizes,
    refuse_dsa,
    sglang_specs,
    token_bytes,
)
from kvcore.planning.registry import Registry

#: The config fields :func:`~kvcore.integrations.sglang.rules.refuse_dsa` reads.
DSA_FIELDS = ("model_type", "index_topk", "index_kpool", "indexer_types", "cli_factor")

#: The text-config fields :func:`~kvcore.integrations.sglang.model.runs_hybrid_swa` reads.
SWA_FIELDS = ("layer_types", "sliding_window", "is_hybrid_swa")

#: The environment variable naming the kvcore policy that sizes SGLang's pools.
POLICY_VARIABLE = "KVCORE_SGLANG_POLICY"

#: The SGLang function the plugin replaces.
TARGET = "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator"

#: Where SGLang splits the budget between its Mamba state pool and the KV pools (rule 5).
MAMBA_TARGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache"

#: kvcore's sizes the Mamba hook made, by SGLang ``KVCacheConfigurator`` (a slotted class, so
#: they are kept here, beside it), for the configurator that runs after it.
_PLANNED: dict[int, tuple[Any, Any]] = {}


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
        hf_config, text = kvc.model_config.hf_config, kvc.model_config.hf_text_config
        refuse_dsa(
            list(getattr(hf_config, "architectures", None) or ()),
            {field: getattr(text, field, None) for field in DSA_FIELDS},
            f"unset {POLICY_VARIABLE} to let SGLang size this model",
        )
        check_hybrid_swa(kvc)
        self.kvc = kvc
        self.specs = specs_from_sglang(kvc)
        check_bytes(own, self.specs)
        self.policy = policy
        self.rules = rules or _rules_of(kvc)
        self.registry = Registry.default()

    def sizes(self, available_bytes: int) -> Any:
        """The pools of kvcore's plan for ``available_bytes`` (:class:`~.rules.SglangPoolSizes`).

        For a Mamba hybrid the plan was made for the whole budget by :func:`handle_max_mamba_cache`
        and ``available_bytes`` is what it left; it is checked to hold the plan's KV pool.
        """
        if "mamba" not in check_specs(self.specs):
            plan = plan_for_sglang(
                self.rules.request(self.specs, available_bytes, policy=self.policy),
                self.rules,
                registry=self.registry,
            )
            return pool_sizes(plan, self.specs)
        kvc, planned = _PLANNED.get(id(self.kvc), (None, None))
        if kvc is not self.kvc:
            raise SglangIntegrationError(
                f"{POLICY_VARIABLE}={self.policy}: SGLang sized this model's KV pools without its "
                "Mamba split (the plugin's hook on _handle_max_mamba_cache did not run); unset it to "
                "serve this model"
            )
        attention = {n: s for n, s in self.specs.items() if s.kind != "state"}
        needed = pool_bytes(attrs.evolve(planned, mamba_states=0), attention)
        if needed > available_bytes:
            raise SglangIntegrationError(
                f"kvcore's KV pool of {planned.full_tokens:,} tokens takes {needed:,} bytes, but SGLang left "
                f"{available_bytes:,} after the Mamba pool; unset {POLICY_VARIABLE} to serve this model"
            )
        return planned

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


def check_hybrid_swa(kvc: Any) -> None:
    """Raise unless SGLang's own answer (``kvc.is_hybrid_swa``) to whether this model gets a
    sliding pool is kvcore's (:func:`~kvcore.integrations.sglang.model.runs_hybrid_swa`, the answer
    ``kvcore compare --engine sglang`` and ``kvcore tune`` show): if they differed, the pools kvcore
    promised there would not be the ones SGLang runs."""
    model_config = kvc.model_config
    hf_config, text = model_config.hf_config, model_config.hf_text_config
    architectures = [str(a) for a in getattr(hf_config, "architectures", None) or ()]
    config = {
        "architectures": architectures,
        "sliding_window_pattern": getattr(hf_config, "sliding_window_pattern", None),
        "text_config": {field: getattr(text, field, None) for field in SWA_FIELDS},
    }
    ours = runs_hybrid_swa(
        architectures,
        config,
        disable_hybrid_swa_memory=bool(getattr(model_config, "disable_hybrid_swa_memory", False)),
    )
    theirs = bool(getattr(kvc, "is_hybrid_swa", False))
    if ours != theirs:
        raise SglangIntegrationError(
            f"SGLang {'gives' if theirs else 'does not give'} this model ({', '.join(architectures)}) a "
            f"sliding-window pool, but kvcore's model of SGLang says it {'does' if ours else 'does not'}: "
            "the pools kvcore's SGLang figures show for it are not what this SGLang runs; unset "
            f"{POLICY_VARIABLE} to let SGLang size this model"
        )


def check_bytes(own: MemoryPoolConfigurator, specs: dict[str, Any]) -> None:
    """Raise unless SGLang's own configurator ``own`` counts the bytes per token kvcore's
    ``specs`` do, pool by pool.

    SGLang adds bytes kvcore's kinds do not describe for an FP4/MXFP8 scale buffer, a
    speculative draft model's layers or a QSA cache (``DefaultPoolConfigurator._compute_cell_size``,
    ``HybridSWAPoolConfigurator._recompute_cell_size``); a plan made without them would overrun
    the budget, so those models are refused. The figures are the
    configurators' own (private) fields of sglang 0.5.23.

    Raises:
        SglangIntegrationError: another configurator (DeepSeek V4's compressed pools) or other
            bytes per token.
    """
    pools = check_specs(specs)
    # the Mamba pool is sized outside the configurator (checked by handle_max_mamba_cache)
    ours = {
        pool: sum(token_bytes(specs[n]) for n in names) for pool, names in pools.items() if pool != "mamba"
    }
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
    """SGLang's settings as the running server resolved them (``get_schedule()``; for a Mamba
    hybrid its slots per request, ``_calculate_mamba_ratio()``)."""
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
        mamba_full_memory_ratio=float(schedule.mamba_full_memory_ratio or DEFAULT_MAMBA_FULL_MEMORY_RATIO),
        mamba_slots_per_request=int(kvc._calculate_mamba_ratio()) if kvc.mambaish_config is not None else 3,
    )


def _refuse_mamba_settings(kvc: Any, policy: str) -> None:
    """Raise for the Mamba settings SGLang sizes with state kvcore does not plan."""
    from sglang.srt.runtime_context import get_exec, get_schedule

    given = {
        "--max-mamba-cache-size": get_schedule().max_mamba_cache_size is not None,
        "speculative decoding (its intermediate SSM states)": not kvc.spec_algorithm.is_none(),
        "--enable-linear-replayssm-spec (its replay rings)": bool(
            get_exec().mamba.enable_linear_replayssm_spec
        ),
        "extra Mamba bytes per request": bool(kvc.extra_mamba_cache_bytes_per_req),
        "a fused draft state": kvc.fused_entry_bytes("mamba") is not None,
        "pipeline parallelism": kvc.pp_size > 1,
    }
    refused = [what for what, on in given.items() if on]
    if refused:
        raise SglangIntegrationError(
            f"{POLICY_VARIABLE}={policy}: SGLang sizes its Mamba pool with {', '.join(refused)}, which "
            f"kvcore's plan does not hold; drop it or unset {POLICY_VARIABLE}"
        )


def handle_max_mamba_cache(sglangs: Callable[..., Any], kvc: Any, total_rest_memory: float) -> float:
    """The hook around SGLang's ``KVCacheConfigurator._handle_max_mamba_cache`` while the policy
    is set: kvcore plans the whole budget (``total_rest_memory`` GiB), SGLang's Mamba pool gets
    the plan's state slots (``max_mamba_cache_size``), and the configurator is left the rest.

    Raises:
        SglangIntegrationError: Mamba settings kvcore does not plan, state bytes that differ
            from SGLang's ``mamba_cache_per_req``, or a plan SGLang cannot run.
    """
    from sglang.srt.runtime_context import get_context

    policy = os.environ[POLICY_VARIABLE]
    _refuse_mamba_settings(kvc, policy)
    specs = specs_from_sglang(kvc)
    rules = _rules_of(kvc)
    states = check_specs(specs)["mamba"]
    slot = sum(token_bytes(specs[n]) for n in states)
    theirs = int(kvc.mambaish_config.mamba2_cache_params.mamba_cache_per_req)
    if slot != theirs:
        raise SglangIntegrationError(
            f"SGLang's Mamba slot takes {theirs:,} bytes, kvcore's specs of its state layers {slot:,}; "
            f"unset {POLICY_VARIABLE} to serve this model"
        )
    budget = int(total_rest_memory * (1 << 30))
    plan = plan_for_sglang(rules.request(specs, budget, policy=policy), rules, registry=Registry.default())
    sizes = pool_sizes(plan, sglang_specs(specs, rules))
    get_context().override("mamba_pool.kvcore", max_mamba_cache_size=sizes.mamba_states)
    _PLANNED[id(kvc)] = (kvc, sizes)
    # an integer byte count over a power of two: SGLang's int(rest x 2**30) gives it back exactly
    return (budget - (sizes.mamba_states + 1) * slot) / (1 << 30)


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
    HookRegistry.register(MAMBA_TARGET, handle_max_mamba_cache, HookType.AROUND)
