"""The ``kvcore`` scheduler profile: the simulator's own rules
(:class:`~kvcore.simulation.simulator.Simulator`; its module docstring states them).

They admit a request when its first chunk fits (no whole-prompt gate), free out-of-window pages
of every request at the end of each step, cache only shared prefixes (``prefix_id``), and have
no cap on running requests. Kept under their own name so that figures made with them stay
reproducible; the default profile is ``vllm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from kvcore.simulation.profile import BuiltInProfile
from kvcore.simulation.simulator import Simulator

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.workload import Workload


@attrs.frozen
class KvcoreProfile(BuiltInProfile):
    """kvcore's own scheduling rules (no settings)."""

    name: str = "kvcore"
    description: str = (
        "kvcore's own rules: first-chunk admission, end-of-step window freeing, shared-prefix cache"
    )
    #: a plan's host tier is simulated (the block pool's host tier)
    simulates_host_tier: ClassVar[bool] = True

    def _stepper(self, plan: KVCachePlan, workload: Workload, options: dict[str, Any]) -> Simulator:
        """A :class:`~kvcore.simulation.simulator.Simulator` (:meth:`simulator` passes ``options``)."""
        return Simulator(plan, workload, **options)
