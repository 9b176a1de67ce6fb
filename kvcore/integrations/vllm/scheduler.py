"""vLLM 0.33's real v1 ``Scheduler`` replaying a workload on a kvcore plan, with a fake model
runner: what the ``vllm`` scheduler profile (:mod:`kvcore.simulation.profiles.vllm`) is checked
against. Imports vLLM.

The plan becomes vLLM's ``KVCacheConfig`` (:func:`~kvcore.integrations.vllm.convert.plan_to_vllm_config`);
the scheduler (``vllm/v1/core/sched/scheduler.py``, or ``async_scheduler.py``'s
``AsyncScheduler`` with async scheduling) is built on it as the engine core builds it, on the CPU
platform. Each step adds the requests that arrive at it (``add_request``), calls ``schedule()``,
and hands the ``SchedulerOutput`` to a fake model runner that samples one token for every
scheduled request whose chunk reaches the end of its known tokens (a partial prefill samples
nothing, as a real runner discards it). Its ``ModelRunnerOutput`` goes back through
``update_from_output`` at once (synchronous), or after the next step was scheduled (async: the
engine core's batch queue of two, ``EngineCore.step_with_batch_queue``).

Token ids: the ``i``-th token of a request is its ``prefix_id``'s ``i``-th token while ``i`` is
inside ``prefix_tokens``, else its own (distinct from every other request's), generated tokens
included; so vLLM's block hashes meet exactly where the profile says they do.

The figures are read from the scheduler itself: running requests after each ``schedule()``
(``len(scheduler.running)``), tokens scheduled, ``KVCacheManager.usage``, preemptions
(``SchedulerOutput.preempted_req_ids``), the steps until every request finished, queue delays
(the step a request first appears in ``scheduled_new_reqs``) and prefix hits (a request's
``num_computed_tokens`` when it is admitted, new or resumed).

A plan with a host tier runs with vLLM's native CPU offloading, configured as
``--kv-offloading-size`` does it (``CacheConfig.kv_offloading_size`` of the tier's bytes in GiB,
backend ``native``: the ``OffloadingConnector``, whose scheduler side the scheduler builds). No
worker runs: the fake model runner reports every load and store job of a step finished in that
step's output (``KVConnectorOutput``: ``finished_recving`` for the loading requests, the jobs in
``OffloadingWorkerMetadata.completed_jobs``), the timing the profile assumes
(:mod:`kvcore.simulation.profiles.vllm_reference.offloading`). The tier's figures are read from
the connector: its load and store jobs, the chunks each covers, the chunks held at the end.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import types
from collections import deque
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import attrs
from vllm.config import CacheConfig, DeviceConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import init_none_hash, resolve_kv_cache_block_sizes
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvcore.integrations.vllm.convert import plan_to_vllm_config
from kvcore.integrations.vllm.rules import VllmIntegrationError
from kvcore.integrations.vllm.versions import (
    admitted_request_ids,
    model_runner_output,
    request_block_hasher,
)
from kvcore.plan import KVCachePlan
from kvcore.runtime.host_cache import HostTierStats
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.profiles.vllm_groups import align_state_block
from kvcore.simulation.simulator import SimulationResult, percentile
from kvcore.simulation.workload import Workload

#: Token ids a request's own tokens start from (a shared prefix's ids stay below).
_OWN_TOKENS = 1 << 20


class _Model(types.SimpleNamespace):
    """The stand-in model config: the fields the scheduler reads are given; any other one it
    asks for (multimodal, pooling, speculative settings) is ``None``, i.e. not in use."""

    def __getattr__(self, name: str) -> None:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _config(
    plan: KVCachePlan, profile: VllmProfile, max_num_batched_tokens: int, prefix_caching: bool
) -> VllmConfig:
    """A ``VllmConfig`` with the profile's scheduler settings and a stand-in model (the
    scheduler reads only a few of the model's fields)."""
    length = plan.context.max_model_len
    tier = plan.offload_tier.nbytes if plan.offload_tier is not None else 0
    # --kv-offloading-size (GiB) --kv-offloading-backend native, only for a tier (the fields are
    # the releases' own: the configs of a plan without one stay as every release takes them)
    offloading: dict[str, Any] = (
        {"kv_offloading_size": tier / (1 << 30), "kv_offloading_backend": "native"} if tier else {}
    )
    config = VllmConfig(
        scheduler_config=SchedulerConfig(
            max_model_len=length,
            is_encoder_decoder=False,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=profile.max_num_seqs,
            async_scheduling=profile.async_scheduling,
            long_prefill_token_threshold=profile.long_prefill_token_threshold,
            scheduler_reserve_full_isl=profile.reserve_full_isl,
        ),
        cache_config=CacheConfig(
            enable_prefix_caching=prefix_caching,
            mamba_cache_mode=_mamba_cache_mode(plan, prefix_caching),
            prefix_cache_retention_interval=profile.prefix_cache_retention_interval,
            **offloading,
        ),
        device_config=DeviceConfig(device="cpu"),
    )
    config.scheduler_config.async_scheduling = profile.async_scheduling
    config.cache_config.num_gpu_blocks = plan.num_blocks  # as the engine core sets it
    model = _Model(
        max_model_len=length,
        original_max_model_len=length,
        supports_kv_cache_grouping=False,
        use_mla=False,
        uses_mrope=False,
        is_encoder_decoder=False,
        return_sampling_mask=False,
        runner_type="generate",
        is_multimodal_model=False,
        skip_tokenizer_init=True,
        model="kvcore-plan",
        dtype="auto",
    )
    # the offloading connector asks for the model's KV heads (its parallelism check)
    model.get_total_num_kv_heads = lambda: _kv_heads(plan)
    object.__setattr__(config, "model_config", model)
    return config


