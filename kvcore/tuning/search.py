"""Search the plan and scheduler settings that serve a workload best.

The knobs (:class:`Knobs`): the policy, the block size, the KV dtype, the pool split (for a
policy of several pools), ``max_num_seqs`` and ``max_num_batched_tokens``. A full grid of them
is hundreds of simulations; :func:`tune` instead runs a coordinate search:

1. the default candidate (the first value of every knob in the :class:`SearchSpace`);
2. each knob in turn, every value of it with the other knobs at the best found so far; the
   best becomes the new base (the first pass from the default is also what each knob bought
   alone: :attr:`TuneResult.knob_effects`);
3. passes repeat until one changes nothing (at most ``max_passes``).

What keeps it cheap:

- **plans are reused**: a plan depends on the policy, block size, dtype, split and
  ``max_num_batched_tokens`` (which sizes sliding pages), not on ``max_num_seqs``, so it is
  made once per distinct key;
- **results are reused**: candidates whose plans hold the same pools and groups and whose
  scheduler settings are equal run once;
- **dominated settings are pruned**: a ``max_num_seqs`` above the most requests a run had
  running at once (its cap never bound) gives the same run, so it is not simulated again.

The objective (:data:`OBJECTIVES`): ``goodput`` (requests per second meeting the latency
targets), ``throughput`` (output tokens per second), both needing a step-time model, or
``tokens_per_step`` (served tokens per step, without one). The latency each candidate is held
against on the Pareto front is the p90 end-to-end latency in seconds, or, without a step-time
model, the p99 queueing delay in steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs

from kvcore.dtypes import to_dtype
from kvcore.errors import InvalidInputError, InvalidSpecError, KVCoreError
from kvcore.plan import KVCachePlan
from kvcore.planning.compare import variant_specs
from kvcore.planning.offload import with_host_memory
from kvcore.planning.planner import plan as plan_request
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest, one_budget
from kvcore.simulation.profile import SchedulerProfile, resolve_profile
from kvcore.simulation.simulator import SimulationResult, simulate
from kvcore.simulation.steps import StepTimeModel
from kvcore.simulation.timing import LatencyReport, latency_report
from kvcore.simulation.workload import Workload
from kvcore.tuning.split import workload_split

#: What :func:`tune` maximises.
OBJECTIVES = ("goodput", "throughput", "tokens_per_step")

#: The pool-split knob's values: ``None`` splits by the worst case (what one request of
#: ``max_model_len`` needs of each pool), ``0.0`` by the workload
#: (:func:`~kvcore.tuning.split.workload_split`), ``s`` the workload's split with ``s`` more
#: of the budget to pool 0 (taken from the others in proportion).
DEFAULT_SPLIT_SHIFTS: tuple[float | None, ...] = (None, 0.0, 0.05, 0.1, -0.05)

#: Makes a candidate's plan from its request (specs, budget, context, policy, options); an
#: engine's rules may stand behind it (``kvcore.integrations.tuned.vllm_planner``).
Planner = Callable[[PlanRequest], KVCachePlan]

#: Makes a plan's step-time model (a roofline depends on the plan's page sizes).
StepTimeFactory = Callable[[KVCachePlan], StepTimeModel]


@attrs.frozen
class Knobs:
    """One candidate's settings.

    Attributes:
        policy: the allocation policy.
        block_size: the block size (``None``: as the specs say).
        kv_cache_dtype: the KV dtype's name (``None``: as the specs say).
        split_shift: the pool split (:data:`DEFAULT_SPLIT_SHIFTS`); read only for a plan of
            several pools.
        max_num_seqs: the most requests running at once.
        max_num_batched_tokens: tokens one step schedules (and the prompt chunk).
    """

    policy: str
    block_size: int | None
    kv_cache_dtype: str | None
    split_shift: float | None
    max_num_seqs: int
    max_num_batched_tokens: int

    def describe(self, knob: str) -> str:
        """One knob's value as a table shows it."""
        value = getattr(self, knob)
        if knob == "split_shift":
            return split_label(value)
        if value is None:
            return "as specs"
        return f"{value:,}" if isinstance(value, int) else str(value)


