"""Whether a replay's arrivals outpace what the plan serves (:class:`ArrivalLoad`).

A queue that grows while requests keep arriving is the mark of an overloaded run: its waits
climb without bound (a 25-minute time to first token says so only after the fact). Over the
arrival window, from the first arrival to the last, the requests that arrived are set against
those the plan began to serve: every request that began is one the plan took off the queue, so
``served_rate`` is the rate the queue drains at while ``arrival_rate`` fills it. The run is
overloaded when a tenth or more of the workload is still waiting when the last request arrives
(:data:`OVERLOAD_SHARE`) and the queue is longer then than half-way through the window.

Steps or seconds: a request begins at the step that first schedules it; without a step-time
model the rates are per step, with one per second (a step begins when the one before it ended).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, Literal

import attrs

#: The share of the workload still waiting at the last arrival from which a run is called
#: overloaded (with the queue longer then than half-way through the arrivals).
OVERLOAD_SHARE = 0.1

#: The fewest requests waiting at the last arrival that count as a queue: one request that
#: arrived as the last step began is not one.
MIN_WAITING = 2


@attrs.frozen(kw_only=True)
class ArrivalLoad:
    """Arrivals against what the plan served while they arrived.

    Attributes:
        unit: ``"step"`` or ``"s"``: what the rates are per, and the window is in.
        window: from the first arrival to the last (> 0).
        arrivals: the requests that arrived (the whole workload).
        arrival_rate: ``arrivals / window``.
        served_rate: the requests that began (were first scheduled) by the last arrival, over
            the window.
        waiting_half_way: requests arrived and not yet begun half-way through the window.
        waiting_at_last_arrival: the same when the last request arrived.
    """

    unit: Literal["step", "s"]
    window: float
    arrivals: int
    arrival_rate: float
    served_rate: float
    waiting_half_way: int
    waiting_at_last_arrival: int

    @property
    def overloaded(self) -> bool:
        """Whether the arrivals outpace the plan: at least :data:`OVERLOAD_SHARE` of the
        workload waits when the last request arrives, and the queue grew since half-way."""
        return (
            self.waiting_at_last_arrival >= max(MIN_WAITING, math.ceil(OVERLOAD_SHARE * self.arrivals))
            and self.waiting_at_last_arrival > self.waiting_half_way
        )

    def line(self) -> str:
        """One line for an overloaded run (``""`` for one that keeps up)."""
        if not self.overloaded:
            return ""
        per = "/s" if self.unit == "s" else " per step"
        return (
            f"overloaded: requests arrive at {_rate(self.arrival_rate)}{per}, served at "
            f"{_rate(self.served_rate)}{per}; the queue grows ({self.waiting_half_way:,} waiting half-way "
            f"through the arrivals, {self.waiting_at_last_arrival:,} at the last), and so do the waits"
        )

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON, with ``overloaded``."""
        return {
            "overloaded": self.overloaded,
            "unit": self.unit,
            "window": self.window,
            "arrival_rate": self.arrival_rate,
            "served_rate": self.served_rate,
            "waiting_half_way": self.waiting_half_way,
            "waiting_at_last_arrival": self.waiting_at_last_arrival,
        }


def _rate(value: float) -> str:
    return f"{value:,.2f}" if value >= 0.1 else f"{value:,.4f}"


def arrival_load(
    arrivals: Sequence[float], begins: Sequence[float], unit: Literal["step", "s"]
) -> ArrivalLoad | None:
    """The load of one replay.

    Args:
        arrivals: when each request arrived (step or second).
        begins: when each began to be served, in the same unit (a negative value or ``inf``:
            it never began).
        unit: what the times are in.

    Returns:
        The load; ``None`` where every request arrives at once (no window: a burst has no
        rate to outpace) or there are none.
    """
    if not arrivals:
        return None
    first, last = min(arrivals), max(arrivals)
    window = last - first
    if window <= 0:
        return None
    arrived = sorted(arrivals)
    began = sorted(b for b in begins if 0 <= b < math.inf)

    def waiting(at: float) -> int:
        return bisect.bisect_right(arrived, at) - bisect.bisect_right(began, at)

    served = bisect.bisect_right(began, last)
    return ArrivalLoad(
        unit=unit,
        window=window,
        arrivals=len(arrivals),
        arrival_rate=len(arrivals) / window,
        served_rate=served / window,
        waiting_half_way=waiting(first + window / 2),
        waiting_at_last_arrival=waiting(last),
    )
