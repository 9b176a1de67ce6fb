"""The ``kvcore`` scheduler profile: the simulator's own rules
(:class:`~kvcore.simulation.simulator.Simulator`; its module docstring states them).

They admit a request when its first chunk fits (no whole-prompt gate), free out-of-window pages
of every request at the end of each step, cache only shared prefixes (``prefix_id``), and have
no cap on running requests. Kept under their own name so that figures made with them stay
reproducible; the default profile is ``vllm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from kvcore.simulation.simulator import Simulator

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.steps import StepTimeModel
    from kvcore.simulation.workload import Workload


@attrs.frozen
class KvcoreProfile:
    """kvcore's own scheduling rules (no settings)."""

    name: str = "kvcore"
    description: str = (
        "kvcore's own rules: first-chunk admission, end-of-step window freeing, shared-prefix cache"
    )

    def simulator(
        self,
        plan: KVCachePlan,
        workload: Workload,
        *,
        max_num_batched_tokens: int | None,
        prefix_caching: bool,
        step_time: StepTimeModel | None = None,
    ) -> Simulator:
        """A :class:`~kvcore.simulation.simulator.Simulator` (see
        :meth:`kvcore.simulation.profile.SchedulerProfile.simulator`)."""
        return Simulator(
            plan,
            workload,
            max_num_batched_tokens=max_num_batched_tokens,
            prefix_caching=prefix_caching,
            step_time=step_time,
        )