#: The knobs in the order the search varies them.
KNOBS = ("policy", "block_size", "kv_cache_dtype", "split_shift", "max_num_seqs", "max_num_batched_tokens")


def split_label(shift: float | None) -> str:
    """``worst case``, ``workload``, ``workload +5% pool 0``."""
    if shift is None:
        return "worst case"
    if shift == 0:
        return "workload"
    return f"workload {100 * shift:+.0f}% pool 0"


def _values(name: str, values: Sequence[Any]) -> tuple[Any, ...]:
    out = tuple(dict.fromkeys(values))  # in order, once each
    if not out:
        raise InvalidInputError(f"the search space gives no value for {name!r}")
    return out


def _counts(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = _values(name, values)
    for value in out:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidInputError(f"{name!r}: every value must be an int >= 1 (got {value!r})")
    return out


def _shifts(values: Sequence[float | None]) -> tuple[float | None, ...]:
    out = _values("split_shifts", values)
    for value in out:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not -1 < value < 1
        ):
            raise InvalidInputError(f"'split_shifts': every value must be None or in (-1, 1) (got {value!r})")
    return out


def _policy_values(values: Sequence[str]) -> tuple[str, ...]:
    return _values("policies", values)


def _block_values(values: Sequence[int | None]) -> tuple[int | None, ...]:
    return _values("block_sizes", values)


def _dtype_values(values: Sequence[str | None]) -> tuple[str | None, ...]:
    return _values("kv_cache_dtypes", values)


def _seq_values(values: Sequence[int]) -> tuple[int, ...]:
    return _counts("max_num_seqs", values)


def _token_values(values: Sequence[int]) -> tuple[int, ...]:
    return _counts("max_num_batched_tokens", values)


@attrs.frozen(kw_only=True)
class SearchSpace:
    """The values each knob may take; the first of each makes the default candidate.

    Attributes:
        policies: policy names.
        block_sizes: block sizes (``None``: as the specs say).
        kv_cache_dtypes: KV dtype names (``None``: as the specs say).
        split_shifts: pool splits (:data:`DEFAULT_SPLIT_SHIFTS`).
        max_num_seqs: running-request caps.
        max_num_batched_tokens: step token budgets.
    """

    policies: tuple[str, ...] = attrs.field(converter=_policy_values)
    block_sizes: tuple[int | None, ...] = attrs.field(default=(None,), converter=_block_values)
    kv_cache_dtypes: tuple[str | None, ...] = attrs.field(default=(None,), converter=_dtype_values)
    split_shifts: tuple[float | None, ...] = attrs.field(default=DEFAULT_SPLIT_SHIFTS, converter=_shifts)
    max_num_seqs: tuple[int, ...] = attrs.field(default=(128,), converter=_seq_values)
    max_num_batched_tokens: tuple[int, ...] = attrs.field(default=(2048,), converter=_token_values)

    def values(self, knob: str) -> tuple[Any, ...]:
        """The values of one of :data:`KNOBS`."""
        return {
            "policy": self.policies,
            "block_size": self.block_sizes,
            "kv_cache_dtype": self.kv_cache_dtypes,
            "split_shift": self.split_shifts,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }[knob]

    def default(self) -> Knobs:
        """The first value of every knob."""
        return Knobs(*(self.values(knob)[0] for knob in KNOBS))

    @property
    def size(self) -> int:
        """Candidates in the full grid (what the coordinate search avoids running)."""
        return math.prod(len(self.values(knob)) for knob in KNOBS)


