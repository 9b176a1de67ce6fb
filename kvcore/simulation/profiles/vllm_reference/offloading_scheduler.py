"""vLLM 0.33's scheduler with the ``OffloadingConnector`` (native CPU offloading), plainly: the
reference scheduler of :mod:`~kvcore.simulation.profiles.vllm_reference.scheduler` with the
connector's calls where vLLM's ``Scheduler`` makes them (``vllm/v1/core/sched/scheduler.py``).

What the connector changes in a step (facts, not code):

- **Two waiting queues** (``Scheduler.schedule``): requests that hold KV blocks while they
  wait (a load in flight, or loaded and not yet admitted) queue in ``kv_holding_waiting``,
  drained before the ``waiting`` queue; a request skipped in a step goes back to the front of
  its queue (``skip_request``, ``prepend_requests``), in order.
- **Admission** of a request with nothing computed: its local prefix hit
  (``get_computed_blocks``), then the connector's hit past it
  (``get_num_new_matched_tokens``; ``None``: skipped this step). With a hit the request's blocks
  for the local and loaded tokens are allocated now (``allocate_slots`` with
  ``num_external_computed_tokens``, ``delay_cache_blocks``, and ``reserved_blocks``: what the
  other prefills in flight still need, ``_inflight_prefill_reserved_blocks``), the connector
  issues the load (``update_state_after_alloc``), and the request waits
  (``WAITING_FOR_REMOTE_KVS``) taking no token budget and no ``max_num_seqs`` seat.
- **The load's end** (``_update_from_kv_xfer_finished``, ``finished_recving``): the request is
  marked received; when the queue next reaches it (``_handle_blocked_waiting_request``,
  ``_update_waiting_for_remote_kv``) its blocks are cached, a full hit gives its last token
  back to be computed, and it is admitted as any request with tokens computed.
- **Stores**: after each step is scheduled, ``build_connector_meta`` offers the prompt chunks
  the step completes, and those of the requests finished since the last step.
- **Deferred frees** (``Scheduler.__init__``: ``defer_block_free`` with async scheduling and a
  connector that loads, as ``kv_both`` does): a freed request's blocks go back to the pool only
  once the last step it was scheduled in is processed (``_free_request_blocks``, fenced by
  ``sched_step_seq`` / ``processed_step_seq``, which count the steps that computed something,
  ``_drain_deferred_frees``), and a running request whose blocks do not fit preempts no request
  whose free would be deferred (``schedule``: the request is not scheduled this step).

Transfers take one step (see :mod:`~kvcore.simulation.profiles.vllm_reference.offloading`):
a step's jobs finish in its own output. With a step-time model whose GPU is known the bytes
moved each way cost the host link's time (:func:`~kvcore.simulation.gpus.host_transfer`),
added to the next step that computes (a step that only loads runs no model).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from kvcore.runtime.host_cache import HostTierStats
from kvcore.simulation.gpus import Gpu, host_transfer
from kvcore.simulation.profiles.vllm_reference.offloading import (
    OffloadingConnectorScheduler,
    OffloadStats,
    check_offloadable,
    host_chunks,
)
from kvcore.simulation.profiles.vllm_reference.request import RequestStatus
from kvcore.simulation.profiles.vllm_reference.scheduler import VllmReferenceScheduler, VllmSettings

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm_reference.block_pool import KVCacheBlock
    from kvcore.simulation.profiles.vllm_reference.kv_cache_manager import Blocks
    from kvcore.simulation.profiles.vllm_reference.request import RequestState
    from kvcore.simulation.result import SimulationResult
    from kvcore.simulation.steps import StepRecord, StepTimeModel
    from kvcore.simulation.workload import Workload


class OffloadingReferenceScheduler(VllmReferenceScheduler):
    """The reference scheduler with vLLM's CPU offloading for the plan's host tier.

    Args: as :class:`~kvcore.simulation.profiles.vllm_reference.VllmReferenceScheduler`
    (prefix caching on: the tier keeps cached blocks), and ``finished_order``: the order in which
    the connector walks a step's finished requests (default: the order they finished). vLLM
    walks them as a set of request-id strings, whose order is the strings' hashes (they vary
    with ``PYTHONHASHSEED``): a caller that knows vLLM's ids, in vLLM's process, can give that
    order (``tests/integrations/vllm/test_offloading.py`` does).

    Raises:
        InvalidInputError: as the reference, or the plan's tier is one this model does not
            simulate (:func:`~kvcore.simulation.profiles.vllm_reference.offloading.check_offloadable`).
    """

    def __init__(
        self,
        plan: KVCachePlan,
        workload: Workload,
        profile: VllmSettings,
        *,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = False,
        step_time: StepTimeModel | None = None,
        finished_order: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        check_offloadable(plan)
        super().__init__(
            plan,
            workload,
            profile,
            max_num_batched_tokens=max_num_batched_tokens,
            prefix_caching=prefix_caching,
            step_time=step_time,
        )
        self.offload = OffloadStats()
        self.connector = OffloadingConnectorScheduler(plan, self.offload)
        for r in range(len(self.requests)):
            self.connector.on_new_request(r)
        self._kv_holding: deque[int] = deque()  # ``kv_holding_waiting``
        self._loading: set[int] = set()  # ``WAITING_FOR_REMOTE_KVS``
        self._received: set[int] = set()  # ``finished_recving_kv_req_ids``
        self._inflight_prefills: set[int] = set()
        #: the requests finished since the last step was scheduled (``finished_req_ids``)
        self._finished_since: list[int] = []
        self._finished_order = finished_order
        #: a loading request's local hit, until it is admitted (for the tier's hit tokens)
        self._local_hit: dict[int, int] = {}
        #: each step's transfer jobs, beside the batch queue: they finish with its output
        self._step_jobs: deque[list[int]] = deque()
        gpu = getattr(step_time, "gpu", None)
        self._host_gpu: Gpu | None = gpu if isinstance(gpu, Gpu) else None
        self._chunk_bytes = plan.pools[0].bytes_per_block
        self.host_transfer_seconds = 0.0
        #: ``defer_block_free``: async scheduling (two batches in flight) with a loading connector
        self._defer_block_free = profile.async_scheduling
        self._sched_step_seq = self._processed_step_seq = 0
        self._last_sched_seq = [0] * len(self.requests)
        #: ``deferred_frees``: (fence, each group's blocks) in the order they were deferred
        self._deferred_frees: deque[tuple[int, list[list[KVCacheBlock | None]]]] = deque()

    def _waits_on_transfers(self) -> bool:
        """Whether the engine keeps stepping with nothing to run (``Scheduler.has_requests``):
        requests hold KV blocks while they wait (a load in flight or received), finished
        requests are not yet reported to the connector (``has_finished_requests``), or transfer
        jobs are in flight (``has_pending_push_work``). Such a step schedules nothing, yet the
        connector learns of the finished requests in it (their last stores, their recency)."""
        return bool(self._kv_holding or self._finished_since or self.connector.jobs)

    # -- Scheduler.schedule --------------------------------------------------------------------

    def schedule(self, step: int) -> tuple[dict[int, int], set[int]]:
        """``Scheduler.schedule`` with the connector: the running requests, then (unless this
        step preempted) both waiting queues, then ``build_connector_meta``."""
        eligible = len(self._running) + len(self._waiting) + len(self._kv_holding)
        threshold = self.profile.long_prefill_token_threshold if eligible > 1 else 0
        scheduled: dict[int, int] = {}
        sampled: set[int] = set()
        budget, preempted = self._schedule_running(threshold, scheduled, sampled)
        if not preempted:
            self._schedule_waiting(step, budget, threshold, scheduled, sampled)
        tables = self.kv_cache_manager.managers[0].req_to_blocks
        finished = self._finished_since
        if self._finished_order is not None and len(finished) > 1:
            finished = self._finished_order(finished)
        jobs = self.connector.build_connector_meta(
            {r: self.reqs[r].num_computed_tokens for r in scheduled},
            finished,
            self.reqs,
            {r: len(tables[r]) for r in scheduled},
        )
        self._finished_since = []
        self._step_jobs.append(jobs)
        if self._defer_block_free and any(scheduled.values()):
            self._sched_step_seq += 1
            for r in scheduled:
                self._last_sched_seq[r] = self._sched_step_seq
        return scheduled, sampled

    def _schedule_waiting(
        self, step: int, budget: int, threshold: int, scheduled: dict[int, int], sampled: set[int]
    ) -> None:
        """``schedule``'s second part with the connector (see the module docstring)."""
        manager, connector = self.kv_cache_manager, self.connector
        running = self._running
        skipped_holding: list[int] = []
        skipped_waiting: list[int] = []
        while budget > 0:
            queue = self._kv_holding or self._waiting
            if not queue or len(running) >= self.profile.max_num_seqs:
                break
            req = self.reqs[queue[0]]
            if req.index in self._loading:  # _handle_blocked_waiting_request
                if req.index not in self._received:
                    skipped_holding.append(queue.popleft())
                    continue
                self._update_waiting_for_remote_kv(req)
            if req.num_stale_output_tokens:
                (skipped_holding if req.num_computed_tokens else skipped_waiting).append(queue.popleft())
                continue
            hit_blocks: list[Blocks] | None = None
            external = 0
            if req.num_computed_tokens == 0:
                local, hit_blocks = manager.get_computed_blocks(req)
                matched = connector.get_num_new_matched_tokens(req, local)
                if matched is None:
                    skipped_waiting.append(queue.popleft())
                    continue
                external = matched
                computed = local + external
            else:
                local = 0
                computed = req.num_computed_tokens
            if external:
                if not self._allocate_for_load(req, local, hit_blocks, external):
                    break
                connector.update_state_after_alloc(req, external)
                self._loading.add(req.index)
                self._local_hit[req.index] = local
                req.num_computed_tokens = computed
                self._inflight_prefills.add(req.index)
                skipped_holding.append(queue.popleft())
                continue
            new = req.num_tokens - computed
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget)
            if not manager.allocate_slots(
                req,
                new,
                num_new_computed_tokens=local,
                new_computed_blocks=hit_blocks,
                full_sequence_must_fit=self.profile.reserve_full_isl,
            ):
                break
            queue.popleft()
            running.append(req.index)
            self.cached_tokens += computed
            self.looked_up_tokens += req.num_tokens
            if req.index in self._local_hit:
                self.offload.host_hit_tokens += computed - self._local_hit.pop(req.index)
            req.status = RequestStatus.RUNNING
            if self._first[req.index] < 0:
                self._first[req.index] = step
            req.num_computed_tokens = computed
            if computed + new < req.num_tokens:
                self._inflight_prefills.add(req.index)
            scheduled[req.index] = new
            budget -= new
            self._update_after_schedule(req, new, sampled)
        self._kv_holding.extendleft(reversed(skipped_holding))
        self._waiting.extendleft(reversed(skipped_waiting))

    def _allocate_for_load(
        self, req: RequestState, local: int, hit_blocks: list[Blocks] | None, external: int
    ) -> bool:
        """``KVCacheManager.allocate_slots`` for an asynchronous load: blocks for the local hit
        and the ``external`` tokens (nothing to compute yet, nothing cached until the load
        ends: ``delay_cache_blocks``), granted only when the whole sequence fits (with
        ``scheduler_reserve_full_isl``) and the blocks fit in the free ones less those the
        prefills in flight still need (``reserved_blocks``)."""
        manager = self.kv_cache_manager
        r = req.index
        if r not in manager.managers[0].req_to_blocks:
            for group in manager.managers:
                group.req_to_blocks[r] = []
        hits = hit_blocks or [[] for _ in manager.managers]
        total = min(local + external, self.max_model_len)
        if self.profile.reserve_full_isl:
            whole = min(req.num_tokens, self.max_model_len)
            if not manager._fits(r, whole, hits, total, manager.prefill_end(req), apply_admission_cap=True):
                return False
        reserved = sum(self._request_remaining_blocks(self.reqs[x]) for x in self._inflight_prefills)
        need = sum(
            group.get_num_blocks_to_allocate(
                r, total, blocks, total, apply_admission_cap=False, prefill_end=manager.prefill_end(req)
            )
            for group, blocks in zip(manager.managers, hits, strict=True)
        )
        if need > manager.block_pools[0].get_num_free_blocks() - reserved:
            return False
        if local:
            for group, blocks in zip(manager.managers, hits, strict=True):
                group.add_local_computed_blocks(r, blocks)
        for group in manager.managers:
            group.allocate_new_blocks(r, total)
        return True

    def _request_remaining_blocks(self, req: RequestState) -> int:
        """``Scheduler._request_remaining_blocks``: the blocks ``req`` still needs to hold its
        whole known sequence."""
        whole = min(req.num_tokens, self.max_model_len)
        return sum(
            group.get_num_blocks_to_allocate(
                req.index,
                whole,
                [],
                req.num_computed_tokens,
                apply_admission_cap=True,
                prefill_end=self.kv_cache_manager.prefill_end(req),
            )
            for group in self.kv_cache_manager.managers
        )

    def _update_waiting_for_remote_kv(self, req: RequestState) -> None:
        """``_update_waiting_for_remote_kv``: the loaded blocks are cached; a hit of every known
        token gives the last one back to be computed (its logits)."""
        self.kv_cache_manager.cache_blocks(req, req.num_computed_tokens)
        if req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens = req.num_tokens - 1
        self._received.discard(req.index)
        self._loading.discard(req.index)

    def _update_after_schedule(self, req: RequestState, new: int, sampled: set[int]) -> None:
        """``_update_after_schedule``: and a request past its prefill leaves the prefills in
        flight."""
        if req.num_computed_tokens + new >= req.num_tokens + req.num_output_placeholders:
            self._inflight_prefills.discard(req.index)
        super()._update_after_schedule(req, new, sampled)

    def _request_blocks_can_be_freed(self, r: int) -> bool:
        """``_request_blocks_can_be_freed``: no step still in flight was scheduled with ``r``."""
        return not self._defer_block_free or self._last_sched_seq[r] <= self._processed_step_seq

    def _free_request_blocks(self, r: int) -> None:
        """``_free_request_blocks``: the blocks go back now, or once the steps in flight are
        processed (``pop_blocks_for_free``, freed tail first)."""
        if self._request_blocks_can_be_freed(r):
            super()._free_request_blocks(r)
            return
        blocks = []
        for group in self.kv_cache_manager.managers:
            blocks.append(group.req_to_blocks.pop(r, []))
            group.num_cached_block.pop(r, None)
        self._deferred_frees.append((self._sched_step_seq, blocks))

    def _drain_deferred_frees(self) -> None:
        """``_drain_deferred_frees``: the deferred blocks whose fence step is processed, in order."""
        while self._deferred_frees and self._deferred_frees[0][0] <= self._processed_step_seq:
            _, blocks = self._deferred_frees.popleft()
            for group, held in zip(self.kv_cache_manager.managers, blocks, strict=True):
                group.block_pool.free_blocks(reversed(held))

    def _preempt_request(self, r: int) -> None:
        """``_preempt_request``: and the request leaves the prefills in flight."""
        self._inflight_prefills.discard(r)
        super()._preempt_request(r)

    # -- Scheduler.update_from_output ----------------------------------------------------------

    def update_from_output(self, scheduled: dict[int, int], sampled: set[int], step: int) -> None:
        """``update_from_output``: the step's tokens, then its transfers
        (``_update_from_kv_xfer_finished``): stores become readable, loads received."""
        if self._defer_block_free and any(scheduled.values()):
            self._processed_step_seq += 1
            self._drain_deferred_frees()
        was_finished = {r for r in scheduled if self.reqs[r].status is RequestStatus.FINISHED}
        super().update_from_output(scheduled, sampled, step)
        for r in scheduled:
            if r not in was_finished and self.reqs[r].status is RequestStatus.FINISHED:
                self._inflight_prefills.discard(r)
                self._finished_since.append(r)
        jobs = self._step_jobs.popleft() if self._step_jobs else []
        for r in self.connector.update_connector_output(jobs):
            self._received.add(r)

    # -- figures -------------------------------------------------------------------------------

    def _advance_clock(self, step: int, record: StepRecord, extra: float = 0.0) -> None:
        """The step's seconds, and the host link's for the chunks moved since the last step
        that computed."""
        stats = self.offload
        if self._host_gpu is not None and (stats.unpriced_out or stats.unpriced_back):
            moving = host_transfer(
                self._host_gpu,
                stats.unpriced_out * self._chunk_bytes,
                stats.unpriced_back * self._chunk_bytes,
            ).seconds
            self.host_transfer_seconds += moving
            extra += moving
        stats.unpriced_out = stats.unpriced_back = 0
        super()._advance_clock(step, record, extra)

    def result(self) -> SimulationResult:
        """The figures so far, with what the CPU tier kept and gave back."""
        stats = self.offload
        per_block = self._chunk_bytes
        tier = HostTierStats(
            enabled=True,
            host_blocks=host_chunks(self.plan),
            held_blocks=self.connector.held_chunks(),
            device_hit_tokens=self.cached_tokens - stats.host_hit_tokens,
            host_hits=stats.loads,
            host_hit_tokens=stats.host_hit_tokens,
            offloaded_blocks=stats.stored_chunks,
            offloaded_bytes=stats.stored_chunks * per_block,
            restored_blocks=stats.loaded_chunks,
            restored_bytes=stats.loaded_chunks * per_block,
            host_evictions=stats.evicted_chunks,
        )
        return attrs.evolve(
            super().result(), host_tier=tier, host_transfer_seconds=self.host_transfer_seconds
        )
