"""Store agreement: every rank's JSON payload gathered over a ``torch.distributed`` store, with
one decision per round that every rank follows, deadlines on every store call, and attempts
that never read each other's keys.

The protocol (one *round* per :meth:`StoreAgreement.exchange`):

1. every rank sets ``<attempt>/<round>/<rank>`` to its payload;
2. rank 0 (the *collector*) waits until every rank's key exists, checks the payloads (a
   ``validate`` callback: fingerprints, plan digests), and writes the round's *decision*,
   ``<attempt>/<round>/result``: every payload, or an abort with its reason;
3. every rank waits for the decision and follows it: it returns the payloads or raises.

The decision key is written with ``compare_set`` (set only if absent), so the first writer
wins and every rank reads the same decision. A rank that gives up writes an abort into the
decision key of the round it is in: its own error (:meth:`StoreAgreement.fail`), or a timeout
at its deadline naming the ranks whose keys are missing. A rank that reaches its deadline
does not simply raise: it tries to write its abort and follows whatever the key then holds, so
if the collector decided first, that rank returns the payloads too. Hence, for every round:

- every rank that returns has read the same decision, with every rank's payload;
- every rank that raises (other than on a lost store) has read an abort;
- a round never has both.

The last round of :func:`~kvcore.initialize_kv_caches` (``ready``) is the commit: its decision
exists only once every rank has allocated and published the digest of its plan, so either
every rank returns the same plans or every rank raises, naming the first fault (the abort that
won). A rank that loses the store itself raises :class:`~kvcore.errors.StoreUnavailableError`
without learning the decision, no earlier than ``STORE_GRACE_S`` after its deadline; so each
rank publishes its deadline (wall clock) with its payload, and the collector writes "ok" only
before the earliest of them (plus half the grace): a rank 0 that hosts the store (``env://``
with ranks started by hand) and froze past the others' deadlines aborts instead, and every rank
raises.

Every store call runs on a worker thread (``TCPStore.check`` and ``add`` ignore the client
timeout); the caller waits until the round's deadline plus :data:`STORE_GRACE_S` and then
reports the store as unavailable, naming its host.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar

import attrs
from torch.distributed import FileStore, PrefixStore, TCPStore  # type: ignore[attr-defined]

from kvcore.errors import (
    AgreementMismatchError,
    AttemptReusedError,
    DistributedAgreementError,
    InvalidInputError,
    StoreUnavailableError,
)
from kvcore.planning.ranks import Parallelism
from kvcore.validators import check_int, is_number

#: Seconds a rank waits for the others in one round unless told otherwise. It must cover the
#: slowest rank's profiling (the plan round starts when a rank has its own memory figure).
DEFAULT_TIMEOUT_S = 300.0
#: Prefix of every key kvcore writes to a store it did not make itself.
STORE_PREFIX = "kvcore"
#: Version of the payloads ranks exchange; ranks running different kvcore versions fail clearly.
PROTOCOL_VERSION = 2
#: Seconds a store call may run past the round's deadline before the store is reported lost.
STORE_GRACE_S = 1.0
#: Environment variables torchrun sets: the job's run id and how often its workers restarted.
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"

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

    def check(self, keys: list[str]) -> bool:
        """Whether every key in ``keys`` is set (never waits)."""
        ...

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value`` (``""``: if it is
        absent); return the value it holds afterwards."""
        ...


@attrs.frozen
class Mismatch:
    """What a ``validate`` callback of :meth:`StoreAgreement.exchange` found wrong.

    Attributes:
        field: what differs (``"max_model_len"``, ``"plan"``).
        detail: the values and who holds them, one sentence.
        ranks: the ranks that differ from the majority.
    """

    field: str
    detail: str
    ranks: tuple[int, ...]


#: ``validate(payloads)``: run by the collector on every rank's payload before it decides.
Validate = Callable[[list[Payload]], "Mismatch | None"]


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


