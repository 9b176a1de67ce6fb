"""What a scheduler step did, as a step-time model reads it, and what a timed run recorded.

A scheduler (:mod:`kvcore.simulation.simulator`, or any other that feeds the same records)
describes each step by a :class:`StepRecord`; a :class:`StepTimeModel`
(:mod:`kvcore.simulation.timing`: a roofline from the model and the GPU, or a measured profile)
turns it into seconds. The run's clock and each request's events in seconds are a
:class:`Timeline`, from which :func:`kvcore.simulation.timing.latency_report` computes latencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import attrs

if TYPE_CHECKING:  # profile_reach reads StepRecord from here
    from kvcore.simulation.profile_reach import ProfileReach


class StepRecord(NamedTuple):
    """What one scheduler step computed (a named tuple: one is made per simulated step, and a
    tuple is several times cheaper to make than an attrs instance).

    Attributes:
        prefill_tokens: tokens computed by requests that computed more than one token in the
            step (prompt chunks, recomputation after a preemption).
        decode_tokens: requests that computed exactly one token (one token each).
        requests: requests scheduled in the step (``decode_tokens`` plus those prefilling).
        context_tokens: over the scheduled requests, the tokens each has cached once the step's
            are written: the KV entries the step's attention reads.
        attention_pairs: over every token computed, the tokens it attends to (itself and those
            before it): query-key pairs, which the attention FLOPs scale with.
    """

    prefill_tokens: int
    decode_tokens: int
    requests: int
    context_tokens: int
    attention_pairs: int

    def term_values(self) -> dict[str, float]:
        """The step's value of each term a measured profile can fit (``fixed`` aside; the names
        of :data:`~kvcore.simulation.profile_file.PROFILE_TERMS`)."""
        return {
            "prefill_tokens": self.prefill_tokens,
            "decode_requests": self.decode_tokens,
            "context_tokens": self.context_tokens,
            "attention_pairs": self.attention_pairs,
            "prefill_requests": self.requests - self.decode_tokens,
        }


class StepTimeModel(Protocol):
    """Seconds one scheduler step takes on some hardware.

    A model fitted to measured steps may also have ``measured``, a tuple of
    :class:`~kvcore.simulation.profile_reach.MeasuredRange` (what its samples covered, as
    :class:`~kvcore.simulation.timing.StepProfile` has); a run it times then reports how far
    its steps went beyond them (:attr:`Timeline.reach`).
    """

    @property
    def description(self) -> str:
        """Which model produced the seconds, as reports state it (``"roofline on H100-SXM, a
        lower bound"``)."""
        ...

    def __call__(self, record: StepRecord) -> float:
        """The step's duration in seconds (``>= 0``)."""
        ...


@attrs.frozen(kw_only=True)
class Timeline:
    """A timed run: the clock after every step, and each request's events in seconds.

    Requests are in the workload's order; times are seconds since the run started (time 0).

    Attributes:
        model: the step-time model's :attr:`~StepTimeModel.description`.
        step_end: the clock when each step ended (an idle step, which runs nothing, takes no
            time).
        arrival: when each request arrived.
        first_token: when each request's first output token was sampled (the end of the step
            that computed the last token of its prompt).
        finish: when each request's last output token was sampled.
        reach: with a measured profile, how far the run's steps went beyond the steps it
            measured (``None`` for a model that says nothing of what it measured).
    """

    model: str
    step_end: tuple[float, ...] = attrs.field(repr=False)
    arrival: tuple[float, ...] = attrs.field(repr=False)
    first_token: tuple[float, ...] = attrs.field(repr=False)
    finish: tuple[float, ...] = attrs.field(repr=False)
    reach: ProfileReach | None = None

    @property
    def seconds(self) -> float:
        """The run's length: the clock when the last step ended."""
        return self.step_end[-1] if self.step_end else 0.0


def build_timeline(
    model: StepTimeModel,
    step_end: Sequence[float],
    arrival: Sequence[int] | Sequence[float],
    *,
    in_seconds: bool,
    first_token_step: Sequence[int],
    finish_step: Sequence[int],
    reach: ProfileReach | None = None,
) -> Timeline:
    """A timed run's :class:`Timeline`, from what any scheduler recorded step by step.

    Args:
        model: the step-time model that advanced the clock.
        step_end: the clock when each step ended.
        arrival: each request's arrival: seconds when ``in_seconds``, else the step it arrived
            at (a request arriving at step ``k`` arrives when step ``k`` starts).
        in_seconds: whether ``arrival`` is in seconds.
        first_token_step: the step that sampled each request's first output token (``-1``: none).
        finish_step: the step that sampled each request's last output token (``-1``: none).
        reach: how far the steps went beyond those the model measured (a measured profile).
    """

    def at(step: int) -> float:  # when ``step`` ended; NaN: not yet
        return step_end[step] if step >= 0 else float("nan")

    if in_seconds:
        arrived = tuple(float(t) for t in arrival)
    else:
        arrived = tuple(step_end[int(s) - 1] if s > 0 else 0.0 for s in arrival)
    return Timeline(
        model=model.description,
        step_end=tuple(step_end),
        arrival=arrived,
        first_token=tuple(at(s) for s in first_token_step),
        finish=tuple(at(s) for s in finish_step),
        reach=reach,
    )
