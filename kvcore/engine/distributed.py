"""Several processes, one plan: ranks agree on the KV cache over a ``torch.distributed`` store.

Each rank of a ``torchrun`` job (gloo on CPU, NCCL on GPU: the agreement itself only moves
CPU-side JSON, so it does not care) wraps its own executor in a :class:`DistributedExecutor`:

::

    executor = DistributedExecutor.from_process_group(LocalExecutor(model, device, ...), tp_size=2)
    plan = initialize_kv_caches(executor, registry=registry, max_model_len=8192)

Specs and memory are found locally; the plan comes from an agreement: every rank publishes its
specs and memory, reads everyone's, and computes the same plans deterministically
(:func:`~kvcore.planning.ranks.ranks_request`); it keeps its own plan and allocates and binds
only its own layers.

Why a key-value store and not collectives: ``all_gather_object`` blocks until the process
group's timeout and then cannot say which rank is missing. Here (:class:`StoreAgreement`) each
rank writes one key per round, rank 0 collects them and writes the round's decision (every
payload, or an abort), and every rank follows that one decision: a missing key names a rank that
died or hangs, an abort names the rank that raised and what it raised, and no rank returns a
plan while another raises. Keys live under an attempt namespace (torchrun's run id and restart
count, a caller's ``run_id``, or a fresh id), so an agreement never reads an older one's keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

import attrs
import torch.distributed as dist

from kvcore.engine.agreement import (
    DEFAULT_TIMEOUT_S,
    KeyValueStore,
    Mismatch,
    StoreAgreement,
    majority_mismatch,
    store_from_env,
)
from kvcore.engine.workflow import Executor
from kvcore.errors import (
    InvalidInputError,
    InvalidSpecError,
    UnknownSpecKindError,
)
from kvcore.model_options import ModelOptions
from kvcore.plan import KVCachePlan
from kvcore.planning.planner import plan
from kvcore.planning.ranks import Parallelism, ranks_request
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest, check_budget, check_specs, takes_request
from kvcore.planning.serialization import plan_to_dict, spec_from_dict, spec_to_dict
from kvcore.policy import AllocationPolicy
from kvcore.spec import KVCacheSpec

#: The two rounds of :func:`~kvcore.initialize_kv_caches`: fingerprint, specs and memory, then
#: initialized (the commit: every rank has allocated the plan whose digest it publishes).
PLAN_ROUND = "plan"
READY_ROUND = "ready"
#: JSON values of a fingerprint.
Fingerprint = dict[str, Any]


@cache
def block_counts(plan: KVCachePlan) -> int | list[int]:
    """The plan's block count as the ranks publish it: an int for one pool, one count per pool
    (a list) for several."""
    counts = [pool.num_blocks for pool in plan.pools]
    return counts if plan.names_pools else counts[0]


def kvcore_version() -> str:
    """The installed kvcore's version (``"unknown"`` when it is not installed as a package)."""
    try:
        return version("kvcore")
    except PackageNotFoundError:
        return "unknown"


def _policy_name(policy: str | AllocationPolicy) -> str:
    if isinstance(policy, str):
        return policy
    kind = type(policy)
    return f"{getattr(policy, 'name', '?')} ({kind.__module__}.{kind.__qualname__})"


