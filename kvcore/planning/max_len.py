"""The longest request a budget admits, found with the real planner.

A plan groups layers for one request length, and the grouping may change with the length
(a policy sizes groups by a layer's worst case, which grows with ``max_model_len``). So the
largest length a plan made at length ``L`` would hold is not always admitted when planning at
that length: the plan there groups differently. The lengths here are found by planning:
length ``L`` is *admitted* when planning at ``L`` (same specs, budgets, policy, options and
block count) gives a pool that holds one request of ``L`` tokens.

:func:`largest_admitted_len` searches for the largest admitted length below a bound, asking a
caller-given function for the plans at a length (the planner passes the one function that
plans a request at a length, :func:`~kvcore.planning.planner.longest_admitted`; this module
does not import it). It descends from
the failing plan's own estimate, in steps that double, to an admitted length, gallops up from
it (+1, +2, +4, ...) to a refused one, then bisects between the two; the length it returns is
admitted and the next one is refused. Admission is monotone for a fixed grouping, and in
practice over the lengths; where a grouping change makes it jump, the search still returns a
length whose successor is refused. A search costs about two plans when the estimate is right
and two per doubling of its error otherwise (``benchmarks/suggestions.py`` counts them).

:func:`memory_bound` is the search's ceiling when nothing else bounds the length (``auto``
with no ``max_position_embeddings``): the longest request whose ideal need fits every rank's
budget; no layout admits a longer one. :func:`longest_between` is the bisection both use (and
the benchmarks that find an engine's longest admitted request).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import attrs

from kvcore.errors import InsufficientMemoryError
from kvcore.limits import MAX_TOKENS
from kvcore.peaks import joint_peak
from kvcore.plan import KVCachePlan
from kvcore.spec import KVCacheSpec, SizingContext

#: What :func:`largest_admitted_len` asks for: every rank's plan at a request length, made
#: without the admission check. It may raise :class:`~kvcore.errors.InsufficientMemoryError`
#: (a forced block count that the budget does not hold at that length): that length is refused.
PlansAt = Callable[[int], Sequence[KVCachePlan]]

#: The longest request :func:`memory_bound` considers (:data:`kvcore.limits.MAX_TOKENS`, the
#: longest kvcore accepts): a budget that holds one request this long bounds nothing.
LENGTH_CEILING = MAX_TOKENS


@attrs.frozen(kw_only=True)
class LengthSearch:
    """The outcome of a search for the longest admitted request.

    Attributes:
        length: the largest admitted length found (0 when not even one token is admitted).
        plans: how many plans the search made.
    """

    length: int
    plans: int


@attrs.frozen(kw_only=True)
class LengthChoice:
    """How ``max_model_len="auto"`` chose the request length.

    Attributes:
        max_model_len: the chosen length.
        cap: the most it could be (the caller's ``context.max_model_len``, e.g. a model's
            ``max_position_embeddings``), or ``None`` where memory alone bounded it.
        limited_by: ``"cap"`` when the cap itself is admitted, ``"memory"`` when the budget
            refuses one more token.
        plans: how many plans the choice took.
    """

    max_model_len: int
    cap: int | None
    limited_by: Literal["cap", "memory"]
    plans: int


class _Prober:
    """Plans at lengths through ``plans_at`` and counts the plans."""

    def __init__(self, plans_at: PlansAt) -> None:
        self.plans_at = plans_at
        self.count = 0

    def refused(self, length: int) -> int | None:
        """``None`` if ``length`` is admitted; else an estimate of the largest admitted length
        below it (the plan's own, for its grouping), at most ``length - 1``."""
        self.count += 1
        try:
            plans = self.plans_at(length)
        except InsufficientMemoryError:  # a forced block count the budget does not hold here
            return length - 1
        if all(plan.fits() for plan in plans):
            return None
        return min(plan.largest_fitting_len(length) for plan in plans)


def largest_admitted_len(plans_at: PlansAt, upper: int, *, estimate: int | None = None) -> LengthSearch:
    """The largest request length up to ``upper`` that planning admits, with its successor refused.

    Args:
        plans_at: every rank's plans at a length, without the admission check.
        upper: the longest length to consider (>= 1).
        estimate: a guess of the answer, below ``upper``, when ``upper`` is already known to
            be refused (the failing plan's own largest fitting length); ``None`` to plan at
            ``upper`` first.

    Returns:
        The length (``upper`` if it is admitted; else a length ``L`` admitted with ``L + 1``
        refused; 0 if length 1 is refused) and the number of plans made.
    """
    probe = _Prober(plans_at)
    if estimate is None:
        estimate = probe.refused(upper)
        if estimate is None:
            return LengthSearch(length=upper, plans=probe.count)
    refused = upper  # the shortest length known to be refused
    candidate = max(1, min(estimate, upper - 1))
    step = 1
    while True:  # descend to an admitted length, the steps doubling
        if candidate >= refused:
            candidate = refused - 1
        if candidate < 1:
            return LengthSearch(length=0, plans=probe.count)
        hint = probe.refused(candidate)
        if hint is None:
            break
        refused = candidate
        candidate = min(hint, candidate - step)
        step *= 2
    admitted = candidate
    step = 1
    while admitted + step < refused:  # gallop up: the estimate is usually right or close
        if probe.refused(admitted + step) is not None:
            refused = admitted + step
            break
        admitted += step
        step *= 2
    admitted = longest_between(lambda length: probe.refused(length) is None, admitted, refused)
    return LengthSearch(length=admitted, plans=probe.count)


def memory_bound(
    rank_specs: Sequence[Mapping[str, KVCacheSpec]],
    rank_memory: Sequence[int],
    context: SizingContext,
) -> int | None:
    """The longest request whose ideal need (a rank's layers at their joint peak) fits every rank's budget.

    No layout admits a longer request: a pool holding one request holds at least the bytes its
    layers need.

    Args:
        rank_specs: each rank's ``{layer: spec}``.
        rank_memory: each rank's byte budget.
        context: the step size (its ``max_model_len`` is ignored).

    Returns:
        The length (0 if not even one token fits), or ``None`` when a request of
        :data:`LENGTH_CEILING` tokens fits: the need stops growing, and memory bounds nothing.
    """
    ranks = [(_distinct(specs), memory) for specs, memory in zip(rank_specs, rank_memory, strict=True)]

    def fits(length: int) -> bool:
        sized = context.with_max_model_len(length)
        return all(
            joint_peak(((spec, count * spec.page_size_bytes) for spec, count in specs), sized) <= memory
            for specs, memory in ranks
        )

    if fits(LENGTH_CEILING):
        return None
    if not fits(1):
        return 0
    low, high = 1, 2  # low fits; find a high that does not
    while fits(high):
        low, high = high, 2 * high
    return longest_between(fits, low, high)


def longest_between(admits: Callable[[int], bool], admitted: int, refused: int) -> int:
    """The longest length ``admits`` accepts between a known admitted and a known refused one, by
    bisection.

    Args:
        admits: whether a request of a length is admitted; taken to be monotone (every length
            below an admitted one is admitted) between the two bounds.
        admitted: a length known to be admitted (or 0, trivially).
        refused: a longer length known to be refused.

    Returns:
        A length ``L`` with ``admitted <= L < refused``, ``admits(L)`` (or ``L == admitted``) and
        ``L + 1`` refused.
    """
    while refused - admitted > 1:
        middle = (admitted + refused) // 2
        if admits(middle):
            admitted = middle
        else:
            refused = middle
    return admitted


def _distinct(specs: Mapping[str, KVCacheSpec]) -> list[tuple[KVCacheSpec, int]]:
    """Each distinct spec of ``specs`` with how many layers have it."""
    counts: dict[KVCacheSpec, int] = {}
    for spec in specs.values():
        counts[spec] = counts.get(spec, 0) + 1
    return list(counts.items())
