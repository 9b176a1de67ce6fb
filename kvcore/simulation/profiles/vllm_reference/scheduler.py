"""vLLM 0.33's scheduler step, plainly (``vllm/v1/core/sched/scheduler.py``, ``Scheduler``; with
async scheduling ``sched/async_scheduler.py``, ``AsyncScheduler``, and the engine's batch
queue, ``vllm/v1/engine/core.py``, ``EngineCore.step_with_batch_queue``), over the manager of
:mod:`~kvcore.simulation.profiles.vllm_reference.kv_cache_manager`.

Each step (:meth:`VllmReferenceScheduler.step`) the engine calls ``schedule``, runs the model
(here a fake runner: every scheduled request whose chunk reaches the end of its known tokens
samples one token) and hands the output back through ``update_from_output``: at once, or with
async scheduling after the next step was scheduled. The fake runner's bookkeeping is done as
vLLM's ``_update_after_schedule`` does it, right after the step is scheduled.

What the step leaves out of vLLM's: speculative decoding, KV connectors, encoder inputs, the
priority policy, structured output, LoRA and pipeline parallelism. Two things are the clock's,
not vLLM's: with nothing running, waiting or arriving, the idle steps up to the next arrival
pass in one go (they schedule nothing and free nothing), and a request that cannot fit even
with the pool to itself is an error, not an endless run.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from kvcore.errors import InvalidInputError
from kvcore.simulation.profiles.vllm_groups import (
    checkpoint_position,
    checkpoint_valid,
    chunks_off_scheduler_block,
    scheduler_checkpoint_alignment,
    usable_text,
    warn_unhit_chunks,
)
from kvcore.simulation.profiles.vllm_reference.kv_cache_manager import KVCacheManager
from kvcore.simulation.profiles.vllm_reference.mamba_manager import MambaManager, find_mamba_hit
from kvcore.simulation.profiles.vllm_reference.request import RequestState, RequestStatus
from kvcore.simulation.stepper import StepperState, check_lengths, step_budget
from kvcore.simulation.steps import StepRecord, StepTimeModel

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.workload import Workload

#: One step's output: tokens scheduled per request, the requests that sampled, and the step.
StepOutput = tuple[dict[int, int], set[int], int]


class VllmSettings(Protocol):
    """vLLM's scheduler settings, as :class:`~kvcore.simulation.profiles.vllm.VllmProfile` holds
    them (not imported here: that module imports this one)."""

    @property
    def name(self) -> str: ...
    @property
    def async_scheduling(self) -> bool: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def reserve_full_isl(self) -> bool: ...
    @property
    def long_prefill_token_threshold(self) -> int: ...
    @property
    def prefix_cache_retention_interval(self) -> int | None: ...

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The settings as ``(vLLM's name, value)`` pairs."""
        ...


