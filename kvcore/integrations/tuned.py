"""A tuned candidate as each engine is told to run it: the flags, and what the engine makes of them.

:func:`kvcore.tuning.search.tune` finds the plan and scheduler settings that serve a workload
best; this module turns its candidate into settings per engine, each beside the capacity the
engine itself would size with them (its own rules, computed here without the engine:
:mod:`kvcore.integrations.vllm.rules`, :mod:`kvcore.integrations.sglang.rules`):

- **vLLM 0.33**: ``--block-size``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
  ``--kv-cache-memory-bytes`` (the budget, exactly), ``--kv-cache-dtype``, and
  ``KVCORE_VLLM_POLICY`` when the layout needs kvcore's plugin. vLLM runs one block pool, so a
  split of several pools has no vLLM form: it is named in :attr:`EngineSettings.cannot_express`.
- **SGLang 0.5**: ``--page-size``, ``--max-running-requests``, ``--chunked-prefill-size``,
  ``--max-total-tokens`` (the full pool's tokens), ``--swa-full-tokens-ratio`` (the sliding
  pool's tokens per full-pool token, which is how SGLang takes a pool split),
  ``--kv-cache-dtype``, and ``--mem-fraction-static`` when the GPU's memory and the weights are
  known. SGLang keeps each attention kind in a pool of its own: a layout that shares memory
  between kinds (``shared_buffer``, ``equal_groups``) is named as one it cannot express, and its
  settings are those of ``kind_pools`` with the nearest split.

:func:`vllm_planner` is the :data:`~kvcore.tuning.search.Planner` that plans candidates under
vLLM's rules (null block, two batches in flight), so that what the search simulates is what
vLLM runs, and a vLLM candidate's flags fed back to
:func:`~kvcore.integrations.vllm.rules.plan_for_vllm` make the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvcore.dtypes import dtype_name, to_dtype
from kvcore.errors import KVCoreError, PolicyNotApplicableError
from kvcore.integrations.host_tier.flags import vllm_host_tier
from kvcore.integrations.sglang.model import SglangModel
from kvcore.integrations.sglang.rules import (
    SglangPoolSizes,
    SglangRules,
    check_specs,
    own_pool_sizes,
    plan_for_sglang,
    pool_sizes,
    sglang_specs,
)
from kvcore.integrations.vllm.rules import (
    VLLM_STATE_CACHE_MODES,
    VllmIntegrationError,
    VllmRules,
    plan_for_vllm,
)
from kvcore.plan import KVCachePlan
from kvcore.planning import planner
from kvcore.planning.compare import variant_specs
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest
from kvcore.policy import PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.tuning.search import Planner, Trial

#: vLLM's own grouping, modelled by a kvcore policy: vLLM pads every group to one page size and
#: gives each layer slot one tensor (``equal_groups``' layout), one spec per group.
VLLM_OWN_POLICY = "equal_groups"

#: The policy whose kinds lend each other one buffer (SGLang's unified memory pool,
#: ``--enable-unified-memory``, does it for an attention and a Mamba sub-pool only:
#: ``python/sglang/srt/mem_cache/unified_memory_pool.py``).
UNIFIED_POLICY = "unified_pool"

#: What an engine's ``--kv-cache-dtype`` calls kvcore's cache dtypes (``auto``: the model's).
VLLM_DTYPES = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
SGLANG_DTYPES = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


@attrs.frozen(kw_only=True)
class Flag:
    """One engine setting.

    Attributes:
        name: the flag (``--block-size``) or environment variable (``KVCORE_VLLM_POLICY``).
        value: its value, as the command line takes it.
        why: what it does for this candidate.
    """

    name: str
    value: str
    why: str = ""

    def __str__(self) -> str:
        return f"{self.name}={self.value}" if self.name.isupper() else f"{self.name} {self.value}"


@attrs.frozen(kw_only=True)
class EngineSettings:
    """A candidate as one engine runs it.

    Attributes:
        engine: ``vllm`` or ``sglang``.
        flags: the settings, environment variables included.
        cannot_express: ``(setting, why)`` for each part of the candidate the engine cannot take.
        unit: what the two capacity figures count: ``requests`` of ``max_model_len`` held at
            once (vLLM), or ``tokens`` of the full and sliding pools together (SGLang).
        kvcore_tokens: that figure for kvcore's layout.
        engine_tokens: that figure for the engine's own sizing with these flags (``None``: it
            sizes nothing for these layers).
        engine_detail: how the engine's figure was made.
        plan: the plan the engine runs with these flags (``None`` when it runs its own sizing).
    """

    engine: str
    flags: tuple[Flag, ...]
    cannot_express: tuple[tuple[str, str], ...] = ()
    unit: str = "tokens"
    kvcore_tokens: float = 0
    engine_tokens: float | None = None
    engine_detail: str = ""
    plan: KVCachePlan | None = attrs.field(default=None, eq=False, repr=False)

    def command_line(self) -> str:
        """The environment variables, then the flags, as one shell line (after the engine's
        own launch command)."""
        env = [str(f) for f in self.flags if f.name.isupper()]
        args = [str(f) for f in self.flags if not f.name.isupper()]
        return " ".join([*env, *args])

    def to_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "engine": self.engine,
            "flags": {f.name: f.value for f in self.flags},
            "why": {f.name: f.why for f in self.flags if f.why},
            "command_line": self.command_line(),
            "cannot_express": [{"setting": s, "why": w} for s, w in self.cannot_express],
            "unit": self.unit,
            "kvcore_tokens": self.kvcore_tokens,
            "engine_tokens": self.engine_tokens,
            "engine_detail": self.engine_detail,
        }


def vllm_rules(context: SizingContext, *, async_scheduling: bool = True) -> VllmRules:
    """vLLM's rules for a candidate planned with ``context`` (its ``max_num_batched_tokens``
    and state cache mode; a mode vLLM does not have, ``all``, is left out, and a caller plans
    such a candidate as one vLLM would not run)."""
    mode = context.state_cache_mode
    return VllmRules(
        max_model_len=context.max_model_len,
        max_num_batched_tokens=context.max_num_batched_tokens,
        async_scheduling=async_scheduling,
        max_encoder_tokens=context.max_encoder_tokens,
        state_cache_mode=mode if mode in VLLM_STATE_CACHE_MODES else None,
    )


def vllm_planner(registry: Registry, *, async_scheduling: bool = True) -> Planner:
    """Plans candidates as vLLM runs them (:func:`~kvcore.integrations.vllm.rules.plan_for_vllm`).

    A layout of several pools, which vLLM cannot run, is still planned under vLLM's sizing
    rules (its context and null block), so that the search can weigh it; its vLLM settings then
    name the pools as what vLLM cannot express.
    """

    def plan_candidate(request: PlanRequest) -> KVCachePlan:
        rules = vllm_rules(request.context, async_scheduling=async_scheduling)
        mode = request.context.state_cache_mode
        sized = attrs.evolve(request, context=attrs.evolve(rules.context(), state_cache_mode=mode))
        if request.options.pool_split is None and rules.state_cache_mode == mode:
            try:
                return plan_for_vllm(sized, rules, registry=registry)
            except VllmIntegrationError:
                pass  # several pools: planned below under vLLM's sizing, named in its flags
            except PolicyNotApplicableError:
                # pages over runs of block ids (unified_pool): planned below, named in its flags;
                # a policy that cannot plan the layers at all raises again there
                pass
        return planner.plan(
            attrs.evolve(sized, options=rules.options(request.options)), registry=registry
        ).plans[0]

    return plan_candidate


def kv_tokens(plan: KVCachePlan) -> int:
    """Tokens of KV cache ``plan`` holds: per pool, its usable blocks times the block size of
    its first group that grows with the request (full attention before sliding), summed."""
    total = 0
    for p in range(len(plan.pools)):
        groups = [g for g in plan.groups if g.pool == p and g.spec.tokens_per_page]
        if groups:
            total += plan.usable_blocks_in(p) * (groups[0].spec.tokens_per_page or 0)
    return total


def _dtype(trial: Trial, table: Mapping[str, str]) -> str:
    name = trial.knobs.kv_cache_dtype
    if name is None:
        return "auto"
    canonical = dtype_name(to_dtype(name))
    return table.get(canonical, canonical)


def vllm_settings(
    trial: Trial,
    specs: Mapping[str, KVCacheSpec],
    available_bytes: int,
    *,
    registry: Registry,
    async_scheduling: bool = True,
) -> EngineSettings:
    """The vLLM 0.33 settings of ``trial`` and the capacity vLLM's own grouping has with them.

    Raises:
        InvalidInputError: ``trial`` has no plan.
    """
    plan = _plan_of(trial)
    knobs = trial.knobs
    cannot = _vllm_cannot_express(trial, plan)
    sizes = sorted({g.spec.block_size for g in plan.groups if g.spec.tokens_per_page})
    block = sizes[0] if sizes else None
    flags = [
        Flag(name="--kv-cache-memory-bytes", value=str(available_bytes), why="the KV-cache budget, exactly"),
        Flag(name="--max-num-seqs", value=str(knobs.max_num_seqs), why="requests running at once, at most"),
        Flag(
            name="--max-num-batched-tokens",
            value=str(knobs.max_num_batched_tokens),
            why="tokens one step schedules (the prefill chunk)",
        ),
        Flag(name="--kv-cache-dtype", value=_dtype(trial, VLLM_DTYPES)),
    ]
    if block is not None:
        flags.insert(
            0, Flag(name="--block-size", value=str(block), why="tokens per block of attention layers")
        )
    tier = plan.offload_tier
    if tier is not None and tier.nbytes:
        try:
            host = vllm_host_tier(plan)
        except KVCoreError as exc:  # several pools: vLLM sizes one host tier for one KV cache
            cannot.append(("host tier", str(exc)))
        else:
            size, backend = (text.partition(" ")[::2] for text in host.flags)
            flags.append(
                Flag(
                    name=size[0],
                    value=size[1],
                    why=f"the host tier: vLLM's CPU offloading, {host.holds_count:,} chunks of a block",
                )
            )
            flags.append(Flag(name=backend[0], value=backend[1], why="vLLM's own CPU offloading connector"))
    own_plan, engine_tokens, detail = _vllm_own_grouping(
        trial, plan, specs, available_bytes, registry=registry, async_scheduling=async_scheduling
    )
    if own_plan is None or _pools(own_plan) != _pools(plan):
        # vLLM's own sizing makes another plan: only kvcore's plugin runs this one
        flags.append(
            Flag(
                name="KVCORE_VLLM_POLICY",
                value=knobs.policy,
                why="kvcore's plugin plans vLLM's KV cache with this policy (pip install kvcore[vllm])",
            )
        )
    return EngineSettings(
        engine="vllm",
        flags=tuple(flags),
        cannot_express=tuple(cannot),
        unit="requests",
        kvcore_tokens=plan.max_concurrency(),
        engine_tokens=engine_tokens,
        engine_detail=detail,
        plan=plan if len(plan.pools) == 1 else None,
    )


def _vllm_cannot_express(trial: Trial, plan: KVCachePlan) -> list[tuple[str, str]]:
    """What of ``trial``'s plan vLLM's flags cannot say, each with what to do instead."""
    cannot: list[tuple[str, str]] = []
    sizes = sorted({g.spec.block_size for g in plan.groups if g.spec.tokens_per_page})
    if len(sizes) > 1:
        cannot.append(
            (
                f"block sizes {sizes}",
                "vLLM's --block-size is one number; kvcore's plugin sets each group's own block size",
            )
        )
    runs = sorted({g.blocks_per_page for g in plan.groups if g.blocks_per_page > 1})
    if runs and any(g.spec.tokens_per_page for g in plan.groups if g.blocks_per_page > 1):
        cannot.append(
            (
                f"attention pages over runs of {runs} block ids ({trial.knobs.policy})",
                "vLLM's managers hand each group one block id per page, and no attention block size "
                "gives every kind's page one; serve this candidate with kvcore's runtime or take the best "
                "candidate vLLM runs",
            )
        )
    if len(plan.pools) > 1:
        shares = _split_text(trial)
        cannot.append(
            (
                f"{len(plan.pools)} block pools split {shares}",
                "vLLM runs one block pool for every group; serve this candidate with SGLang (its "
                "--swa-full-tokens-ratio is the split) or take the best one-pool candidate for vLLM",
            )
        )
    return cannot


def _vllm_own_grouping(
    trial: Trial,
    plan: KVCachePlan,
    specs: Mapping[str, KVCacheSpec],
    available_bytes: int,
    *,
    registry: Registry,
    async_scheduling: bool,
) -> tuple[KVCachePlan | None, float | None, str]:
    """vLLM's own grouping of the same layers under ``trial``'s settings: its plan (``None`` where
    it holds no request), its concurrency, and a line saying which."""
    knobs = trial.knobs
    variant = variant_specs(specs, block_size=knobs.block_size, kv_cache_dtype=knobs.kv_cache_dtype)
    # the candidate's own step budget: its plan's context already counts vLLM's batches in flight
    rules = VllmRules(
        max_model_len=plan.context.max_model_len,
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        async_scheduling=async_scheduling,
        max_encoder_tokens=plan.context.max_encoder_tokens,
    )
    try:
        own_plan = plan_for_vllm(
            rules.request(
                variant, available_bytes, policy=VLLM_OWN_POLICY, options=PlanOptions(mixed_pages=False)
            ),
            rules,
            registry=registry,
        )
    except KVCoreError as exc:
        # the first clause says what is short; the fix that follows is for a plan, not for flags
        return None, None, f"vLLM's own grouping holds no request here: {str(exc).split(';')[0]}"
    detail = f"vLLM's own grouping (modelled by {VLLM_OWN_POLICY}, one page size per group)"
    return own_plan, own_plan.max_concurrency(), detail


def sglang_settings(
    trial: Trial,
    model: SglangModel,
    available_bytes: int,
    *,
    registry: Registry,
    gpu_memory: int | None = None,
    weights: int | None = None,
) -> EngineSettings:
    """The SGLang 0.5 settings of ``trial`` and the pools SGLang's own configurator sizes with them.

    The candidate's layout as SGLang runs it is ``kind_pools`` at SGLang's page (the block
    size; 64 for a DSA model), with the candidate's pool split (SGLang always keeps its pools
    apart); the sliding pool's tokens over the full pool's are its ``--swa-full-tokens-ratio``.
    The layers are ``model``'s, as SGLang keeps them
    (:func:`~kvcore.integrations.sglang.model.sglang_model`, which ``kvcore compare --engine
    sglang`` reads too): a model SGLang gives no sliding pool has no ratio, its sliding layers
    keep every token in the full pool, and a candidate's split of several pools is named as one
    SGLang cannot express.

    Args:
        trial: the candidate.
        model: the model as SGLang runs it.
        available_bytes: the KV budget.
        registry: where policies are looked up.
        gpu_memory: the GPU's bytes, with ``weights``: adds ``--mem-fraction-static``.
        weights: the weights' bytes on the GPU.

    Raises:
        InvalidInputError: ``trial`` has no plan.
        SglangIntegrationError: layers SGLang cannot run.
    """
    plan = _plan_of(trial)
    knobs = trial.knobs
    variant = variant_specs(model.specs, block_size=knobs.block_size, kv_cache_dtype=knobs.kv_cache_dtype)
    page = model.page_size(min((g.spec.block_size for g in plan.groups if g.spec.tokens_per_page), default=1))
    rules = SglangRules(
        context_len=plan.context.max_model_len,
        page_size=page,
        chunked_prefill_size=knobs.max_num_batched_tokens,
    )
    paged = sglang_specs(variant, rules)
    pools = check_specs(paged)
    cannot = _sglang_cannot_express(trial, plan, model, pools)
    options = (
        PlanOptions(pool_split=trial.pool_split)
        if trial.pool_split and len(pools) == len(trial.pool_split)
        else None
    )
    sglang_plan = plan_for_sglang(
        rules.request(variant, available_bytes, options=options), rules, registry=registry
    )
    sizes = pool_sizes(sglang_plan, paged)
    flags, ratio = _sglang_flags(trial, page, sizes, available_bytes, gpu_memory=gpu_memory, weights=weights)
    engine_tokens, detail = _sglang_own_sizing(paged, available_bytes, rules, ratio)
    return EngineSettings(
        engine="sglang",
        flags=tuple(flags),
        cannot_express=tuple(cannot),
        kvcore_tokens=sizes.full_tokens + sizes.swa_tokens,
        engine_tokens=engine_tokens,
        engine_detail=detail,
        plan=sglang_plan,
    )


def _sglang_flags(
    trial: Trial,
    page: int,
    sizes: SglangPoolSizes,
    available_bytes: int,
    *,
    gpu_memory: int | None,
    weights: int | None,
) -> tuple[list[Flag], float | None]:
    """SGLang's flags for ``trial`` with the pools ``sizes`` gives, and its sliding-to-full ratio."""
    knobs = trial.knobs
    flags = [
        Flag(name="--page-size", value=str(page), why="tokens per page of every pool"),
        Flag(name="--max-running-requests", value=str(knobs.max_num_seqs), why="requests running at once"),
        Flag(
            name="--chunked-prefill-size",
            value=str(knobs.max_num_batched_tokens),
            why="tokens one prefill chunk computes",
        ),
        Flag(name="--max-total-tokens", value=str(sizes.max_total_num_tokens), why="the full pool's tokens"),
        Flag(name="--kv-cache-dtype", value=_dtype(trial, SGLANG_DTYPES)),
    ]
    ratio = None
    if sizes.is_hybrid_swa and sizes.full_tokens:
        ratio = round(sizes.swa_tokens / sizes.full_tokens, 4)
        flags.insert(
            4,
            Flag(
                name="--swa-full-tokens-ratio",
                value=f"{ratio:g}",
                why="sliding-pool tokens per full-pool token: the pool split",
            ),
        )
    if gpu_memory and weights is not None:
        fraction = (available_bytes + weights) / gpu_memory
        flags.append(
            Flag(
                name="--mem-fraction-static",
                value=f"{fraction:.4f}",
                why="(weights + KV budget) / GPU memory: SGLang's KV budget is gpu x fraction - weights",
            )
        )
    return flags, ratio


