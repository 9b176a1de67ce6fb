"""How far a timed run's steps reach beyond the steps its measured profile was fitted on.

A measured step profile (:class:`~kvcore.simulation.timing.StepProfile`) is a line fitted to
the steps an engine ran while ``kvcore profile`` watched it. A simulated step beyond them (a
longer context, a wider batch, a longer prompt chunk than any measured) gets the line's
extrapolation, which nothing measured backs; and where a noisy fit has a negative coefficient,
the line can fall to 0 s there (the profile clamps it at 0). Either way the seconds a
simulation reports are not what the profile measured, and a user should be told.

So the profile keeps the range its samples measured of each fitted term
(:class:`MeasuredRange`), the stepper tallies each timed step against them
(:class:`ReachTally`), and the run's :class:`ProfileReach` says how many steps fell outside
and how far. Terms are checked one at a time: a step whose every term lies inside its range,
in a combination never measured, is not flagged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs


@attrs.frozen(kw_only=True)
class MeasuredRange:
    """The values one term of a profile took over its samples.

    Attributes:
        term: the term's name (:data:`~kvcore.simulation.profile_file.PROFILE_TERMS`).
        low: its least value over the samples.
        high: its greatest.
    """

    term: str
    low: float
    high: float


@attrs.frozen(kw_only=True)
class TermReach:
    """One term's values over a run, beside the range its profile measured.

    Attributes:
        term: the term's name.
        low: the least value the profile measured.
        high: the greatest value the profile measured.
        least: the least value over the run's timed steps.
        most: the greatest value over the run's timed steps.
        steps_outside: the timed steps whose value lies outside ``low..high``.
    """

    term: str
    low: float
    high: float
    least: float
    most: float
    steps_outside: int

    @property
    def text(self) -> str:
        """``context tokens up to 48,000 (measured 0 to 12,288)``."""
        name = self.term.replace("_", " ")
        measured = f"(measured {self.low:,.0f} to {self.high:,.0f})"
        beyond = []
        if self.least < self.low:
            beyond.append(f"down to {self.least:,.0f}")
        if self.most > self.high:
            beyond.append(f"up to {self.most:,.0f}")
        return f"{name} {' and '.join(beyond)} {measured}"


@attrs.frozen(kw_only=True)
class ProfileReach:
    """How a timed run's steps lay against the steps its profile measured.

    Attributes:
        steps: the run's timed steps (those that scheduled something).
        outside: those with some term outside the range its samples measured.
        at_zero: those the profile predicted at 0 s (its line, clamped at 0).
        terms: each term some step went outside the range of, in the profile's order.
    """

    steps: int
    outside: int
    at_zero: int
    terms: tuple[TermReach, ...] = ()

    @property
    def share_outside(self) -> float:
        """The share of the timed steps outside the measured ranges."""
        return self.outside / self.steps if self.steps else 0.0

    @property
    def summary(self) -> str | None:
        """One line for a report, or ``None`` when every step lay inside what was measured."""
        if not self.outside and not self.at_zero:
            return None
        parts = []
        if self.outside:
            beyond = "; ".join(t.text for t in self.terms)
            parts.append(
                f"{self.outside:,} of {self.steps:,} steps ({100 * self.share_outside:.1f} %) lie beyond "
                f"the steps the profile measured, their seconds the fitted line extrapolated: {beyond}"
            )
        if self.at_zero:
            parts.append(
                f"steps predicted at 0 s: {self.at_zero:,} (the line falls below 0 there); measure "
                "the engine over the range the simulation runs (kvcore profile)"
            )
        return "; ".join(parts)


class ReachTally:
    """Tallies a run's timed steps against a profile's :class:`MeasuredRange` s.

    Args:
        ranges: what the profile's samples measured, one range per fitted term.
    """

    def __init__(self, ranges: Sequence[MeasuredRange]) -> None:
        self._ranges = tuple(ranges)
        self._least = [r.high for r in self._ranges]
        self._most = [r.low for r in self._ranges]
        self._outside = [0] * len(self._ranges)
        self.steps = 0
        self.outside = 0
        self.at_zero = 0

    def add(self, values: Mapping[str, float], seconds: float) -> None:
        """Count one step that ran something, of ``values`` (each term's:
        :meth:`~kvcore.simulation.steps.StepRecord.term_values`), timed at ``seconds``."""
        self.steps += 1
        if seconds <= 0:
            self.at_zero += 1
        beyond = False
        for k, measured in enumerate(self._ranges):
            value = values[measured.term]
            if value < self._least[k]:
                self._least[k] = value
            if value > self._most[k]:
                self._most[k] = value
            if not measured.low <= value <= measured.high:
                self._outside[k] += 1
                beyond = True
        self.outside += beyond

    def reach(self) -> ProfileReach:
        """The run so far."""
        terms = tuple(
            TermReach(term=r.term, low=r.low, high=r.high, least=least, most=most, steps_outside=outside)
            for r, least, most, outside in zip(
                self._ranges, self._least, self._most, self._outside, strict=True
            )
            if outside
        )
        return ProfileReach(steps=self.steps, outside=self.outside, at_zero=self.at_zero, terms=terms)


def measured_ranges(terms: Sequence[str], rows: Sequence[Sequence[float]]) -> tuple[MeasuredRange, ...]:
    """The range of each of ``terms`` over ``rows`` (one value per term each, in that order)."""
    return tuple(
        MeasuredRange(term=term, low=min(row[k] for row in rows), high=max(row[k] for row in rows))
        for k, term in enumerate(terms)
    )