def store_address(store: object) -> str | None:
    """Where ``store`` lives, for messages: ``"host:port"`` of a TCP store, ``"file PATH"`` of
    a file store (through any ``PrefixStore``); ``None`` for an in-process store."""
    seen = 0
    while isinstance(store, PrefixStore) and seen < 16:
        store = store.underlying_store
        seen += 1
    if isinstance(store, TCPStore):
        return f"{store.host}:{store.port}"
    if isinstance(store, FileStore):
        path = getattr(store, "path", None)
        return f"file {path}" if path else "a file store"
    return None


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
        StoreUnavailableError: the store cannot be reached.
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
        raise StoreUnavailableError(
            f"rank {rank} cannot reach the key-value store at {host}:{port} ({_first_line(exc)}); "
            "check MASTER_ADDR and MASTER_PORT",
            round_id="connect",
            host=f"{host}:{port}",
        ) from None
    return PrefixStore(STORE_PREFIX, store)


class _StoreStuck(Exception):
    """A store call outlived its limit (internal)."""


class _Job(Generic[_T]):
    def __init__(self, call: Callable[[], _T]) -> None:
        self.call = call
        self.done = threading.Event()
        self.result: _T | None = None
        self.error: BaseException | None = None


class _StoreWorker:
    """Runs store calls on a daemon thread, so a deadline can cut a call the store never
    answers (``TCPStore.check`` ignores the client timeout). A thread stuck in such a call is
    abandoned; the next call gets a fresh thread. An idle thread exits after a few seconds."""

    IDLE_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job[Any]] | None = None

    def _serve(self, jobs: queue.SimpleQueue[_Job[Any]]) -> None:
        while True:
            try:
                job = jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if jobs.empty():  # nothing was queued meanwhile: retire
                        if self._jobs is jobs:
                            self._jobs = None
                        return
                continue
            try:
                job.result = job.call()
            except BaseException as exc:  # handed to the caller
                job.error = exc
            job.done.set()

    def call(self, what: Callable[[], _T], limit_s: float) -> _T:
        job: _Job[_T] = _Job(what)
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                threading.Thread(
                    target=self._serve, args=(self._jobs,), name="kvcore-store", daemon=True
                ).start()
            jobs = self._jobs
            jobs.put(job)
        if not job.done.wait(max(0.0, limit_s)):
            with self._lock:
                if self._jobs is jobs:
                    self._jobs = None  # abandon the stuck thread
            raise _StoreStuck
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]


#: How many agreements each (run id, rank) has made in this process: every rank makes its
#: agreements in the same order, so the n-th agreement of every rank gets the same namespace.
_instances: Counter[tuple[str, int]] = Counter()
_instances_lock = threading.Lock()


def _next_instance(base: str, rank: int) -> int:
    with _instances_lock:
        _instances[(base, rank)] += 1
        return _instances[(base, rank)]


def elastic_run_id() -> str | None:
    """``"<run id>/<restart count>"`` from the environment torchrun sets, or ``None`` outside
    torchrun (``TORCHELASTIC_RUN_ID`` unset)."""
    run = os.environ.get(RUN_ID_ENV, "").strip()
    if not run:
        return None
    restarts = os.environ.get(RESTART_COUNT_ENV, "").strip() or "0"
    return f"{run}/{restarts}"


