"""Admission: can a plan hold one request of ``max_model_len`` tokens? If not, say what fits."""

from __future__ import annotations

from collections.abc import Callable

from kvcore.error_messages import with_message
from kvcore.errors import InsufficientMemoryError
from kvcore.plan import KVCachePlan


def check_admission(
    plan: KVCachePlan,
    *,
    forced_num_blocks: bool = False,
    largest_admitted: Callable[[], int] | None = None,
) -> None:
    """Raise unless one request of the plan's ``max_model_len`` fits in its block pools (in
    each of them, for a plan of several).

    Args:
        plan: the plan to check.
        forced_num_blocks: the block count was forced by the caller (``num_blocks=``), so the
            fix to suggest is a larger block count rather than more memory.
        largest_admitted: called on failure only: the largest ``max_model_len`` that planning
            with the same inputs admits (the planner passes its search over plans at other
            lengths, where the grouping may differ:
            :func:`~kvcore.planning.planner.longest_admitted`). ``None``: the largest length
            this plan's own grouping holds (:meth:`~kvcore.plan.KVCachePlan.largest_fitting_len`).

    Raises:
        InsufficientMemoryError: with the bytes and blocks needed and available, the largest
            ``max_model_len`` that fits, and the fix (``reason`` ``"num_blocks"`` or ``"memory"``).
    """
    if plan.fits():
        return
    largest = largest_admitted() if largest_admitted is not None else plan.largest_fitting_len()
    by_pool = plan.blocks_per_request_by_pool()
    one_pool = len(plan.pools) == 1
    raise with_message(
        InsufficientMemoryError(
            reason="num_blocks" if forced_num_blocks else "memory",
            required_bytes=sum(n * pool.bytes_per_block for n, pool in zip(by_pool, plan.pools, strict=True)),
            available_bytes=plan.kv_cache_bytes if forced_num_blocks else plan.available_memory_bytes,
            max_model_len=plan.context.max_model_len,
            largest_fitting_len=largest,
            required_blocks=sum(by_pool),
            available_blocks=plan.usable_blocks,
            bytes_per_block=plan.pools[0].bytes_per_block if one_pool else None,
            required_pool_blocks=None if one_pool else tuple(by_pool),
            available_pool_blocks=(
                None if one_pool else tuple(plan.usable_blocks_in(p) for p in range(len(plan.pools)))
            ),
        )
    )
