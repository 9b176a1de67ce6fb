"""The ``vllm`` profile's sparse retention of a sliding window's prefix cache (vLLM's
``prefix_cache_retention_interval``): which blocks of a sliding-window group are hashed when
computed (``SlidingWindowManager.reachable_block_mask``, ``single_type_kv_cache_manager.py``,
the same in vLLM 0.32, 0.33 and 0.34).

A sliding window hits on a run of ``need = cdiv(window - 1, block)`` cached blocks that ends on
the scheduler's block, so vLLM hashes only blocks that can end such a run: the last ``need``
blocks of each segment (the scheduler's block with the interval ``None``, the interval when it
is positive, none with 0: vLLM's default), and, unless the interval is ``None``, the ``need``
blocks before each boundary a later request can resume at (one token before the prompt's end,
and the request's shared-prefix junction), floored to the scheduler's block. A block left out
stays unhashed for good. Full attention and chunked local attention hash every block. State
groups (vLLM's ``MambaManager.reachable_block_mask``) are thinned by the same setting, one
state a hit rather than a run, in
:class:`~kvcore.simulation.profiles.vllm.state_groups.AlignStates` (no lazy hashing there).

Every speed path stays on. Lazy hashing hashes a request's own blocks when they are freed, not
when computed, and so the paths on it count as cached, when freed, only the positions vLLM
would have hashed (:meth:`SparseRetention._lazy_runs`); the others go back among the uncached
blocks at the front of the free queue, where vLLM puts a freed block with no hash. The mask is
the one the blocks were computed under: a request's junction changes only at a lookup, when it
holds no block (a preemption frees them all). A lookup that leaves a preempted request's runs
unread (``unread_runs``) must not change the junction either, so it also needs the type looked
up first to hit nothing of them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.steady import SteadyDecoders
from kvcore.simulation.profiles.vllm_groups import align_state_block, is_state, scheduler_block
from kvcore.spec import cdiv

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan


def thinned_windows(
    plan: KVCachePlan, interval: int | None, *, prefix_caching: bool
) -> dict[int, tuple[int, int]]:
    """The sliding-window groups of ``plan`` whose blocks are not all hashed, each as
    ``(need, per_segment)``: the blocks a hit runs over, and the blocks of a segment (0: no
    segments, the interval 0). Empty without prefix caching."""
    if not prefix_caching:
        return {}
    state = align_state_block(plan)
    align = math.lcm(scheduler_block(plan), state or 1)
    thinned: dict[int, tuple[int, int]] = {}
    for index, group in enumerate(plan.groups):
        spec = group.spec
        window = getattr(spec, "sliding_window", None)
        block = spec.tokens_per_page or 0
        if is_state(spec) or getattr(spec, "attention_chunk_size", None) or not isinstance(window, int):
            continue
        if window <= 0 or not block or align % block:
            continue
        need = cdiv(window - 1, block)
        segment = align if interval is None else interval
        per_segment = segment // block
        if segment and need >= per_segment:
            continue  # every block can end a hit's run
        thinned[index] = (need, per_segment)
    return thinned


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class SparseRetention(SteadyDecoders):
    """Hashing a thinned window's blocks only where a hit can end (see the module docstring)."""

    #: per request, its shared-prefix junction (``shared_prefix_boundary``) as its last lookup
    #: found it (kept by :class:`~kvcore.simulation.profiles.vllm.state_groups.AlignStates`)
    _junction: list[int]

    def _init_hits(self, prefix_caching: bool) -> None:
        """The thinned windows (:func:`thinned_windows`), then the hit types as before."""
        super()._init_hits(prefix_caching)
        interval = self.profile.prefix_cache_retention_interval
        #: per thinned group: (need, per_segment)
        self._thinned = thinned_windows(self.plan, interval, prefix_caching=prefix_caching)
        self._thinned_classes = {self._class_of[g]: thinned for g, thinned in self._thinned.items()}
        #: whether reachable boundaries are kept (a set interval, 0 included)
        self._keeps_boundaries = interval is not None

    def _first_type(self) -> int:
        """The hit type vLLM looks up first (the junction is its hit): the first full-attention
        type in group order, else the first type in group order."""
        groups = self.groups
        order = [
            (bool(window or chunk or groups[ids[0]].state_block), ids[0], k)
            for k, (window, chunk, ids) in enumerate(self._hit_types)
        ]
        return min(order)[2]

    def _leaves_runs_unread(self, r: int) -> bool:
        """As before, and with reachable boundaries kept, only when the type looked up first
        has a group with none of its blocks left in the runs: its hit, the junction the
        blocks computed next are hashed under, is then the same without them."""
        if self._thinned and self._keeps_boundaries and self._hit_types:
            left = self._groups_left(tuple(self._pending[r]))
            if left.issuperset(self._hit_types[self._first_type()][2]):
                return False
        return super()._leaves_runs_unread(r)

    def _kept(
        self, r: int, per_page: int, thinned: tuple[int, int], start: int, end: int
    ) -> list[tuple[int, int]]:
        """The table positions from ``start`` to ``end`` of request ``r``'s thinned window
        (``thinned``: need, per_segment) that vLLM hashes, as sorted, disjoint ranges: the last
        ``need`` of every segment, and the ``need`` before each reachable boundary (one token
        before the prompt's end, the junction its last lookup set)."""
        if start >= end:
            return []
        need, per_segment = thinned
        spans: list[tuple[int, int]] = []
        if per_segment:  # the last `need` blocks of every segment
            for segment in range(start // per_segment * per_segment, end, per_segment):
                spans.append((max(start, segment + per_segment - need), min(end, segment + per_segment)))
        if self._keeps_boundaries:
            for boundary in (self.requests[r].prompt_tokens - 1, self._junction[r]):
                if boundary > 0:
                    last = boundary // self._align * self._align // per_page
                    spans.append((max(start, last - need), min(end, last)))
        spans.sort()
        kept: list[tuple[int, int]] = []
        for low, high in spans:
            if low >= high:
                continue
            if kept and low <= kept[-1][1]:  # overlapping or touching: one stretch
                if high > kept[-1][1]:
                    kept[-1] = (kept[-1][0], high)
            else:
                kept.append((low, high))
        return kept

    def _hash_blocks(self, r: int, g: int, start: int, end: int) -> None:
        """Hash table positions ``start`` to ``end`` of request ``r``'s group ``g``, those a
        thinned window would not keep left out (they are passed over for good)."""
        thinned = self._thinned.get(g)
        if thinned is None:
            super()._hash_blocks(r, g, start, end)
            return
        for low, high in self._kept(r, self.groups[g].tokens_per_page, thinned, start, end):
            super()._hash_blocks(r, g, low, high)

    def _lazy_runs(self, r: int, c: int, low: int, high: int) -> list[tuple[int, int]]:
        """Of a thinned window, the positions of the request's own content that vLLM would have
        hashed (:meth:`_kept`); its shared prefix's are hashed when computed."""
        thinned = self._thinned_classes.get(c)
        if thinned is None:
            return super()._lazy_runs(r, c, low, high)
        per_page = self.groups[self._classes[c][0]].tokens_per_page
        own = self.requests[r].prefix_tokens // per_page  # (see _content)
        return self._kept(r, per_page, thinned, max(low, own), high)
