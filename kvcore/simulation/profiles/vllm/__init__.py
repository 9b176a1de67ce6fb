"""The ``vllm`` scheduler profile: vLLM 0.33's v1 scheduler and KV-cache manager, step for step.

What it follows, with where vLLM does it (``vllm/v1/core/``; facts, not code):

- **A step** (``sched/scheduler.py``, ``Scheduler.schedule``): running requests first, in
  admission order, each asking for what it lacks (``num_tokens + num_output_placeholders -
  num_computed_tokens``), cut to ``long_prefill_token_threshold`` when more than one request is
  eligible, to the token budget left and to ``max_model_len``; then, unless a request was
  preempted in this step, the waiting queue first come first served while the budget lasts and
  fewer than ``max_num_seqs`` run.
- **Preemption** (``Scheduler._preempt_request``): when ``allocate_slots`` fails for a running
  request, the most recently admitted running request is preempted (blocks freed, computed
  tokens reset to 0, back to the head of the queue) until the allocation succeeds or the
  request preempted itself. The request later computes its prompt and the tokens it had
  generated again (full recompute).
- **Admission gate** (``kv_cache_manager.py``, ``KVCacheManager.allocate_slots`` with
  ``full_sequence_must_fit``; the scheduler passes ``scheduler_reserve_full_isl``, on by
  default): a waiting request is admitted only when the pool's free blocks hold its whole
  known sequence, each sliding or chunked group capped at its ``max_admission_blocks_per_request``
  (``single_type_kv_cache_manager.py``, ``get_num_blocks_to_allocate`` with
  ``apply_admission_cap``). Then the per-step check for the chunk itself.
- **Lazy freeing** (``allocate_slots`` → ``remove_skipped_blocks``): a sliding-window or chunk
  group frees the blocks before its window only when the request next allocates, counting the
  tokens processed (``num_computed_tokens - num_in_flight_tokens``), in running order.
- **Async scheduling** (``sched/async_scheduler.py``, ``engine/core.py``
  ``step_with_batch_queue``): the output of a step comes back after the next step was
  scheduled; a decoding request holds an output placeholder meanwhile, a preempted request's
  in-flight output is stale and keeps it waiting until it is back (``num_stale_output_tokens``).
- **Prefix cache** (``block_pool.py``): every full block of a request's known tokens (its
  prompt and what it generated) is hashed once computed, up to a multiple of the scheduler
  block (``cache_blocks``, ``get_num_cacheable_tokens``); a freed block that
  is cached goes to the back of the one free queue and one that is not to the front
  (``BlockPool.free_blocks``); allocation takes from the front, evicting a cached block's hash
  (``get_new_blocks``); an admitted request takes the longest run of cached blocks every group
  agrees on, up to ``num_tokens - 1`` (``kv_cache_coordinator.py``,
  ``HybridKVCacheCoordinator.find_longest_cache_hit``: full attention from the start, a sliding
  window from the end with ``cdiv(window - 1, block_size)`` contiguous blocks, chunked local
  attention from the start of the chunk the hit ends in, the blocks before it counted as hit),
  and so does a preempted request when it is admitted again.

Tokens stand for themselves: the ``j``-th block of a request has the content of its
``prefix_id``'s ``j``-th block while it lies inside ``prefix_tokens``, else its own.

- **State (Mamba) groups**: without prefix caching one block per request from its first token
  (vLLM's ``mamba_cache_mode='none'``); with it, vLLM's ``mamba_cache_mode='align'``
  (``single_type_kv_cache_manager.py``, ``MambaManager``; ``sched/scheduler.py``,
  ``_mamba_block_aligned_split``): prefill chunks end on block boundaries, a request holds the
  states of its last two boundaries, caches each and hits the last cached one below the hit the
  other groups agree on, and a hit on a state cached in the same step waits a step; a state kind
  with prefill checkpoint blocks (Mamba-2's ``num_prefill_checkpoint_blocks``) writes the state
  of a chunk's last block boundary into a block of its own from inside the step, so the prompt's
  last chunk is not cut there and holds one state more. The plain
  reference models it (:mod:`~kvcore.simulation.profiles.vllm_reference.mamba_manager`), the
  fast path in :mod:`~kvcore.simulation.profiles.vllm.state_groups`, where every speed path
  steps aside for such a run.

Where it is an approximation: chunked local groups whose block is not the scheduler's never hit
(vLLM's lookup asserts that it is; ``plan_for_vllm`` never makes such a plan), so a plan with
them hits nothing; with prefix caching, state groups beside attention groups of several block
sizes are refused (vLLM hits inside a state block then); no speculative decoding, no KV
connector but vLLM's native CPU offloading (a plan with a host tier replays on the reference,
:mod:`kvcore.simulation.profiles.vllm_reference.offloading`: the speed paths step aside), no
encoder inputs, no priority policy, no watermark. ``tests/integrations/vllm`` checks the profile
figure for figure against vLLM 0.33's real ``Scheduler``.

How it is laid out (a package of modules, each a layer of :class:`VllmSimulator`, bottom up):

- :mod:`~kvcore.simulation.profiles.vllm.profile`: :class:`VllmProfile`, the settings;
- :mod:`~kvcore.simulation.profiles.vllm.state`: what a replay keeps (the per-request counts
  and tables, the groups worked out once per class) and which speed paths are on
  (:data:`SPEED_PATHS`);
- :mod:`~kvcore.simulation.profiles.vllm.block_pool`: the block pools, their free queues and
  hash tables (``BlockPool``);
- :mod:`~kvcore.simulation.profiles.vllm.prefix_cache`: hashing computed blocks and finding a
  hit (``cache_blocks``, ``get_computed_blocks``);
- :mod:`~kvcore.simulation.profiles.vllm.manager`: ``allocate_slots``,
  ``remove_skipped_blocks``, ``free`` (``KVCacheManager``);
- :mod:`~kvcore.simulation.profiles.vllm.shared`: freeing the tables of a request with shared
  blocks, its own pages as runs; a preempted request's runs, hashed at its next lookup (or left
  unhashed when its hit cannot read them); the
  hit of a prefix remembered (speed paths);
- :mod:`~kvcore.simulation.profiles.vllm.lean`: the lean boundary call of a decode and the
  lean finish (speed paths over compact tables);
- :mod:`~kvcore.simulation.profiles.vllm.steady`: steady decoders (a speed path);
- :mod:`~kvcore.simulation.profiles.vllm.retention`: a sliding window's sparse prefix cache
  (vLLM's ``prefix_cache_retention_interval``): which of a window's blocks are hashed, and which
  of a request's own blocks lazy hashing counts as cached when they are freed;
- :mod:`~kvcore.simulation.profiles.vllm.state_groups`: state groups under prefix caching (vLLM's
  ``mamba_cache_mode='align'``, their cached states thinned by the retention interval), for which
  the speed paths step aside;
- :mod:`~kvcore.simulation.profiles.vllm.scheduler`: the step itself (``Scheduler.schedule``,
  ``update_from_output``, preemption): :class:`VllmSimulator`.

The speed paths are named in :data:`SPEED_PATHS`; ``VllmSimulator(..., speed_paths=())`` turns
every one off (the plain path, which ``tests/simulation/test_vllm_reference.py`` holds to the
reference as it holds the fast path), and ``benchmarks/speed_paths.py`` measures what each buys.
"""

from __future__ import annotations

from kvcore.simulation.profiles.vllm.profile import VLLM_MAX_NUM_SEQS, VllmProfile
from kvcore.simulation.profiles.vllm.scheduler import VllmSimulator
from kvcore.simulation.profiles.vllm.state import SPEED_PATHS
from kvcore.simulation.profiles.vllm_groups import chunks_off_scheduler_block, scheduler_block

__all__ = [
    "SPEED_PATHS",
    "VLLM_MAX_NUM_SEQS",
    "VllmProfile",
    "VllmSimulator",
    "chunks_off_scheduler_block",
    "scheduler_block",
]