@attrs.frozen(kw_only=True)
class Trial:
    """One candidate and what it served.

    Attributes:
        knobs: its settings.
        plan: its plan, or ``None`` when none could be made.
        pool_split: the fractions its pools got (``None``: one pool, or the worst-case split).
        error: why there is no plan or no run.
        result: the simulation (``None`` without a plan).
        latency: the seconds, with a step-time model.
        score: the objective (higher is better; ``-inf`` without a run).
        latency_figure: what the Pareto front weighs the score against (lower is better).
        reused: the run was not simulated: the result of an equal candidate (same pools and
            groups, same scheduler settings) or of a lower ``max_num_seqs`` that never bound.
    """

    knobs: Knobs
    plan: KVCachePlan | None
    pool_split: tuple[float, ...] | None = None
    error: str | None = None
    result: SimulationResult | None = attrs.field(default=None, repr=False)
    latency: LatencyReport | None = attrs.field(default=None, repr=False)
    score: float = -math.inf
    latency_figure: float = math.inf
    reused: bool = False

    @property
    def ok(self) -> bool:
        """Whether it ran."""
        return self.result is not None


@attrs.frozen(kw_only=True)
class KnobEffect:
    """What one knob bought alone: the default with only that knob changed, at its best value.

    Attributes:
        knob: one of :data:`KNOBS`.
        default: the default candidate's value, as shown.
        best: the value that scored best with the other knobs at their defaults.
        score: that candidate's score.
        gain: ``score / default score - 1`` (``None`` when the default did not run).
    """

    knob: str
    default: str
    best: str
    score: float
    gain: float | None


@attrs.frozen(kw_only=True)
class TuneResult:
    """What :func:`tune` found.

    Attributes:
        objective: what was maximised.
        latency_unit: ``"s"`` or ``"steps"`` (the Pareto front's latency).
        default: the default candidate.
        best: the best candidate (the highest score; a tie within :data:`TIE`, the lower latency).
        trials: every candidate tried, in order (reused runs included).
        front: the Pareto front: candidates no other beats on score and latency at once,
            by latency.
        knob_effects: one per knob with more than one value.
        simulations: runs actually simulated (``len(trials)`` less the reused).
        plans: plans made (each plan key once).
        grid_size: candidates the full grid would have run.
    """

    objective: str
    latency_unit: str
    default: Trial
    best: Trial
    trials: tuple[Trial, ...]
    front: tuple[Trial, ...]
    knob_effects: tuple[KnobEffect, ...]
    simulations: int
    plans: int
    grid_size: int


def default_planner(registry: Registry) -> Planner:
    """kvcore's own planner (:func:`~kvcore.planning.planner.plan`) as a :data:`Planner`."""
    return lambda request: plan_request(request, registry=registry).plans[0]


def pareto_front(trials: Sequence[Trial]) -> tuple[Trial, ...]:
    """The trials that ran and that no other trial beats on both score (higher) and latency
    (lower), one per distinct (score, latency), by latency then score."""
    ran = sorted((t for t in trials if t.ok), key=lambda t: (t.latency_figure, -t.score))
    front: list[Trial] = []
    best = -math.inf
    for trial in ran:
        if trial.score > best:  # lower latency already seen had a lower score
            front.append(trial)
            best = trial.score
    return tuple(front)


def dominated(trial: Trial, others: Sequence[Trial]) -> bool:
    """Whether some other trial is at least as good on both figures and better on one."""
    return any(
        o is not trial
        and o.ok
        and o.score >= trial.score
        and o.latency_figure <= trial.latency_figure
        and (o.score > trial.score or o.latency_figure < trial.latency_figure)
        for o in others
    )


def _fingerprint(plan: KVCachePlan) -> Hashable:
    """What a run depends on of a plan: its pools and groups (equal fingerprints run alike)."""
    return (
        tuple((p.num_blocks, p.bytes_per_block) for p in plan.pools),
        tuple((g.spec, g.pool, len(g.layer_names)) for g in plan.groups),
        plan.null_block,
        plan.context,
    )