def _sglang_cannot_express(
    trial: Trial, plan: KVCachePlan, model: SglangModel, pools: Mapping[Any, Any]
) -> list[tuple[str, str]]:
    """What of ``trial``'s plan SGLang's flags cannot say, each with what SGLang runs instead."""
    knobs = trial.knobs
    cannot: list[tuple[str, str]] = []
    if model.sliding_in_full_pool:
        shares = _split_text(trial)
        split = f"{len(plan.pools)} pools split {shares}" if len(plan.pools) > len(pools) else ""
        cannot.append(
            (
                split or "a pool of its own for the sliding layers",
                f"{model.note()}: no --swa-full-tokens-ratio",
            )
        )
    several = len(pools) > 1  # with one SGLang pool, every layout of it is SGLang's own
    if several and knobs.policy == UNIFIED_POLICY:
        cannot.append(
            (
                f"policy {knobs.policy}",
                "the kinds lend each other one buffer's rows; SGLang's unified memory pool "
                "(--enable-unified-memory) lends one buffer only between an attention and a Mamba "
                "sub-pool, and keeps sliding-window layers in a pool of their own; its settings are "
                "kind_pools' split by the worst case",
            )
        )
    elif several and knobs.policy != "kind_pools":
        cannot.append(
            (
                f"policy {knobs.policy}",
                "SGLang keeps each attention kind in a pool of its own; its settings are kind_pools' "
                "with this candidate's split",
            )
        )
    return cannot


