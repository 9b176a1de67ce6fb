"""A plan's host tier from one figure: ``--host-memory SIZE`` shared among the plan's pools.

:func:`with_host_memory` gives a plan an :class:`~kvcore.plan.OffloadTier` of ``nbytes`` of host
memory, shared among its pools as :func:`~kvcore.plan.split_host_memory` shares it, and refuses
an amount that would leave a pool unable to hold one of its pages on the host (the plan check,
:func:`~kvcore.planning.invariants.offload_tier_problems`, allows a pool a share of 0; asked
for host memory, every pool with pages should get some).
"""

from __future__ import annotations

from kvcore.errors import InvalidInputError
from kvcore.plan import KVCachePlan, split_host_memory
from kvcore.planning.invariants import check_plan, host_page_bytes, smallest_host_memory
from kvcore.units import format_bytes


def with_host_memory(plan: KVCachePlan, nbytes: int) -> KVCachePlan:
    """``plan`` with a host tier of ``nbytes`` shared among its pools (``0``: without a tier).

    Args:
        plan: the plan.
        nbytes: host bytes for the whole tier.

    Returns:
        The plan with its :attr:`~kvcore.plan.KVCachePlan.offload_tier` set, checked.

    Raises:
        InvalidInputError: a pool's share cannot hold one of its pages; says the least host
            memory that serves every pool.
        PlanValidationError: the plan with its tier fails the plan check.
    """
    if not nbytes or not plan.groups:
        return plan.with_offload_tier(None)
    tier = split_host_memory(plan.pools, nbytes)
    for p, share in enumerate(tier.pool_bytes):
        page = host_page_bytes(plan, p)
        if plan.pools[p].nbytes and share < page:
            where = f"pool {p} gets" if plan.names_pools else "it gives"
            raise InvalidInputError(
                f"host memory of {format_bytes(nbytes)} ({nbytes:,} bytes) cannot hold one page of the plan: "
                f"{where} {share:,} bytes for pages of {page:,} bytes; give at least "
                f"{format_bytes(smallest_host_memory(plan))} ({smallest_host_memory(plan):,} bytes), or none"
            )
    out = plan.with_offload_tier(tier)
    check_plan(out, source="with_host_memory()", structure=False, capacity=False)
    return out
