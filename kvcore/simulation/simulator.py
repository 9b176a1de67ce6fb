"""Replay a workload through a plan's block pool, with the ``kvcore`` scheduler profile's rules
(:func:`simulate` takes any registered profile: :mod:`kvcore.simulation.profile`; the default,
``vllm``, is :mod:`kvcore.simulation.profiles.vllm`).

The ``kvcore`` rules, like vLLM's (v1) scheduler without its admission gate: each step
schedules up to ``max_num_batched_tokens`` tokens:

1. the running requests, in the order they were admitted: a decoding request computes one
   token, a request still in its prompt (chunked prefill) computes the rest of it, as much as the
   budget left allows. Before computing, a request's block tables grow to cover its new tokens
   (:meth:`~kvcore.runtime.block_pool.BlockPool.reserve`); when the pool is out of pages, the
   most recently admitted running request is preempted (all its pages freed, back to the head
   of the queue, to recompute its prompt and the tokens it had generated) until the page is
   found or the request itself was preempted;
2. then, unless a request was preempted in this step, the waiting requests that have arrived,
   first come first served, while the budget lasts and the pool holds their first chunk.

After the step every scheduled request has its tokens cached; one that has computed all its
known tokens samples the next one, and one that has its ``output_tokens`` finishes and frees its
pages; the others free the pages that fell out of a sliding window or chunk
(:meth:`~kvcore.runtime.block_pool.BlockPool.release_stale`). A request computes its prompt and
all but its last output token; a preempted request computes what it had again (counted in
``total_tokens`` and, separately, in ``recomputed_tokens``).

A plan of several block pools (:attr:`~kvcore.KVCachePlan.pools`) runs the same way: a request
is admitted, and grows, only when every pool its groups draw from has room (the pool takes its
pages in all of them or in none), and the pool usage reported is that of the fullest pool at
each step (the pool that decides admission).

There is no cap on running requests (vLLM's ``max_num_seqs``): the pool and the token budget
bound them.

With ``prefix_caching``, the pool caches full blocks
(:meth:`~kvcore.runtime.block_pool.BlockPool.attach_prefix`): a request admitted (or admitted
again after a preemption) starts from the tokens of its ``prefix_id``'s first
``prefix_tokens`` that every group has cached, and computes only the rest.
Only shared prefixes are cached (a request's own tokens, and what a preempted request
generated, are computed again). On a hybrid, a hit is the longest prefix every group serves:
full attention its blocks from the start, a sliding window the blocks of its last window, a
state group (cache mode ``align`` or ``all``) a checkpoint after exactly that many tokens. In
``align`` the pool keeps the state of a block boundary only where a step ends on it, so a
prefill chunk that would cross the last boundary of its shared prefix (the prefix rounded down
to the pool's :attr:`~kvcore.runtime.block_pool.BlockPool.hit_step`) stops there, and the rest
follows in the next step (vLLM's ``Scheduler._mamba_block_aligned_split`` cuts a chunk at the
last block boundary it can cache; vllm/v1/core/sched/scheduler.py). The result counts what each
group kind's pages served (:attr:`SimulationResult.prefix_hits_by_kind`).

A plan with a host tier (:attr:`~kvcore.KVCachePlan.offload_tier`, e.g.
:func:`~kvcore.planning.offload.with_host_memory`) keeps the cached blocks the device evicts in
host memory and brings them back on a hit (:mod:`kvcore.runtime.host_cache`); the result counts
hits per tier and the bytes moved each way (:attr:`SimulationResult.host_tier`). With a
step-time model on a GPU (the roofline's ``gpu``), each step also takes the seconds its moves
take over the GPU's host link at its published bandwidth
(:func:`~kvcore.simulation.gpus.host_transfer`), after its compute (no overlap): an estimate,
like the roofline it is added to. The ``vllm`` profile simulates a host tier as vLLM's CPU
offloading, the ``sglang`` one as SGLang's HiCache.

With a step-time model (``step_time``, :mod:`kvcore.simulation.timing`), each step is described
by a :class:`~kvcore.simulation.steps.StepRecord` (prefill tokens, decodes, requests, context
read, query-key pairs) and the model's seconds advance a clock; requests may then arrive in
seconds (``arrival_time``), and the result carries a :class:`~kvcore.simulation.steps.Timeline`
(each request's arrival, first token and finish in seconds). The step figures are the same with
or without it.

Speed: the pool is called only when a request's tables change. For kinds whose pages follow
the default :meth:`~kvcore.KVCacheSpec.live_pages` (every built-in kind), the token counts at
which a table grows or frees a page depend on the count alone, so they are computed once per
simulation; other kinds are asked at every step.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from kvcore.errors import BlockPoolExhaustedError, InvalidInputError
from kvcore.peaks import pool_peaks
from kvcore.plan import KVCachePlan
from kvcore.runtime.block_pool import BlockPool
from kvcore.runtime.host_cache import HostCache
from kvcore.runtime.prefix_cache import PrefixKey, checkpoint_mode
from kvcore.simulation.gpus import Gpu, host_transfer
from kvcore.simulation.profile import DEFAULT_SCHEDULER, SchedulerProfile, resolve_profile
from kvcore.simulation.result import SimulationResult as SimulationResult, percentile as percentile
from kvcore.simulation.stepper import StepperState, check_lengths, step_budget
from kvcore.simulation.steps import StepRecord, StepTimeModel
from kvcore.simulation.workload import Request, Workload
from kvcore.spec import KVCacheSpec, SizingContext

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry


def simulate(
    plan: KVCachePlan,
    workload: Workload,
    *,
    max_num_batched_tokens: int | None = None,
    on_step: Callable[[int, int], None] | None = None,
    prefix_caching: bool = False,
    step_time: StepTimeModel | None = None,
    scheduler: str | SchedulerProfile = DEFAULT_SCHEDULER,
    registry: Registry | None = None,
) -> SimulationResult:
    """Replay ``workload`` through ``plan``'s block pool until every request has finished.

    Args:
        plan: the plan (its ``num_blocks`` and groups make the pool).
        workload: the requests.
        max_num_batched_tokens: tokens one step may schedule (default:
            ``plan.context.max_num_batched_tokens``).
        on_step: called after every step (after an idle stretch, once) with the steps done and
            the requests finished so far, e.g. to draw a progress bar.
        prefix_caching: cache blocks for reuse as the scheduler does (``kvcore``: the requests'
            shared prefixes, ``prefix_id``; ``vllm``: every full block).
        scheduler: the scheduler profile (a registered name, or a profile object such as
            ``VllmProfile(async_scheduling=False)``); default ``vllm``.
        registry: where a profile name is looked up (default: the default registry).
        step_time: turns each step into seconds (:mod:`kvcore.simulation.timing`); the result
            then carries a :class:`~kvcore.simulation.steps.Timeline`. Needed when the
            requests arrive in seconds (``arrival_time``).

    Returns:
        The figures and the per-step series.

    Raises:
        InvalidInputError: a request is longer than ``plan.context.max_model_len``, or needs
            more block ids than the pool has even when it runs alone (the message names it), or
            ``max_num_batched_tokens`` is not an int from 1 to ``kvcore.limits.MAX_TOKENS``, or
            the requests arrive in seconds and no ``step_time`` is given.
        UnknownSchedulerError: no registered profile is named ``scheduler``.
    """
    profile = resolve_profile(scheduler, registry)
    tier_bytes = plan.offload_tier.nbytes if plan.offload_tier is not None else 0
    if tier_bytes and not getattr(profile, "simulates_host_tier", False):
        raise InvalidInputError(
            f"the plan has a host tier of {tier_bytes:,} bytes, but the scheduler profile "
            f"{profile.name!r} does not simulate one (it would be ignored): simulate it with the 'vllm' "
            "profile (vLLM's CPU offloading), the 'kvcore' one or the 'sglang' one (SGLang's HiCache), or "
            "without the tier"
        )
    if plan.offload_tier is not None and plan.offload_tier.nbytes and not prefix_caching:
        raise InvalidInputError(
            "the plan has a host tier, which keeps the cached blocks the device evicts: simulate it with "
            "prefix caching (prefix_caching=True), or without the tier"
        )
    timed: dict[str, StepTimeModel] = {}
    if step_time is not None:
        # ``step_time`` is optional in the protocol: a profile that does not time steps omits it
        if "step_time" not in inspect.signature(profile.simulator).parameters:
            raise InvalidInputError(
                f"the scheduler profile {profile.name!r} does not time its steps (its simulator() takes "
                "no step_time); simulate it without a step-time model, or with a profile that does "
                "('vllm', 'kvcore')"
            )
        timed["step_time"] = step_time
    simulator = profile.simulator(
        plan, workload, max_num_batched_tokens=max_num_batched_tokens, prefix_caching=prefix_caching, **timed
    )
    while not simulator.done:
        simulator.step()
        if on_step is not None:
            on_step(simulator.steps, simulator.finished)
    result: SimulationResult = simulator.result()
    return result


class Simulator(StepperState):
    """The scheduler and its pool, one :meth:`step` at a time (:func:`simulate` runs it to the end).

    Requests are known to the pool by their index in ``workload.requests``.

    Args:
        plan: the plan.
        workload: the requests.
        max_num_batched_tokens: tokens per step (default: the plan's).
        prefix_caching: cache shared prefixes (as :func:`simulate`).
        step_time: the step-time model (as :func:`simulate`). With it the simulator keeps a
            clock: step ``k`` starts when step ``k - 1`` ended; requests that arrive in seconds
            join the queue at the first step starting at or after their arrival, and when
            nothing runs or waits the clock jumps to the next arrival.

    Raises:
        InvalidInputError: as :func:`simulate`.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        workload: Workload,
        *,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = False,
        step_time: StepTimeModel | None = None,
    ) -> None:
        budget = step_budget(plan, max_num_batched_tokens)
        self.plan = plan
        self.workload = workload
        self.requests: tuple[Request, ...] = workload.requests
        self.budget: int = budget
        check_lengths(plan, self.requests)
        _check_fits_alone(plan, self.requests, budget)
        self.pool = BlockPool(plan, lowest_first=False, prefix_caching=prefix_caching)
        self.caching = self.pool.prefix_caching  # what the shared figures report
        #: with align checkpoints, per request the boundary a prefill chunk stops at, else None
        self._junctions: list[int] | None = None
        if self.caching and any(checkpoint_mode(g.spec) == "align" for g in plan.groups):
            unit = self.pool.hit_step
            self._junctions = [r.prefix_tokens // unit * unit for r in workload.requests]
        self._pools = len(plan.pools)
        #: each pool's host tier (with prefix caching and a plan that has one)
        caches = [pool.cache for pool in self.pool.pools if pool.cache is not None]
        self._hosts: list[HostCache] = [cache.host for cache in caches if cache.host is not None]
        gpu = getattr(step_time, "gpu", None)  # a roofline's GPU: its host link prices the moves
        self._host_gpu: Gpu | None = gpu if self._hosts and isinstance(gpu, Gpu) else None
        self.host_transfer_seconds = 0.0
        #: per request, what names its prompt's shared prefix (with prefix caching)
        self._prefixes: list[PrefixKey] | None = None
        if prefix_caching:
            self._prefixes = [
                PrefixKey(r.prefix_id if r.prefix_tokens else None, r.prefix_tokens) for r in self.requests
            ]
        count = len(self.requests)
        self._start(workload, step_time, "kvcore")
        self._computed = [0] * count  # tokens cached
        self._known = [r.prompt_tokens for r in self.requests]  # prompt + tokens generated so far
        self._end = [r.total_tokens - 1 for r in self.requests]  # tokens cached when the last is sampled
        self._first = [-1] * count
        self._next = 0  # the next request to arrive
        self._waiting: deque[int] = deque()
        self._running: list[int] = []
        longest = max((r.total_tokens for r in self.requests), default=1)
        tables = _event_tables(plan, longest)
        if tables is None:  # some kind's pages are not the default's: ask the pool every step
            tables = (bytearray(b"\x01") * (longest + 2), bytearray(b"\x01") * (longest + 2))
        self._grows, self._releases = tables
        if self.pool.prefix_caching:  # release_stale caches full blocks: call it at block ends
            self._releases = bytearray(self._releases)
            for group in plan.groups:
                per_page = group.spec.tokens_per_page or 1
                self._releases[per_page::per_page] = b"\x01" * len(range(per_page, longest + 2, per_page))

    def step(self) -> None:
        """Run one scheduler step, or skip an idle stretch up to the next arrival.

        Raises:
            InvalidInputError: a request can get no page even with the pool to itself (a
                recomputation chunk needs more than the pool has).
        """
        if self.done:
            return
        step = self.steps
        if not self._arrive(step):
            return  # an idle stretch skipped
        moved = self._host_bytes() if self._host_gpu is not None else (0, 0)
        finishing: list[int] = []  # requests that sample their last token in this step
        stale: list[int] = []  # requests whose new tokens free a page
        # with a step-time model, what the step computed: decodes and the context they read;
        # prefilling requests, their tokens, context and attention pairs
        counts = [0, 0, 0, 0, 0, 0]
        budget, preempted = self._schedule_running(step, finishing, stale, counts)
        if not preempted:
            budget = self._schedule_waiting(step, budget, finishing, stale, counts)
        tokens = self.budget - budget
        if tokens == 0:
            stuck = self.requests[self._waiting[0]]
            raise InvalidInputError(
                f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                f"cannot get its pages even with the pool to itself ({_usable(self.plan)} block ids): "
                "plan more blocks, or give a smaller max_num_batched_tokens"
            )
        self.total_tokens += tokens
        self._end_step(step, finishing, stale, counts, moved)

    def _arrive(self, step: int) -> bool:
        """Queue the requests that have arrived by now; with nothing to run, skip the idle stretch
        up to the next arrival instead and return ``False``."""
        arrival, waiting = self._arrival, self._waiting
        upcoming = self._next
        now = self.clock if self._in_seconds else step
        if not self._running and not waiting and arrival[upcoming] > now:
            if self._in_seconds:  # nothing to run: the clock jumps to the next arrival
                self.clock = arrival[upcoming]
                return False
            gap = int(arrival[upcoming]) - step
            self._running_series.extend_repeat(0, gap)
            self._usage_series.extend_repeat(0.0, gap)
            if self._step_time is not None:  # an idle step runs nothing and takes no time
                self._step_end.extend([self.clock] * gap)
            self.steps += gap
            return False
        count = len(arrival)
        while upcoming < count and arrival[upcoming] <= now:
            if self._in_seconds:
                self._queued[upcoming] = step
            waiting.append(upcoming)
            upcoming += 1
        self._next = upcoming
        return True

    def _schedule_running(
        self, step: int, finishing: list[int], stale: list[int], counts: list[int]
    ) -> tuple[int, bool]:
        """The running requests in order, each its next tokens within the budget, preempting the
        latest running request while a reservation fails; returns the budget left and whether a
        request was preempted."""
        running = self._running
        reserve = self.pool.reserve
        computed, known, end = self._computed, self._known, self._end
        grows, releases = self._grows, self._releases
        junctions, token_step = self._junctions, self._token_step
        timed = self._step_time is not None
        budget = self.budget
        preempted = False
        victim = -1
        decodes = decode_context = prefills = prefill = prefill_context = pairs = 0
        # ``for`` over a list the loop pops from the end: CPython's iterator stops at the new end
        for r in running:
            if not budget:
                break
            c = computed[r]
            ahead = known[r]
            new = ahead - c
            if new > budget:
                new = budget
            if junctions is not None and c < junctions[r] < c + new:  # end on the checkpoint
                new = junctions[r] - c
            c += new
            if new > 1 or grows[c]:
                while True:
                    try:
                        reserve(r, c)
                        break
                    except BlockPoolExhaustedError:
                        victim = running.pop()
                        self._preempt(victim)
                        preempted = True
                        if victim == r:
                            break
                if preempted and victim == r:
                    break
            computed[r] = c
            budget -= new
            if timed:
                if new == 1:
                    decodes += 1
                    decode_context += c
                else:
                    prefills += 1
                    prefill += new
                    prefill_context += c
                    pairs += new * c - new * (new - 1) // 2  # token i of the chunk attends to c - new + i
            if c == ahead:  # every known token is cached: the next one is sampled
                if timed and token_step[r] < 0:
                    token_step[r] = step
                if c == end[r]:
                    finishing.append(r)
                    continue
                known[r] = c + 1
            if new > 1 or releases[c]:
                stale.append(r)
        if timed:
            _add_counts(counts, decodes, decode_context, prefills, prefill, prefill_context, pairs)
        return budget, preempted

    def _schedule_waiting(
        self, step: int, budget: int, finishing: list[int], stale: list[int], counts: list[int]
    ) -> int:
        """The waiting queue first come first served while the budget lasts, each taking its
        prefix hit; returns the budget left."""
        waiting, running, pool = self._waiting, self._running, self.pool
        reserve = pool.reserve
        computed, known, end = self._computed, self._known, self._end
        junctions, token_step = self._junctions, self._token_step
        first, prefixes = self._first, self._prefixes
        timed = self._step_time is not None
        decodes = decode_context = prefills = prefill = prefill_context = pairs = 0
        while waiting and budget:
            r = waiting[0]
            hit = 0 if prefixes is None else pool.attach_prefix(r, prefixes[r], known[r])
            new = known[r] - hit
            if new > budget:
                new = budget
            if junctions is not None and hit < junctions[r] < hit + new:  # end on the checkpoint
                new = junctions[r] - hit
            try:
                reserve(r, hit + new)
            except BlockPoolExhaustedError:
                if prefixes is not None:
                    pool.free_request(r)  # attached: let go of its cached blocks
                break
            waiting.popleft()
            running.append(r)
            budget -= new
            if first[r] < 0:
                first[r] = step
            self.cached_tokens += hit
            if timed:
                if new == 1:
                    decodes += 1
                    decode_context += hit + 1
                else:
                    prefills += 1
                    prefill += new
                    prefill_context += hit + new
                    pairs += new * (hit + new) - new * (new - 1) // 2
            new += hit
            computed[r] = new
            if new == known[r]:
                if timed and token_step[r] < 0:
                    token_step[r] = step
                if new == end[r]:
                    finishing.append(r)
                    continue
                known[r] = new + 1
            stale.append(r)
        if timed:
            _add_counts(counts, decodes, decode_context, prefills, prefill, prefill_context, pairs)
        return budget

    def _end_step(
        self, step: int, finishing: list[int], stale: list[int], counts: list[int], moved: tuple[int, int]
    ) -> None:
        """The step's time (with a step-time model) and series; then free what fell out of
        windows and chunks, and the finished requests."""
        pool, computed, end, running = self.pool, self._computed, self._end, self._running
        if self._step_time is not None:
            decodes, decode_context, prefills, prefill, prefill_context, pairs = counts
            context = decode_context + prefill_context
            record = StepRecord(prefill, decodes, decodes + prefills, context, pairs + decode_context)
            moving = 0.0
            if self._host_gpu is not None:  # the step's moves to and from the host tier
                out, back = self._host_bytes()
                if out > moved[0] or back > moved[1]:
                    moving = host_transfer(self._host_gpu, out - moved[0], back - moved[1]).seconds
                    self.host_transfer_seconds += moving
            self._advance_clock(step, record, extra=moving)
            for r in finishing:
                self._finish_step[r] = step
        self._running_series.append(len(running))
        self._usage_series.append(self._usage())
        release = pool.release_stale
        for r in stale:
            release(r, computed[r])
        if finishing:
            for r in finishing:
                pool.free_request(r)
            self.finished += len(finishing)
            self._running = [r for r in running if computed[r] != end[r]]
        self.steps = step + 1

    def _host_bytes(self) -> tuple[int, int]:
        """Bytes the host tiers took from the device and gave back so far."""
        hosts = self._hosts
        return (
            sum(host.offloaded_blocks * host.bytes_per_block for host in hosts),
            sum(host.restored_blocks * host.bytes_per_block for host in hosts),
        )

    def _usage(self) -> float:
        """The pool's usage: the share of usable block ids held, of the fullest pool when
        the plan has several (admission needs room in every pool, so the fullest decides)."""
        pool = self.pool
        if self._pools == 1:
            usable = pool.num_usable_blocks
            # a plan with no cache-holding layer has no blocks: none is ever in use
            return (usable - pool.num_free_blocks) / usable if usable else 0.0
        shares = (
            (pool.num_usable_blocks_in(p) - pool.num_free_blocks_in(p)) / pool.num_usable_blocks_in(p)
            for p in range(self._pools)
            if pool.num_usable_blocks_in(p)
        )
        return max(shares, default=0.0)

    def _preempt(self, r: int) -> None:
        self.pool.free_request(r)
        self.recomputed_tokens += self._computed[r]
        self._computed[r] = 0
        self._waiting.appendleft(r)
        self.preemptions += 1

    def result(self) -> SimulationResult:
        """The figures so far (the whole run once :attr:`done`): the shared ones, with the
        prefix cache's and the host tier's from the pool."""
        stats = self.pool.prefix_cache_stats
        return attrs.evolve(
            super().result(),
            prefix_caching=stats.enabled,
            prefix_hit_rate=stats.hit_rate,
            prefix_hits_by_kind=stats.by_kind,
            host_tier=self.pool.host_tier_stats if self._hosts else None,
            host_transfer_seconds=self.host_transfer_seconds,
        )


# -- checks before simulating ----------------------------------------------------------------


def _check_fits_alone(plan: KVCachePlan, requests: Sequence[Request], budget: int) -> None:
    """Refuse a request that cannot run even with the pool to itself (it would stall the queue).

    The plan's worst case for a length (over steps of ``budget`` tokens) bounds what a request
    of that length holds; only requests above that bound are run alone through a fresh pool.
    """
    by_length: dict[int, list[Request]] = {}
    for request in requests:
        by_length.setdefault(request.total_tokens, []).append(request)
    tried: set[tuple[int, int]] = set()
    for length in sorted(by_length, reverse=True):
        context = SizingContext(max_model_len=length, max_num_batched_tokens=budget)
        need = pool_peaks(plan.groups, len(plan.pools), context)
        if all(n <= plan.usable_blocks_in(p) for p, n in enumerate(need)):
            return  # the bound grows with the length: every shorter request fits too
        for request in by_length[length]:
            shape = (request.prompt_tokens, request.output_tokens)
            if shape in tried:
                continue
            tried.add(shape)
            if not _runs_alone(plan, request, budget):
                raise InvalidInputError(
                    f"{request.label} ({request.prompt_tokens} prompt + {request.output_tokens} output "
                    f"tokens) needs more block ids than the pool has ({_usable(plan)})"
                    " even when it runs alone: plan more blocks (or a larger budget), or shorten the request"
                )


def _usable(plan: KVCachePlan) -> str:
    """The usable block ids of ``plan``, per pool when it has several, for a message."""
    if not plan.names_pools:
        return str(plan.usable_blocks)
    return ", ".join(f"{plan.usable_blocks_in(p)} in pool {p}" for p in range(len(plan.pools)))


def _runs_alone(plan: KVCachePlan, request: Request, budget: int) -> bool:
    pool = BlockPool(plan)
    computed, known, generated = 0, request.prompt_tokens, 0
    try:
        while True:
            tokens = min(known, computed + budget)
            pool.reserve(0, tokens)
            computed = tokens
            if computed == known:
                generated += 1
                if generated == request.output_tokens:
                    return True
                known += 1
            pool.release_stale(0, computed)
    except BlockPoolExhaustedError:
        return False


# -- when the pool needs calling -------------------------------------------------------------


def _event_tables(plan: KVCachePlan, longest: int) -> tuple[bytearray, bytearray] | None:
    """``(grows, releases)``: ``grows[n]`` is 1 when covering ``n`` tokens takes a page that
    ``n - 1`` did not in some group; ``releases[c]`` is 1 when ``c`` computed tokens free a page
    that ``c - 1`` kept. ``None`` when a kind's pages do not follow the default rule (counts
    alone decide), so the pool must be asked every step.
    """
    grows = bytearray(longest + 2)
    releases = bytearray(longest + 2)
    for spec in {group.spec for group in plan.groups}:
        if not _default_pages(spec, longest):
            return None
        per_page = spec.tokens_per_page
        if per_page is None:
            grows[1] = 1
            continue
        grows[1 : longest + 2 : per_page] = b"\x01" * len(range(1, longest + 2, per_page))
        if type(spec).first_retained_token is KVCacheSpec.first_retained_token:
            continue
        first = spec.first_retained_token
        last = 0
        for c in range(1, longest + 2):
            start = first(c) // per_page
            if start > last:
                releases[c] = 1
                last = start
    return grows, releases


def _default_pages(spec: KVCacheSpec, longest: int) -> bool:
    if type(spec).live_pages is KVCacheSpec.live_pages:
        return True
    if spec.tokens_per_page is not None:
        return False
    # a per-request state: one page from the first token on (the default rule for states)
    probes = ((0, 0), (1, 0), (1, 1), (2, 1), (longest, 0), (longest, longest - 1))
    return all(spec.live_pages(n, c) == range(1 if n > 0 else 0) for n, c in probes)


def _add_counts(counts: list[int], *values: int) -> None:
    """Add one loop's step-time counts to the step's (:meth:`Simulator.step`)."""
    for index, value in enumerate(values):
        counts[index] += value
