"""The ``vllm`` profile's reference: vLLM 0.33's scheduler step and KV-cache manager written
plainly, one method for each vLLM method it stands for, named after it, with no speed path.

It reads side by side with vLLM's sources:

- :mod:`~kvcore.simulation.profiles.vllm_reference.scheduler`: ``vllm/v1/core/sched/scheduler.py``
  (``Scheduler.schedule``, ``_preempt_request``, ``_update_after_schedule``,
  ``update_from_output``) and ``sched/async_scheduler.py``;
- :mod:`~kvcore.simulation.profiles.vllm_reference.kv_cache_manager`:
  ``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``, ``allocate_slots``, ``free``),
  ``kv_cache_coordinator.py`` (``find_longest_cache_hit``) and
  ``single_type_kv_cache_manager.py`` (``get_num_blocks_to_allocate``,
  ``remove_skipped_blocks``, ``cache_blocks``, ``free``, each attention type's
  ``find_longest_cache_hit``);
- :mod:`~kvcore.simulation.profiles.vllm_reference.mamba_manager`: ``MambaManager`` in
  ``mamba_cache_mode='align'`` (state groups under prefix caching);
- :mod:`~kvcore.simulation.profiles.vllm_reference.block_pool`: ``vllm/v1/core/block_pool.py``
  (``get_new_blocks``, ``free_blocks``, ``touch``, ``get_cached_block``, eviction);
- :mod:`~kvcore.simulation.profiles.vllm_reference.request`: ``vllm/v1/request.py``;
- :mod:`~kvcore.simulation.profiles.vllm_reference.offloading`: vLLM's native CPU offloading
  (``--kv-offloading-size``): ``vllm/v1/kv_offload/cpu/manager.py`` (``CPUOffloadingManager``),
  ``cpu/policies/lru.py`` and the ``OffloadingConnector``'s scheduler side
  (``kv_connector/v1/offloading/scheduler.py``), and
  :mod:`~kvcore.simulation.profiles.vllm_reference.offloading_scheduler`: the scheduler's calls
  into it (a plan with a host tier replays there).

Select it with ``simulate(..., scheduler="vllm-reference")``, ``VllmProfile(reference=True)``
or ``kvcore simulate --scheduler vllm-reference``. The fast path
(:class:`~kvcore.simulation.profiles.vllm.VllmSimulator`) must give every figure it gives:
``tests/simulation/test_vllm_reference.py`` holds the two equal on random plans and traces.
"""

from __future__ import annotations

from kvcore.simulation.profiles.vllm_reference.scheduler import VllmReferenceScheduler

__all__ = ["VllmReferenceScheduler"]