def _sglang_own_sizing(
    paged: Mapping[str, KVCacheSpec], available_bytes: int, rules: SglangRules, ratio: float | None
) -> tuple[float | None, str]:
    """The tokens SGLang's own configurator holds with the flags, and a line saying how."""
    try:
        own_rules = attrs.evolve(rules, swa_full_tokens_ratio=ratio) if ratio else rules
        own = own_pool_sizes(paged, available_bytes, own_rules)
        detail = (
            f"SGLang's own configurator with these flags: full {own.full_tokens:,} + sliding "
            f"{own.swa_tokens:,} tokens"
            if own.is_hybrid_swa
            else "SGLang's own configurator with these flags"  # its figure, the tokens, follows
        )
    except KVCoreError as exc:
        return None, f"SGLang's own configurator refuses: {str(exc).split(';')[0]}"
    return own.full_tokens + own.swa_tokens, detail


def _split_text(trial: Trial) -> str:
    """``'60.0%, 40.0%'``: the candidate's pool split, or ``'by worst case'`` where it sets none."""
    return ", ".join(f"{100 * s:.1f}%" for s in trial.pool_split) if trial.pool_split else "by worst case"


def _pools(plan: KVCachePlan) -> tuple[object, ...]:
    """What tells two plans apart for an engine: the pools, and the groups' layers and specs."""
    return (
        tuple((p.num_blocks, p.bytes_per_block) for p in plan.pools),
        tuple((g.layer_names, g.spec, tuple(sorted(g.layer_specs))) for g in plan.groups),
        plan.context,
    )


def _plan_of(trial: Trial) -> KVCachePlan:
    if trial.plan is None:
        from kvcore.errors import InvalidInputError

        raise InvalidInputError(f"the candidate has no plan ({trial.error}); it has no engine settings")
    return trial.plan


def sglang_profile(registry: Registry) -> Any | None:
    """The registered ``sglang`` scheduler profile, or ``None`` when none is registered."""
    return registry.scheduler_profiles.get("sglang")