def digest(value: object) -> str:
    """A short SHA-256 of ``value``'s canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


_T = TypeVar("_T")


def _checked(value: _T, check: Callable[[_T], None]) -> _T:
    # checked inside the round, so a bad value stops every rank at once (the request, made
    # after it, would raise on this rank alone and leave the others waiting for it)
    check(value)
    return value


class DistributedExecutor:
    """One rank of a tensor x pipeline parallel job: local specs and memory, the plan by agreement.

    It wraps the rank's own executor (a :class:`~kvcore.LocalExecutor` over the rank's part of
    the model) and follows :class:`kvcore.engine.AgreeingExecutor`, so
    :func:`~kvcore.initialize_kv_caches` runs it like any executor. Two agreement rounds run:

    1. ``plan``: every rank's specs and memory; every rank plans them all
       (:func:`~kvcore.planning.ranks.ranks_request`) and keeps its own plan (``rank_plans``
       holds all);
    2. ``ready``: after the local ``initialize`` (allocate and bind this rank's layers only),
       so an allocation failure on one rank stops every rank too.

    Before planning, rank 0 compares every rank's *fingerprint* (:meth:`fingerprint`): the
    parallel layout, policy, sizing context, plan options, forced block count, kvcore version,
    registered kinds and policies, and ``identity``; a difference stops every rank with an
    :class:`~kvcore.errors.AgreementMismatchError` naming the field and the ranks. The ``ready``
    round compares digests of the whole plans.

    A failure on this rank (specs, profiling, planning, allocation) is published before it is
    re-raised, so the other ranks fail at once with a :class:`DistributedAgreementError`
    naming this rank; a rank that dies or hangs is named when the timeout expires. Either every
    rank returns the same plans or every rank raises (see :mod:`kvcore.engine.agreement`).

    Args:
        local: this rank's executor.
        rank: this rank (``RANK``).
        world_size: ranks in all (``WORLD_SIZE``): ``tp_size x pp_size``.
        store: a store every rank reaches; :func:`store_from_env` builds one under torchrun.
        tp_size: tensor-parallel ranks per pipeline stage.
        timeout_s: how long to wait for the other ranks in one round.
        run_id: an id of this attempt, the same on every rank and new for every attempt (default:
            torchrun's run id and restart count, else a fresh id rank 0 draws).
        identity: more values every rank must agree on (``{"model": "openai/gpt-oss-20b",
            "kv_cache_dtype": "fp8"}``), JSON.
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
        run_id: str | None = None,
        identity: Mapping[str, Any] | None = None,
    ) -> None:
        self.local = local
        self.parallelism = Parallelism.for_world(world_size, tp_size)
        self.identity = dict(identity or {})
        try:
            json.dumps(self.identity)
        except (TypeError, ValueError):
            raise InvalidInputError(f"'identity' must map names to JSON values (got {identity!r})") from None
        self.agreement = StoreAgreement(
            store, rank, world_size, timeout_s=timeout_s, describe=self.parallelism.describe, run_id=run_id
        )
        self.rank = rank
        self.rank_plans: list[KVCachePlan] = []
        self.plan: KVCachePlan | None = None
        self._registry: Registry | None = None

    @classmethod
    def from_process_group(
        cls,
        local: Executor,
        *,
        tp_size: int = 1,
        store: KeyValueStore | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        run_id: str | None = None,
        identity: Mapping[str, Any] | None = None,
    ) -> DistributedExecutor:
        """The executor of this rank of the default process group.

        Args:
            local: this rank's executor.
            tp_size: tensor-parallel ranks per pipeline stage.
            store: the store to agree over; default :func:`store_from_env`.
            timeout_s: how long to wait for the other ranks in one round.
            run_id: an id of this attempt (see the class).
            identity: more values every rank must agree on (see the class).

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
            run_id=run_id,
            identity=identity,
        )

    def _local(self, step: Callable[[], _T], round_name: str) -> _T:
        try:
            return step()
        except Exception as exc:
            self.agreement.fail(round_name, exc)
            raise

    def get_kv_cache_spec(self) -> Mapping[str, KVCacheSpec]:
        """This rank's specs, from the wrapped executor, checked (a failure stops every rank)."""
        return self._local(lambda: _checked(self.local.get_kv_cache_spec(), check_specs), PLAN_ROUND)

    def determine_available_memory(self) -> int:
        """This rank's KV-cache budget, from the wrapped executor, checked (a failure stops
        every rank)."""
        return self._local(
            lambda: _checked(self.local.determine_available_memory(), check_budget), PLAN_ROUND
        )

    def fingerprint(self, request: PlanRequest, *, registry: Registry) -> Fingerprint:
        """What must be the same on every rank, field by field (JSON values): the parts of
        ``request`` that are not the rank's own (its specs and budget are).

        Returns:
            ``{"kvcore version", "tp_size", "pp_size", "policy", "max_model_len",
            "max_num_batched_tokens", "plan options", "num_blocks", "spec kinds", "policies"}``,
            ``"model options"`` (the wrapped executor's ``scan_options``: KV-cache dtype, state
            dtype, block size, tp) when it has them, and every ``identity`` entry. A forced
            count per pool is a list.
        """
        num_blocks = request.num_blocks
        return {
            "kvcore version": kvcore_version(),
            "tp_size": self.parallelism.tp_size,
            "pp_size": self.parallelism.pp_size,
            "policy": _policy_name(request.policy),
            "max_model_len": request.context.max_model_len,
            "max_num_batched_tokens": request.context.max_num_batched_tokens,
            "plan options": attrs.asdict(request.options),
            # one count, or one per pool (a list, as JSON reads it back on every rank)
            "num_blocks": num_blocks
            if num_blocks is None or isinstance(num_blocks, int)
            else list(num_blocks),
            "spec kinds": sorted(registry.kinds),
            "policies": sorted(registry.policies),
            **self._model_options(),
            **self.identity,
        }

    def _model_options(self) -> Fingerprint:
        options = getattr(self.local, "scan_options", None)
        if not isinstance(options, ModelOptions):
            return {}
        return {
            "model options": {
                field.name: value if value is None or isinstance(value, int) else str(value)
                for field, value in ((f, getattr(options, f.name)) for f in attrs.fields(ModelOptions))
            }
        }

    def _check_fingerprints(self, answers: list[Any]) -> Mismatch | None:
        prints = [answer.get("fingerprint", {}) if isinstance(answer, dict) else {} for answer in answers]
        fields = list(dict.fromkeys(field for printed in prints for field in printed))
        for field in fields:
            found = majority_mismatch(field, [p.get(field) for p in prints], self.parallelism.describe)
            if found is not None:
                return found
        return None

    @takes_request(
        "specs, memory, context", "agree_on_plan(PlanRequest(specs=..., budgets=memory, ...))", method=True
    )
    def agree_on_plan(self, request: PlanRequest, *, registry: Registry) -> KVCachePlan:
        """Share this rank's fingerprint, specs and memory (the request's), plan every rank,
        and return this rank's plan.

        Raises:
            AgreementMismatchError: ranks were started with different settings (names the
                field and the ranks; before any planning).
            DistributedAgreementError: a rank did not answer in time or failed (named).
            StoreUnavailableError: the store was lost or stopped answering (names its host).
            SpecMismatchError: ranks disagree on a layer (same error on every rank).
            InsufficientMemoryError: one request does not fit (same error on every rank).
        """
        self._registry = registry
        payload = self._local(
            lambda: {
                "fingerprint": self.fingerprint(request, registry=registry),
                "layers": {name: spec_to_dict(spec, registry) for name, spec in request.specs.items()},
                "memory": request.budgets[0],
            },
            PLAN_ROUND,
        )
        answers = self.agreement.exchange(PLAN_ROUND, payload, validate=self._check_fingerprints)
        plans = self._local(lambda: self._plan_ranks(request, answers, registry), READY_ROUND)
        self.rank_plans = plans
        return plans[self.rank]

    def _plan_ranks(self, request: PlanRequest, answers: list[Any], registry: Registry) -> list[KVCachePlan]:
        """Every rank's plan from every rank's answer (the same on every rank)."""
        rank_specs = [self._read_specs(answer, rank, registry) for rank, answer in enumerate(answers)]
        memory = [answer["memory"] for answer in answers]
        ranks = ranks_request(request, rank_specs, memory, tp_size=self.parallelism.tp_size)
        return list(plan(ranks, registry=registry).plans)

    def _read_specs(self, answer: Mapping[str, Any], rank: int, registry: Registry) -> dict[str, KVCacheSpec]:
        try:
            return {name: spec_from_dict(data, registry) for name, data in answer["layers"].items()}
        except (UnknownSpecKindError, InvalidSpecError) as exc:
            raise type(exc)(
                f"{self.parallelism.describe(rank)} reports a spec this rank cannot read: {exc}"
            ) from None

    def _digest(self, plan: KVCachePlan) -> str:
        # layers that share another layer's cache are added to this rank's plan after the
        # agreement (``with_kv_sharing``): they are the rank's own business
        plain = attrs.evolve(plan, kv_sharing={})
        return digest(plan_to_dict(plain, self._registry) if self._registry is not None else repr(plain))

    def _check_plans(self, answers: list[Any]) -> Mismatch | None:
        describe = self.parallelism.describe
        found = majority_mismatch("the plans of all ranks", [a.get("plans") for a in answers], describe)
        if found is not None:
            return Mismatch(
                found.field,
                found.detail + " (digests of every rank's plan as each rank computed them)",
                found.ranks,
            )
        if self.rank_plans:
            wrong = [
                r for r, answer in enumerate(answers) if answer.get("own") != self._digest(self.rank_plans[r])
            ]
            if wrong:
                return Mismatch(
                    "plan",
                    f"{', '.join(describe(r) for r in wrong)} initialized a plan other than the one "
                    "agree_on_plan returned to it; every rank must initialize its agreed plan",
                    tuple(wrong),
                )
        return None

    def initialize(self, plan: KVCachePlan) -> None:
        """Allocate and bind this rank's layers, then commit: wait until every rank has done so
        with the plan agreed for it.

        Raises:
            DistributedAgreementError: another rank failed to initialize or did not answer.
            AgreementMismatchError: a rank initialized another plan than the agreed one.
            StoreUnavailableError: the store was lost or stopped answering (names its host).
            KVCacheAllocationError, KVCacheBindingError: this rank failed (the others are told).
        """
        self._local(lambda: self.local.initialize(plan), READY_ROUND)
        everyone = [self._digest(p) for p in self.rank_plans]
        self.agreement.exchange(
            READY_ROUND,
            {"plans": digest(everyone), "own": self._digest(plan), "num_blocks": block_counts(plan)},
            validate=self._check_plans,
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
