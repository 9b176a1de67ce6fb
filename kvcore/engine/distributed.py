"""Several processes, one plan: ranks agree on the KV cache over a ``torch.distributed`` store.

Each rank of a ``torchrun`` job (gloo on CPU, NCCL on GPU: the agreement itself only moves
CPU-side JSON, so it does not care) wraps its own executor in a :class:`DistributedExecutor`:

::

    executor = DistributedExecutor.from_process_group(LocalExecutor(model, device, ...), tp_size=2)
    plan = initialize_kv_caches(executor, registry=registry, max_model_len=8192)

Specs and memory are found locally; the plan comes from an agreement: every rank publishes its
specs and memory, reads everyone's, and computes the same :func:`~kvcore.planning.ranks.plan_for_ranks`
deterministically; it keeps its own plan and allocates and binds only its own layers.

Why a key-value store and not collectives: ``all_gather_object`` blocks until the process
group's timeout and then cannot say which rank is missing. Here (:class:`StoreAgreement`) each
rank writes one key per round, ``<name>/<round>/<rank>``, holding its payload or, if it raised,
an error marker, and polls for the other keys until its own deadline. A missing key names a
rank that died or hangs; an error marker names the rank that raised and says what it raised.
Round numbers come from a counter in the store (``store.add``), so a second agreement never
reads the keys of an earlier one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch.distributed as dist

from kvcore.engine.agreement import DEFAULT_TIMEOUT_S, KeyValueStore, StoreAgreement, store_from_env
from kvcore.engine.workflow import Executor
from kvcore.errors import (
    DistributedAgreementError,
    InvalidInputError,
    InvalidSpecError,
    UnknownSpecKindError,
)
from kvcore.plan import KVCachePlan
from kvcore.planning.ranks import Parallelism, plan_for_ranks
from kvcore.planning.registry import Registry
from kvcore.planning.serialization import spec_from_dict, spec_to_dict
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext

#: The two rounds of :func:`~kvcore.initialize_kv_caches`: specs and memory, then initialized.
PLAN_ROUND = "plan"
READY_ROUND = "ready"

_T = TypeVar("_T")


class DistributedExecutor:
    """One rank of a tensor x pipeline parallel job: local specs and memory, the plan by agreement.

    It wraps the rank's own executor (a :class:`~kvcore.LocalExecutor` over the rank's part of
    the model) and follows :class:`kvcore.engine.AgreeingExecutor`, so
    :func:`~kvcore.initialize_kv_caches` runs it like any executor. Two agreement rounds run:

    1. ``plan``: every rank's specs and memory; every rank computes
       :func:`~kvcore.planning.ranks.plan_for_ranks` and keeps its own plan (``rank_plans`` holds all);
    2. ``ready``: after the local ``initialize`` (allocate and bind this rank's layers only),
       so an allocation failure on one rank stops every rank too.

    A failure on this rank (specs, profiling, planning, allocation) is published before it is
    re-raised, so the other ranks fail at once with a :class:`DistributedAgreementError`
    naming this rank; a rank that dies or hangs is named when the timeout expires.

    Args:
        local: this rank's executor.
        rank: this rank (``RANK``).
        world_size: ranks in all (``WORLD_SIZE``): ``tp_size x pp_size``.
        store: a store every rank reaches; :func:`store_from_env` builds one under torchrun.
        tp_size: tensor-parallel ranks per pipeline stage.
        timeout_s: how long to wait for the other ranks in one round.
    """

    def __init__(
        self,
        local: Executor,
        *,
        rank: int,
        world_size: int,
        store: KeyValueStore,
        tp_size: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.local = local
        self.parallelism = Parallelism.for_world(world_size, tp_size)
        self.agreement = StoreAgreement(
            store, rank, world_size, timeout_s=timeout_s, describe=self.parallelism.describe
        )
        self.rank = rank
        self.rank_plans: list[KVCachePlan] = []
        self.plan: KVCachePlan | None = None

    @classmethod
    def from_process_group(
        cls,
        local: Executor,
        *,
        tp_size: int = 1,
        store: KeyValueStore | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> DistributedExecutor:
        """The executor of this rank of the default process group.

        Args:
            local: this rank's executor.
            tp_size: tensor-parallel ranks per pipeline stage.
            store: the store to agree over; default :func:`store_from_env`.
            timeout_s: how long to wait for the other ranks in one round.

        Raises:
            InvalidInputError: ``torch.distributed`` is not initialized, or the environment
                lacks what :func:`store_from_env` needs.
        """
        if not (dist.is_available() and dist.is_initialized()):
            raise InvalidInputError(
                "torch.distributed is not initialized; call torch.distributed.init_process_group() "
                "(backend gloo on CPU, nccl on GPU) before building a DistributedExecutor"
            )
        return cls(
            local,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            store=store if store is not None else store_from_env(timeout_s=timeout_s),
            tp_size=tp_size,
            timeout_s=timeout_s,
        )

    def _local(self, step: Callable[[], _T], round_name: str) -> _T:
        try:
            return step()
        except Exception as exc:
            self.agreement.fail(round_name, exc)
            raise

    def get_kv_cache_spec(self) -> Mapping[str, KVCacheSpec]:
        """This rank's specs, from the wrapped executor (a failure stops every rank)."""
        return self._local(self.local.get_kv_cache_spec, PLAN_ROUND)

    def determine_available_memory(self) -> int:
        """This rank's KV-cache budget, from the wrapped executor (a failure stops every rank)."""
        return self._local(self.local.determine_available_memory, PLAN_ROUND)

    def agree_on_plan(
        self,
        specs: Mapping[str, KVCacheSpec],
        memory: int,
        context: SizingContext,
        *,
        registry: Registry,
        policy: str | AllocationPolicy = "auto",
        options: PlanOptions | None = None,
        num_blocks: int | None = None,
    ) -> KVCachePlan:
        """Share this rank's specs and memory, plan every rank, and return this rank's plan.

        Raises:
            DistributedAgreementError: a rank did not answer in time or failed (named).
            SpecMismatchError: ranks disagree on a layer (same error on every rank).
            InsufficientMemoryError: one request does not fit (same error on every rank).
        """
        payload = self._local(
            lambda: {
                "layers": {name: spec_to_dict(spec, registry) for name, spec in specs.items()},
                "memory": memory,
            },
            PLAN_ROUND,
        )
        answers = self.agreement.exchange(PLAN_ROUND, payload)
        plans = self._local(
            lambda: plan_for_ranks(
                [self._read_specs(answer, rank, registry) for rank, answer in enumerate(answers)],
                [answer["memory"] for answer in answers],
                context,
                registry=registry,
                policy=policy,
                options=options,
                num_blocks=num_blocks,
                tp_size=self.parallelism.tp_size,
            ),
            READY_ROUND,
        )
        self.rank_plans = plans
        return plans[self.rank]

    def _read_specs(self, answer: Mapping[str, Any], rank: int, registry: Registry) -> dict[str, KVCacheSpec]:
        try:
            return {name: spec_from_dict(data, registry) for name, data in answer["layers"].items()}
        except (UnknownSpecKindError, InvalidSpecError) as exc:
            raise type(exc)(
                f"{self.parallelism.describe(rank)} reports a spec this rank cannot read: {exc}"
            ) from None

    def initialize(self, plan: KVCachePlan) -> None:
        """Allocate and bind this rank's layers, then wait until every rank has done so.

        Raises:
            DistributedAgreementError: another rank failed to initialize or did not answer.
            KVCacheAllocationError, KVCacheBindingError: this rank failed (the others are told).
        """
        self._local(lambda: self.local.initialize(plan), READY_ROUND)
        answers = self.agreement.exchange(READY_ROUND, {"num_blocks": plan.num_blocks})
        counts = {rank: answer["num_blocks"] for rank, answer in enumerate(answers)}
        if len(set(counts.values())) != 1:
            listed = ", ".join(f"{self.parallelism.describe(r)}: {n}" for r, n in counts.items())
            raise DistributedAgreementError(
                f"ranks were initialized with different block counts ({listed}); every rank must "
                "initialize the plan agree_on_plan returned to it",
                ranks=tuple(r for r, n in counts.items() if n != plan.num_blocks),
                round_id=READY_ROUND,
            )
        self.plan = plan

    def release(self) -> int:
        """Free this rank's caches (:meth:`kvcore.LocalExecutor.release` of the wrapped executor);
        every rank releases its own before the ranks plan again.

        Returns:
            The bytes this rank let go.

        Raises:
            InvalidInputError: the wrapped executor has no ``release()``.
        """
        release = getattr(self.local, "release", None)
        if not callable(release):
            raise InvalidInputError(
                f"the wrapped executor ({type(self.local).__name__}) has no release(); wrap a "
                "kvcore.LocalExecutor or give yours one"
            )
        self.plan = None
        return int(release())