class _Search:
    """The state of one :func:`tune` call: plan and run caches, the trials so far."""

    def __init__(
        self,
        request: PlanRequest,
        workload: Workload,
        *,
        planner: Planner,
        profile: SchedulerProfile,
        step_time: StepTimeFactory | None,
        prefix_caching: bool,
        objective: str,
        slo_ttft: float | None,
        slo_itl: float | None,
        on_trial: Callable[[Trial], None] | None,
        host_memory: int = 0,
    ) -> None:
        self.request = request
        self.host_memory = host_memory
        self.workload = workload
        self.planner = planner
        self.profile = profile
        self.step_time = step_time
        self.prefix_caching = prefix_caching
        self.objective = objective
        self.slo_ttft = slo_ttft
        self.slo_itl = slo_itl
        self.on_trial = on_trial
        self.plans: dict[Hashable, tuple[KVCachePlan | None, tuple[float, ...] | None, str | None]] = {}
        self.runs: dict[tuple[Hashable, int, int], Trial] = {}
        self.trials: dict[Knobs, Trial] = {}
        self.simulations = 0
        self.outputs = [r.output_tokens for r in workload.requests]
        longest = max((r.prompt_tokens + r.output_tokens for r in workload.requests), default=0)
        self.stall_steps = STALL_FACTOR * longest + STALL_MIN_STEPS

    def plan(self, knobs: Knobs) -> tuple[KVCachePlan | None, tuple[float, ...] | None, str | None]:
        """The candidate's plan, split and error (made once per plan key)."""
        key = (
            knobs.policy,
            knobs.block_size,
            knobs.kv_cache_dtype,
            knobs.split_shift,
            knobs.max_num_batched_tokens,
        )
        if key in self.plans:
            return self.plans[key]
        shared = self.request
        context = attrs.evolve(shared.context, max_num_batched_tokens=knobs.max_num_batched_tokens)
        try:
            variant = variant_specs(
                shared.specs, block_size=knobs.block_size, kv_cache_dtype=knobs.kv_cache_dtype
            )
            request = attrs.evolve(shared, specs=variant, context=context, policy=knobs.policy)
            planned = self.planner(request)
            split = None
            if knobs.split_shift is not None and len(planned.pools) > 1:
                split = shifted(workload_split(planned, self.workload), knobs.split_shift)
                planned = self.planner(
                    attrs.evolve(request, options=attrs.evolve(shared.options, pool_split=split))
                )
            if self.host_memory:  # every candidate keeps this host tier below its pool
                planned = with_host_memory(planned, self.host_memory)
            made: tuple[KVCachePlan | None, tuple[float, ...] | None, str | None] = (planned, split, None)
        except (KVCoreError, InvalidSpecError) as exc:
            made = (None, None, str(exc))
        self.plans[key] = made
        return made

    def profile_for(self, knobs: Knobs) -> SchedulerProfile:
        """The scheduler profile with the candidate's ``max_num_seqs`` (a profile without the
        setting, such as ``kvcore``'s, runs as it is)."""
        profile: Any = self.profile
        fields = attrs.fields_dict(type(profile)) if attrs.has(type(profile)) else {}
        for name in ("max_num_seqs", "max_running_requests"):
            if name in fields:
                evolved: SchedulerProfile = attrs.evolve(profile, **{name: knobs.max_num_seqs})
                return evolved
        return self.profile

    def trial(self, knobs: Knobs) -> Trial:
        """Plan and run one candidate (or reuse an equal run)."""
        if knobs in self.trials:
            return self.trials[knobs]
        plan, split, error = self.plan(knobs)
        made = Trial(knobs=knobs, plan=None, error=error) if plan is None else self._run(knobs, plan, split)
        self.trials[knobs] = made
        if self.on_trial is not None:
            self.on_trial(made)
        return made

    def _run(self, knobs: Knobs, plan: KVCachePlan, split: tuple[float, ...] | None) -> Trial:
        base = (_fingerprint(plan), knobs.max_num_batched_tokens)
        key = (*base, knobs.max_num_seqs)
        same = self.runs.get(key)
        if same is None:
            # a lower cap that never bound ran exactly as this one would
            same = next(
                (
                    t
                    for (fp, mnbt, seqs), t in self.runs.items()
                    if (fp, mnbt) == base
                    and seqs < knobs.max_num_seqs
                    and t.result is not None
                    and t.result.peak_running < seqs
                ),
                None,
            )
        if same is not None:
            return attrs.evolve(same, knobs=knobs, plan=plan, pool_split=split, reused=True)
        timer = self.step_time(plan) if self.step_time is not None else None
        watchdog = _Watchdog(self.stall_steps)
        try:
            result = simulate(
                plan,
                self.workload,
                max_num_batched_tokens=knobs.max_num_batched_tokens,
                on_step=watchdog,
                prefix_caching=self.prefix_caching,
                step_time=timer,
                scheduler=self.profile_for(knobs),
            )
        except _Stalled as exc:
            return Trial(knobs=knobs, plan=plan, pool_split=split, error=str(exc))
        except KVCoreError as exc:
            return Trial(knobs=knobs, plan=plan, pool_split=split, error=str(exc))
        self.simulations += 1
        latency = (
            latency_report(result.timeline, self.outputs, slo_ttft=self.slo_ttft, slo_itl=self.slo_itl)
            if result.timeline is not None
            else None
        )
        made = Trial(
            knobs=knobs,
            plan=plan,
            pool_split=split,
            result=result,
            latency=latency,
            score=score_of(self.objective, result, latency),
            latency_figure=latency.e2e.p90 if latency is not None else result.p99_queue_delay,
        )
        self.runs[key] = made
        return made


