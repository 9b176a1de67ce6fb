"""Joint peaks: the most a request holds at one moment, summed over its groups at that moment.

Each group's worst case (:meth:`~kvcore.KVCacheSpec.max_num_blocks`) comes at its own moment:
a full-attention group holds most at the request's end, a chunked-local group in the middle
of a chunk, a sliding-window group wherever the window straddles one more page. A request
never holds every group's worst case at once, so the sum of them over-counts (12 full + 36
chunked-local(8192) layers: 1,472 blocks summed, 1,280 at the worst moment). What a request
needs is the *joint peak*: the largest sum over groups of the pages each holds during one
step, over every step of every chunking an engine may schedule.

A step starts with ``c`` tokens cached and computes up to ``n <= min(c + T, L)``
(``T`` = :attr:`~kvcore.SizingContext.max_tokens_per_step`, ``L`` the request length); during
it a group holds ``len(spec.live_pages(n, c))`` pages. Every ``c`` in ``0 .. L - 1`` starts a
step of some chunking, and ``n = min(c + T, L)`` holds the most, so the joint peak is
``max over c of sum(weight * len(live_pages(min(c + T, L), c)))`` (exact: some chunking
attains it). The largest sum comes at ``c = 0`` or where some kind's count grows
(:meth:`~kvcore.KVCacheSpec.growth_steps`); the walk visits those candidates from the end
backwards and stops when no earlier step can beat the best found: a group holds at most its
``max_num_blocks`` and at most ``live_pages(n).stop`` pages for a step ending by ``n``.

Equal specs are asked once, with their weights added (a plan's groups of one spec, a model's
layers of one spec), and results are cached per (specs, weights, length, step size).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable, Mapping
from typing import Protocol

from kvcore.spec import KVCacheSpec, SizingContext


class PooledGroup(Protocol):
    """What :func:`pool_peaks` reads of a group (a :class:`~kvcore.plan.KVCacheGroup`)."""

    @property
    def spec(self) -> KVCacheSpec: ...

    @property
    def blocks_per_page(self) -> int: ...

    @property
    def pool(self) -> int: ...

#: Candidates the walk visits at most before it settles for the bound it has reached (the
#: sum of each group's worst case over the steps it did not visit): an upper bound that keeps
#: planning fast for lengths of billions of tokens; exact whenever the walk ends before.
MAX_WALK = 1 << 16


def joint_peak(weighted: Iterable[tuple[KVCacheSpec, int]], context: SizingContext) -> int:
    """The largest weighted sum of pages a request of ``context.max_model_len`` tokens holds at
    one moment, over every chunking into steps of at most ``context.max_tokens_per_step``.

    Args:
        weighted: ``(spec, weight)`` pairs, e.g. a group's spec and its block ids per page, or a
            layer's spec and its page bytes. Each spec is served as the context says
            (:meth:`~kvcore.KVCacheSpec.sized_for`); equal specs add their weights.
        context: the request length and step size.

    Returns:
        ``max over c of sum(weight * len(spec.live_pages(min(c + T, L), c)))``; 0 for no specs.
    """
    return _peak(_merged(weighted, context), context)[0]


def worst_step(weighted: Iterable[tuple[KVCacheSpec, int]], context: SizingContext) -> int:
    """Where :func:`joint_peak` comes: the tokens cached when the step that holds the most
    starts (a step to ``min(c + T, L)``; an engine whose chunk boundaries fall on it holds the
    joint peak). Same arguments as :func:`joint_peak`; 0 for no specs."""
    return _peak(_merged(weighted, context), context)[1]


def _merged(
    weighted: Iterable[tuple[KVCacheSpec, int]], context: SizingContext
) -> tuple[tuple[KVCacheSpec, int], ...]:
    """The pairs with each spec served as ``context`` says and equal specs' weights added."""
    merged: dict[KVCacheSpec, int] = {}
    sized: dict[int, KVCacheSpec] = {}
    for spec, weight in weighted:
        if not weight:
            continue
        served = sized.get(id(spec))
        if served is None:
            served = sized[id(spec)] = spec.sized_for(context)
        merged[served] = merged.get(served, 0) + weight
    return tuple(merged.items())


def spec_peak(specs: Mapping[str, KVCacheSpec], context: SizingContext) -> int:
    """Bytes one request needs at its worst moment, over every layer of ``specs``: the joint
    peak with each layer weighted by its page bytes (the ideal a layout is judged against)."""
    counts: dict[int, tuple[KVCacheSpec, int]] = {}
    for spec in specs.values():
        known = counts.get(id(spec))
        counts[id(spec)] = (spec, known[1] + 1 if known else 1)
    return joint_peak(((spec, count * spec.page_size_bytes) for spec, count in counts.values()), context)


@functools.lru_cache(maxsize=4096)
def _peak(items: tuple[tuple[KVCacheSpec, int], ...], context: SizingContext) -> tuple[int, int]:
    """``(joint peak, the step start where it comes)`` of merged pairs."""
    length, per_step = context.max_model_len, context.max_tokens_per_step
    fixed = 0  # kinds whose growth is unknown: their worst case at every moment
    walked: list[tuple[KVCacheSpec, int, int]] = []
    steps: list[range] = []
    for spec, weight in items:
        growth = spec.growth_steps(context)
        most = spec.max_num_blocks(context)
        if growth is None:
            fixed += weight * most
        else:
            walked.append((spec, weight, most))
            if growth:
                steps.append(growth)
    if not walked:
        return fixed, 0

    def held(c: int) -> int:
        n = min(c + per_step, length)
        return sum(w * len(spec.live_pages(n, c)) for spec, w, _ in walked)

    def bound(c: int) -> int:
        # no step starting at or before c holds more than this (its n is at most min(c + T, L))
        n = min(c + per_step, length)
        return sum(w * min(most, spec.live_pages(n).stop) for spec, w, most in walked)

    best, where = held(0), 0
    last = None
    for visited, c in enumerate(heapq.merge(*(reversed(r) for r in steps), reverse=True)):
        if c == last:
            continue
        last = c
        ceiling = bound(c)
        if ceiling <= best:
            break
        if visited >= MAX_WALK:  # settle for the bound of every step not visited
            best, where = ceiling, c
            break
        now = held(c)
        if now > best:
            best, where = now, c
    return fixed + best, where


def pool_peaks(groups: Iterable[PooledGroup], num_pools: int, context: SizingContext) -> tuple[int, ...]:
    """Block ids one request needs in each pool: the joint peak of the pool's groups, each
    weighted by its block ids per page (a pool's groups draw from one free list, so what
    counts is their sum at the worst moment; pools are reserved each on its own).

    Args:
        groups: a plan's groups (each names its pool).
        num_pools: how many pools there are; a group of a pool beyond them is left out.
        context: the request length and step size.

    Returns:
        One count per pool (0 for a pool no group draws from).
    """
    members: list[list[tuple[KVCacheSpec, int]]] = [[] for _ in range(num_pools)]
    for group in groups:
        if group.pool < num_pools:
            members[group.pool].append((group.spec, group.blocks_per_page))
    return tuple(joint_peak(weighted, context) for weighted in members)
