"""vLLM 0.33's ``MambaManager`` in ``mamba_cache_mode='align'``, plainly: the blocks of a state
group whose states are kept at block boundaries for prefix caching
(``vllm/v1/core/single_type_kv_cache_manager.py``, ``MambaManager``).

What vLLM does in align mode, in our words (each method below names the vLLM method it stands
for):

- A state group's block table is indexed by position, as an attention group's is: the block at
  position ``j`` holds the state after ``(j + 1) * block_size`` tokens. Only two positions hold
  a block at a time; every other position is the null block.
- **Allocation** (``allocate_new_blocks``): when the slots asked for reach a block past the
  table's end, the positions up to the new last one are padded with nulls and one fresh block
  is taken for the last position (the running state); the block that held the running state so
  far is remembered (``last_state_block_idx``). ``get_num_blocks_to_allocate`` asks for at most
  one block per call (``physical_block_cap``), plus the hit block when it leaves the free queue.
- **Freeing** (``remove_skipped_blocks``, ``_remove_blocks_in_range``): only the state of the
  last computed token is needed (``get_num_skipped_tokens`` is ``num_computed_tokens - 1``), so
  once the processed tokens pass a block, every block before the running state's is freed (a
  cached one to the back of the free queue, where a later request may still hit it).
- **Caching** (``cache_blocks``, ``BlockPool.cache_full_blocks``): every full block that is not
  null gets its hash, as an attention block does; the hashes cached while a step is scheduled
  are remembered (``cached_blocks_this_step``) and a request whose hit ends on one of them is not
  admitted in that step (``get_num_blocks_to_allocate`` asks for more blocks than the pool has:
  the state is written only when the step runs).
- **Sparse retention** (``MambaManager.reachable_block_mask``, under vLLM's
  ``prefix_cache_retention_interval``, 0 by default): a state hit is a single block, so vLLM
  hashes a state block only where a later request can resume: every one with the interval
  ``None`` (dense); the one ending each interval-sized segment with a positive interval (every
  one when the interval is a block or less); none of the segments' with 0; and, with 0 or a
  positive interval, the block ending one token before the prompt's end and the one ending at
  the request's shared-prefix junction (the longest hit one attention type found, when longer
  than the hit), each floored to the alignment. A block left out stays unhashed for good: it
  is freed as an uncached block, and no hash of it counts as cached in the step. A prefill
  checkpoint's block is hashed by the same rule (``_cache_partial_tail_block`` drops one vLLM
  would not keep, which here is one the mask left out already), so under retention 0 only the
  prompt's own checkpoint stays cached.
- **Hits** (``MambaManager.find_longest_cache_hit``): from the right, the first cached block
  whose end lies on the scheduler's block; the hit is that one block, nulls before it.
- **Prefill checkpoint blocks** (``num_prefill_checkpoint_blocks > 0`` with a
  ``prefill_checkpoint_alignment``: Mamba-2 mixers, and Qwen's gated-delta-net layers where
  FlashInfer runs their prefill). Such a layer can write, from inside one step, the state at a
  block boundary the chunk passes, not only the state at the chunk's end. The boundary is the
  last one strictly before the chunk's end (``get_mamba_prefill_checkpoint_position``: a token
  is left over for the logits), and the chunk can export it
  (``is_mamba_prefill_checkpoint_valid``) when it starts on a block boundary, the boundary lies
  a whole block or more past its start, and the distance is a multiple of the alignment (no
  alignment: never). ``get_num_blocks_to_allocate`` (through ``_needs_internal_checkpoint``)
  then asks for one more block, for the boundary's position, when that position holds no block
  yet, and notes the checkpoint (``_checkpoints``) for the allocation that follows (not at the
  admission gate's count, which only counts it). Under retention 0 (vLLM's default) only the
  chunk that reaches the end of the prefill may take one; under any other setting every chunk
  may (the coordinator passes no ``prefill_end``). ``allocate_new_blocks`` then pads with nulls
  up to the boundary's position only and takes two fresh blocks, the checkpoint's and the
  running state's. The checkpoint's block is a full block, so it is hashed like any other
  (``cache_blocks``; ``_cache_partial_tail_block`` finds it keyed already, the hash block being
  the state block), hit from the right like any other, and freed once the processed tokens
  pass it. The scheduler's side is ``_mamba_block_aligned_split``
  (:mod:`~kvcore.simulation.profiles.vllm_reference.scheduler`): where every state group holds
  checkpoint blocks, a chunk that reaches the end of the prefill and can export its checkpoint
  (by the first state group's alignment) is no longer cut at the last block boundary before
  the end, so the prompt ends in one step fewer.

What is left out: speculative blocks (``num_speculative_blocks``), partial (sub-block) hash hits
and their copy-on-write, the opt-in shared-prefix checkpoint (it needs EAGLE:
``enable_mamba_shared_prefix_checkpoint``) and KV connectors: the profile simulates none of
them. The state block is the scheduler's block (vLLM's ``mamba_block_size`` in align mode is the
attention block size), and the hash block must equal it
(:func:`~kvcore.simulation.profiles.vllm_groups.check_align_states`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from kvcore.simulation.profiles.vllm_groups import checkpoint_position, checkpoint_valid
from kvcore.simulation.profiles.vllm_reference.kv_cache_manager import HitRows, SingleTypeKVCacheManager
from kvcore.spec import cdiv

if TYPE_CHECKING:
    from kvcore.simulation.profiles.vllm_groups import ManagerGroup
    from kvcore.simulation.profiles.vllm_reference.block_pool import BlockPool, KVCacheBlock
    from kvcore.simulation.profiles.vllm_reference.request import RequestState


class MambaManager(SingleTypeKVCacheManager):
    """``MambaManager`` in align mode: one state group's blocks of every request.

    Attributes:
        last_state_block_idx: per request, the position of the block that held its running state
            before the latest block was taken (freed once the processed tokens pass it).
        num_retired_blocks: per request, the positions before which every block was freed
            (``_num_retired_blocks``).
        allocated: the requests that took a block for their running state
            (``_allocated_block_reqs``).
        cached_blocks_this_step: the hashes cached since the step began.
        checkpoints: per request, the prefill checkpoint its next allocation takes: the
            boundary and its position in the table (``_checkpoints``).
    """

    def __init__(self, index: int, group: ManagerGroup, block_pool: BlockPool, *, hash_block: int) -> None:
        super().__init__(index, group, block_pool, hash_block=hash_block)
        self.block_size = group.state_block
        self.last_state_block_idx: dict[int, int] = {}
        self.num_retired_blocks: dict[int, int] = {}
        self.allocated: set[int] = set()
        self.cached_blocks_this_step: set[Hashable] = set()
        self.checkpoints: dict[int, tuple[int, int]] = {}

    def new_step_starts(self) -> None:
        """``MambaManager.new_step_starts``: forget the hashes cached in the step before."""
        self.cached_blocks_this_step.clear()

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``MambaManager.get_num_skipped_tokens``: only the last computed token's state is
        needed."""
        return num_computed_tokens - 1

    def _needs_internal_checkpoint(
        self, r: int, start: int, end: int, position: int, prefill_end: int
    ) -> bool:
        """``MambaManager._needs_internal_checkpoint``: whether the chunk of tokens ``start`` to
        ``end`` exports the state at ``position`` from inside its step into a block of its own:
        the group holds checkpoint blocks, the chunk reaches ``prefill_end``, it can export that
        position (:func:`~kvcore.simulation.profiles.vllm_groups.checkpoint_valid`), and the
        position's block is not held yet (no speculative blocks here)."""
        index = cdiv(end, self.block_size) - 2
        blocks = self.req_to_blocks.get(r, [])
        return (
            end >= prefill_end
            and checkpoint_valid(start, end, position, self.hash_block, self.group.checkpoint_alignment)
            and index >= 0
            and (index >= len(blocks) or blocks[index] is None)
        )

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
        """``MambaManager.get_num_blocks_to_allocate`` in align mode: one block at most for the
        running state (when the slots reach past the table), one more for a prefill checkpoint
        the chunk exports (noted for :meth:`allocate_new_blocks` unless this is the admission
        gate's count), and the hit block when it leaves the free queue. A hit whose block was
        cached in this step asks for more than the pool holds, so the request waits for the
        next step."""
        if new_computed_blocks:
            last = new_computed_blocks[-1]
            if last is not None and last.block_hash in self.cached_blocks_this_step:
                return self.block_pool.num_ids + 1
        held = len(self.req_to_blocks.get(r, ()))
        new_blocks = cdiv(num_tokens, self.block_size) - len(new_computed_blocks) - held
        position = checkpoint_position(num_tokens, self.alignment)
        if not self._needs_internal_checkpoint(r, total_computed_tokens, num_tokens, position, prefill_end):
            position = 0
        checkpoint = int(position > 0)
        if not apply_admission_cap:
            if checkpoint:
                self.checkpoints[r] = (position, cdiv(num_tokens, self.block_size) - 2)
            else:
                self.checkpoints.pop(r, None)
        if new_blocks > 0:
            new_blocks = min(new_blocks, 1 + checkpoint)  # physical_block_cap
        evictable = sum(1 for block in new_computed_blocks if block is not None and block.ref_cnt == 0)
        return (new_blocks + evictable) * self.group.span

    def add_local_computed_blocks(self, r: int, new_computed_blocks: Sequence[KVCacheBlock | None]) -> None:
        """``add_local_computed_blocks``: the hit's block (after its nulls) is held, and counted as
        cached."""
        super().add_local_computed_blocks(r, new_computed_blocks)
        self.num_cached_block[r] = len(self.req_to_blocks[r])

    def allocate_new_blocks(self, r: int, num_tokens: int) -> None:
        """``MambaManager.allocate_new_blocks`` in align mode: when ``num_tokens`` reach past the
        table, or a prefill checkpoint was noted, nulls up to the new last position (the
        checkpoint's position left out) and fresh blocks for the rest; the position of the
        block that held the running state so far is remembered."""
        blocks = self.req_to_blocks[r]
        required = cdiv(num_tokens, self.block_size)
        checkpoint = int(r in self.checkpoints)
        if required <= len(blocks) and not checkpoint:
            self.allocated.add(r)
            return
        held = len(blocks)
        if r in self.allocated or held > 0:  # its running state, or the state a hit gave it
            self.last_state_block_idx[r] = held - 1
        if held < required - 1:
            blocks.extend([None] * (required - 1 - checkpoint - held))
        new_blocks = max(required - len(blocks), 0)
        assert new_blocks <= 1 + checkpoint, "the count asked for fewer blocks"
        blocks.extend(self.block_pool.get_new_blocks(new_blocks, self.group.span))
        self.allocated.add(r)

    def remove_skipped_blocks(self, r: int, processed_computed_tokens: int) -> None:
        """``MambaManager.remove_skipped_blocks`` in align mode: the blocks before the one of the
        last processed token are freed, latest first, from where the last call stopped
        (``_remove_blocks_in_range``); then the block that held the running state before the
        latest one, once the processed tokens passed it."""
        blocks = self.req_to_blocks[r]
        skipped = self.get_num_skipped_tokens(processed_computed_tokens)
        if skipped > 0:
            first = self.num_retired_blocks.get(r, 0)
            last = min(skipped // self.block_size, len(blocks))
            if first < last:
                freed: list[KVCacheBlock | None] = []
                for i in range(last - 1, first - 1, -1):
                    if blocks[i] is not None:
                        freed.append(blocks[i])
                        blocks[i] = None
                self.block_pool.free_blocks(freed)
                self.num_retired_blocks[r] = last
        index = self.last_state_block_idx.get(r)
        if index is not None and index < cdiv(processed_computed_tokens, self.block_size) - 1:
            block = blocks[index]
            if block is not None:
                self.block_pool.free_blocks([block])
                blocks[index] = None

    def reachable_block_mask(self, start: int, end: int, boundaries: Sequence[int]) -> list[bool] | None:
        """``MambaManager.reachable_block_mask``: which of blocks ``start`` to ``end`` (exclusive)
        a state group hashes, or ``None`` for every one.

        A state hit is one block, so vLLM keeps: with the interval ``None`` (dense), every
        block; with a positive interval, the block ending each interval-sized segment (every
        block when the interval is one block or less); with 0, no segment's. With 0 or a
        positive interval, also the block ending at each of ``boundaries`` (one token before the
        prompt's end, the request's shared-prefix junction), floored to the alignment."""
        interval = self.retention_interval
        if interval is None:
            return None
        mask = [False] * (end - start)
        if interval:
            per_segment = interval // self.block_size
            if per_segment <= 1:
                return None
            for i in range(start, end):
                mask[i - start] = (i + 1) % per_segment == 0
        for boundary in boundaries:
            last = boundary // self.alignment * self.alignment // self.block_size - 1
            if start <= last < end:
                mask[last - start] = True
        return mask

    def cache_blocks(self, req: RequestState, num_tokens: int, boundaries: Sequence[int] = ()) -> None:
        """``MambaManager.cache_blocks``: hash the full blocks that are not null (the states at
        block boundaries) and that :meth:`reachable_block_mask` keeps, remember their hashes as
        cached in this step, then :meth:`_cache_partial_tail_block`."""
        r = req.index
        before = self.num_cached_block.get(r, 0)
        super().cache_blocks(req, num_tokens, boundaries)
        self._cache_partial_tail_block(req, num_tokens)
        blocks = self.req_to_blocks[r]
        for j in range(before, min(self.num_cached_block.get(r, 0), len(blocks))):
            block = blocks[j]
            if block is not None and block.block_hash is not None:
                self.cached_blocks_this_step.add(block.block_hash)

    def _cache_partial_tail_block(self, req: RequestState, num_tokens: int) -> None:
        """``MambaManager._cache_partial_tail_block`` for a prefill checkpoint the request's
        latest allocation took: vLLM keeps its hash only when the checkpoint is the prompt's
        (the last block boundary before the prompt's last token), ends a kept segment
        (:meth:`reachable_block_mask` without boundaries) or lies on the shared-prefix
        junction, and otherwise drops it (``BlockPool._maybe_evict_cached_block``: the state is
        transient). Here the state block is the hash block and the alignment, and a junction is
        a hit's length (a multiple of the alignment), so those are the blocks the mask kept:
        nothing is dropped that the mask hashed, which this checks. (vLLM's other branch, a
        partial-block boundary's re-key up to ``num_tokens``, needs a hash block finer than the
        state block.)"""
        checkpoint = self.checkpoints.get(req.index)
        if checkpoint is None or self.retention_interval is None:
            return
        position, index = checkpoint
        block = self.req_to_blocks[req.index][index]
        if block is None or block.block_hash is None:
            return
        segment = self.reachable_block_mask(index, index + 1, ())
        kept = (
            segment is None
            or segment[0]
            or position == checkpoint_position(req.request.prompt_tokens, self.alignment)
            or position == req.shared_prefix_boundary
        )
        assert kept, "vLLM would drop a checkpoint the mask hashed"

    def free(self, r: int) -> None:
        """``MambaManager.pop_blocks_for_free`` and ``free``: forget the request's align state,
        then free its blocks, the last first."""
        self.allocated.discard(r)
        self.last_state_block_idx.pop(r, None)
        self.num_retired_blocks.pop(r, None)
        self.checkpoints.pop(r, None)
        super().free(r)


def find_mamba_hit(
    req: RequestState, groups: Sequence[SingleTypeKVCacheManager], max_length: int, alignment: int
) -> tuple[HitRows, int]:
    """``MambaManager.find_longest_cache_hit``: from the right, the first block cached in every
    group of ``groups`` that ends on a multiple of ``alignment`` (the scheduler's block); the
    hit is that block, the positions before it nulls."""
    block_size = groups[0].block_size
    for j in range(max_length // block_size - 1, -1, -1):
        row = groups[0].cached_blocks(req, groups, j)
        if row is None:
            continue
        if (j + 1) * block_size % alignment:
            continue
        rows: HitRows = [None] * j
        rows.append(row)
        return rows, (j + 1) * block_size
    return [], 0
