"""Store agreement: an all-gather of one JSON payload per rank over a ``torch.distributed`` store,
with a deadline that names the ranks at fault.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

from kvcore.errors import (
    DistributedAgreementError,
    InvalidInputError,
)
from kvcore.planning.ranks import Parallelism
from kvcore.spec import cdiv
from kvcore.validators import check_int, is_number

#: Seconds a rank waits for the others in one round unless told otherwise. It must cover the
#: slowest rank's profiling (the plan round starts when a rank has its own memory figure).
DEFAULT_TIMEOUT_S = 300.0
#: Prefix of every key kvcore writes to a store it did not make itself.
STORE_PREFIX = "kvcore"
#: Version of the payloads ranks exchange; ranks running different kvcore versions fail clearly.
PROTOCOL_VERSION = 1

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
    if not is_number(value) or not value > 0:
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
        parallelism = Parallelism.for_world(world_size)
        check_int(rank, "rank", minimum=0, below=world_size)
        self.store = store
        self.rank = rank
        self.world_size = parallelism.world_size
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
