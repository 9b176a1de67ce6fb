"""Scheduler profiles: the engines a simulation can replay a workload as.

A profile is what a plugin registers through the ``kvcore_register_scheduler_profiles`` hook: a
name (``kvcore simulate --scheduler NAME``), a one-line description, and
:meth:`SchedulerProfile.simulator`, which makes the stepper :func:`~kvcore.simulation.simulate`
drives to the end. The built-in profiles are in :mod:`kvcore.simulation.profiles`: ``vllm`` (the
default: vLLM 0.33's v1 scheduler), ``kvcore`` (the simulator's own rules,
:class:`~kvcore.simulation.simulator.Simulator`) and ``sglang`` (SGLang 0.5.23's scheduler).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from kvcore.errors import InvalidInputError

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.planning.registry import Registry
    from kvcore.simulation.steps import StepTimeModel
    from kvcore.simulation.workload import Workload

#: The profile :func:`~kvcore.simulation.simulate` and ``kvcore simulate`` use unless told.
DEFAULT_SCHEDULER: Final = "vllm"


class Stepper(Protocol):
    """One simulation, one scheduler step at a time (what a profile's ``simulator`` returns)."""

    @property
    def done(self) -> bool:
        """Whether every request has finished."""

    @property
    def steps(self) -> int:
        """Steps run so far."""

    @property
    def finished(self) -> int:
        """Requests finished so far."""

    def step(self) -> None:
        """Run one step (or skip an idle stretch); nothing once :attr:`done`."""

    def result(self) -> Any:
        """The figures so far (the whole run once :attr:`done`): a
        :class:`~kvcore.simulation.simulator.SimulationResult` (not imported here: the simulator
        imports this module)."""


@runtime_checkable
class SchedulerProfile(Protocol):
    """An engine's scheduling rules, as a simulation replays them.

    Attributes:
        name: what ``--scheduler`` calls it (unique among the registered profiles).
        description: one line for ``kvcore simulate --help`` and the docs.
    """

    name: str
    description: str

    def simulator(
        self,
        plan: KVCachePlan,
        workload: Workload,
        *,
        max_num_batched_tokens: int | None,
        prefix_caching: bool,
        step_time: StepTimeModel | None = None,
    ) -> Stepper:
        """A fresh stepper replaying ``workload`` through ``plan``'s pool.

        Args:
            plan: the plan (its groups and block counts make the pool).
            workload: the requests.
            max_num_batched_tokens: tokens one step may schedule (``None``: the plan's).
            prefix_caching: cache blocks for reuse, as the engine does.
            step_time: optional: a profile that times its steps takes it; :func:`simulate`
                passes it only when a step-time model is given. A step-time model
                (:mod:`kvcore.simulation.timing`): the stepper
                describes each step by a :class:`~kvcore.simulation.steps.StepRecord`, keeps
                a clock, takes requests that arrive in seconds, and its result carries a
                :class:`~kvcore.simulation.steps.Timeline`.

        Raises:
            InvalidInputError: the workload cannot run on the plan (a request longer than
                ``max_model_len``, or one that needs more than the pool even alone).
        """


class BuiltInProfile:
    """What the built-in profiles share: :meth:`simulator` hands the options every profile takes
    to the profile's own stepper (:meth:`_stepper`)."""

    def simulator(
        self,
        plan: KVCachePlan,
        workload: Workload,
        *,
        max_num_batched_tokens: int | None,
        prefix_caching: bool,
        step_time: StepTimeModel | None = None,
    ) -> Stepper:
        """A fresh stepper (see :meth:`SchedulerProfile.simulator`)."""
        options = {
            "max_num_batched_tokens": max_num_batched_tokens,
            "prefix_caching": prefix_caching,
            "step_time": step_time,
        }
        return self._stepper(plan, workload, options)

    def _stepper(self, plan: KVCachePlan, workload: Workload, options: dict[str, Any]) -> Stepper:
        """The profile's stepper, made with ``options`` (the keywords of :meth:`simulator`)."""
        raise NotImplementedError


def resolve_profile(scheduler: str | SchedulerProfile, registry: Registry | None = None) -> SchedulerProfile:
    """The profile ``scheduler`` names (looked up in ``registry``, default: the default
    registry's), or ``scheduler`` itself when it is a profile object.

    Raises:
        UnknownSchedulerError: no registered profile has that name.
        InvalidInputError: ``scheduler`` is neither a name nor a profile.
    """
    if isinstance(scheduler, str):
        if registry is None:
            from kvcore.planning.registry import Registry

            registry = _default_registry(Registry)
        profile = registry.scheduler_profile(scheduler)
        return profile  # type: ignore[no-any-return]
    if not isinstance(scheduler, SchedulerProfile):
        raise InvalidInputError(
            "scheduler must be a profile name (e.g. 'vllm') or a SchedulerProfile, "
            f"got {type(scheduler).__name__}"
        )
    return scheduler


_REGISTRY: list[Registry] = []


def _default_registry(cls: type[Registry]) -> Registry:
    """One default registry per process for name lookups (building one loads every plugin)."""
    if not _REGISTRY:
        _REGISTRY.append(cls.default())
    return _REGISTRY[0]