#: A run in which no request finishes for ``STALL_FACTOR x`` the longest request's tokens
#: (plus :data:`STALL_MIN_STEPS`) steps is stopped: a scheduler that never admits the next
#: request (a plan that holds one by kvcore's count but not by the profile's admission rule)
#: would otherwise step for ever.
STALL_FACTOR = 4
STALL_MIN_STEPS = 10_000


class _Stalled(Exception):
    """A run stopped by :class:`_Watchdog`."""


class _Watchdog:
    """``simulate``'s ``on_step``: raises :class:`_Stalled` when no request finished for too long."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.finished = 0
        self.since = 0

    def __call__(self, steps: int, finished: int) -> None:
        if finished != self.finished:
            self.finished, self.since = finished, steps
        elif steps - self.since > self.limit:
            raise _Stalled(
                f"the run stalled: no request finished in {steps - self.since:,} steps ({finished:,} had); "
                "the scheduler never admits the next one (plan under the engine's own rules)"
            )


#: Scores within this fraction of each other count as a tie, broken by the lower latency: a
#: simulation's last digits are noise next to a candidate that answers sooner.
TIE = 1e-3


def better(trial: Trial, than: Trial) -> bool:
    """Whether ``trial`` beats ``than``: a score higher by more than :data:`TIE`, or a tied score
    and a lower latency."""
    if not than.ok:
        return trial.ok
    if trial.score > than.score * (1 + TIE):
        return True
    return trial.score >= than.score * (1 - TIE) and trial.latency_figure < than.latency_figure


def shifted(split: Sequence[float], shift: float) -> tuple[float, ...]:
    """``split`` with ``shift`` more of the budget to pool 0, the others giving it up in
    proportion; kept inside (0, 1) so that it stays a valid split."""
    if shift == 0:
        return tuple(split)
    first = min(max(split[0] + shift, 0.01), 0.99)
    rest = 1 - split[0]
    return (first, *((1 - first) * s / rest if rest else (1 - first) / (len(split) - 1) for s in split[1:]))


def score_of(objective: str, result: SimulationResult, latency: LatencyReport | None) -> float:
    """A run's figure for ``objective`` (see :data:`OBJECTIVES`)."""
    if objective == "tokens_per_step":
        return result.served_tokens_per_step
    if latency is None:
        raise InvalidInputError(f"objective {objective!r} needs seconds: give a step-time model")
    if objective == "goodput":
        return latency.goodput_requests_per_second
    return latency.output_tokens_per_second


