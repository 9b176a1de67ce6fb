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

from kvcore.errors import InvalidInputError, SimulationWarning
from kvcore.spec import KVCacheSpec, SizingContext, cdiv

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan


@attrs.frozen
class ManagerGroup:
    """What the manager of one plan group needs: its pages and how they free."""

    pool: int
    tokens_per_page: int  # 0: a per-request state (one page); an align state: its state block
    span: int  # block ids one page takes
    windowed: bool  # frees pages before its window (first_retained_token)
    spec: KVCacheSpec
    cap: int | None  # vLLM's max_admission_blocks_per_request, in pages
    sliding: int  # the window, for cache hits (0: hits from the start or its chunk's; -1: never hits)
    chunk: int  # chunked local attention's chunk, for cache hits (0: not chunked)
    #: a state group in vLLM's ``mamba_cache_mode='align'``: the tokens a state block stands for
    #: (0: not such a group; the fast path never sets it, see :func:`align_state_block`)
    state_block: int = 0
    #: such a group's prefill checkpoint alignment where it holds prefill checkpoint blocks
    #: (vLLM's ``prefill_checkpoint_alignment`` beside ``num_prefill_checkpoint_blocks > 0``;
    #: 0: it exports none, see :func:`checkpoint_valid`)
    checkpoint_alignment: int = 0


def scheduler_block(plan: KVCachePlan) -> int:
    """vLLM's scheduler block for ``plan``: the least common multiple of its groups' block sizes
    (a state group counts 1; with prefix caching its state block counts, see
    :func:`align_state_block`). Prefix hits are multiples of it."""
    return math.lcm(*(group.spec.tokens_per_page or 1 for group in plan.groups))


def is_state(spec: KVCacheSpec) -> bool:
    """Whether ``spec`` is a per-request state kind (a page is a whole state, vLLM's
    ``MambaSpec``): no tokens per page, offloaded as a checkpoint."""
    return spec.tokens_per_page is None and spec.offload_unit == "checkpoint"


def align_state_block(plan: KVCachePlan) -> int:
    """The tokens each state block of ``plan`` stands for in vLLM's ``mamba_cache_mode='align'``,
    or 0 when the plan has no state group.

    vLLM 0.33 runs every Mamba layer in align mode when prefix caching is on and in ``'none'``
    when it is off, whatever a plan was sized for (``mamba_cache_mode`` is derived from
    ``enable_prefix_caching``: ``vllm/model_executor/models/config.py``,
    ``HybridAttentionMambaModelConfig``); plan with ``state_cache_mode='align'`` to size for the
    two states a request then holds. The Mamba block is the attention block in align mode
    (``mamba_block_size`` is the cache's ``block_size``): here the least common multiple of
    the attention groups' block sizes, or, with no attention group, the state spec's own
    ``block_size``.
    """
    states = [group.spec for group in plan.groups if is_state(group.spec)]
    if not states:
        return 0
    attention = [group.spec.tokens_per_page for group in plan.groups if group.spec.tokens_per_page]
    if attention:
        return math.lcm(*attention)
    return max(int(getattr(spec, "block_size", 1) or 1) for spec in states)


def check_align_states(plan: KVCachePlan, *, prefix_caching: bool) -> None:
    """Refuse what the profile cannot simulate of align-mode state groups: with prefix caching,
    a hash block (the groups' greatest common divisor) finer than the state block, where vLLM
    0.33 hits inside a block and copies the state on write (partial hash hits).

    Raises:
        InvalidInputError: ``plan``'s attention groups have several block sizes.
    """
    if not prefix_caching:
        return
    block = align_state_block(plan)
    if not block:
        return
    sizes = sorted({group.spec.tokens_per_page for group in plan.groups if group.spec.tokens_per_page})
    if math.gcd(block, *sizes) != block:
        raise InvalidInputError(
            f"policy {plan.policy!r}: with prefix caching, state groups keep states at block boundaries "
            "(vLLM's mamba_cache_mode 'align') "
            f"beside attention groups of several block sizes ({', '.join(map(str, sizes))} tokens); "
            "vLLM 0.33 then hits inside a state block (partial hash hits), which the vllm profile does "
            "not simulate: plan with uniform_block_size=True (one block size), or simulate with the "
            "kvcore profile"
        )


def retention_alignment(
    plan: KVCachePlan, alignment: int, *, max_model_len: int, prefix_caching: bool
) -> int:
    """The scheduler's block vLLM checks a retention interval against: ``alignment`` (the hits'
    block), or, without prefix caching on a plan with state groups, its least common multiple
    with ``max_model_len``, a state block's tokens in ``mamba_cache_mode='none'``
    (``resolve_kv_cache_block_sizes``, ``vllm/v1/core/kv_cache_utils.py``, takes every group's
    block; kvcore's :mod:`~kvcore.integrations.vllm.convert` gives vLLM that block)."""
    if prefix_caching or not any(is_state(group.spec) for group in plan.groups):
        return alignment
    return math.lcm(alignment, max_model_len)


