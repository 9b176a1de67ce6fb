"""What every built-in scheduler profile's stepper keeps the same way: the request clock
(arrivals in steps or seconds, when each step ended), the counters a result reports, the
queue views, and the result itself.

A profile's simulator (:mod:`kvcore.simulation.profiles`) subclasses :class:`StepperState`,
calls :meth:`~StepperState._start` in its constructor, and implements the scheduling; the
figures are then computed one way for every profile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcore.errors import InvalidInputError
from kvcore.limits import MAX_TOKENS, check_at_most
from kvcore.simulation.compiled import check_compiled_sources, mypyc_attr
from kvcore.simulation.load import ArrivalLoad, arrival_load
from kvcore.simulation.profile_reach import ReachTally
from kvcore.simulation.result import SimulationResult, percentile
from kvcore.simulation.series import StepSeries
from kvcore.simulation.steps import StepRecord, StepTimeModel, Timeline, build_timeline
from kvcore.validators import check_int

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.workload import Request, Workload

# every profile imports this module: compiled modules built from other sources stop here
check_compiled_sources()


def step_budget(plan: KVCachePlan, tokens: object) -> int:
    """The tokens one step may schedule: ``tokens``, else the plan's ``max_num_batched_tokens``.

    Raises:
        InvalidInputError: it is not an int from 1 to ``kvcore.limits.MAX_TOKENS``.
    """
    given = plan.context.max_num_batched_tokens if tokens is None else tokens
    budget = check_int(given, "'max_num_batched_tokens'", minimum=1)
    check_at_most(budget, MAX_TOKENS, "'max_num_batched_tokens' (kvcore.limits.MAX_TOKENS)", "give fewer")
    return budget


def check_lengths(plan: KVCachePlan, requests: Sequence[Request]) -> None:
    """Refuse a request longer than the plan's ``max_model_len`` (no step could finish it).

    Raises:
        InvalidInputError: naming the first such request, its lengths and the plan's limit.
    """
    limit = plan.context.max_model_len
    for request in requests:
        if request.total_tokens > limit:
            raise InvalidInputError(
                f"{request.label} has {request.prompt_tokens} prompt + {request.output_tokens} output "
                f"tokens = {request.total_tokens}, more than the plan's max_model_len ({limit}); plan for a "
                "longer max_model_len or shorten the request"
            )


# the vllm profile's stepper subclasses it compiled (kvcore.simulation.compiled), the other
# profiles' interpreted: mypyc lets an interpreted class subclass a compiled one when told
@mypyc_attr(allow_interpreted_subclasses=True)
class StepperState:
    """The clock, counters and figures of one replay (see the module docstring).

    Attributes:
        plan: the plan replayed.
        requests: the workload's requests, in arrival order.
        caching: whether prefix caching is on.
        clock: seconds so far (with a step-time model).
        steps, finished, total_tokens, recomputed_tokens, cached_tokens, looked_up_tokens,
        preemptions: the run's counts so far.
    """

    plan: KVCachePlan
    requests: tuple[Request, ...]
    caching: bool
    _running: list[int]
    _waiting: Sequence[int]
    _first: list[int]

    def _start(self, workload: Workload, step_time: StepTimeModel | None, scheduler: str) -> None:
        """Set the clock and the counters for ``workload``; ``scheduler`` names the profile in
        the result.

        Raises:
            InvalidInputError: the workload arrives in seconds but no step-time model is given.
        """
        self._scheduler = scheduler
        count = len(self.requests)
        self._arrival: list[int] | list[float] = [r.arrival_step for r in self.requests]
        #: the step each request joined the queue at (its arrival step unless it arrives in seconds)
        self._queued = self._arrival
        #: with a step-time model: the clock, when each step ended, each request's first-token
        #: and finish steps
        self._step_time = step_time
        # a measured profile says what it measured: the run counts its steps beyond that
        measured = getattr(step_time, "measured", ())
        self._reach = ReachTally(measured) if measured else None
        self.clock = 0.0
        self._step_end: list[float] = []
        self._token_step = [-1] * count if step_time is not None else []
        self._finish_step = [-1] * count if step_time is not None else []
        self._in_seconds = any(r.arrival_time is not None for r in self.requests)
        if self._in_seconds:
            if step_time is None:
                raise InvalidInputError(
                    f"the workload {workload.name!r} gives arrival times in seconds: simulating it needs a "
                    "step-time model (a GPU's roofline or a measured step-time profile)"
                )
            self._arrival = [r.arrival_time or 0.0 for r in self.requests]
            self._queued = [-1] * count
        # idle stretches stored as one run (a request arriving at step 10**7 costs nothing)
        self._running_series: StepSeries[int] = StepSeries()
        self._usage_series: StepSeries[float] = StepSeries()
        self.steps = 0
        self.finished = 0
        self.total_tokens = 0
        self.recomputed_tokens = 0
        self.cached_tokens = 0
        self.looked_up_tokens = 0
        self.preemptions = 0

    @property
    def done(self) -> bool:
        """Whether every request has finished."""
        return self.finished == len(self.requests)

    @property
    def running(self) -> tuple[int, ...]:
        """The running requests (indices into ``workload.requests``), in the scheduler's order."""
        return tuple(self._running)

    @property
    def waiting(self) -> tuple[int, ...]:
        """The requests that arrived and wait, in queue order."""
        return tuple(self._waiting)

    def _advance_clock(self, step: int, record: StepRecord, extra: float = 0.0) -> None:
        """Advance the clock by the step-time model's seconds for ``record``, step ``step``'s,
        and ``extra`` seconds the step spends beside the model (moves to and from a host tier).

        Raises:
            InvalidInputError: the model gave a time that is not finite and >= 0.
        """
        model = self._step_time
        assert model is not None
        seconds = model(record)
        if not 0.0 <= seconds < math.inf:  # NaN fails too
            raise InvalidInputError(
                f"the step-time model {model.description!r} gave {seconds!r} seconds for step "
                f"{step} ({record}): a step takes a finite time >= 0; fix the model"
            )
        if self._reach is not None and record.requests:  # an idle step is not the profile's
            self._reach.add(record.term_values(), seconds)
        self.clock += seconds + extra
        self._step_end.append(self.clock)

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The scheduler settings this run used (reported with the result; none by default)."""
        return ()

    def _timeline(self) -> Timeline | None:
        """The run in seconds, with a step-time model (``None`` without one)."""
        if self._step_time is None:
            return None
        return build_timeline(
            self._step_time,
            self._step_end,
            self._arrival,
            in_seconds=self._in_seconds,
            first_token_step=self._token_step,
            finish_step=self._finish_step,
            reach=self._reach.reach() if self._reach is not None else None,
        )

    def result(self) -> SimulationResult:
        """The figures so far (the whole run once :attr:`done`)."""
        steps = self.steps
        running, usage = self._running_series, self._usage_series
        delays = sorted(f - a for f, a in zip(self._first, self._queued, strict=True) if f >= 0)
        return SimulationResult(
            policy=self.plan.policy,
            num_requests=len(self.requests),
            steps=steps,
            mean_running=running.total() / steps if steps else 0.0,
            peak_running=running.peak(0),
            tokens_per_step=self.total_tokens / steps if steps else 0.0,
            total_tokens=self.total_tokens,
            recomputed_tokens=self.recomputed_tokens,
            preemptions=self.preemptions,
            mean_queue_delay=sum(delays) / len(delays) if delays else 0.0,
            p99_queue_delay=float(percentile(delays, 99)) if delays else 0.0,
            mean_pool_usage=usage.total() / steps if steps else 0.0,
            peak_pool_usage=usage.peak(0.0),
            running=running.copy(),
            pool_usage=usage.copy(),
            prefix_caching=self.caching,
            cached_tokens=self.cached_tokens,
            prefix_hit_rate=self.cached_tokens / self.looked_up_tokens if self.looked_up_tokens else 0.0,
            scheduler=self._scheduler,
            scheduler_settings=self.settings(),
            timeline=self._timeline(),
            load=self._load(),
        )

    def _load(self) -> ArrivalLoad | None:
        """Arrivals against the requests begun while they arrived (:mod:`kvcore.simulation.load`):
        in steps, or in seconds with a step-time model (a step begins when the one before ended)."""
        if self._step_time is None:
            return arrival_load(self._arrival, self._first, "step")
        ends = self._step_end

        def began(step: int) -> float:
            if step < 0:
                return math.inf
            return ends[min(step, len(ends)) - 1] if step > 0 and ends else 0.0

        arrived = (
            [float(t) for t in self._arrival]
            if self._in_seconds
            else [began(int(step)) for step in self._arrival]
        )
        return arrival_load(arrived, [began(step) for step in self._first], "s")
