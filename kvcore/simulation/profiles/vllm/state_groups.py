"""The fast path's state groups under prefix caching: vLLM 0.33's ``mamba_cache_mode='align'``.

With prefix caching, vLLM 0.33 runs a state group in ``mamba_cache_mode='align'`` (what it does
is told, method by method, in :mod:`~kvcore.simulation.profiles.vllm_reference.mamba_manager`):
its table is indexed by position as an attention group's is, one block a state block, so here a
state group's pages are of :func:`~kvcore.simulation.profiles.vllm_groups.align_state_block`
tokens and its hashes name positions as an attention group's do. What differs is overridden in
:class:`AlignStates`, a layer over the fast path's manager:

- a hit type of its own (``MambaManager.find_longest_cache_hit``: the last cached block from the
  right), and the longest hit one type found, which names a shared prefix the state group has
  not cached yet (``shared_prefix_boundary``);
- ``get_num_blocks_to_allocate``: one block at most for the running state, one more for a
  prefill checkpoint the chunk exports (``_needs_internal_checkpoint``), and a hit on a state
  cached in the same step asks for more blocks than the pool holds;
- ``allocate_new_blocks``: nulls up to the new last position (the checkpoint's left out), one
  fresh block there (and one at the checkpoint's);
- ``remove_skipped_blocks``: the blocks before the last processed token's freed, and the block
  that held the running state before the latest one, group by group with the windows';
- the hashes cached while a step is scheduled (``cached_blocks_this_step``);
- sparse retention (``MambaManager.reachable_block_mask``, vLLM's
  ``prefix_cache_retention_interval``): a state block is hashed only where a later request can
  resume (:meth:`AlignStates._kept_states`), the others never;
- ``Scheduler._mamba_block_aligned_split``: chunks cut to block boundaries, the prompt's last
  chunk not at its last boundary where the state groups export it as a prefill checkpoint (the
  scheduler calls :meth:`AlignStates._aligned_split`).

Of the speed paths (:data:`~kvcore.simulation.profiles.vllm.state.SPEED_PATHS`), event bounds
(with a state group's next free among the events) and steady decoders stay on for such a run;
the others step aside (:data:`STATE_SPEED_PATHS`). ``tests/simulation/test_vllm_reference.py``
holds it to the reference as it holds the rest.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable
from typing import TYPE_CHECKING

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.retention import SparseRetention
from kvcore.simulation.profiles.vllm.state import SPEED_PATHS
from kvcore.simulation.profiles.vllm_groups import (
    align_state_block,
    check_align_states,
    check_retention_interval,
    checkpoint_position,
    checkpoint_valid,
    chunks_off_scheduler_block,
    is_state,
    manager_group,
    retention_alignment,
    scheduler_block,
    scheduler_checkpoint_alignment,
)
from kvcore.spec import SizingContext, cdiv

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm_reference.scheduler import VllmSettings
    from kvcore.simulation.steps import StepTimeModel
    from kvcore.simulation.workload import Workload


#: The speed paths that stay on for state groups in align mode: a decode short of its events
#: (a state's free among them: :meth:`AlignStates._note_events`) skips the manager, and steady
#: decoders are counted. The others (lazy hashing, compact tables, the lean calls, the gate memo)
#: step aside: they free, hash and take blocks, or remember a refusal, as attention groups do.
STATE_SPEED_PATHS = ("event_bounds", "steady_decoders")


def steps_aside(plan: KVCachePlan, *, prefix_caching: bool) -> bool:
    """Whether the speed paths other than :data:`STATE_SPEED_PATHS` step aside for ``plan``: it
    has state groups and prefix caching is on (vLLM then runs them in align mode)."""
    return prefix_caching and align_state_block(plan) > 0


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class AlignStates(SparseRetention):
    """State groups in align mode over the fast path (see the module docstring); a plan without
    them under prefix caching runs as before."""

    def __init__(
        self,
        plan: KVCachePlan,
        workload: Workload,
        profile: VllmSettings,
        *,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = False,
        step_time: StepTimeModel | None = None,
        speed_paths: Collection[str] = SPEED_PATHS,
    ) -> None:
        if steps_aside(plan, prefix_caching=prefix_caching) and set(speed_paths) <= set(SPEED_PATHS):
            speed_paths = [path for path in speed_paths if path in STATE_SPEED_PATHS]
        super().__init__(
            plan,
            workload,
            profile,
            max_num_batched_tokens=max_num_batched_tokens,
            prefix_caching=prefix_caching,
            step_time=step_time,
            speed_paths=speed_paths,
        )
        check_align_states(plan, prefix_caching=prefix_caching)
        check_retention_interval(
            plan,
            profile.prefix_cache_retention_interval,
            retention_alignment(
                plan, self._align, max_model_len=self.max_model_len, prefix_caching=prefix_caching
            ),
        )
        #: per (request, state group): its retired positions (``_num_retired_blocks``) and the
        #: position of the block that held its running state before the latest
        #: (``last_state_block_idx``; -1: none)
        self._mamba: dict[tuple[int, int], list[int]] = {}
        #: the hashes state groups cached since the step began (``cached_blocks_this_step``)
        self._cached_this_step: set[Hashable] = set()
        #: per request, where a shared prefix the state groups have not cached ends
        #: (``shared_prefix_boundary``), as its last lookup found it
        self._junction = [0] * len(self.requests)
        self._allocating = -1  # the request _allocate works for (read by _take)
        #: per (request, class of state groups), the position of the prefill checkpoint block its
        #: next allocation takes (``_checkpoints``), as the latest count noted it
        self._checkpoints: dict[tuple[int, int], int] = {}
        #: the prefill checkpoint alignment the scheduler cuts chunks by (0: no checkpoint)
        self._checkpoint_align = scheduler_checkpoint_alignment(plan) if self._state_block else 0

    # -- the groups -------------------------------------------------------------------------

    def _init_classes(self, prefix_caching: bool) -> None:
        """The groups again, state groups of align mode among them, before their classes."""
        self._state_block = align_state_block(self.plan) if prefix_caching else 0
        if self._state_block:
            in_flight = (self.lag + 1) * self.budget
            context = SizingContext(max_model_len=self.max_model_len, max_num_batched_tokens=in_flight)
            unhit = chunks_off_scheduler_block(self.plan)
            self.groups = [
                manager_group(
                    g.spec,
                    g.pool,
                    g.blocks_per_page,
                    context,
                    hits_chunk=index not in unhit,
                    state_block=self._state_block if is_state(g.spec) else 0,
                )
                for index, g in enumerate(self.plan.groups)
            ]
            self._align = math.lcm(scheduler_block(self.plan), self._state_block)
        super()._init_classes(prefix_caching)
        # a state group frees blocks as it goes: remove_skipped_blocks runs for it
        self._windowed = self._windowed or bool(self._state_block)

    def _init_hits(self, prefix_caching: bool) -> None:
        """The hit types with state groups' a type of their own: groups of one spec together,
        in the plan's order with full attention first (``verify_and_split_kv_cache_groups``)."""
        super()._init_hits(prefix_caching)
        if not self._state_block or not self._hit_types:
            return
        by_type: dict[tuple[int, int, int, int], list[int]] = {}
        for index, g in enumerate(self.groups):
            by_type.setdefault((g.sliding, g.chunk, g.tokens_per_page, g.state_block), []).append(index)
        types = sorted(by_type.items(), key=lambda item: not (item[0][:2] == (0, 0) and not item[0][3]))
        self._hit_types = [(key[0], key[1], ids) for key, ids in types]
        self._hit_classes = [
            sorted({(self._class_of[g], len(self._classes[self._class_of[g]][1])) for g in ids})
            for _, _, ids in self._hit_types
        ]
        self._null_hits = all(chunk for _, chunk, _ in self._hit_types)

    # -- hits -------------------------------------------------------------------------------

    def _find_hit(self, r: int) -> tuple[int, list[list[int | None]] | None]:
        """``get_computed_blocks``, and the request's ``shared_prefix_boundary``: the first
        type's hit (the longest one type found) where it is longer than the hit."""
        hit, blocks = super()._find_hit(r)
        if self._state_block or self._thinned:
            longest = self._first_type_hit(r) if self._hit_types else 0
            self._junction[r] = longest if longest > hit else 0
        return hit, blocks

    def _first_type_hit(self, r: int) -> int:
        """The tokens the hit type vLLM looks up first finds below the request's last token (the
        first lookup of ``find_longest_cache_hit``, which no later one exceeds): the first
        full-attention type in group order, else the first type in group order."""
        groups = self.groups
        t = self._first_type()
        window, chunk, ids = self._hit_types[t]
        current = self._tokens[r] - 1
        per_page = groups[ids[0]].tokens_per_page
        if chunk:
            return self._hit_chunk(r, t, current, chunk)[2]
        if window == 0:
            return self._hit_full(r, t, current // per_page, self._align)[2]
        return self._hit_window(r, t, current // per_page, cdiv(window - 1, per_page), self._align)[2]

    def _hit_full(self, r: int, t: int, most: int, align: int) -> tuple[int, int, int]:
        """Full attention's lookup, or a state type's (``MambaManager.find_longest_cache_hit``):
        from the right, the first block cached in every group of the type that ends on the
        scheduler's block; the hit is that block alone."""
        group = self.groups[self._hit_types[t][2][0]]
        if not group.state_block:
            return super()._hit_full(r, t, most, align)
        per_page = group.tokens_per_page
        for j in range(most - 1, -1, -1):
            if self._has(r, t, j) and (j + 1) * per_page % align == 0:
                return j, j + 1, (j + 1) * per_page
        return 0, 0, 0

    # -- allocation -------------------------------------------------------------------------

    def _allocate(
        self,
        r: int,
        new: int,
        *,
        gate: bool,
        hit: int = 0,
        hit_blocks: list[list[int | None]] | None = None,
    ) -> bool:
        """``allocate_slots``, noting the request for :meth:`_take`."""
        self._allocating = r
        return super()._allocate(r, new, gate=gate, hit=hit, hit_blocks=hit_blocks)

    def _to_allocate(
        self,
        tables: list[list[int | None]],
        tokens: int,
        hit_blocks: list[list[int | None]] | None,
        computed: int,
        *,
        cap: bool,
    ) -> list[int]:
        """``get_num_blocks_to_allocate``, a state group's as ``MambaManager``'s in align mode:
        one block at most (not every page up to ``tokens``), one more for a prefill checkpoint
        (:meth:`_checkpoint_block`, noted for :meth:`_take` unless ``cap``: the admission gate's
        count), and more than the pool holds when the hit ends on a state cached in this step."""
        need = super()._to_allocate(tables, tokens, hit_blocks, computed, cap=cap)
        if not self._state_block:
            return need
        r = self._allocating
        for c, (g, ids) in enumerate(self._classes):
            group = self.groups[g]
            if not group.state_block:
                continue
            checkpoint = self._checkpoint_block(r, g, tables[g], computed, tokens)
            if not cap:
                if checkpoint >= 0:
                    self._checkpoints[(r, c)] = checkpoint
                else:
                    self._checkpoints.pop((r, c), None)
            most = 1 if checkpoint < 0 else 2  # physical_block_cap
            hits = len(hit_blocks[g]) if hit_blocks is not None else 0
            pages = max(cdiv(tokens, group.tokens_per_page) - hits - len(tables[g]), 0)
            if pages > most:  # the attention count, less the blocks past the cap
                for p, span in self._class_spans[c]:
                    need[p] -= (pages - most) * span
            if hits and hit_blocks is not None:
                for i in ids:
                    last = hit_blocks[i][-1]
                    if last is not None and self._content_of(last) in self._cached_this_step:
                        need[group.pool] += self.pools[group.pool].usable + 1
                        break
        return need

    def _checkpoint_block(self, r: int, g: int, table: list[int | None], start: int, end: int) -> int:
        """``MambaManager._needs_internal_checkpoint`` for state group ``g`` of request ``r`` (see
        the reference's): the position of the prefill checkpoint block a chunk of tokens
        ``start`` to ``end`` takes, or -1 for none."""
        group = self.groups[g]
        if not group.checkpoint_alignment:
            return -1
        retention = self.profile.prefix_cache_retention_interval
        prefill_end = max(self.requests[r].prompt_tokens, self._tokens[r] - 1) if retention == 0 else 0
        per_page = group.tokens_per_page
        index = cdiv(end, per_page) - 2
        position = checkpoint_position(end, self._align)
        if (
            end >= prefill_end
            and checkpoint_valid(start, end, position, per_page, group.checkpoint_alignment)
            and index >= 0
            and (index >= len(table) or table[index] is None)
        ):
            return index
        return -1

    def _take(self, tables: list[list[int | None]], pages: list[int], *, compact: bool) -> None:
        """``get_new_blocks``, a state group's as ``MambaManager.allocate_new_blocks`` in align
        mode: the position of the block that held the running state is noted, the table padded
        with nulls up to the new last position (the prefill checkpoint's position, where one
        was noted, left out), and fresh blocks taken for the rest."""
        if self._state_block:
            r = self._allocating
            pages = list(pages)
            for c, (g, ids) in enumerate(self._classes):
                if not self.groups[g].state_block or pages[c] <= 0:
                    continue
                checkpoint = int((r, c) in self._checkpoints)
                nulls = max(pages[c] - 1 - checkpoint, 0)
                for i in ids:
                    table = tables[i]
                    state = self._mamba.setdefault((r, i), [0, -1])
                    if table:
                        state[1] = len(table) - 1
                    table.extend([None] * nulls)
                pages[c] -= nulls
        super()._take(tables, pages, compact=compact)

    def _remove_skipped(self, r: int, tables: list[list[int | None]], processed: int) -> None:
        """``remove_skipped_blocks`` of every group in group order, with no speed path: a
        window's pages before it, last first down to the first freed; a state group's
        (``MambaManager``) blocks before the last processed token's, and the block that held
        the running state before the latest once the processed tokens passed it."""
        if not self._state_block:
            super()._remove_skipped(r, tables, processed)
            return
        for g, group in enumerate(self.groups):
            table = tables[g]
            freed: list[int] = []
            if group.state_block:
                per_page = group.tokens_per_page
                state = self._mamba.setdefault((r, g), [0, -1])
                last = min((processed - 1) // per_page, len(table)) if processed > 1 else 0
                for i in range(last - 1, state[0] - 1, -1):
                    block = table[i]
                    if block is not None:
                        freed.append(block)
                        table[i] = None
                if state[0] < last:
                    state[0] = last
                index = state[1]
                running = table[index] if 0 <= index < cdiv(processed, per_page) - 1 else None
                if running is not None:  # freed on its own, after the range
                    self._release_all(r, g, freed)
                    freed = [running]
                    table[index] = None
            elif group.windowed:
                skipped = min(group.spec.first_retained_token(processed) // group.tokens_per_page, len(table))
                for i in range(skipped - 1, -1, -1):
                    block = table[i]
                    if block is None:
                        break
                    freed.append(block)
                    table[i] = None
            self._release_all(r, g, freed)

    def _release_all(self, r: int, g: int, blocks: list[int]) -> None:
        """``BlockPool.free_blocks`` of ``blocks`` of request ``r``'s group ``g`` (no lazy hashing
        here: a hashed block to the back of the queue, another among the uncached)."""
        if blocks:
            self._release(r, g, blocks, len(self._tables[r][g]) - 1, live=True, window=True)

    def _note_events(self, r: int, *, grew: bool = True, freed: bool = True, cached: bool = True) -> None:
        """When request ``r``'s tables next change, a state group's next free among the events:
        the processed tokens past the block after the first one still held from its retired
        positions on, or past the block after the one that held the running state before."""
        super()._note_events(r, grew=grew, freed=freed, cached=cached)
        if not self._state_block or not self._event_bounds or not freed:
            return
        tables, bound = self._tables[r], self._free_at[r]
        for g, group in enumerate(self.groups):
            if not group.state_block or not tables:
                continue
            table, per_page = tables[g], group.tokens_per_page
            retired, index = self._mamba.get((r, g), (0, -1))
            for i in range(retired, len(table)):
                if table[i] is not None:
                    bound = min(bound, (i + 1) * per_page + 1)
                    break
            if index >= 0 and table[index] is not None:
                bound = min(bound, (index + 1) * per_page + 1)
        self._free_at[r] = bound

    # -- caching ----------------------------------------------------------------------------

    def _cache_blocks(self, r: int, tokens: int) -> None:
        """``cache_blocks``, noting the hashes a state group caches (``cached_blocks_this_step``)."""
        if not self._state_block or not self._tables[r]:
            super()._cache_blocks(r, tokens)
            return
        before = list(self._hashed[r])
        super()._cache_blocks(r, tokens)
        after, tables = self._hashed[r], self._tables[r]
        for c, (g, ids) in enumerate(self._classes):
            if not self.groups[g].state_block or after[c] <= before[c]:
                continue
            for i in ids:
                table = tables[i]
                for j in range(before[c], min(after[c], len(table))):
                    block = table[j]
                    if block is not None and block in self._hash_of:
                        self._cached_this_step.add(self._hash_of[block])

    def _hash_blocks(self, r: int, g: int, start: int, end: int) -> None:
        """Hash table positions ``start`` to ``end`` of request ``r``'s group ``g``; a state
        group's only where vLLM's sparse retention keeps a state (:meth:`_kept_states`), the
        others passed over for good."""
        if not self.groups[g].state_block or self.profile.prefix_cache_retention_interval is None:
            super()._hash_blocks(r, g, start, end)
            return
        for j in self._kept_states(r, self.groups[g].tokens_per_page, start, end):
            super()._hash_blocks(r, g, j, j + 1)

    def _kept_states(self, r: int, per_page: int, start: int, end: int) -> list[int] | range:
        """``MambaManager.reachable_block_mask`` (see the reference's): the positions from
        ``start`` to ``end`` of request ``r``'s state group that vLLM hashes under a set
        retention interval, in order: the last of every interval-sized segment (every one when
        the interval is a block or less; none with 0), and the one ending at each reachable
        boundary (one token before the prompt's end, the junction its last lookup set), floored
        to the scheduler's block."""
        interval = self.profile.prefix_cache_retention_interval or 0
        per_segment = interval // per_page
        if interval and per_segment <= 1:
            return range(start, end)
        kept: set[int] = set()
        if interval:
            kept.update(range(start + (-start - 1) % per_segment, end, per_segment))
        for boundary in (self.requests[r].prompt_tokens - 1, self._junction[r]):
            last = boundary // self._align * self._align // per_page - 1
            if start <= last < end:
                kept.add(last)
        return sorted(kept)

    def _free(self, r: int, *, live: bool) -> None:
        """``free``, forgetting the request's align state (``pop_blocks_for_free``)."""
        super()._free(r, live=live)
        if self._state_block:
            for g, group in enumerate(self.groups):
                if group.state_block:
                    self._mamba.pop((r, g), None)
            for c in range(len(self._classes)):
                self._checkpoints.pop((r, c), None)

    # -- the scheduler's part ---------------------------------------------------------------

    def _new_step_starts(self) -> None:
        """``KVCacheManager.new_step_starts``: forget the hashes cached in the step before."""
        self._cached_this_step.clear()

    def _aligned_split(self, r: int, new: int, hit: int = 0) -> int:
        """``Scheduler._mamba_block_aligned_split`` (see the reference's): a prefill chunk cut to
        end on a block boundary, never past the last one before the request's last known token
        (unless the state groups export it as a prefill checkpoint of the prompt's last chunk),
        and at its shared prefix's junction; 0 when no boundary fits in the budget."""
        start = self._computed[r] + hit
        known = self._tokens[r]
        prefill_end = max(self.requests[r].prompt_tokens, known - 1)
        if start >= prefill_end:
            return new
        block = self._state_block
        end = start + new
        last_cache_position = (known - 1) // block * block
        if end >= prefill_end and checkpoint_valid(
            start, end, checkpoint_position(prefill_end, block), block, self._checkpoint_align
        ):
            last_cache_position = 0  # exported from inside the step
        if end < prefill_end:
            most = self.budget
            threshold = self.profile.long_prefill_token_threshold
            if threshold > 0:
                most = min(most, threshold)
            aligned = end // block * block
            if aligned > start or block <= most:
                end = aligned
        junction = self._junction[r]
        stops = (
            (start // block + 1) * block if start % block else 0,
            last_cache_position,
            start + (junction - start) // block * block if start < junction < end else 0,
        )
        end = min((stop for stop in stops if start < stop < end), default=end)
        return max(end - start, 0)
