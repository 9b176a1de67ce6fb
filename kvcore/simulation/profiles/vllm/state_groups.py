"""The fast path's step aside for state groups in vLLM's ``mamba_cache_mode='align'``.

With prefix caching, vLLM 0.33 runs a state group in ``mamba_cache_mode='align'`` (its states
kept at block boundaries), which changes what a step does:
prefill chunks are cut to the state block, the group holds the states of the last two block
boundaries reached, caches them and hits them, and a hit on a state cached in the same step
waits a step (:mod:`~kvcore.simulation.profiles.vllm_reference.mamba_manager`). None of the fast
path's tables, event bounds or runs models that, so for such a plan the fast path steps aside:
:class:`AlignStatesAside` replays it with the plain reference
(:class:`~kvcore.simulation.profiles.vllm_reference.VllmReferenceScheduler`), whose figures the
fast path must give anyway. Plans without such groups are untouched.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from kvcore.simulation.profiles.vllm.state import SPEED_PATHS
from kvcore.simulation.profiles.vllm.steady import SteadyDecoders
from kvcore.simulation.profiles.vllm_groups import align_state_block, check_align_states

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler
    from kvcore.simulation.profiles.vllm_reference.scheduler import VllmSettings
    from kvcore.simulation.simulator import SimulationResult
    from kvcore.simulation.steps import StepTimeModel
    from kvcore.simulation.workload import Workload


def steps_aside(plan: KVCachePlan, *, prefix_caching: bool) -> bool:
    """Whether the fast path replays ``plan`` with the reference: it has state groups and prefix
    caching is on (vLLM then runs them in align mode:
    :func:`~kvcore.simulation.profiles.vllm_groups.align_state_block`)."""
    return prefix_caching and align_state_block(plan) > 0


class AlignStatesAside(SteadyDecoders):
    """The fast path with its step aside (see the module docstring): for a plan of align-mode
    state groups, :meth:`step`, :attr:`done` and :meth:`result` are the reference's."""

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
        self._aside: VllmReferenceScheduler | None = None
        if steps_aside(plan, prefix_caching=prefix_caching):
            from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler

            self._aside = VllmReferenceScheduler(
                plan,
                workload,
                profile,
                max_num_batched_tokens=max_num_batched_tokens,
                prefix_caching=prefix_caching,
                step_time=step_time,
            )

    @property
    def done(self) -> bool:
        """Whether every request has finished (the reference's count when it steps aside)."""
        if self._aside is not None:
            return self._aside.done
        return self.finished == len(self.requests)

    @property
    def running(self) -> tuple[int, ...]:
        """The running requests, in the scheduler's order."""
        return self._aside.running if self._aside is not None else tuple(self._running)

    @property
    def waiting(self) -> tuple[int, ...]:
        """The requests that arrived and wait, in queue order."""
        return self._aside.waiting if self._aside is not None else tuple(self._waiting)

    def result(self) -> SimulationResult:
        """The figures (the reference's when it steps aside)."""
        if self._aside is not None:
            return self._aside.result()
        return super().result()