def check_objective(objective: str, timed: bool, slo: bool) -> None:
    """Raise for an objective the inputs cannot score.

    Raises:
        InvalidInputError: an unknown objective, one in seconds without a step-time model, or
            goodput without a latency target.
    """
    if objective not in OBJECTIVES:
        raise InvalidInputError(
            f"unknown objective {objective!r}; choose one of {', '.join(map(repr, OBJECTIVES))}"
        )
    if objective != "tokens_per_step" and not timed:
        raise InvalidInputError(
            f"objective {objective!r} is in seconds: give a step-time model (a GPU's roofline or a measured "
            "profile), or maximise 'tokens_per_step'"
        )
    if objective == "goodput" and not slo:
        raise InvalidInputError(
            "objective 'goodput' counts requests that meet a latency target: give slo_ttft and/or slo_itl, "
            "or maximise 'throughput'"
        )


def tune(
    request: PlanRequest,
    workload: Workload,
    space: SearchSpace,
    *,
    registry: Registry,
    objective: str = "tokens_per_step",
    scheduler: str | SchedulerProfile = "vllm",
    step_time: StepTimeFactory | None = None,
    slo_ttft: float | None = None,
    slo_itl: float | None = None,
    prefix_caching: bool = False,
    planner: Planner | None = None,
    max_passes: int = 2,
    on_trial: Callable[[Trial], None] | None = None,
    host_memory: int = 0,
) -> TuneResult:
    """Search ``space`` for the candidate that serves ``workload`` best (see the module docstring).

    Args:
        request: what every candidate plans: the model's specs, the KV-cache budget (one rank),
            the length (a number) and the plan options. The knobs replace its policy, its specs'
            block size and KV dtype, its context's ``max_num_batched_tokens`` and its options'
            ``pool_split``.
        workload: the requests.
        space: the knobs' values.
        registry: where policies and scheduler profiles are looked up.
        objective: one of :data:`OBJECTIVES`.
        scheduler: the scheduler profile (a name or a profile object); its ``max_num_seqs`` is
            each candidate's.
        step_time: makes each plan's step-time model (needed for the objectives in seconds).
        slo_ttft: the time-to-first-token target goodput counts, seconds.
        slo_itl: the inter-token target goodput counts, seconds.
        prefix_caching: replay with the scheduler's prefix cache.
        planner: makes the plans (default: kvcore's own, :func:`default_planner`).
        max_passes: coordinate passes at most (>= 1).
        on_trial: called after every candidate (a progress line).
        host_memory: host bytes of a tier below every candidate's pool
            (:func:`~kvcore.planning.offload.with_host_memory`; 0: none), replayed by a profile
            that simulates one (``vllm``: vLLM's CPU offloading; needs ``prefix_caching``).

    Returns:
        The result. The best is the highest score; scores within :data:`TIE` of each other are
        tied, and the lower latency wins the tie.

    Raises:
        InvalidInputError: a request of several ranks, of a length ``auto`` chooses or with a
            forced block count, a bad objective for the inputs, ``max_passes`` < 1, a KV dtype
            no cache can hold, a host tier without prefix caching or under a profile that does
            not simulate one, or no candidate that runs.
    """
    check_objective(objective, step_time is not None, slo_ttft is not None or slo_itl is not None)
    profile = resolve_profile(scheduler, registry)
    _check_inputs(request, space, max_passes, profile, host_memory, prefix_caching)
    search = _Search(
        request,
        workload,
        planner=planner or default_planner(registry),
        profile=profile,
        step_time=step_time,
        prefix_caching=prefix_caching,
        objective=objective,
        slo_ttft=slo_ttft,
        slo_itl=slo_itl,
        on_trial=on_trial,
        host_memory=host_memory,
    )
    default = search.trial(space.default())
    varied = [knob for knob in KNOBS if len(space.values(knob)) > 1]
    best = _coordinate_ascent(search, space, default, varied, max_passes)
    return _result(search, space, default, best, varied, objective=objective, timed=step_time is not None)