def check_retention_interval(plan: KVCachePlan, interval: int | None, alignment: int) -> None:
    """Refuse a ``prefix_cache_retention_interval`` vLLM refuses (``KVCacheCoordinator``'s
    ``_validate_prefix_cache_retention_interval``, ``vllm/v1/core/kv_cache_coordinator.py``,
    0.32 to 0.34): a positive one on a plan with no sliding-window or state group (it would
    change nothing), or one that is not a multiple of ``alignment`` (the scheduler's block:
    a hit ends only there).

    Raises:
        InvalidInputError: the interval is one of those.
    """
    if not interval:
        return
    thinned = any(
        is_state(group.spec) or getattr(group.spec, "sliding_window", None) for group in plan.groups
    )
    if not thinned:
        raise InvalidInputError(
            f"prefix_cache_retention_interval {interval}: policy {plan.policy!r} has no sliding-window or "
            "state group, the only ones it thins (vLLM refuses it so); leave it at 0"
        )
    if interval % alignment:
        raise InvalidInputError(
            f"prefix_cache_retention_interval {interval} is not a multiple of the scheduler's block "
            f"({alignment} tokens for policy {plan.policy!r}), where every prefix hit ends; "
            f"use {max(alignment, interval // alignment * alignment)} or 0"
        )


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
    spec: KVCacheSpec, pool: int, span: int, context: SizingContext, *, hits_chunk: bool, state_block: int = 0
) -> ManagerGroup:
    """A plan group as the manager sees it; ``hits_chunk``: a chunked local group on the
    scheduler's block, which prefix hits look up (see :func:`chunks_off_scheduler_block`);
    ``state_block``: for a state group in align mode, :func:`align_state_block` (its states
    hit, one block per boundary)."""
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
        tokens_per_page=per_page or state_block,  # align: a state block per boundary, by position
        span=span,
        windowed=windowed,
        spec=spec,
        cap=spec.max_num_blocks(context) if windowed else None,
        sliding=0 if state_block else sliding,
        chunk=chunk,
        state_block=state_block,
        checkpoint_alignment=_checkpoint_alignment(spec) if state_block else 0,
    )


def _checkpoint_alignment(spec: KVCacheSpec) -> int:
    """A state spec's prefill checkpoint alignment where it holds checkpoint blocks, else 0."""
    if not getattr(spec, "checkpoint_slots", 0):
        return 0
    return int(getattr(spec, "checkpoint_alignment", 0) or 0)


def scheduler_checkpoint_alignment(plan: KVCachePlan) -> int:
    """The prefill checkpoint alignment vLLM 0.33's scheduler cuts chunks by
    (``Scheduler.mamba_prefill_checkpoint_alignment`` beside ``mamba_has_prefill_checkpoint_blocks``):
    the first state group's, where every state group holds checkpoint blocks; 0 where one holds
    none or the first gives no alignment (the scheduler then never counts on an internal
    checkpoint)."""
    states = [group.spec for group in plan.groups if is_state(group.spec)]
    if not states or not all(getattr(spec, "checkpoint_slots", 0) for spec in states):
        return 0
    return int(getattr(states[0], "checkpoint_alignment", 0) or 0)


def checkpoint_position(num_tokens: int, block: int) -> int:
    """vLLM 0.33's ``get_mamba_prefill_checkpoint_position`` (``vllm/v1/kv_cache_interface.py``)
    with no EAGLE block drop and no hash lookahead: the last multiple of ``block`` strictly
    below ``num_tokens`` (one token is always left to compute again for its logits), or 0."""
    return max((num_tokens - 1) // block * block, 0)


def checkpoint_valid(start: int, end: int, position: int, block: int, alignment: int) -> bool:
    """vLLM 0.33's ``is_mamba_prefill_checkpoint_valid`` (``vllm/v1/kv_cache_interface.py``),
    with one block for hashes and states (:func:`check_align_states`): whether a chunk of
    tokens ``start`` to ``end`` can export the state at ``position`` from inside the step. It
    starts on a block boundary, the position lies a whole block or more past its start and
    before its end, on ``alignment`` (0: the layer exports none), and its block is not the
    one the chunk starts from."""
    if not alignment:
        return False
    first = (start - 1) // block  # the block of the state the chunk starts from
    column = cdiv(end, block) - 2  # the block the checkpoint is written to
    return (
        start % block == 0
        and column > first
        and start + block <= position
        and start < position < end
        and (position - start) % alignment == 0
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
