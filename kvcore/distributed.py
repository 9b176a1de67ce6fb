"""Several processes, one plan: ranks agree on the KV cache over a ``torch.distributed`` store.

Each rank of a ``torchrun`` job (gloo on CPU, NCCL on GPU: the agreement itself only moves
CPU-side JSON, so it does not care) wraps its own executor in a :class:`DistributedExecutor`:

::

    executor = DistributedExecutor.from_process_group(LocalExecutor(model, device, ...), tp_size=2)
    plan = initialize_kv_caches(executor, registry=registry, max_model_len=8192)

Specs and memory are found locally; the plan comes from an agreement: every rank publishes its
specs and memory, reads everyone's, and computes the same :func:`~kvcore.parallel.plan_for_ranks`
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

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

from kvcore.engine import Executor
from kvcore.errors import (
    DistributedAgreementError,
    InvalidInputError,
    InvalidSpecError,
    UnknownSpecKindError,
)
from kvcore.parallel import RankLayout, plan_for_ranks
from kvcore.plan import KVCacheConfig
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.registry import Registry
from kvcore.serialization import spec_from_dict, spec_to_dict
from kvcore.spec import KVCacheSpec, SizingContext, cdiv

#: Seconds a rank waits for the others in one round unless told otherwise. It must cover the
#: slowest rank's profiling (the plan round starts when a rank has its own memory figure).
DEFAULT_TIMEOUT_S = 300.0
#: Prefix of every key kvcore writes to a store it did not make itself.
STORE_PREFIX = "kvcore"
#: Version of the payloads ranks exchange; ranks running different kvcore versions fail clearly.
PROTOCOL_VERSION = 1
#: The two rounds of :func:`~kvcore.initialize_kv_caches`: specs and memory, then initialized.
PLAN_ROUND = "plan"
READY_ROUND = "ready"

_T = TypeVar("_T")
#: What one rank publishes in a round: any JSON value.
Payload = Any


class KeyValueStore(Protocol):
    """What the agreement needs of a store: every ``torch.distributed.Store`` (``TCPStore``,
    ``PrefixStore``, ``FileStore``, ``HashStore``) has it."""

    def set(self, key: str, value: str) -> None:
        """Set ``key`` to ``value``."""
        ...

    def get(self, key: str) -> bytes:
        """The value of ``key`` (waits for it)."""
        ...

    def add(self, key: str, value: int) -> int:
        """Add ``value`` to the counter ``key``; return the new count."""
        ...

    def check(self, keys: list[str]) -> bool:
        """Whether every key in ``keys`` is set (never waits)."""
        ...


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _positive_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInputError(f"{name!r} must be a number of seconds > 0 (got {value!r})")
    return float(value)


def _env(name: str) -> str:
    text = os.environ.get(name, "").strip()
    if not text:
        raise InvalidInputError(
            f"environment variable {name} is not set; launch the program with torchrun (which sets "
            "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE) or pass a torch.distributed.Store yourself"
        )
    return text


def _env_int(name: str) -> int:
    text = _env(name)
    try:
        return int(text)
    except ValueError:
        raise InvalidInputError(f"environment variable {name} must be an integer (got {text!r})") from None


def store_from_env(*, timeout_s: float = DEFAULT_TIMEOUT_S) -> KeyValueStore:
    """A store shared by every rank, from the environment ``torchrun`` sets up.

    It connects to the same TCP store the default process group met on
    (``MASTER_ADDR:MASTER_PORT``) and puts every key under ``kvcore/``:

    - under ``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE=True``) that store lives in the
      launcher's agent, so it outlives every worker and a dead rank 0 is named like any other;
    - otherwise (``env://`` with ranks started by hand) rank 0 hosts it, as
      ``torch.distributed`` does, and rank 0's death shows as a lost store.

    Args:
        timeout_s: how long a store operation may wait (connecting included).

    Returns:
        A ``torch.distributed.PrefixStore``.

    Raises:
        InvalidInputError: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` or ``WORLD_SIZE`` is
            missing or not a number.
        DistributedAgreementError: the store cannot be reached.
    """
    seconds = _positive_seconds("timeout_s", timeout_s)
    host = _env("MASTER_ADDR")
    port = _env_int("MASTER_PORT")
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    try:
        store = TCPStore(
            host,
            port,
            world_size,
            is_master=not agent_store and rank == 0,
            timeout=timedelta(seconds=seconds),
            wait_for_workers=False,
            multi_tenant=True,  # rank 0 reuses the server the default process group started
        )
    except (RuntimeError, OSError) as exc:
        raise DistributedAgreementError(
            f"rank {rank} cannot reach the key-value store at {host}:{port} ({_first_line(exc)}); "
            "check MASTER_ADDR and MASTER_PORT",
            ranks=(),
            round_id="connect",
        ) from None
    return PrefixStore(STORE_PREFIX, store)


class StoreAgreement:
    """All-gather of one JSON payload per rank over a store, with a deadline that names the
    ranks at fault.

    Every rank calls :meth:`exchange` (or :meth:`fail`) once per round, in the same order of
    round names; a rank that raised calls :meth:`fail` so the others stop at once.

    Args:
        store: a ``torch.distributed.Store`` every rank reaches (:func:`store_from_env`).
        rank: this rank.
        world_size: ranks in all.
        timeout_s: how long to wait for the other ranks in one round.
        poll_s: the first pause between polls (doubles up to 0.1 s).
        describe: ``describe(rank)`` names a rank in messages (default ``"rank N"``).
    """

    def __init__(
        self,
        store: KeyValueStore,
        rank: int,
        world_size: int,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        poll_s: float = 0.005,
        describe: Callable[[int], str] | None = None,
    ) -> None:
        layout = RankLayout.for_world(world_size)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise InvalidInputError(f"rank must be an int in [0, {world_size}) (got {rank!r})")
        self.store = store
        self.rank = rank
        self.world_size = layout.world_size
        self.timeout_s = _positive_seconds("timeout_s", timeout_s)
        self.poll_s = _positive_seconds("poll_s", poll_s)
        self.describe = describe if describe is not None else (lambda r: f"rank {r}")
        self._open: dict[str, str] = {}

    def exchange(self, name: str, payload: Payload) -> list[Payload]:
        """Publish ``payload`` in round ``name`` and return every rank's, in rank order.

        Raises:
            DistributedAgreementError: a rank published an error marker (names it and its
                error), ranks did not answer within ``timeout_s`` (names them), or the store
                failed.
        """
        round_id = self._round(name)
        try:
            self._publish(round_id, {"ok": payload}, pending=range(self.world_size))
            return self._gather(round_id)
        finally:
            self._open.pop(name, None)

    def fail(self, name: str, exc: BaseException) -> None:
        """Tell the other ranks that this rank failed in round ``name`` (the caller re-raises).

        Never raises: if the store is gone as well, there is no one left to tell.
        """
        try:
            self._publish(self._round(name), {"error": _first_line(exc)}, pending=())
        except DistributedAgreementError:
            pass
        finally:
            self._open.pop(name, None)

    # -- internals -------------------------------------------------------------------------

    def _key(self, round_id: str, rank: int) -> str:
        return f"{round_id}/{rank}"

    def _store_call(self, what: Callable[[], _T], round_id: str, pending: Sequence[int] | range) -> _T:
        try:
            return what()
        except (RuntimeError, OSError) as exc:
            waiting = list(pending)
            named = ", ".join(self.describe(r) for r in waiting) or "no one"
            raise DistributedAgreementError(
                f"{self.describe(self.rank)} lost the key-value store in agreement round {round_id!r} "
                f"({_first_line(exc)}) while waiting for {named}; the process that hosts the store (the "
                "torchrun agent, or rank 0) has probably exited",
                ranks=tuple(waiting),
                round_id=round_id,
            ) from None

    def _round(self, name: str) -> str:
        if name not in self._open:
            # Every rank adds once per round and finishes a round only after every rank has
            # published in it, so the k-th add of every rank precedes any (k+1)-th add.
            count = self._store_call(
                lambda: self.store.add(f"{name}/rounds", 1), name, pending=range(self.world_size)
            )
            self._open[name] = f"{name}/{cdiv(count, self.world_size)}"
        return self._open[name]

    def _publish(self, round_id: str, entry: Mapping[str, Any], pending: Sequence[int] | range) -> None:
        text = json.dumps({"version": PROTOCOL_VERSION, **entry})
        self._store_call(lambda: self.store.set(self._key(round_id, self.rank), text), round_id, pending)

    def _read(self, round_id: str, rank: int, pending: list[int]) -> dict[str, Any] | None:
        key = self._key(round_id, rank)
        if not self._store_call(lambda: self.store.check([key]), round_id, pending):
            return None
        raw = self._store_call(lambda: self.store.get(key), round_id, pending)
        entry = json.loads(bytes(raw).decode("utf-8"))
        if not isinstance(entry, dict) or entry.get("version") != PROTOCOL_VERSION:
            got = entry.get("version") if isinstance(entry, dict) else None
            raise DistributedAgreementError(
                f"{self.describe(rank)} speaks agreement protocol version {got!r} but "
                f"{self.describe(self.rank)} speaks {PROTOCOL_VERSION}; run one kvcore version on every rank",
                ranks=(rank,),
                round_id=round_id,
            )
        return entry

    def _gather(self, round_id: str) -> list[Payload]:
        deadline = time.monotonic() + self.timeout_s
        answers: dict[int, Payload] = {}
        delay = self.poll_s
        while True:
            pending = [r for r in range(self.world_size) if r not in answers]
            failed: list[tuple[int, str]] = []
            for rank in pending:
                entry = self._read(round_id, rank, pending)
                if entry is None:
                    continue
                if "error" in entry:
                    failed.append((rank, str(entry["error"])))
                else:
                    answers[rank] = entry.get("ok")
            if failed:
                told = "; ".join(f"{self.describe(r)} failed: {message}" for r, message in failed)
                raise DistributedAgreementError(
                    f"agreement round {round_id!r} stopped on {self.describe(self.rank)} because {told}; "
                    "fix the failing rank (its own log has the full error)",
                    ranks=tuple(r for r, _ in failed),
                    round_id=round_id,
                )
            if len(answers) == self.world_size:
                return [answers[r] for r in range(self.world_size)]
            if time.monotonic() >= deadline:
                missing = [r for r in range(self.world_size) if r not in answers]
                what = (
                    "it died, hangs or is not running this agreement: check its log"
                    if len(missing) == 1
                    else "they died, hang or are not running this agreement: check their logs"
                )
                raise DistributedAgreementError(
                    f"{', '.join(self.describe(r) for r in missing)} did not answer within "
                    f"{self.timeout_s:g} s in agreement round {round_id!r} ({len(answers)} of "
                    f"{self.world_size} ranks did); {what}, or raise the timeout if a slow start "
                    "(profiling, compilation) is the cause",
                    ranks=tuple(missing),
                    round_id=round_id,
                )
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.1)


class DistributedExecutor:
    """One rank of a tensor x pipeline parallel job: local specs and memory, the plan by agreement.

    It wraps the rank's own executor (a :class:`~kvcore.LocalExecutor` over the rank's part of
    the model) and follows :class:`kvcore.engine.AgreeingExecutor`, so
    :func:`~kvcore.initialize_kv_caches` runs it like any executor. Two agreement rounds run:

    1. ``plan``: every rank's specs and memory; every rank computes
       :func:`~kvcore.parallel.plan_for_ranks` and keeps its own plan (``rank_plans`` holds all);
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
        self.layout = RankLayout.for_world(world_size, tp_size)
        self.agreement = StoreAgreement(
            store, rank, world_size, timeout_s=timeout_s, describe=self.layout.describe
        )
        self.rank = rank
        self.rank_plans: list[KVCacheConfig] = []
        self.plan: KVCacheConfig | None = None

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
    ) -> KVCacheConfig:
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
                tp_size=self.layout.tp_size,
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
                f"{self.layout.describe(rank)} reports a spec this rank cannot read: {exc}"
            ) from None

    def initialize(self, plan: KVCacheConfig) -> None:
        """Allocate and bind this rank's layers, then wait until every rank has done so.

        Raises:
            DistributedAgreementError: another rank failed to initialize or did not answer.
            KVCacheAllocationError, KVCacheBindingError: this rank failed (the others are told).
        """
        self._local(lambda: self.local.initialize(plan), READY_ROUND)
        answers = self.agreement.exchange(READY_ROUND, {"num_blocks": plan.num_blocks})
        counts = {rank: answer["num_blocks"] for rank, answer in enumerate(answers)}
        if len(set(counts.values())) != 1:
            listed = ", ".join(f"{self.layout.describe(r)}: {n}" for r, n in counts.items())
            raise DistributedAgreementError(
                f"ranks were initialized with different block counts ({listed}); every rank must "
                "initialize the plan agree_on_plan returned to it",
                ranks=tuple(r for r, n in counts.items() if n != plan.num_blocks),
                round_id=READY_ROUND,
            )
        self.plan = plan
