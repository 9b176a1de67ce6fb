"""What a replay reports (:class:`SimulationResult`), the same for every scheduler profile, and
the nearest-rank percentile its figures use."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import attrs

from kvcore.runtime.host_cache import HostTierStats
from kvcore.runtime.prefix_cache import KindHits
from kvcore.simulation.load import ArrivalLoad
from kvcore.simulation.steps import Timeline

_T = TypeVar("_T", int, float)


@attrs.frozen(kw_only=True)
class SimulationResult:
    """What one plan served of a workload.

    Attributes:
        policy: the plan's policy.
        num_requests: requests in the workload (all of them finish).
        steps: scheduler steps until the last request finished (idle steps included).
        mean_running: running requests per step, on average.
        peak_running: the most requests running in one step.
        tokens_per_step: tokens scheduled per step (``total_tokens / steps``), the throughput proxy.
        total_tokens: tokens scheduled (prefill and decode), recomputation included.
        recomputed_tokens: tokens computed again after a preemption (part of ``total_tokens``).
        preemptions: how many times a running request was preempted.
        mean_queue_delay: steps from arrival to first scheduling, on average.
        p99_queue_delay: the same, 99th percentile (nearest rank).
        prefix_caching: whether the pool cached prefixes (asked for, and every group can).
        cached_tokens: prompt tokens found in the prefix cache at admission, not computed.
        prefix_hit_rate: ``cached_tokens`` over the tokens of the requests looked up (0..1).
        prefix_hits_by_kind: with prefix caching (``kvcore`` profile), per group kind of the
            plan, the lookups its cached pages served and how many pages they used (a state
            group's are checkpoints); else empty.
        mean_pool_usage: the share of the pool's usable block ids held during a step, on average
            (0..1); cached blocks no request holds count as free. With several pools, the share
            of the fullest pool at each step.
        peak_pool_usage: the largest share held during one step.
        running: running requests at each step (a :class:`~kvcore.simulation.series.StepSeries`:
            reads as a tuple, stores an idle stretch as one run).
        pool_usage: the share of the pool held at each step (a ``StepSeries`` too).
        scheduler: the scheduler profile that ran (``kvcore``, ``vllm``, ...).
        scheduler_settings: the profile's settings that shaped the run, as ``(name, value)``.
        host_tier: with prefix caching and a plan with a host tier, what the tier kept and gave
            back (hits per tier, blocks and bytes each way); else ``None``.
        host_transfer_seconds: with a step-time model on a GPU, the seconds the host tier's
            moves added to the steps (each step's moves at the host link's peak, after its
            compute); else 0.
        load: arrivals against the requests the plan began to serve while they arrived (per
            step, or per second with a step-time model), which says whether the run is
            overloaded; ``None`` where every request arrives at once.
    """

    policy: str
    num_requests: int
    steps: int
    mean_running: float
    peak_running: int
    tokens_per_step: float
    total_tokens: int
    recomputed_tokens: int
    preemptions: int
    mean_queue_delay: float
    p99_queue_delay: float
    mean_pool_usage: float
    peak_pool_usage: float
    running: Sequence[int] = attrs.field(repr=False)
    pool_usage: Sequence[float] = attrs.field(repr=False)
    prefix_caching: bool = False
    cached_tokens: int = 0
    prefix_hit_rate: float = 0.0
    prefix_hits_by_kind: tuple[KindHits, ...] = ()
    timeline: Timeline | None = attrs.field(default=None, repr=False)
    scheduler: str = "kvcore"
    scheduler_settings: tuple[tuple[str, object], ...] = ()
    host_tier: HostTierStats | None = None
    host_transfer_seconds: float = 0.0
    load: ArrivalLoad | None = None

    @property
    def served_tokens_per_step(self) -> float:
        """The workload's own tokens per step: scheduled tokens less those recomputed after a
        preemption, plus those found in the prefix cache, over the steps to drain. The figure
        plans are ranked by: recomputation keeps the engine busy but serves nothing new, so a
        plan that preempts more must not look faster; a cached token is served without
        computing."""
        served = self.total_tokens - self.recomputed_tokens + self.cached_tokens
        return served / max(self.steps, 1)


def percentile(ordered: Sequence[_T], q: float) -> _T:
    """The ``q``-th percentile of sorted values by nearest rank (``ordered`` non-empty)."""
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