def _check_inputs(
    request: PlanRequest,
    space: SearchSpace,
    max_passes: int,
    profile: SchedulerProfile,
    host_memory: int,
    prefix_caching: bool,
) -> None:
    """Refuse what :func:`tune` cannot search before any plan is made.

    Raises:
        InvalidInputError: a request of several ranks, of an ``auto`` length or with a forced
            block count, ``max_passes`` < 1, a misspelt dtype, or a host tier the replay would
            ignore (``profile`` does not simulate one, or prefix caching is off).
    """
    one_budget(request, "tune")
    if request.num_blocks is not None:
        raise InvalidInputError(
            f"tune sizes each candidate's pool from the budget; the request forces num_blocks="
            f"{request.num_blocks} (leave it None)"
        )
    if isinstance(max_passes, bool) or not isinstance(max_passes, int) or max_passes < 1:
        raise InvalidInputError(f"'max_passes' must be an int >= 1 (got {max_passes!r})")
    for name in space.kv_cache_dtypes:
        if name is not None:
            to_dtype(name)  # a misspelt dtype fails before any plan
    if host_memory and not getattr(profile, "simulates_host_tier", False):
        raise InvalidInputError(
            f"the scheduler profile {profile.name!r} does not simulate a host tier: tune with the 'vllm' "
            "profile (vLLM's CPU offloading), 'kvcore' or 'sglang', or without host_memory"
        )
    if host_memory and not prefix_caching:
        raise InvalidInputError(
            "a host tier keeps the cached blocks the device evicts: tune with prefix_caching=True, or "
            "without host_memory"
        )


def _result(
    search: _Search,
    space: SearchSpace,
    default: Trial,
    best: Trial,
    varied: Sequence[str],
    *,
    objective: str,
    timed: bool,
) -> TuneResult:
    """The search's result, with what each knob buys alone from the default.

    Raises:
        InvalidInputError: no candidate could be planned and run.
    """
    # what each knob buys alone, from the default (mostly runs the search already made)
    effects = [
        _effect(
            knob,
            default,
            [search.trial(attrs.evolve(default.knobs, **{knob: v})) for v in space.values(knob)],
        )
        for knob in varied
    ]
    trials = tuple(search.trials.values())
    if not best.ok:
        reasons = "; ".join(sorted({t.error for t in trials if t.error}))
        raise InvalidInputError(f"no candidate could be planned and run: {reasons or 'no candidates'}")
    return TuneResult(
        objective=objective,
        latency_unit="s" if timed else "steps",
        default=default,
        best=best,
        trials=trials,
        front=pareto_front(trials),
        knob_effects=tuple(effects),
        simulations=search.simulations,
        plans=sum(1 for plan, _, _ in search.plans.values() if plan is not None),
        grid_size=space.size,
    )


def _coordinate_ascent(
    search: _Search, space: SearchSpace, default: Trial, varied: Sequence[str], max_passes: int
) -> Trial:
    """The best trial found by varying one knob at a time from the best so far, pass after pass,
    until a pass changes nothing or ``max_passes`` have run."""
    best = default
    for _ in range(max_passes):
        changed = False
        for knob in varied:
            base = best.knobs
            tried = [search.trial(attrs.evolve(base, **{knob: v})) for v in space.values(knob)]
            if knob == "policy":  # a policy of several pools competes with its best split
                tried += [
                    search.trial(attrs.evolve(t.knobs, split_shift=shift))
                    for t in list(tried)
                    if t.plan is not None and len(t.plan.pools) > 1
                    for shift in space.split_shifts
                ]
            for trial in tried:
                if trial.ok and better(trial, best):
                    best, changed = trial, True
        if not changed:
            break
    return best


def _effect(knob: str, default: Trial, tried: Sequence[Trial]) -> KnobEffect:
    top = max(tried, key=lambda t: t.score)
    gain = top.score / default.score - 1 if default.ok and default.score > 0 else None
    return KnobEffect(
        knob=knob,
        default=default.knobs.describe(knob),
        best=top.knobs.describe(knob),
        score=top.score,
        gain=gain,
    )


def estimated_trials(space: SearchSpace, max_passes: int = 2) -> int:
    """Candidates a search of ``space`` tries at most (the default, then every other value of
    every knob per pass, then each knob alone from the default): the progress line's total."""
    per_pass = sum(len(space.values(k)) - 1 for k in KNOBS)
    return 1 + per_pass * (max_passes + 1)
