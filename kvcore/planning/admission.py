"""Admission: can a plan hold one request of ``max_model_len`` tokens? If not, say what fits."""

from __future__ import annotations

from kvcore.errors import InsufficientMemoryError
from kvcore.plan import KVCacheConfig
from kvcore.units import format_bytes


def check_admission(plan: KVCacheConfig, *, forced_num_blocks: bool = False) -> None:
    """Raise unless one request of the plan's ``max_model_len`` fits in its block pool.

    Args:
        plan: the plan to check.
        forced_num_blocks: the block count was forced by the caller (``--num-blocks``), so the
            fix to suggest is a larger block count rather than more memory.

    Raises:
        InsufficientMemoryError: with the bytes needed, the bytes available, the largest
            ``max_model_len`` that fits, and the fix.
    """
    length = plan.context.max_model_len
    needed_blocks = plan.blocks_per_request()
    if needed_blocks <= plan.num_blocks:
        return
    needed_bytes = needed_blocks * plan.bytes_per_block
    largest = plan.largest_fitting_len()
    if forced_num_blocks:
        have = f"--num-blocks {plan.num_blocks} holds {format_bytes(plan.kv_cache_bytes)}"
        fix = f"raise --num-blocks to at least {needed_blocks}"
        available = plan.kv_cache_bytes
    else:
        have = (
            f"only {format_bytes(plan.available_memory_bytes)} is available "
            f"({plan.num_blocks} blocks of {format_bytes(plan.bytes_per_block)})"
        )
        fix = "give the KV cache more memory (--memory, or a higher utilization)"
        available = plan.available_memory_bytes
    if largest > 0:
        fits = (
            f"the largest max_model_len that fits is {largest}; lower --max-model-len to {largest} or {fix}"
        )
    else:
        fits = f"not even a one-token request fits; {fix}"
    raise InsufficientMemoryError(
        f"one request of {length} tokens needs {format_bytes(needed_bytes)} of KV cache "
        f"({needed_blocks} blocks of {format_bytes(plan.bytes_per_block)}) but {have}; {fits}",
        required_bytes=needed_bytes,
        available_bytes=available,
        max_model_len=length,
        largest_fitting_len=largest,
    )
