"""What vLLM 0.33's KV-cache manager needs to know of a kvcore plan's groups, shared by the
``vllm`` profile's fast path (:mod:`kvcore.simulation.profiles.vllm`) and its reference
(:mod:`kvcore.simulation.profiles.vllm_reference`): each group's pages, window and admission
cap, the scheduler's block (prefix hits are multiples of it), and the chunked local groups
vLLM's prefix cache cannot look up.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import attrs

from kvcore.errors import SimulationWarning
from kvcore.spec import KVCacheSpec, SizingContext, cdiv

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan


@attrs.frozen
class ManagerGroup:
    """What the manager of one plan group needs: its pages and how they free."""

    pool: int
    tokens_per_page: int  # 0: a per-request state (one page)
    span: int  # block ids one page takes
    windowed: bool  # frees pages before its window (first_retained_token)
    spec: KVCacheSpec
    cap: int | None  # vLLM's max_admission_blocks_per_request, in pages
    sliding: int  # the window, for cache hits (0: hits from the start or its chunk's; -1: never hits)
    chunk: int  # chunked local attention's chunk, for cache hits (0: not chunked)


def scheduler_block(plan: KVCachePlan) -> int:
    """vLLM's scheduler block for ``plan``: the least common multiple of its groups' block sizes
    (a state group counts 1). Prefix hits are multiples of it."""
    return math.lcm(*(group.spec.tokens_per_page or 1 for group in plan.groups))


def chunks_off_scheduler_block(plan: KVCachePlan) -> list[int]:
    """The chunked local attention groups of ``plan`` whose block is not its
    :func:`scheduler_block`: vLLM 0.33's prefix-cache lookup asserts that it is
    (``ChunkedLocalAttentionManager.find_longest_cache_hit``)."""
    block = scheduler_block(plan)
    return [
        index
        for index, group in enumerate(plan.groups)
        if getattr(group.spec, "attention_chunk_size", None) and group.spec.tokens_per_page != block
    ]


def manager_group(
    spec: KVCacheSpec, pool: int, span: int, context: SizingContext, *, hits_chunk: bool
) -> ManagerGroup:
    """A plan group as the manager sees it; ``hits_chunk``: a chunked local group on the
    scheduler's block, which prefix hits look up (see :func:`chunks_off_scheduler_block`)."""
    per_page = spec.tokens_per_page or 0
    windowed = per_page > 0 and type(spec).first_retained_token is not KVCacheSpec.first_retained_token
    window = getattr(spec, "sliding_window", None)
    sliding = 0 if not windowed and per_page else (window if isinstance(window, int) and window > 0 else -1)
    chunk = getattr(spec, "attention_chunk_size", 0) if windowed else 0
    if chunk and hits_chunk:
        sliding = 0  # hits from its chunk's start
    elif chunk:
        # vLLM's lookup asserts a chunked group's block is the scheduler's; the vLLM adapter
        # plans such models with one block size, and here such a group never hits
        chunk = 0
    return ManagerGroup(
        pool=pool,
        tokens_per_page=per_page,
        span=span,
        windowed=windowed,
        spec=spec,
        cap=spec.max_num_blocks(context) if windowed else None,
        sliding=sliding,
        chunk=chunk,
    )


def warn_unhit_chunks(plan: KVCachePlan, index: int) -> None:
    """Warn that chunked local group ``index`` is off the scheduler block: vLLM 0.33 stops on
    such a plan at its first prefix-cache lookup, and the profile lets the group never hit, so
    the plan hits nothing."""
    warnings.warn(
        SimulationWarning(
            f"policy {plan.policy!r}: chunked local attention group {index} has blocks of "
            f"{plan.groups[index].spec.tokens_per_page} tokens, not the scheduler's {scheduler_block(plan)} "
            "(the least common multiple of every group's block size); vLLM 0.33 stops on such a plan at "
            "its first prefix-cache lookup, and here its chunked groups never hit, so the plan hits "
            "nothing; plan with uniform_block_size=True (one block size) for the hits vLLM would find"
        ),
        stacklevel=4,
    )


def pages(group: ManagerGroup, tokens: int) -> int:
    """Pages covering ``tokens`` (a state: one page from the first token)."""
    if not group.tokens_per_page:
        return 1 if tokens > 0 else 0
    return cdiv(tokens, group.tokens_per_page)


def usable_text(plan: KVCachePlan) -> str:
    if len(plan.pools) == 1:
        return str(plan.usable_blocks)
    return ", ".join(f"{plan.usable_blocks_in(p)} in pool {p}" for p in range(len(plan.pools)))