def _mamba_cache_mode(plan: KVCachePlan, prefix_caching: bool) -> str:
    """vLLM's ``mamba_cache_mode`` for ``plan``: ``'align'`` for state layers with prefix caching
    (vLLM derives it so: ``HybridAttentionMambaModelConfig``), else ``'none'``."""
    return "align" if prefix_caching and align_state_block(plan) else "none"


def _tokens(index: int, prompt: int, prefix: int, prefix_tokens: int) -> list[int]:
    """A request's prompt: its shared prefix's tokens (``prefix``-th prefix), then its own."""
    base = _OWN_TOKENS * (index + 1)
    own = [base + i for i in range(prompt)]
    if prefix_tokens:  # a prefix's ids: below _OWN_TOKENS, distinct per prefix (the hash chains)
        own[:prefix_tokens] = [prefix * 4096 + 1 + i % 4096 for i in range(prefix_tokens)]
    return own


def run_vllm_scheduler(
    plan: KVCachePlan,
    workload: Workload,
    profile: VllmProfile,
    *,
    max_num_batched_tokens: int,
    prefix_caching: bool = False,
    max_steps: int = 1_000_000,
) -> SimulationResult:
    """Replay ``workload`` through vLLM's real scheduler on ``plan`` (see the module docstring).

    Args:
        plan: a plan vLLM can run (made with
            :func:`~kvcore.integrations.vllm.rules.plan_for_vllm`).
        workload: the requests.
        profile: vLLM's settings (async scheduling, ``max_num_seqs``, the admission gate,
            ``long_prefill_token_threshold``).
        max_num_batched_tokens: vLLM's ``max_num_batched_tokens``.
        prefix_caching: vLLM's ``enable_prefix_caching``.
        max_steps: stop with an error after this many steps (a stuck queue).

    Returns:
        The figures, as :func:`kvcore.simulation.simulate` reports them.

    Raises:
        VllmIntegrationError: the requests do not finish within ``max_steps``.
    """
    scheduler, hasher = _scheduler(plan, profile, max_num_batched_tokens, prefix_caching)
    # a tier too small for a step's stores logs a warning per request and step; the tally counts
    # what was stored instead
    quiet = logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _replay(
            scheduler, hasher, plan, workload, profile, max_steps=max_steps, prefix_caching=prefix_caching
        )
    finally:
        quiet.setLevel(level)


