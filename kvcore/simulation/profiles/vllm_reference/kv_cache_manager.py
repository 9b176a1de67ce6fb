"""vLLM 0.33's KV-cache manager, plainly: one manager per plan group
(``vllm/v1/core/single_type_kv_cache_manager.py``), the prefix-cache lookup every group agrees
on (``vllm/v1/core/kv_cache_coordinator.py``, ``HybridKVCacheCoordinator``) and the manager
the scheduler calls (``vllm/v1/core/kv_cache_manager.py``, ``KVCacheManager``).

Each method is named after the vLLM method it stands for and says what that method does, in
our words. Where this differs from vLLM 0.33:

- **Hashes** are the identity of a block's content: block ``j`` of group ``g`` of request
  ``r`` holds ``(g, True, prefix_id, j)`` while the block lies inside the request's shared
  prefix (``prefix_tokens``), else ``(g, False, r, j)``: the trace says which requests share
  their first tokens, and a request's own tokens (what it generated too) are its alone, so
  only it can hit them (after a preemption). vLLM chains a hash of the token ids, which names
  the same blocks.
- **Groups** are a kvcore plan's (its pools, page spans and kinds, see
  :mod:`~kvcore.simulation.profiles.vllm_reference.block_pool`); a Mamba-style state group
  holds one block from the request's first token without prefix caching (vLLM's
  ``mamba_cache_mode='none'``) and is a
  :class:`~kvcore.simulation.profiles.vllm_reference.mamba_manager.MambaManager` with it
  (``'align'``: vLLM derives the mode from prefix caching); a chunked local group whose block is
  not the scheduler's never hits (vLLM 0.33's lookup asserts that it is).
- **One count for every request**: ``get_num_blocks_to_allocate`` counts the required blocks
  less the larger of those before the window and those held (hit blocks included) for a running
  request too, where vLLM takes a shortcut (required less held): a running request's blocks
  cover its computed tokens, so the two agree. No speculative decoding, KV connector,
  copy-on-write of a partial hit (a hit is a multiple of every block size) or encoder blocks.
- **Sparse retention** (``prefix_cache_retention_interval``, see
  :meth:`SingleTypeKVCacheManager.reachable_block_mask`) thins a sliding-window group's cached
  blocks, and a state group's cached states
  (:meth:`~kvcore.simulation.profiles.vllm_reference.mamba_manager.MambaManager.reachable_block_mask`),
  as vLLM does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from kvcore.simulation.profiles.vllm_groups import (
    ManagerGroup,
    align_state_block,
    check_align_states,
    check_retention_interval,
    chunks_off_scheduler_block,
    is_state,
    manager_group,
    pages,
    retention_alignment,
    scheduler_block,
)
from kvcore.simulation.profiles.vllm_reference.block_pool import BlockPool, KVCacheBlock
from kvcore.spec import SizingContext, cdiv

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm_reference.request import RequestState

#: One group's blocks of a request (``None``: vLLM's null block, a page before the window).
Blocks = list[KVCacheBlock | None]


def block_hash(group: int, req: RequestState, tokens_per_page: int, j: int) -> Hashable:
    """The hash of block ``j`` of group ``group`` of ``req`` (see the module docstring)."""
    request = req.request
    if request.prefix_tokens and (j + 1) * tokens_per_page <= request.prefix_tokens:
        return (group, True, request.prefix_id, j)
    return (group, False, req.index, j)


class SingleTypeKVCacheManager:
    """``SingleTypeKVCacheManager``: one plan group's blocks of every request.

    Attributes:
        index: the group's index in the plan (``kv_cache_group_id``).
        group: what the group's pages are (tokens per page, span, window, admission cap).
        block_pool: the pool of the group's plan pool.
        req_to_blocks: each request's blocks, page by page.
        num_cached_block: each request's blocks counted as cached (hashed) so far.
    """

    #: vLLM's ``prefix_cache_retention_interval`` (``None``: dense) and the hits' alignment
    #: (``cache_hit_alignment_tokens``: the scheduler's block), set by :class:`KVCacheManager`
    retention_interval: int | None = None
    alignment: int = 1

    def __init__(self, index: int, group: ManagerGroup, block_pool: BlockPool, *, hash_block: int) -> None:
        self.index = index
        self.group = group
        self.block_size = group.tokens_per_page
        self.block_pool = block_pool
        self.hash_block = hash_block
        self.req_to_blocks: dict[int, Blocks] = {}
        self.num_cached_block: dict[int, int] = {}

    def new_step_starts(self) -> None:
        """``new_step_starts``: nothing to forget (a state group's manager forgets the hashes it
        cached in the step before)."""

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``get_num_skipped_tokens``: the leading tokens no longer attended to once
        ``num_computed_tokens`` are computed (0 unless the group has a window or chunk)."""
        if not self.group.windowed:
            return 0
        return self.group.spec.first_retained_token(num_computed_tokens)

    def get_num_blocks_to_allocate(
        self,
        r: int,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock | None],
        total_computed_tokens: int,
        *,
        apply_admission_cap: bool,
        prefill_end: int = 0,
    ) -> int:
        """``get_num_blocks_to_allocate``: the block ids that giving request ``r`` slots for
        ``num_tokens`` takes from the pool: new blocks for the pages not yet held and not before
        the window (capped at ``max_admission_blocks_per_request`` at admission), and the hit
        blocks that leave the free queue when touched. (``prefill_end``: where the request's
        prefill ends, for a state group's prefill checkpoint; 0: any chunk may take one.)"""
        required = pages(self.group, num_tokens)
        if apply_admission_cap and self.group.cap is not None:
            required = min(required, self.group.cap)
        held = len(self.req_to_blocks.get(r, ()))
        skipped = (
            self.get_num_skipped_tokens(total_computed_tokens) // self.block_size if self.block_size else 0
        )
        new_blocks = max(required - max(skipped, len(new_computed_blocks) + held), 0)
        # hit blocks before the window are not held (nulls take their place)
        attended = new_computed_blocks[max(0, skipped - held) :]
        evictable = sum(1 for block in attended if block is not None and block.ref_cnt == 0)
        return (new_blocks + evictable) * self.group.span

    def add_local_computed_blocks(self, r: int, new_computed_blocks: Sequence[KVCacheBlock | None]) -> None:
        """``add_local_computed_blocks``: request ``r`` holds its prefix hit's blocks."""
        self.block_pool.touch(new_computed_blocks)
        self.req_to_blocks[r].extend(new_computed_blocks)

    def allocate_new_blocks(self, r: int, num_tokens: int) -> None:
        """``allocate_new_blocks``: fresh blocks until request ``r`` has a page for each of
        ``num_tokens`` slots (a state group: one block)."""
        blocks = self.req_to_blocks[r]
        count = pages(self.group, num_tokens) - len(blocks)
        if count > 0:
            blocks.extend(self.block_pool.get_new_blocks(count, self.group.span))

    def remove_skipped_blocks(self, r: int, processed_computed_tokens: int) -> None:
        """``remove_skipped_blocks``: free the pages before the window of the processed tokens,
        from the last one down to the first already freed, each replaced by the null block."""
        skipped = self.get_num_skipped_tokens(processed_computed_tokens)
        if skipped <= 0:
            return
        blocks = self.req_to_blocks[r]
        freed: list[KVCacheBlock | None] = []
        for i in range(min(skipped // self.block_size, len(blocks)) - 1, -1, -1):
            if blocks[i] is None:
                break
            freed.append(blocks[i])
            blocks[i] = None
        self.block_pool.free_blocks(freed)

    def cache_blocks(self, req: RequestState, num_tokens: int, boundaries: Sequence[int] = ()) -> None:
        """``cache_blocks``: hash request ``req``'s full blocks of its first ``num_tokens`` tokens
        that are not hashed yet (``BlockPool.cache_full_blocks``; a block that already has a
        full hash keeps it, a null block has none), those :meth:`reachable_block_mask` leaves
        out (a sliding window under sparse retention) included: they stay unhashed for good.
        ``boundaries``: where a later request can resume (``replay_boundaries`` and the
        request's ``shared_prefix_boundary``)."""
        if self.group.sliding < 0:  # never hits: vLLM's prefix_cacheable is off
            return
        r = req.index
        blocks = self.req_to_blocks[r]
        start = self.num_cached_block.get(r, 0)
        full = num_tokens // self.block_size
        mask = self.reachable_block_mask(start, full, boundaries) if start < full else None
        for j in range(start, min(full, len(blocks))):
            block = blocks[j]
            if block is None or (block.block_hash is not None and not _is_partial(block.block_hash)):
                continue
            if mask is not None and not mask[j - start]:
                continue
            self.block_pool.cache_block(block, block_hash(self.index, req, self.block_size, j))
        self.num_cached_block[r] = max(start, full)
        if self.group.sliding == 0 and not self.group.chunk and self.block_size > self.hash_block:
            self._cache_partial_tail_block(req, num_tokens)

    def reachable_block_mask(self, start: int, end: int, boundaries: Sequence[int]) -> list[bool] | None:
        """``SlidingWindowManager.reachable_block_mask``: which of blocks ``start`` to ``end``
        (exclusive) a sliding-window group caches, or ``None`` for every one (any other kind
        of group, or a window whose hit run spans a whole segment).

        A window's hit is a run of ``need = cdiv(window - 1, block)`` cached blocks ending on a
        multiple of the alignment, so only such runs are worth a hash. vLLM keeps: with the
        interval ``None``, the last ``need`` blocks of each alignment-sized segment (every
        block when ``need`` covers a segment); with a positive interval, the same per
        interval-sized segment; with 0, no segment's. With 0 or a positive interval, also the
        ``need`` blocks ending at each of ``boundaries``, floored to the alignment."""
        group = self.group
        if group.sliding <= 0 or group.chunk or group.state_block or self.alignment % self.block_size:
            return None
        need = cdiv(group.sliding - 1, self.block_size)
        interval = self.retention_interval
        segment = self.alignment if interval is None else interval
        mask = [False] * (end - start)
        if segment:
            per_segment = segment // self.block_size
            if need >= per_segment:
                return None
            for i in range(start, end):
                mask[i - start] = i % per_segment >= per_segment - need
        if interval is not None:
            for boundary in boundaries:
                last = boundary // self.alignment * self.alignment // self.block_size
                for j in range(max(start, last - need), min(end, last)):
                    mask[j - start] = True
        return mask

    def _cache_partial_tail_block(self, req: RequestState, num_tokens: int) -> None:
        """``FullAttentionManager._cache_partial_tail_block``: a group whose block is larger than
        the hash block also hashes the block where the prompt's last full hash block ends,
        under a key no full-block lookup matches (the block counts as cached: freed, it goes to
        the back of the free queue)."""
        step = self.hash_block
        boundary = min((req.request.prompt_tokens - 1) // step, req.num_tokens // step) * step
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_to_blocks[req.index]
        index = boundary // self.block_size
        block = blocks[index] if index < len(blocks) else None
        if block is None or block.block_hash is not None:
            return
        self.block_pool.cache_block(block, (self.index, "partial", req.index, boundary))

    def free(self, r: int) -> None:
        """``free``: request ``r``'s blocks go back to the pool, the last page first (so that
        the tail is evicted first)."""
        blocks = self.req_to_blocks.pop(r, [])
        self.num_cached_block.pop(r, None)
        self.block_pool.free_blocks(reversed(blocks))

    def cached_blocks(
        self, req: RequestState, groups: Sequence[SingleTypeKVCacheManager], j: int
    ) -> list[KVCacheBlock] | None:
        """``BlockPool.get_cached_block`` for block ``j`` of every group of ``groups`` (one
        attention type): the cached block of each, or ``None`` unless every one has it."""
        found = []
        for manager in groups:
            block = manager.block_pool.get_cached_block(block_hash(manager.index, req, manager.block_size, j))
            if block is None:
                return None
            found.append(block)
        return found


def _is_partial(key: Hashable) -> bool:
    return isinstance(key, tuple) and len(key) > 1 and key[1] == "partial"


#: The blocks of a hit, per group of one attention type, position by position (``None``: null).
HitRows = list[list[KVCacheBlock] | None]

#: A state group's manager class and its hit lookup (``find_longest_cache_hit``): the request,
#: the type's managers, the longest hit, the alignment -> the hit's rows and tokens.
StateHitFinder = Callable[
    ["RequestState", Sequence["SingleTypeKVCacheManager"], int, int], tuple[HitRows, int]
]
StateManager = tuple[type["SingleTypeKVCacheManager"], StateHitFinder]


def find_full_attention_hit(
    req: RequestState, groups: Sequence[SingleTypeKVCacheManager], max_length: int, alignment: int
) -> tuple[HitRows, int]:
    """``FullAttentionManager.find_longest_cache_hit``: the blocks cached from the start, up to
    ``max_length`` tokens, cut to a multiple of ``alignment`` (the scheduler's block)."""
    block_size = groups[0].block_size
    rows: HitRows = []
    for j in range(max_length // block_size):
        row = groups[0].cached_blocks(req, groups, j)
        if row is None:
            break
        rows.append(row)
    length = len(rows) * block_size
    length -= length % alignment
    return rows[: cdiv(length, block_size)], length


def find_chunked_local_hit(
    req: RequestState, groups: Sequence[SingleTypeKVCacheManager], max_length: int, chunk: int
) -> tuple[HitRows, int]:
    """``ChunkedLocalAttentionManager.find_longest_cache_hit``: the blocks before the chunk
    ``max_length`` lies in count as hit (nulls: outside the attention), then the cached blocks
    from the chunk's start (the group's block is the scheduler's)."""
    block_size = groups[0].block_size
    start = max_length // chunk * chunk // block_size
    rows: HitRows = [None] * start
    for j in range(start, max_length // block_size):
        row = groups[0].cached_blocks(req, groups, j)
        if row is None:
            break
        rows.append(row)
    return rows, len(rows) * block_size


def find_sliding_window_hit(
    req: RequestState,
    groups: Sequence[SingleTypeKVCacheManager],
    max_length: int,
    window: int,
    alignment: int,
) -> tuple[HitRows, int]:
    """``SlidingWindowManager.find_longest_cache_hit``: from the end, the first run of
    ``cdiv(window - 1, block_size)`` cached blocks (a window's worth) that ends on a multiple
    of ``alignment``, the blocks before it nulls; with no such run, the run from the start."""
    block_size = groups[0].block_size
    need = cdiv(window - 1, block_size)
    most = max_length // block_size
    rows: HitRows = [None] * most
    run = 0
    for j in range(most - 1, -1, -1):
        row = groups[0].cached_blocks(req, groups, j)
        if row is None:
            run = 0
            continue
        if run == 0 and (j + 1) * block_size % alignment:
            continue  # a hit must end on the scheduler's block
        rows[j] = row
        run += 1
        if run >= need:
            return rows[: j + run], (j + run) * block_size
    kept = run  # the run from the start, cut to the scheduler's block
    while kept * block_size % alignment:
        kept -= 1
    return rows[:kept], kept * block_size


class KVCacheManager:
    """``KVCacheManager`` with its coordinator: every group's manager, one block pool per plan
    pool, and the calls the scheduler makes.

    Args:
        plan: the plan (its groups and pools).
        max_model_len: the longest request.
        max_in_flight_tokens: vLLM's ``max_in_flight_tokens`` (what a window may hold beyond
            itself: the admission cap's context).
        enable_caching: vLLM's ``enable_prefix_caching``.
        state_manager: with prefix caching, the manager class of state groups and its hit lookup
            (:mod:`~kvcore.simulation.profiles.vllm_reference.mamba_manager`: vLLM's
            ``MambaManager`` in align mode), which subclasses :class:`SingleTypeKVCacheManager`.
        retention_interval: vLLM's ``prefix_cache_retention_interval`` (``None``: dense; see
            :meth:`SingleTypeKVCacheManager.reachable_block_mask`), checked as vLLM checks it
            (:func:`~kvcore.simulation.profiles.vllm_groups.check_retention_interval`).
    """

    def __init__(
        self,
        plan: KVCachePlan,
        *,
        max_model_len: int,
        max_in_flight_tokens: int,
        enable_caching: bool,
        state_manager: StateManager | None = None,
        retention_interval: int | None = None,
    ) -> None:
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.retention_interval = retention_interval
        context = SizingContext(max_model_len=max_model_len, max_num_batched_tokens=max_in_flight_tokens)
        #: the scheduler's block: a hit is a multiple of it (``_cache_hit_alignment_tokens``)
        check_align_states(plan, prefix_caching=enable_caching)
        #: with prefix caching, the state groups' block (align mode, see :mod:`.mamba_manager`); 0: none
        self.state_block = align_state_block(plan) if enable_caching else 0
        self.alignment = math.lcm(scheduler_block(plan), self.state_block or 1)
        check_retention_interval(
            plan,
            retention_interval,
            retention_alignment(
                plan, self.alignment, max_model_len=max_model_len, prefix_caching=enable_caching
            ),
        )
        unhit = chunks_off_scheduler_block(plan)
        groups = [
            manager_group(
                g.spec,
                g.pool,
                g.blocks_per_page,
                context,
                hits_chunk=index not in unhit,
                state_block=self.state_block if is_state(g.spec) else 0,
            )
            for index, g in enumerate(plan.groups)
        ]
        self.block_pools = [
            BlockPool(plan.usable_blocks_in(p), enable_caching=enable_caching) for p in range(len(plan.pools))
        ]
        # the hash block: the groups' greatest common divisor (``hash_block_size``)
        hash_block = math.gcd(*(g.tokens_per_page or g.state_block for g in groups)) or 1
        # the align-mode state groups' manager and lookup (vLLM's MambaManager: see mamba_manager)
        state_class: type[SingleTypeKVCacheManager] = SingleTypeKVCacheManager
        self._find_state_hit: StateHitFinder | None = None
        if state_manager is not None:
            state_class, self._find_state_hit = state_manager
        self.managers = [
            (state_class if g.state_block else SingleTypeKVCacheManager)(
                index, g, self.block_pools[g.pool], hash_block=hash_block
            )
            for index, g in enumerate(groups)
        ]
        for manager in self.managers:
            manager.retention_interval = retention_interval
            manager.alignment = self.alignment
        self.windowed = any(g.windowed or g.state_block for g in groups)
        # the attention types a hit looks up (``attention_groups``): (window, chunk, managers),
        # groups of one spec together, in the plan's order with full attention first (its
        # lookup bounds the others'; ``verify_and_split_kv_cache_groups``); a group that never
        # hits leaves no hit at all
        self.attention_groups: list[tuple[int, int, list[SingleTypeKVCacheManager]]] = []
        if enable_caching and all(g.sliding >= 0 for g in groups):
            by_type: dict[tuple[int, int, int, int], list[SingleTypeKVCacheManager]] = {}
            for manager in self.managers:
                g = manager.group
                by_type.setdefault((g.sliding, g.chunk, g.tokens_per_page, g.state_block), []).append(manager)
            types = sorted(by_type.items(), key=lambda item: not (item[0][:2] == (0, 0) and not item[0][3]))
            self.attention_groups = [(key[0], key[1], found) for key, found in types]

    # -- the coordinator ---------------------------------------------------------------------

    def find_longest_cache_hit(
        self, req: RequestState, max_cache_hit_length: int
    ) -> tuple[int, list[Blocks], int]:
        """``HybridKVCacheCoordinator.find_longest_cache_hit``: the longest hit every attention
        type serves. Each type looks up at most the length the types before it found, and the
        pass repeats with the shorter length until no type shortens it. (vLLM reuses the full
        attention lookup in later passes and stops after one pass when full attention and one
        other type take part: shortcuts that find the same hit.) Groups of one window, chunk
        and block size are looked up together, as vLLM looks up the groups of one spec.

        Also returns the longest hit one type found (``longest_hit_length``: the first type's,
        full attention where there is one), which names a shared prefix a state group has not
        cached yet."""
        hit = max_cache_hit_length
        longest = 0
        found: dict[int, Blocks] = {}
        while True:
            current = hit
            for window, chunk, groups in self.attention_groups:
                if groups[0].group.state_block:
                    assert self._find_state_hit is not None, "state groups need the state manager"
                    rows, length = self._find_state_hit(req, groups, current, self.alignment)
                elif chunk:
                    rows, length = find_chunked_local_hit(req, groups, current, chunk)
                elif window == 0:
                    rows, length = find_full_attention_hit(req, groups, current, self.alignment)
                else:
                    rows, length = find_sliding_window_hit(req, groups, current, window, self.alignment)
                current = min(current, length)
                longest = max(longest, current)
                for k, manager in enumerate(groups):
                    found[manager.index] = [row[k] if row is not None else None for row in rows]
            if current >= hit:
                break
            hit = current
            if hit == 0:
                break
        if hit <= 0:
            return 0, [], longest
        return hit, [found[m.index][: cdiv(hit, m.block_size)] for m in self.managers], longest

    # -- what the scheduler calls ------------------------------------------------------------

    def get_computed_blocks(self, req: RequestState) -> tuple[int, list[Blocks]]:
        """``KVCacheManager.get_computed_blocks``: the request's prefix hit, at most
        ``num_tokens - 1`` tokens (the last one is computed again for its logits): tokens and
        blocks per group (none without prefix caching or where a group never hits). The
        request's ``shared_prefix_boundary`` is set: the longest hit one type found when it is
        longer than the hit (the hit plus ``num_uncached_common_prefix_tokens``), else 0."""
        req.shared_prefix_boundary = 0
        if not self.attention_groups:
            return 0, []
        hit, blocks, longest = self.find_longest_cache_hit(req, req.num_tokens - 1)
        if longest > hit:
            req.shared_prefix_boundary = longest
        return hit, blocks

    def new_step_starts(self) -> None:
        """``KVCacheManager.new_step_starts``: each state group forgets the hashes cached in the
        step before (:class:`~.mamba_manager.MambaManager`)."""
        for manager in self.managers:
            manager.new_step_starts()

    def allocate_slots(
        self,
        req: RequestState,
        num_new_tokens: int,
        *,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[Blocks] | None = None,
        full_sequence_must_fit: bool = False,
    ) -> bool:
        """``KVCacheManager.allocate_slots``: give ``req`` slots for ``num_new_tokens`` after its
        computed tokens and its prefix hit (``num_new_computed_tokens`` tokens in
        ``new_computed_blocks``), or return False with nothing changed when its pools fall
        short. With ``full_sequence_must_fit`` (``scheduler_reserve_full_isl`` at admission) its
        whole known sequence must fit first, each windowed group capped at its admission cap.
        Before the new blocks are taken, the pages before each window of the processed tokens
        are freed; after, the full blocks of the computed and new tokens are cached."""
        r = req.index
        if r not in self.managers[0].req_to_blocks:
            for manager in self.managers:
                manager.req_to_blocks[r] = []
        hits = new_computed_blocks or [[] for _ in self.managers]
        computed = min(req.num_computed_tokens + num_new_computed_tokens, self.max_model_len)
        prefill_end = self.prefill_end(req)
        if full_sequence_must_fit:
            whole = min(req.num_tokens, self.max_model_len)
            if not self._fits(r, whole, hits, computed, prefill_end, apply_admission_cap=True):
                return False
        if self.windowed:
            processed = max(0, computed - req.num_in_flight_tokens)
            for manager in self.managers:
                manager.remove_skipped_blocks(r, processed)
        slots = min(computed + num_new_tokens, self.max_model_len)
        if not self._fits(r, slots, hits, computed, prefill_end, apply_admission_cap=False):
            return False
        if num_new_computed_tokens:
            for manager, blocks in zip(self.managers, hits, strict=True):
                manager.add_local_computed_blocks(r, blocks)
        for manager in self.managers:
            manager.allocate_new_blocks(r, slots)
        if self.enable_caching:
            self.cache_blocks(req, min(computed + num_new_tokens, req.num_tokens))
        return True

    def prefill_end(self, req: RequestState) -> int:
        """Where ``req``'s prefill ends (``allocate_slots``' ``prefill_end``, the scheduler's), as
        the managers are told it: it bounds a state group's prefill checkpoint to the chunk that
        reaches it only under retention 0 (``KVCacheCoordinator.get_num_blocks_to_allocate``
        passes 0 under any other interval: every chunk may export one)."""
        if self.retention_interval != 0:
            return 0
        return max(req.request.prompt_tokens, req.num_tokens - 1)

    def _fits(
        self,
        r: int,
        num_tokens: int,
        hits: list[Blocks],
        computed: int,
        prefill_end: int,
        *,
        apply_admission_cap: bool,
    ) -> bool:
        """Whether every pool has the block ids ``get_num_blocks_to_allocate`` asks of it."""
        need = [0] * len(self.block_pools)
        for manager, blocks in zip(self.managers, hits, strict=True):
            need[manager.group.pool] += manager.get_num_blocks_to_allocate(
                r,
                num_tokens,
                blocks,
                computed,
                apply_admission_cap=apply_admission_cap,
                prefill_end=prefill_end,
            )
        return all(n <= pool.get_num_free_blocks() for n, pool in zip(need, self.block_pools, strict=True))

    def cache_blocks(self, req: RequestState, num_tokens: int) -> None:
        """``KVCacheManager.cache_blocks`` (the coordinator's): every group caches the full
        blocks of the request's first ``num_tokens`` known tokens, cut to a multiple of the
        scheduler's block (``get_num_cacheable_tokens``: no hit could end elsewhere), told where
        a later request can resume: one token before the prompt's end (``replay_boundaries``:
        a resend of the prompt hits at most that) and the request's shared-prefix junction."""
        if not self.enable_caching or req.index not in self.managers[0].req_to_blocks:
            return
        tokens = min(num_tokens, req.num_tokens)
        tokens -= tokens % self.alignment
        boundaries = [req.request.prompt_tokens - 1]
        if req.shared_prefix_boundary:
            boundaries.append(req.shared_prefix_boundary)
        for manager in self.managers:
            manager.cache_blocks(req, tokens, boundaries)

    def free(self, r: int) -> None:
        """``KVCacheManager.free``: every group frees the request's blocks, group by group."""
        for manager in self.managers:
            manager.free(r)

    def usage(self) -> float:
        """``BlockPool.get_usage`` of the fullest pool (a pool of no ids counts as empty)."""
        return max((pool.get_usage() for pool in self.block_pools if pool.num_ids), default=0.0)