class VllmReferenceScheduler(StepperState):
    """vLLM's scheduler and KV-cache manager over a kvcore plan, one :meth:`step` at a time,
    with no speed path: every running request is visited at every step, every table change
    goes through the manager, every full block is hashed when computed.

    It gives every figure of :class:`~kvcore.simulation.profiles.vllm.VllmSimulator` (the
    ``vllm`` profile's fast path); ``tests/simulation/test_vllm_reference.py`` holds the two
    equal. Its arguments and errors are the fast path's.
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
    ) -> None:
        self.budget = step_budget(plan, max_num_batched_tokens)
        self.plan = plan
        self.profile = profile
        self.requests = workload.requests
        self.max_model_len = plan.context.max_model_len
        check_lengths(plan, self.requests)
        self.caching = prefix_caching
        #: steps before a step's output comes back (async scheduling: one)
        self.lag = 1 if profile.async_scheduling else 0
        unhit = chunks_off_scheduler_block(plan)
        if prefix_caching and unhit:
            warn_unhit_chunks(plan, unhit[0])
        self.kv_cache_manager = KVCacheManager(
            plan,
            max_model_len=self.max_model_len,
            max_in_flight_tokens=(self.lag + 1) * self.budget,  # vLLM's VllmConfig.max_in_flight_tokens
            enable_caching=prefix_caching,
            state_manager=(MambaManager, find_mamba_hit),
            retention_interval=profile.prefix_cache_retention_interval,
        )
        #: the prefill checkpoint alignment the scheduler cuts chunks by (0: no checkpoint)
        self._checkpoint_alignment = scheduler_checkpoint_alignment(plan)
        self._start(workload, step_time, profile.name)
        self.reqs = [RequestState(index, request) for index, request in enumerate(self.requests)]
        self._waiting: deque[int] = deque()
        self._running: list[int] = []
        self._first = [-1] * len(self.requests)
        self._next_arrival = 0
        #: the steps scheduled whose output is not back yet, oldest first (the batch queue)
        self._batch_queue: deque[StepOutput] = deque()
        #: request -> (its computed tokens, requests finished) when it last failed to grow alone
        self._failed_alone: dict[int, tuple[int, int]] = {}

    # -- the engine ----------------------------------------------------------------------------

    def step(self) -> None:
        """One engine step: the arrivals join the queue, ``schedule``, the fake model runner,
        then ``update_from_output`` of the step ``lag`` steps ago.

        Raises:
            InvalidInputError: the first waiting request can never be admitted: nothing runs or
                is in flight and it still does not fit.
        """
        if self.done:
            return
        step = self.steps
        arrival = self._arrival
        now = self.clock if self._in_seconds else step
        upcoming = self._next_arrival
        if (
            not self._running
            and not self._waiting
            and not self._waits_on_transfers()
            and arrival[upcoming] > now
        ):
            self._idle_until(upcoming, step)
            return
        while upcoming < len(arrival) and arrival[upcoming] <= now:
            if self._in_seconds:
                self._queued[upcoming] = step
            self._waiting.append(upcoming)
            upcoming += 1
        self._next_arrival = upcoming
        scheduled, sampled = self.schedule(step)
        tokens = sum(scheduled.values())
        in_flight = any(output[0] for output in self._batch_queue) or self._waits_on_transfers()
        if not tokens and not self._running and not in_flight and self._waiting:
            stuck = self.requests[self._waiting[0]]
            raise InvalidInputError(
                f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                f"cannot be admitted even with the pool to itself ({usable_text(self.plan)} block ids): "
                "plan more blocks, or give a smaller max_num_batched_tokens"
            )
        self.total_tokens += tokens
        self._running_series.append(len(self._running))
        self._usage_series.append(self.kv_cache_manager.usage())
        if self._step_time is not None:
            self._time_step(step, scheduled)
            for r in sampled:
                if self._token_step[r] < 0:
                    self._token_step[r] = step
        self._batch_queue.append((scheduled, sampled, step))
        while len(self._batch_queue) > self.lag:
            self.update_from_output(*self._batch_queue.popleft())
        self.steps = step + 1
        if self.finished == len(self.requests):
            self._batch_queue.clear()  # the last (empty) steps in flight

    def _waits_on_transfers(self) -> bool:
        """Whether a request waits on a KV connector's transfer (none here: the CPU tier's
        scheduler, :mod:`~kvcore.simulation.profiles.vllm_reference.offloading_scheduler`, says
        when one does); such a step is neither idle nor stuck."""
        return False

    def _idle_until(self, upcoming: int, step: int) -> None:
        """Nothing runs or waits before request ``upcoming`` arrives: the outputs in flight (of
        finished requests) come back, and the steps up to its arrival pass with nothing to
        run (in seconds: the clock jumps to it and no step is counted)."""
        while self._batch_queue:
            self.update_from_output(*self._batch_queue.popleft())
        if self._in_seconds:
            self.clock = self._arrival[upcoming]
            return
        gap = int(self._arrival[upcoming]) - step
        self._running_series.extend_repeat(0, gap)
        self._usage_series.extend_repeat(0.0, gap)
        if self._step_time is not None:  # an idle step runs nothing and takes no time
            self._step_end.extend([self.clock] * gap)
        self.steps += gap

    # -- Scheduler.schedule --------------------------------------------------------------------

    def schedule(self, step: int) -> tuple[dict[int, int], set[int]]:
        """``Scheduler.schedule``: the tokens each request computes in this step, and the
        requests that sample a token in it.

        First the running requests in admission order, each asking for what it lacks, cut to
        ``long_prefill_token_threshold`` (when more than one request is eligible), to the
        budget left and to ``max_model_len``; when its blocks do not fit, the latest admitted
        running request is preempted until they do or it was itself. Then, unless this step
        preempted, the waiting queue first come first served while the budget lasts and fewer
        than ``max_num_seqs`` run, each taking its prefix hit and admitted only when
        ``allocate_slots`` grants it (its whole known sequence first, with
        ``scheduler_reserve_full_isl``). ``_update_after_schedule`` follows each request."""
        self.kv_cache_manager.new_step_starts()
        eligible = len(self._running) + len(self._waiting)
        threshold = self.profile.long_prefill_token_threshold if eligible > 1 else 0
        scheduled: dict[int, int] = {}
        sampled: set[int] = set()
        budget, preempted = self._schedule_running(threshold, scheduled, sampled)
        if not preempted:
            self._schedule_waiting(step, budget, threshold, scheduled, sampled)
        return scheduled, sampled

    def _schedule_running(
        self, threshold: int, scheduled: dict[int, int], sampled: set[int]
    ) -> tuple[int, bool]:
        """``schedule``'s first part: the running requests; returns the budget left and whether
        a request was preempted."""
        manager, running = self.kv_cache_manager, self._running
        budget = self.budget
        preempted = False
        index = 0
        while index < len(running) and budget > 0:
            req = self.reqs[running[index]]
            index += 1
            # async: the request's last token is in flight, nothing is left to compute
            if (
                req.num_output_placeholders
                and req.num_computed_tokens + 2 - req.num_output_placeholders >= req.num_total_tokens
            ):
                continue
            new = req.num_tokens + req.num_output_placeholders - req.num_computed_tokens
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget, self.max_model_len - 1 - req.num_computed_tokens)
            if self.kv_cache_manager.state_block:
                new = self._mamba_block_aligned_split(req, new)
            if new <= 0:
                continue
            granted = True
            while not manager.allocate_slots(req, new):
                if not self._request_blocks_can_be_freed(running[-1]):
                    granted = False  # a deferred free would not help this allocation
                    break
                victim = running.pop()
                if victim == req.index and not running:
                    self._check_alone(req.index)
                self._preempt_request(victim)
                preempted = True
                if victim == req.index:
                    granted = False
                    break
            if not granted:
                break
            scheduled[req.index] = new
            budget -= new
            self._update_after_schedule(req, new, sampled)
        return budget, preempted

    def _schedule_waiting(
        self, step: int, budget: int, threshold: int, scheduled: dict[int, int], sampled: set[int]
    ) -> None:
        """``schedule``'s second part: the waiting queue, first come first served."""
        profile, manager = self.profile, self.kv_cache_manager
        running, waiting = self._running, self._waiting
        skipped: list[int] = []  # waiting requests whose stale output is not back yet
        while budget > 0 and waiting and len(running) < profile.max_num_seqs:
            req = self.reqs[waiting[0]]
            if req.num_stale_output_tokens:
                skipped.append(waiting.popleft())
                continue
            hit, hit_blocks = manager.get_computed_blocks(req)
            new = req.num_tokens - hit
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget)
            if manager.state_block:
                new = self._mamba_block_aligned_split(req, new, hit)
                if not new:
                    break
            if not manager.allocate_slots(
                req,
                new,
                num_new_computed_tokens=hit,
                new_computed_blocks=hit_blocks,
                full_sequence_must_fit=profile.reserve_full_isl,
            ):
                break
            waiting.popleft()
            running.append(req.index)
            self.cached_tokens += hit
            self.looked_up_tokens += req.num_tokens
            req.status = RequestStatus.RUNNING
            if self._first[req.index] < 0:
                self._first[req.index] = step
            req.num_computed_tokens += hit
            scheduled[req.index] = new
            budget -= new
            self._update_after_schedule(req, new, sampled)
        waiting.extendleft(reversed(skipped))

    def _mamba_block_aligned_split(self, req: RequestState, new: int, hit: int = 0) -> int:
        """``Scheduler._mamba_block_aligned_split``: with state groups in align mode, a prefill
        chunk is cut so that it ends where a state is kept: on a block boundary (unless it ends
        the prefill; a block larger than the chunk budget is crossed in several chunks), never
        past the last block boundary before the request's last known token (unless the chunk
        ends the prefill and its state groups export that boundary's state from inside the
        step: prefill checkpoint blocks, see :mod:`.mamba_manager`), and at the shared prefix a
        lookup found beyond the hit (``shared_prefix_boundary``, floored to a block). Returns
        the tokens left (0: none fit in the budget on a boundary)."""
        start = req.num_computed_tokens + hit
        prefill_end = max(req.request.prompt_tokens, req.num_tokens - 1)
        if start >= prefill_end:
            return new
        block = self.kv_cache_manager.state_block
        # the last boundary whose state can be cached: a hit stops one token short of the end
        last_cache_position = checkpoint_position(req.num_tokens, block)
        end = start + new
        if end >= prefill_end and checkpoint_valid(
            start, end, checkpoint_position(prefill_end, block), block, self._checkpoint_alignment
        ):
            last_cache_position = 0  # the state groups export it from inside the step
        if end < prefill_end:
            most = self.budget
            if self.profile.long_prefill_token_threshold > 0:
                most = min(most, self.profile.long_prefill_token_threshold)
            aligned = end // block * block
            if aligned > start or block <= most:
                end = aligned
        junction = req.shared_prefix_boundary
        stops = (
            (start // block + 1) * block if start % block else 0,  # a chunk begun mid-block
            last_cache_position,
            start + (junction - start) // block * block if start < junction < end else 0,
        )
        end = min((stop for stop in stops if start < stop < end), default=end)
        return max(end - start, 0)

    def _update_after_schedule(self, req: RequestState, new: int, sampled: set[int]) -> None:
        """``Scheduler._update_after_schedule`` (and ``AsyncScheduler``'s): the ``new`` tokens
        count as computed and in flight; a chunk that reaches the end of the known tokens
        samples a token, which async scheduling holds as a placeholder until it is back."""
        req.num_computed_tokens += new
        req.num_in_flight_tokens += new
        if req.num_computed_tokens >= req.num_tokens + req.num_output_placeholders:
            sampled.add(req.index)
            req.num_output_placeholders += self.lag

    def _preempt_request(self, r: int) -> None:
        """``Scheduler._preempt_request``: free the request's blocks, count its computed tokens
        as to be computed again, and put it back at the head of the waiting queue; what it has in
        flight is stale (it waits until that is back)."""
        req = self.reqs[r]
        self._free_request_blocks(r)
        self.recomputed_tokens += req.num_computed_tokens
        self.preemptions += 1
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_stale_output_tokens = req.num_in_flight_tokens
        req.num_output_placeholders = 0
        self._waiting.appendleft(r)

    def _request_blocks_can_be_freed(self, r: int) -> bool:
        """``Scheduler._request_blocks_can_be_freed``: whether request ``r``'s blocks go back to
        the pool at once when it is freed (always here; with a KV connector and async
        scheduling vLLM defers them, see
        :mod:`~kvcore.simulation.profiles.vllm_reference.offloading_scheduler`)."""
        return True

    def _free_request_blocks(self, r: int) -> None:
        """``Scheduler._free_request_blocks``: request ``r``'s blocks go back to the pool."""
        self.kv_cache_manager.free(r)

    def _check_alone(self, r: int) -> None:
        """Stop a run that would never end: request ``r``, running alone, failed to grow where it
        failed alone before and no request finished in between (the admission gate off, it
        would be admitted and preempted at that same point without end).

        Raises:
            InvalidInputError: ``r`` failed alone at the same point twice.
        """
        point = (self.reqs[r].num_computed_tokens, self.finished)
        if self._failed_alone.get(r) == point:
            stuck = self.requests[r]
            raise InvalidInputError(
                f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                f"cannot grow past {point[0]:,} computed tokens even with the pool to itself "
                f"({usable_text(self.plan)} block ids), so it would be admitted and preempted without end: "
                "plan more blocks, give a smaller max_num_batched_tokens, or keep reserve_full_isl on "
                "(vLLM's default: a request waits until its whole prompt fits)"
            )
        self._failed_alone[r] = point

    # -- Scheduler.update_from_output ----------------------------------------------------------

    def update_from_output(self, scheduled: dict[int, int], sampled: set[int], step: int) -> None:
        """``Scheduler.update_from_output``: step ``step``'s tokens come back. A request that
        sampled knows one token more (``_update_request_with_output``), finishes once it knows
        them all, and is freed; async, a running request's new full blocks are cached. The
        output of a preempted request's step is stale: dropped."""
        finished: list[int] = []
        for r, n in scheduled.items():
            req = self.reqs[r]
            req.num_in_flight_tokens -= n
            stale = req.num_stale_output_tokens > 0
            if stale:
                req.num_stale_output_tokens -= n
            if r not in sampled or req.status is RequestStatus.FINISHED:
                continue
            req.num_tokens += 1
            if req.num_output_placeholders and not stale:
                # async: the token was a placeholder; a running request caches the full blocks
                # of what it has processed, finishing or not (a finishing one's blocks are then
                # freed as cached: to the back of the free queue)
                req.num_output_placeholders -= 1
                if req.status is RequestStatus.RUNNING:
                    processed = req.num_computed_tokens - req.num_in_flight_tokens
                    self.kv_cache_manager.cache_blocks(req, processed)
            if req.num_tokens >= req.num_total_tokens:
                finished.append(r)
                if self._step_time is not None:
                    self._finish_step[r] = step
        for r in finished:
            req = self.reqs[r]
            if req.status is RequestStatus.RUNNING:
                self._free_request_blocks(r)
                self._running.remove(r)
            else:
                self._waiting.remove(r)
            req.status = RequestStatus.FINISHED
        self.finished += len(finished)

    # -- figures -------------------------------------------------------------------------------

    def _time_step(self, step: int, scheduled: dict[int, int]) -> None:
        """Describe the step as a :class:`~kvcore.simulation.steps.StepRecord` and advance the
        clock by the step-time model's seconds (a step with nothing scheduled takes none)."""
        if not scheduled:
            self._step_end.append(self.clock)
            return
        decodes = prefills = prefill = context = pairs = 0
        for r, n in scheduled.items():
            before = self.reqs[r].num_computed_tokens - n
            context += before + n
            if n == 1:
                decodes += 1
                pairs += before + 1
            else:
                prefills += 1
                prefill += n
                pairs += n * before + n * (n + 1) // 2  # each new token attends to itself and all before
        self._advance_clock(step, StepRecord(prefill, decodes, decodes + prefills, context, pairs))

    def settings(self) -> tuple[tuple[str, Any], ...]:
        """The profile's settings (reported with the result)."""
        return self.profile.settings()