def _replay(
    scheduler: Scheduler,
    hasher: Any,
    plan: KVCachePlan,
    workload: Workload,
    profile: VllmProfile,
    *,
    max_steps: int,
    prefix_caching: bool,
) -> SimulationResult:
    """The steps of :func:`run_vllm_scheduler` on its scheduler."""
    requests = workload.requests
    tally = _Tally(first=[-1] * len(requests))
    by_id: dict[str, int] = {}
    prefixes: dict[object, int] = {}
    pending = deque(range(len(requests)))
    lag = 1 if profile.async_scheduling else 0
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    finished = 0
    step = 0
    while finished < len(requests):
        if step >= max_steps:
            raise VllmIntegrationError(f"vLLM's scheduler did not finish the workload in {max_steps} steps")
        while pending and requests[pending[0]].arrival_step <= step:
            i = pending.popleft()
            r = requests[i]
            prefix = prefixes.setdefault(r.prefix_id, len(prefixes))
            tokens = _tokens(i, r.prompt_tokens, prefix, r.prefix_tokens)
            params = SamplingParams(max_tokens=r.output_tokens, ignore_eos=True)
            scheduler.add_request(Request(f"r{i}", tokens, params, None, block_hasher=hasher))
            by_id[f"r{i}"] = i
        if not scheduler.has_requests() and not in_flight:  # idle: nothing has arrived yet
            tally.running.append(0)
            tally.usage.append(0.0)
            step += 1
            continue
        before = {rid: scheduler.requests[rid].num_computed_tokens for rid in scheduler.requests}
        output = scheduler.schedule()
        tally.count(scheduler, output, before, by_id, step)
        runner = _sampled(scheduler, output, by_id)
        if scheduler.connector is not None:
            runner.kv_connector_output = tally.count_transfers(scheduler, output)
        in_flight.append((output, runner))
        while len(in_flight) > lag:
            done_output, done_runner = in_flight.popleft()
            engine_outputs = scheduler.update_from_output(done_output, done_runner)
            for outputs in engine_outputs.values():
                finished += sum(1 for o in outputs.outputs if o.finish_reason is not None)
        step += 1
    return tally.result(
        plan, workload, profile, steps=step, prefix_caching=prefix_caching, scheduler=scheduler
    )


def _kv_heads(plan: KVCachePlan) -> int:
    """The KV heads of the plan's first group's layers (what vLLM's model config would give)."""
    return int(getattr(plan.groups[0].spec, "num_kv_heads", 1) or 1)


def _scheduler(
    plan: KVCachePlan, profile: VllmProfile, max_num_batched_tokens: int, prefix_caching: bool
) -> tuple[Scheduler, Any]:
    """vLLM's scheduler on ``plan``, and the block hasher its requests take (``None`` without caching)."""
    config = _config(plan, profile, max_num_batched_tokens, prefix_caching)
    # the states run in the mode vLLM derives from prefix caching, whatever the plan was sized
    # for; the engine core copies the retention setting into its KVCacheConfig (get_kv_cache_configs)
    kv_config = dataclasses.replace(
        plan_to_vllm_config(plan, state_cache_mode=_mamba_cache_mode(plan, prefix_caching)),
        prefix_cache_retention_interval=profile.prefix_cache_retention_interval,
    )
    sizes = [g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups]
    config.cache_config.block_size = math.lcm(*sizes) if sizes else 1
    # the scheduler's block (lcm of the groups') and the hashes' (their gcd with caching)
    block, hash_block = resolve_kv_cache_block_sizes(kv_config, config)
    cls = AsyncScheduler if profile.async_scheduling else Scheduler
    scheduler = cls(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block,
        hash_block_size=hash_block,
        log_stats=False,
    )
    hasher = None
    if prefix_caching:  # as the engine core makes it (EngineCore.__init__)
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = request_block_hasher(hash_block, hash_fn, config)
    return scheduler, hasher


def _sampled(scheduler: Scheduler, output: SchedulerOutput, by_id: Mapping[str, int]) -> ModelRunnerOutput:
    """The model runner's output for ``output``: one token for each request whose chunk reaches its end."""
    ids = list(output.num_scheduled_tokens)
    # the token is the request's own next one (at position num_computed_tokens), so that its hash
    # is the request's alone
    sampled = [
        []
        if scheduler.requests[rid].is_prefill_chunk
        else [_OWN_TOKENS * (by_id[rid] + 1) + scheduler.requests[rid].num_computed_tokens]
        for rid in ids
    ]
    return model_runner_output(ids, sampled)