class StoreAgreement:
    """All-gather of one JSON payload per rank over a store, one decision per round, with a
    deadline that names the ranks at fault.

    Every rank calls :meth:`exchange` (or :meth:`fail`) once per round, in the same order of
    round names; a rank that raised calls :meth:`fail` so the others stop at once.

    Keys live under an *attempt* namespace, so an agreement never reads another's keys:

    - under torchrun, ``TORCHELASTIC_RUN_ID`` and ``TORCHELASTIC_RESTART_COUNT`` (a restarted
      worker group gets a new one);
    - ``run_id``, when the caller passes one (added to torchrun's, if any); it must differ
      between attempts on one store: each rank claims its slot of the namespace for its
      process, so a run that reuses one on a store that outlived the earlier run raises
      :class:`~kvcore.errors.AttemptReusedError` on every rank instead of reading that run's
      decisions;
    - otherwise a fresh id that rank 0 draws and publishes under ``attempt``; the other ranks
      join it with a nonce of their own and accept it only once rank 0 has admitted that
      nonce, so the keys of an earlier attempt on the same store are never mistaken for it
      (one agreement at a time per store). A rank that comes after rank 0 gave up waiting for
      it raises naming itself.

    With a fixed id, the n-th agreement a rank makes in a process gets the n-th namespace under
    it, so every rank must make its agreements in the same order.

    Args:
        store: a ``torch.distributed.Store`` every rank reaches (:func:`store_from_env`).
        rank: this rank.
        world_size: ranks in all.
        timeout_s: how long to wait for the other ranks in one round.
        poll_s: the first pause between polls (doubles up to 0.1 s).
        describe: ``describe(rank)`` names a rank in messages (default ``"rank N"``).
        run_id: an id for this attempt, the same on every rank, new for every attempt.
        store_host: how messages name the store (default: its ``host:port`` or file).
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
        run_id: str | None = None,
        store_host: str | None = None,
    ) -> None:
        parallelism = Parallelism.for_world(world_size)
        check_int(rank, "rank", minimum=0, below=world_size)
        if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
            raise InvalidInputError(f"'run_id' must be a non-empty string (got {run_id!r})")
        self.store = store
        self.rank = rank
        self.world_size = parallelism.world_size
        self.timeout_s = _positive_seconds("timeout_s", timeout_s)
        self.poll_s = _positive_seconds("poll_s", poll_s)
        self.describe = describe if describe is not None else (lambda r: f"rank {r}")
        self.store_host = store_host if store_host is not None else store_address(store)
        fixed = "/".join(part for part in (elastic_run_id(), run_id) if part)
        self._attempt: str | None = f"{fixed}/{_next_instance(fixed, rank)}" if fixed else None
        self._rounds: dict[str, int] = {}
        self._join_label = "join"
        self._worker = _StoreWorker()
        # this process's claim on a fixed namespace: a later run with the same id finds it taken
        self._session = uuid.uuid4().hex
        self._claimed = False

    @property
    def attempt(self) -> str | None:
        """The attempt's namespace (``None`` until a fresh one is joined)."""
        return self._attempt

    def exchange(self, name: str, payload: Payload, *, validate: Validate | None = None) -> list[Payload]:
        """Publish ``payload`` in round ``name`` and return every rank's, in rank order.

        Args:
            name: the round (every rank calls its rounds in the same order).
            payload: this rank's JSON value.
            validate: run by rank 0 on every payload before it decides; a :class:`Mismatch`
                aborts the round on every rank.

        Raises:
            DistributedAgreementError: a rank published an error (names it and its error), ranks
                did not answer within ``timeout_s`` (names them), rank 0 decided after a rank's
                deadline (names rank 0).
            AttemptReusedError: the fixed namespace was used by an earlier run on this store.
            AgreementMismatchError: ``validate`` found a mismatch (names the field and ranks).
            StoreUnavailableError: the store was lost or stopped answering (names its host).
        """
        deadline = time.monotonic() + self.timeout_s
        attempt = self._join(deadline, f"{name}/{self._rounds.get(name, 0) + 1}")
        round_id = self._next_round(name)
        deadline = time.monotonic() + self.timeout_s
        # the wall-clock time this rank stops waiting: the collector decides "ok" only before it
        until = time.time() + self.timeout_s
        text = json.dumps({"version": PROTOCOL_VERSION, "ok": payload, "until": until})
        self._set(self._key(attempt, round_id, self.rank), text, round_id, deadline)
        if self.rank == 0:
            decision = self._collect(attempt, round_id, deadline, validate)
        else:
            decision = self._await(attempt, round_id, deadline)
        return self._follow(decision, round_id)

    def fail(self, name: str, exc: BaseException) -> None:
        """Tell the other ranks that this rank failed in round ``name`` (the caller re-raises).

        It writes an abort into the round's decision key unless a decision is already there.
        Never raises: if the store is gone as well, there is no one left to tell.
        """
        deadline = time.monotonic() + self.timeout_s
        try:
            attempt = self._join(deadline, f"{name}/{self._rounds.get(name, 0) + 1}")
            round_id = self._next_round(name)
            self._decide(
                attempt,
                round_id,
                self._abort({"kind": "failed", "ranks": [self.rank], "error": _first_line(exc)}),
                time.monotonic() + STORE_GRACE_S,
            )
        except DistributedAgreementError:
            pass

    # -- keys and store calls ----------------------------------------------------------------

    @staticmethod
    def _key(attempt: str, round_id: str, rank: int | str) -> str:
        return f"run/{attempt}/{round_id}/{rank}"

    def _next_round(self, name: str) -> str:
        self._rounds[name] = self._rounds.get(name, 0) + 1
        return f"{name}/{self._rounds[name]}"

    def _call(self, what: Callable[[], _T], round_id: str, deadline: float) -> _T:
        # every call may run until the deadline, and at least STORE_GRACE_S (a rank that was
        # frozen past its deadline still gets to read the decision)
        limit = max(deadline - time.monotonic(), 0.0) + STORE_GRACE_S
        try:
            return self._worker.call(what, limit)
        except _StoreStuck:
            why = f"a store call did not return within {limit:.1f} s: the store host is frozen or unreachable"
        except (RuntimeError, OSError) as exc:
            why = _first_line(exc)
        round_id = self._shown(round_id)
        where = f" at {self.store_host}" if self.store_host else ""
        raise StoreUnavailableError(
            f"{self.describe(self.rank)} lost the key-value store{where} in agreement round {round_id!r} "
            f"({why}); no rank is at fault: the process that hosts the store (the torchrun agent, "
            "or rank 0) exited, hangs or cannot be reached",
            round_id=round_id,
            host=self.store_host,
            attempt=self._attempt,
        ) from None

    def _read_json(self, raw: bytes, what: str, round_id: str) -> dict[str, Any]:
        round_id = self._shown(round_id)
        try:
            entry = json.loads(bytes(raw).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            entry = None
        if not isinstance(entry, dict) or entry.get("version") != PROTOCOL_VERSION:
            got = entry.get("version") if isinstance(entry, dict) else None
            raise AgreementMismatchError(
                f"{what} speaks agreement protocol version {got!r} but {self.describe(self.rank)} "
                f"speaks {PROTOCOL_VERSION}; run one kvcore version on every rank",
                ranks=(),
                round_id=round_id,
                field="agreement protocol",
                attempt=self._attempt,
            )
        return entry

    def _pause(self, delay: float, deadline: float) -> float:
        time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        return min(delay * 2, 0.1)

    # -- attempts ----------------------------------------------------------------------------

    def _shown(self, round_id: str) -> str:
        """The round messages name: the join is reported as part of the first round."""
        return self._join_label if round_id == "join" else round_id

    def _join(self, deadline: float, label: str) -> str:
        """The attempt namespace: fixed, or (fresh) drawn by rank 0 and joined by the others.

        Args:
            deadline: when to give up.
            label: the round the caller is entering (messages name it).
        """
        if self._attempt is not None:
            if not self._claimed:
                self._join_label = label
                self._claim(self._attempt, deadline)
            return self._attempt
        self._join_label = label
        pointer = "attempt"
        nonce = uuid.uuid4().hex
        if self.rank == 0:
            attempt = uuid.uuid4().hex
            self._set(pointer, attempt, "join", deadline)
            self._set(self._key(attempt, "join", 0), json.dumps(nonce), "join", deadline)
            decision = self._collect(attempt, "join", deadline, None, raw=True)
            self._attempt = attempt
            self._follow(decision, "join")
            return attempt
        return self._join_as_follower(pointer, nonce, deadline)

    def _claim(self, attempt: str, deadline: float) -> None:
        """Claim this rank's slot of a fixed namespace for this process, once.

        A run that reuses a run id on a store that outlived the earlier run would otherwise
        read that run's decisions as its own (ranks started with different settings would
        both succeed); it finds every slot taken and raises on every rank instead.

        Raises:
            AttemptReusedError: an earlier run's process holds the slot.
        """
        key = self._key(attempt, "owner", self.rank)
        raw = self._call(lambda: self.store.compare_set(key, "", self._session), "join", deadline)
        if bytes(raw).decode("utf-8", "replace") != self._session:
            raise AttemptReusedError(
                f"{self.describe(self.rank)}: the agreement namespace {attempt!r} was used on this store "
                "by an earlier run, whose keys and decisions are still there; a run id must be new for "
                "every run: pass another run_id (or none, and rank 0 draws a fresh one), or use a new "
                "store",
                ranks=(),
                round_id=self._shown("join"),
                attempt=attempt,
            )
        self._claimed = True

    def _join_as_follower(self, pointer: str, nonce: str, deadline: float) -> str:
        current: str | None = None
        refused: Mapping[str, Any] | None = None  # the last join decision that did not admit this rank
        delay = self.poll_s
        while True:
            if self._check([pointer], "join", deadline):
                seen = self._get(pointer, "join", deadline).decode("utf-8")
                if seen != current:  # a new attempt (or the first one seen): join it
                    current = seen
                    self._set(self._key(seen, "join", self.rank), json.dumps(nonce), "join", deadline)
            if current is not None:
                result = self._key(current, "join", "result")
                if self._check([result], "join", deadline):
                    decision = self._read_json(self._get(result, "join", deadline), "rank 0", "join")
                    if self._admits(decision, nonce):
                        self._attempt = current
                        self._follow(decision, "join")
                        return current
                    # an earlier attempt's decision: wait for rank 0 to publish the new attempt
                    refused = decision
            # rank 0 aborts a join at the same deadline: give its decision a moment to arrive
            if time.monotonic() >= deadline + STORE_GRACE_S:
                late = self._late_join(refused, current)
                if late is not None:
                    raise late
                raise DistributedAgreementError(
                    f"{self.describe(0)} did not admit {self.describe(self.rank)} to an agreement "
                    f"attempt within {self.timeout_s:g} s; it died, hangs or is not running this "
                    "agreement: check its log, or raise the timeout if a slow start is the cause",
                    ranks=(0,),
                    round_id=self._shown("join"),
                    attempt=current,
                )
            delay = self._pause(delay, deadline + STORE_GRACE_S)

    def _late_join(
        self, refused: Mapping[str, Any] | None, attempt: str | None
    ) -> DistributedAgreementError | None:
        """The error of a rank that arrived after rank 0 gave up waiting for it: the last attempt
        it saw aborted its join naming this rank among the missing, and no new one came. It
        names this rank (the late one), not rank 0; ``None`` when that is not what it saw."""
        abort = refused.get("abort") if refused is not None else None
        if not isinstance(abort, dict) or abort.get("kind") != "timeout":
            return None
        ranks = tuple(int(r) for r in abort.get("ranks", ()) if is_number(r))
        if self.rank not in ranks:
            return None
        me = self.describe(self.rank)
        return DistributedAgreementError(
            f"{me} came too late: {self.describe(0)} stopped waiting for "
            f"{', '.join(self.describe(r) for r in ranks)} after {float(abort.get('seconds', 0)):g} s in "
            f"agreement round {self._shown('join')!r} and started no new attempt within "
            f"{self.timeout_s:g} s; the other ranks have raised: check what delayed {me} (a stopped or "
            "overloaded process, a slow start), or raise the timeout",
            ranks=ranks,
            round_id=self._shown("join"),
            attempt=attempt,
        )

    def _admits(self, decision: Mapping[str, Any], nonce: str) -> bool:
        if "ok" in decision:
            payloads = decision["ok"]
            return isinstance(payloads, list) and len(payloads) > self.rank and payloads[self.rank] == nonce
        abort = decision.get("abort")
        return isinstance(abort, dict) and abort.get("nonces", {}).get(str(self.rank)) == nonce

    # -- one round ---------------------------------------------------------------------------

    def _decide(
        self, attempt: str, round_id: str, entry: Mapping[str, Any], deadline: float
    ) -> dict[str, Any]:
        """Write ``entry`` as the round's decision unless one is there; return the decision."""
        key = self._key(attempt, round_id, "result")
        text = json.dumps({"version": PROTOCOL_VERSION, **entry})
        raw = self._call(lambda: self.store.compare_set(key, "", text), round_id, deadline)
        return self._read_json(raw, "the decision", round_id)

    def _abort(self, abort: Mapping[str, Any]) -> dict[str, Any]:
        return {"abort": {**abort, "by": self.rank}}

    def _set(self, key: str, value: str, round_id: str, deadline: float) -> None:
        self._call(lambda: self.store.set(key, value), round_id, deadline)

    def _check(self, keys: list[str], round_id: str, deadline: float) -> bool:
        return self._call(lambda: self.store.check(keys), round_id, deadline)

    def _get(self, key: str, round_id: str, deadline: float) -> bytes:
        return bytes(self._call(lambda: self.store.get(key), round_id, deadline))

    def _missing(self, attempt: str, round_id: str, deadline: float) -> list[int]:
        """The ranks whose key of the round is not set (one check per rank: only at a deadline)."""
        return [
            r
            for r in range(self.world_size)
            if not self._check([self._key(attempt, round_id, r)], round_id, deadline)
        ]

    def _timeout(self, attempt: str, round_id: str, deadline: float) -> dict[str, Any]:
        missing = self._missing(attempt, round_id, deadline)
        if missing:
            return self._abort({"kind": "timeout", "ranks": missing, "seconds": self.timeout_s})
        return self._abort({"kind": "collector", "ranks": [0], "seconds": self.timeout_s})

    def _collect(
        self, attempt: str, round_id: str, deadline: float, validate: Validate | None, *, raw: bool = False
    ) -> dict[str, Any]:
        """Rank 0: wait for every rank's key (or an abort), check the payloads, decide.

        Per poll it makes two store calls whatever the world size: one ``check`` of the
        decision key, one ``check`` of every rank's key at once.
        """
        keys = [self._key(attempt, round_id, r) for r in range(self.world_size)]
        result = self._key(attempt, round_id, "result")
        delay = self.poll_s
        while True:
            if self._check([result], round_id, deadline):
                return self._read_json(self._get(result, round_id, deadline), "the decision", round_id)
            if self._check(keys, round_id, deadline):
                break
            if time.monotonic() >= deadline:
                entry = self._timeout(attempt, round_id, deadline)
                if raw:  # the join round: tell the ranks that did join (by nonce) to stop
                    entry["abort"]["nonces"] = self._nonces(attempt, round_id, deadline)
                return self._decide(attempt, round_id, entry, deadline)
            delay = self._pause(delay, deadline)
        values = self._multi_get(keys, round_id, deadline)
        if raw:
            nonces = [json.loads(v.decode("utf-8")) for v in values]
            return self._decide(attempt, round_id, {"ok": nonces}, deadline)
        payloads: list[Payload] = []
        untils: dict[int, float] = {}
        found: Mismatch | None = None
        for rank, value in enumerate(values):
            try:
                entry = self._read_json(value, self.describe(rank), round_id)
            except AgreementMismatchError as exc:
                found = found or Mismatch("agreement protocol", str(exc), (rank,))
                continue
            payloads.append(entry.get("ok"))
            if is_number(entry.get("until")):
                untils[rank] = float(entry["until"])
        if found is None and validate is not None:
            found = validate(payloads)
        if found is not None:
            decision = self._abort(
                {"kind": "mismatch", "ranks": list(found.ranks), "field": found.field, "detail": found.detail}
            )
        else:
            decision = self._late(untils) or {"ok": payloads}
        return self._decide(attempt, round_id, decision, deadline)

    def _late(self, untils: Mapping[int, float]) -> dict[str, Any] | None:
        """An abort if the collector decides after a rank may have stopped waiting, else ``None``.

        A rank whose store stops answering (rank 0 hosts it under ``env://`` and froze) gives up
        ``STORE_GRACE_S`` after its deadline without writing anything; if rank 0 then woke and
        decided "ok", it would return the plan while that rank raised. So an "ok" is written
        only before every rank's deadline (plus half the grace, for the write and clock skew);
        past it, every rank that reads the decision raises, naming rank 0.
        """
        if not untils:
            return None
        rank, until = min(untils.items(), key=lambda item: item[1])
        past = time.time() - until
        if past < STORE_GRACE_S / 2:
            return None
        return self._abort({"kind": "late", "ranks": [0], "waited": rank, "past": past})

    def _nonces(self, attempt: str, round_id: str, deadline: float) -> dict[str, str]:
        present = sorted(set(range(self.world_size)) - set(self._missing(attempt, round_id, deadline)))
        values = self._multi_get([self._key(attempt, round_id, r) for r in present], round_id, deadline)
        return {str(r): json.loads(v.decode("utf-8")) for r, v in zip(present, values, strict=True)}

    def _multi_get(self, keys: list[str], round_id: str, deadline: float) -> list[bytes]:
        multi_get = getattr(self.store, "multi_get", None)
        if multi_get is not None:
            return [bytes(v) for v in self._call(lambda: multi_get(keys), round_id, deadline)]
        return [self._get(key, round_id, deadline) for key in keys]

    def _await(self, attempt: str, round_id: str, deadline: float) -> dict[str, Any]:
        """Every rank but 0: wait for the decision; at the deadline, try to abort and follow
        whatever decision the key then holds."""
        result = self._key(attempt, round_id, "result")
        delay = self.poll_s
        while True:
            if self._check([result], round_id, deadline):
                return self._read_json(self._get(result, round_id, deadline), "the decision", round_id)
            if time.monotonic() >= deadline:
                return self._decide(attempt, round_id, self._timeout(attempt, round_id, deadline), deadline)
            delay = self._pause(delay, deadline)

    def _follow(self, decision: Mapping[str, Any], round_id: str) -> list[Payload]:
        """The payloads of an ``ok`` decision; raise the error an abort describes."""
        if "ok" in decision:
            return list(decision["ok"])
        abort = decision.get("abort", {})
        raise self._error(abort, round_id)

    def _error(self, abort: Mapping[str, Any], round_id: str) -> DistributedAgreementError:
        round_id = self._shown(round_id)
        kind = abort.get("kind")
        ranks = tuple(int(r) for r in abort.get("ranks", ()))
        names = ", ".join(self.describe(r) for r in ranks)
        me = self.describe(self.rank)
        if kind == "failed":
            return DistributedAgreementError(
                f"agreement round {round_id!r} stopped on {me} because {names} failed: {abort.get('error')}; "
                "fix the failing rank (its own log has the full error)",
                ranks=ranks,
                round_id=round_id,
                attempt=self._attempt,
            )
        if kind == "mismatch":
            return AgreementMismatchError(
                f"agreement round {round_id!r} stopped on {me}: {abort.get('detail')}",
                ranks=ranks,
                round_id=round_id,
                field=str(abort.get("field")),
                attempt=self._attempt,
            )
        if kind == "late":
            waited = self.describe(int(abort.get("waited", 0)))
            return DistributedAgreementError(
                f"{self.describe(0)} reached the decision of agreement round {round_id!r} "
                f"{float(abort.get('past', 0.0)):.1f} s after the deadline of {waited}; ranks that lost "
                "the store meanwhile (rank 0 hosts it when ranks are started by hand) have given up, so "
                "no rank takes the plan: check what stalled rank 0 (a frozen or overloaded host), or "
                "raise the timeout",
                ranks=(0,),
                round_id=round_id,
                attempt=self._attempt,
            )
        seconds = float(abort.get("seconds", self.timeout_s))
        if kind == "collector":
            return DistributedAgreementError(
                f"{self.describe(0)} did not decide agreement round {round_id!r} within {seconds:g} s "
                f"although all {self.world_size} ranks answered; it collects every round, and it "
                "died or hangs: check its log",
                ranks=(0,),
                round_id=round_id,
                attempt=self._attempt,
            )
        what = (
            "it died, hangs or is not running this agreement: check its log"
            if len(ranks) == 1
            else "they died, hang or are not running this agreement: check their logs"
        )
        return DistributedAgreementError(
            f"{names} did not answer within {seconds:g} s in agreement round {round_id!r} "
            f"({self.world_size - len(ranks)} of {self.world_size} ranks did); {what}, or raise the "
            "timeout if a slow start (profiling, compilation) is the cause",
            ranks=ranks,
            round_id=round_id,
            attempt=self._attempt,
        )


def majority_mismatch(
    field: str, values: Sequence[object], describe: Callable[[int], str]
) -> Mismatch | None:
    """A :class:`Mismatch` if ``values`` (one per rank, JSON) are not all equal, naming the
    ranks that differ from the most common value (rank 0's value on a tie).

    Args:
        field: what the values are.
        values: each rank's value.
        describe: names a rank.

    Returns:
        ``None`` when every rank has the same value.
    """
    texts = [json.dumps(v, sort_keys=True) for v in values]
    if len(set(texts)) <= 1:
        return None
    counts = Counter(texts)
    top = max(counts.values())
    common = next(t for t in texts if counts[t] == top)  # first in rank order: rank 0 wins ties

    def holders(text: str) -> str:
        ranks = [r for r, t in enumerate(texts) if t == text]
        named = ", ".join(describe(r) for r in ranks[:4]) + (
            f" and {len(ranks) - 4} more" if len(ranks) > 4 else ""
        )
        return f"{named} {'has' if len(ranks) == 1 else 'have'} {text}"

    odd = [t for t in dict.fromkeys(texts) if t != common]
    return Mismatch(
        field=field,
        detail=(
            f"ranks disagree on {field}: {'; '.join(holders(t) for t in odd)}, but {holders(common)}; "
            "start every rank with the same settings"
        ),
        ranks=tuple(r for r, t in enumerate(texts) if t != common),
    )


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "PROTOCOL_VERSION",
    "STORE_GRACE_S",
    "STORE_PREFIX",
    "KeyValueStore",
    "Mismatch",
    "StoreAgreement",
    "elastic_run_id",
    "majority_mismatch",
    "store_address",
    "store_from_env",
]
