"""The ideal capacity bound a plan is judged against.

For a request length ``L``, no layout can hold more than
``available_bytes / sum over layers of max_memory_usage_bytes(L)`` requests at once: that is
the *ideal concurrency*. A plan's efficiency is its own concurrency divided by this bound.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvcore.plan import KVCacheConfig
from kvcore.spec import KVCacheSpec, SizingContext


def request_bytes(specs: Mapping[str, KVCacheSpec], context: SizingContext) -> int:
    """Bytes one request of ``context.max_model_len`` tokens needs, summed over layers."""
    return sum(spec.max_memory_usage_bytes(context) for spec in specs.values())


def ideal_concurrency(
    specs: Mapping[str, KVCacheSpec], available_bytes: int, context: SizingContext
) -> float:
    """The most requests of ``context.max_model_len`` tokens any layout could hold."""
    need = request_bytes(specs, context)
    return available_bytes / need if need else float("inf")


def efficiency(plan: KVCacheConfig, specs: Mapping[str, KVCacheSpec]) -> float:
    """``plan.max_concurrency() / ideal_concurrency(...)`` for the plan's own budget and context."""
    ideal = ideal_concurrency(specs, plan.available_memory_bytes, plan.context)
    if ideal == 0:
        return 0.0
    return plan.max_concurrency() / ideal