@attrs.define
class _Tally:
    """The figures counted step by step while vLLM's scheduler runs the workload."""

    first: list[int]  # each request's first scheduled step (-1 until then)
    running: list[int] = attrs.Factory(list)
    usage: list[float] = attrs.Factory(list)
    total: int = 0
    preemptions: int = 0
    recomputed: int = 0
    cached: int = 0
    looked_up: int = 0
    # the CPU tier (vLLM's OffloadingConnector): loads, chunks loaded and stored, tokens it gave
    loads: int = 0
    loaded_chunks: int = 0
    stored_chunks: int = 0
    host_tokens: int = 0
    loading_local: dict[str, int] = attrs.Factory(dict)  # a loading request's local hit

    def count(
        self,
        scheduler: Scheduler,
        output: SchedulerOutput,
        before: Mapping[str, int],
        by_id: Mapping[str, int],
        step: int,
    ) -> None:
        self.preemptions += len(output.preempted_req_ids or ())
        for rid in output.preempted_req_ids or ():
            self.recomputed += before.get(rid, 0)
        for rid in admitted_request_ids(output):
            request = scheduler.requests[rid]
            computed = request.num_computed_tokens - output.num_scheduled_tokens[rid]
            self.cached += computed
            self.looked_up += request.num_tokens
            if rid in self.loading_local:
                self.host_tokens += computed - self.loading_local.pop(rid)
            i = by_id[rid]
            if self.first[i] < 0:
                self.first[i] = step
        self.total += output.total_num_scheduled_tokens
        self.running.append(len(scheduler.running))
        self.usage.append(scheduler.get_kv_cache_usage())

    def count_transfers(self, scheduler: Scheduler, output: SchedulerOutput) -> Any:
        """The worker's report of the step's transfer jobs, all finished (see the module
        docstring), after counting them."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput

        meta = output.kv_connector_metadata
        side = scheduler.connector.connector_scheduler
        received: set[str] = set()
        for job_id, job in meta.load_jobs.items():
            self.loads += 1
            self.loaded_chunks += len(side._jobs[job_id].keys)
            self.loading_local[job.req_id] = side._req_status[job.req_id].num_locally_computed_tokens
            received.add(job.req_id)
        for job_id in meta.store_jobs:
            self.stored_chunks += len(side._jobs[job_id].keys)
        done = {job_id: 1 for job_id in [*meta.load_jobs, *meta.store_jobs]}
        if not done:
            return None
        return KVConnectorOutput(
            finished_recving=received or None,
            kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done),
        )

    def host_tier(self, plan: KVCachePlan, scheduler: Scheduler) -> HostTierStats | None:
        """The tier's figures, as the profile reports them."""
        if scheduler.connector is None:
            return None
        manager = scheduler.connector.connector_scheduler.manager
        held = len(manager._policy.chunks)
        per_block = plan.pools[0].bytes_per_block
        return HostTierStats(
            enabled=True,
            host_blocks=manager._num_chunks,
            held_blocks=held,
            device_hit_tokens=self.cached - self.host_tokens,
            host_hits=self.loads,
            host_hit_tokens=self.host_tokens,
            offloaded_blocks=self.stored_chunks,
            offloaded_bytes=self.stored_chunks * per_block,
            restored_blocks=self.loaded_chunks,
            restored_bytes=self.loaded_chunks * per_block,
            host_evictions=self.stored_chunks - held,  # a chunk leaves the tier only when evicted
        )

    def result(
        self,
        plan: KVCachePlan,
        workload: Workload,
        profile: VllmProfile,
        *,
        steps: int,
        prefix_caching: bool,
        scheduler: Scheduler,
    ) -> SimulationResult:
        requests = workload.requests
        delays = sorted(f - r.arrival_step for f, r in zip(self.first, requests, strict=True) if f >= 0)
        return SimulationResult(
            policy=plan.policy,
            num_requests=len(requests),
            steps=steps,
            mean_running=sum(self.running) / steps if steps else 0.0,
            peak_running=max(self.running, default=0),
            tokens_per_step=self.total / steps if steps else 0.0,
            total_tokens=self.total,
            recomputed_tokens=self.recomputed,
            preemptions=self.preemptions,
            mean_queue_delay=sum(delays) / len(delays) if delays else 0.0,
            p99_queue_delay=float(percentile(delays, 99)) if delays else 0.0,
            mean_pool_usage=sum(self.usage) / steps if steps else 0.0,
            peak_pool_usage=max(self.usage, default=0.0),
            running=tuple(self.running),
            pool_usage=tuple(self.usage),
            prefix_caching=prefix_caching,
            cached_tokens=self.cached,
            prefix_hit_rate=self.cached / self.looked_up if self.looked_up else 0.0,
            scheduler="vllm (vLLM's own Scheduler)",
            scheduler_settings=profile.settings(),
            host_tier=self.host_tier(plan, scheduler),
        )
