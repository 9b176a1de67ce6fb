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
stays unhashed for good. Full attention, chunked local attention and state groups hash every
block (vLLM thins a state group's states too: not modelled, see
:class:`~kvcore.simulation.profiles.vllm.profile.VllmProfile`).

The speed paths that hash a request's own blocks late or remember a lookup for another request
(:data:`RETENTION_STEPS_ASIDE`) step aside for a plan whose windows are thinned.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvcore.simulation.profiles.vllm.steady import SteadyDecoders
from kvcore.simulation.profiles.vllm_groups import align_state_block, is_state, scheduler_block
from kvcore.spec import cdiv

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan

#: The speed paths that step aside for thinned windows: lazy hashing hashes a request's own
#: blocks densely when they are freed (and the paths built on it: the lean calls, the free
#: queue's runs of own blocks), and the hit memo hands one request's lookup to another, whose
#: shared-prefix junction (what the thinned windows keep) it then never sets.
RETENTION_STEPS_ASIDE = (
    "lazy_hashing",
    "lean_decode",
    "lean_finish",
    "shared_runs",
    "preempted_runs",
    "hit_memo",
)


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
        #: whether reachable boundaries are kept (a set interval, 0 included)
        self._keeps_boundaries = interval is not None

    def _hash_blocks(self, r: int, g: int, start: int, end: int) -> None:
        """Hash table positions ``start`` to ``end`` of request ``r``'s group ``g``, those a
        thinned window would not keep left out (they are passed over for good)."""
        thinned = self._thinned.get(g)
        if thinned is None:
            super()._hash_blocks(r, g, start, end)
            return
        need, per_segment = thinned
        kept: set[int] = set()
        if per_segment:  # the last `need` blocks of every segment
            first = start // per_segment * per_segment
            for segment in range(first, end, per_segment):
                kept.update(range(max(start, segment + per_segment - need), min(end, segment + per_segment)))
        if self._keeps_boundaries:
            per_page = self.groups[g].tokens_per_page
            junction = self._junction[r]
            for boundary in (self.requests[r].prompt_tokens - 1, junction):
                if boundary <= 0:
                    continue
                last = boundary // self._align * self._align // per_page
                kept.update(range(max(start, last - need), min(end, last)))
        # hash each run of kept positions as one stretch
        run = -1
        for j in range(start, end + 1):
            if j < end and j in kept:
                if run < 0:
                    run = j
            elif run >= 0:
                super()._hash_blocks(r, g, run, j)
                run = -1
