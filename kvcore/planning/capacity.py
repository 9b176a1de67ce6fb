"""What a plan means for capacity: one :class:`Capacity` value per plan, and the bound it is
judged against.

For a request length ``L``, no layout can hold more than ``available_bytes`` over the bytes one
request's layers hold at its worst moment (their joint peak, :func:`request_bytes`) requests
at once: that is the *ideal concurrency*. A plan's efficiency is its own concurrency divided by this bound.

Every figure the command line, ``kvcore compare``, the engine log and the memory map show is
read from :meth:`Capacity.of`, computed once per plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from kvcore.peaks import joint_peak, spec_peak
from kvcore.plan import KVCachePlan
from kvcore.spec import KVCacheSpec, SizingContext


def blocks_that_fit(available_bytes: int, bytes_per_block: int) -> int:
    """Block ids of ``bytes_per_block`` bytes that ``available_bytes`` holds (0 for a free block).

    Args:
        available_bytes: the byte budget.
        bytes_per_block: what one block id costs (0 when there is nothing to place).

    Returns:
        ``available_bytes // bytes_per_block``, or 0 when ``bytes_per_block`` is 0.
    """
    return available_bytes // bytes_per_block if bytes_per_block else 0


def split_by_fractions(
    available_bytes: int, bytes_per_block: Sequence[int], fractions: Sequence[float]
) -> tuple[int, ...]:
    """Block counts for several pools that share one budget, pool ``p`` taking the share
    ``fractions[p]`` of it (:attr:`~kvcore.policy.PlanOptions.pool_split`).

    Pool ``p`` gets ``floor(available_bytes x fractions[p] / bytes_per_block[p])`` ids; the
    fractions sum to 1 (checked where they are given), and should float rounding make the pools
    take a byte more than the budget, the pool of the largest blocks gives one back until they
    do not.

    Args:
        available_bytes: the budget.
        bytes_per_block: what one block id of each pool costs (0: the pool has no bytes here).
        fractions: the share of each pool.

    Returns:
        The block count of each pool (0 for a pool of no bytes).
    """
    counts = [
        int(available_bytes * fraction) // size if size else 0
        for fraction, size in zip(fractions, bytes_per_block, strict=True)
    ]
    # the fractions sum to 1 only within float rounding: never let that exceed the budget
    while sum(c * b for c, b in zip(counts, bytes_per_block, strict=True)) > available_bytes:
        largest = max((p for p, c in enumerate(counts) if c), key=lambda p: bytes_per_block[p])
        counts[largest] -= 1
    return tuple(counts)


def split_budget(
    available_bytes: int, bytes_per_block: Sequence[int], need: Sequence[int]
) -> tuple[int, ...]:
    """Block counts for several pools that share one budget, each in proportion to the block
    ids one request needs in it, so that the pools run out together.

    A request of the worst case needs ``need[p]`` ids of pool ``p``, so the plan holds
    ``min(count[p] / need[p])`` requests; the counts that maximise it given
    ``sum(count[p] * bytes_per_block[p]) <= available_bytes`` are ``need[p]`` times one common
    factor, rounded down, and the bytes left over then go a block at a time to the pool that
    holds the fewest requests. A pool no request needs (``need[p] == 0``) gets none.

    Args:
        available_bytes: the budget.
        bytes_per_block: what one block id of each pool costs (0: the pool has no bytes here,
            as on a rank that holds none of its layers).
        need: block ids of each pool one request holds at most.

    Returns:
        The block count of each pool; with one pool, ``blocks_that_fit``.
    """
    if len(bytes_per_block) == 1:
        return (blocks_that_fit(available_bytes, bytes_per_block[0]),)
    per_unit = sum(n * b for n, b in zip(need, bytes_per_block, strict=True))
    if not per_unit:
        return tuple(0 for _ in need)
    units = available_bytes // per_unit
    counts = [units * n for n in need]
    left = available_bytes - units * per_unit
    # one block at a time to the pool that holds the fewest requests, while the bytes last:
    # at most one round per block id of the largest need
    while True:
        order = sorted((c / n, p) for p, (c, n) in enumerate(zip(counts, need, strict=True)) if n)
        grew = False
        for _, p in order:
            if bytes_per_block[p] <= left:
                counts[p] += 1
                left -= bytes_per_block[p]
                grew = True
                break
        if not grew or not left:
            break
    return tuple(counts)


def own_pool_blocks(plan: KVCachePlan) -> tuple[int, ...]:
    """The block count of each pool that the plan's own budget holds, split as the plan was
    split: by :attr:`~kvcore.plan.KVCachePlan.pool_split` where it records one
    (:func:`split_by_fractions`), else by what one request of ``max_model_len`` needs of each
    pool (:func:`split_budget`). For a plan of one pool, :func:`blocks_that_fit`.

    What a forced block count or the tightest of several ranks set aside, this is what the
    budget would give: the figure ``Capacity.blocks_that_fit`` and the per-rank report show.
    """
    pool_bytes = [pool.bytes_per_block for pool in plan.pools]
    split = plan.pool_split
    if split is not None and len(split) == len(pool_bytes) > 1:
        return split_by_fractions(plan.available_memory_bytes, pool_bytes, split)
    return split_budget(plan.available_memory_bytes, pool_bytes, plan.blocks_per_request_by_pool())


def request_bytes(specs: Mapping[str, KVCacheSpec], context: SizingContext) -> int:
    """Bytes one request of ``context.max_model_len`` tokens needs at its worst moment, over
    every layer: the joint peak of the layers' pages (:func:`~kvcore.peaks.spec_peak`), not
    the sum of each layer's own worst case.

    Each distinct spec object is asked once, however many layers share it.
    """
    return spec_peak(specs, context)


#: How an unbounded figure reads in text (a plan with no cache-holding layer holds any number
#: of requests); JSON writes it as ``null`` (:func:`finite_or_none`).
UNBOUNDED = "unbounded"


def format_figure(value: float | None, spec: str = ",.2f") -> str:
    """``value`` formatted with ``spec``, or :data:`UNBOUNDED` for ``None`` or infinity."""
    return UNBOUNDED if value is None or math.isinf(value) else format(value, spec)


def finite_or_none(value: float | None) -> float | None:
    """``value`` for JSON: ``None`` (``null``) for an unbounded figure, which JSON cannot
    write (``Infinity`` is not JSON)."""
    return None if value is None or math.isinf(value) else value


def _ideal(available_bytes: int, need: int) -> float:
    return available_bytes / need if need else float("inf")


def ideal_concurrency(
    specs: Mapping[str, KVCacheSpec], available_bytes: int, context: SizingContext
) -> float:
    """The most requests of ``context.max_model_len`` tokens any layout could hold."""
    return _ideal(available_bytes, request_bytes(specs, context))


@attrs.frozen(kw_only=True)
class Capacity:
    """What one plan holds, beside the bound no layout can beat (for the plan's own budget and
    request length).

    Attributes:
        max_model_len: the request length the figures are for.
        blocks_per_request: block ids one request holds at most, its groups together at their
            worst moment (each pool's joint peak, summed over pools).
        request_bytes: the bytes those block ids account for (``blocks_per_request x
            bytes_per_block``, summed over pools).
        ideal_request_bytes: the bytes one request's layers hold together at their worst moment.
        padding_bytes: ``request_bytes - ideal_request_bytes``: what the layout costs a request
            beyond what its layers need.
        max_concurrency: requests of ``max_model_len`` tokens the pool holds at once.
        ideal_concurrency: the budget over ``ideal_request_bytes``.
        efficiency: ``max_concurrency / ideal_concurrency`` (0 when the bound is 0; 1 when both
            are unbounded, as for a plan with no cache-holding layer).
        kv_cache_tokens: tokens the pool holds in requests of ``max_model_len``
            (``int(max_concurrency x max_model_len)``); ``None`` when unbounded.
        blocks_that_fit: block ids the budget holds (the block count unless it was forced).
        tokens_held: per group, the tokens the whole pool could hold for its layers (``None``
            for a per-request state).
        pools: how many block pools the plan has.
    """

    max_model_len: int
    blocks_per_request: int
    request_bytes: int
    ideal_request_bytes: int
    padding_bytes: int
    max_concurrency: float
    ideal_concurrency: float
    efficiency: float
    kv_cache_tokens: int | None
    blocks_that_fit: int
    tokens_held: tuple[int | None, ...]
    pools: int = 1

    @property
    def unbounded(self) -> bool:
        """Whether no request needs a block (a plan with no cache-holding layer): the
        concurrency and token figures are then infinite, shown as :data:`UNBOUNDED`."""
        return math.isinf(self.max_concurrency)

    @classmethod
    def of(cls, plan: KVCachePlan, specs: Mapping[str, KVCacheSpec] | None = None) -> Capacity:
        """The capacity of ``plan``.

        Args:
            plan: the plan.
            specs: the layer specs it was made from, for the ideal figures. By default each
                layer's group spec stands in for its own, which is exact unless the policy
                enlarged the group's block size (only the ideal figures depend on it).

        Returns:
            The figures.
        """
        context = plan.context
        if specs is not None:
            need = request_bytes(specs, context)
        else:
            need = joint_peak(
                ((g.spec, len(g.layer_names) * g.spec.page_size_bytes) for g in plan.groups), context
            )
        by_pool = plan.blocks_per_request_by_pool()
        pool_bytes = [pool.bytes_per_block for pool in plan.pools]
        held = sum(n * b for n, b in zip(by_pool, pool_bytes, strict=True))
        concurrency = plan.max_concurrency()
        ideal = _ideal(plan.available_memory_bytes, need)
        # no layer needs bytes: both figures are infinite, and nothing is wasted
        unbounded = math.isinf(concurrency)
        return cls(
            max_model_len=context.max_model_len,
            blocks_per_request=sum(by_pool),
            request_bytes=held,
            ideal_request_bytes=need,
            padding_bytes=held - need,
            max_concurrency=concurrency,
            ideal_concurrency=ideal,
            efficiency=1.0 if unbounded and math.isinf(ideal) else concurrency / ideal if ideal else 0.0,
            kv_cache_tokens=None if unbounded else int(concurrency * context.max_model_len),
            blocks_that_fit=sum(own_pool_blocks(plan)),
            tokens_held=tuple(plan.tokens_held(g) for g in plan.groups),
            pools=len(plan.pools),
        )


def efficiency(plan: KVCachePlan, specs: Mapping[str, KVCacheSpec]) -> float:
    """``plan.max_concurrency() / ideal_concurrency(...)`` for the plan's own budget and context
    (:attr:`Capacity.efficiency`)."""
    return Capacity.of(plan, specs).efficiency
