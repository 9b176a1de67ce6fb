"""Per-step figures of a simulation, stored as runs of equal values.

A workload whose requests arrive ten million steps apart (``arrival_step`` up to
:data:`~kvcore.simulation.workload.MAX_ARRIVAL_STEP`) has ten million idle steps; the
simulator jumps over them in one go, and :class:`StepSeries` records the stretch as one run, so
that memory and time grow with the steps where something happens, not with the clock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import TypeVar, overload

T = TypeVar("T", int, float)


class StepSeries(Sequence[T]):
    """A sequence of one value per step, stored as runs of equal consecutive values.

    It reads as the tuple of its values (indexing, slicing, iteration, ``len``, ``==`` with a
    tuple or list), at the memory of its runs.
    """

    __slots__ = ("_ends", "_values")

    def __init__(self, values: Sequence[T] = ()) -> None:
        self._values: list[T] = []  # the value of each run
        self._ends: list[int] = []  # the step after each run's last one
        for value in values:
            self.append(value)

    def append(self, value: T) -> None:
        """Add one step's value."""
        self.extend_repeat(value, 1)

    def extend_repeat(self, value: T, count: int) -> None:
        """Add ``count`` steps of ``value`` (an idle stretch is one call)."""
        if count <= 0:
            return
        ends = self._ends
        if ends and self._values[-1] == value:
            ends[-1] += count
        else:
            self._values.append(value)
            ends.append((ends[-1] if ends else 0) + count)

    def copy(self) -> StepSeries[T]:
        """A copy that later appends to this one do not change (copies the runs, not the steps)."""
        other: StepSeries[T] = StepSeries()
        other._values, other._ends = list(self._values), list(self._ends)
        return other

    def total(self) -> float:
        """The sum of every step's value (an exact int for a series of ints)."""
        start = 0
        total: float = 0  # an int until a float value is added
        for value, end in zip(self._values, self._ends, strict=True):
            total += value * (end - start)
            start = end
        return total

    def peak(self, default: T) -> T:
        """The largest value, or ``default`` when there are no steps."""
        return max(self._values, default=default)

    @property
    def num_runs(self) -> int:
        """How many runs of equal values it stores (its memory)."""
        return len(self._values)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        length = len(self)
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError("step index out of range")
        return self._values[bisect_right(self._ends, index)]

    def __iter__(self) -> Iterator[T]:
        start = 0
        for value, end in zip(self._values, self._ends, strict=True):
            yield from repeat(value, end - start)
            start = end

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepSeries):
            return self._values == other._values and self._ends == other._ends
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))  # equal to the tuple of its values, so hashed as it

    def __repr__(self) -> str:
        return f"StepSeries({len(self)} steps in {self.num_runs} runs)"
