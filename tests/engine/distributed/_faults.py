"""The fault matrix: real CPU ranks (processes) agreeing over a TCP store hosted by a process of
its own, so that a test can freeze the store host, kill or freeze (``SIGSTOP``) ranks at chosen
points of the agreement, slow one down, reuse a store with an older attempt's keys, or start
ranks with different settings.

The ranks skip ``init_process_group`` (the agreement needs only the store) and start together:
each waits for a ``go`` key the parent sets once every rank is up, so the time each reports is
the time from that start to its outcome, whatever the cost of starting processes.

A frozen rank named in ``resume`` is continued (``SIGCONT``) once every other rank has
reported; it must then report too, and its outcome is checked with the others': never a plan
on one rank and an error on another.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import signal
import socket
import time
from datetime import timedelta
from typing import Any

import attrs
import torch.distributed as dist

from kvcore import initialize_kv_caches
from kvcore.engine.distributed import DistributedExecutor
from kvcore.errors import DistributedAgreementError, MemoryProfilingError
from kvcore.planning.serialization import plan_to_dict
from tests.engine.distributed._ranks import DEAD, RankExecutor, Scenario, error_report, toy_registry

#: Every fault a rank can be given (``Case.faults``):
#: ``kill`` (exit before the first round), ``kill-mid`` (exit right after publishing its plan
#: round key), ``freeze`` (stop itself before the first round), ``freeze-mid`` (stop itself
#: right after publishing its plan round key), ``freeze-after`` (stop itself after the plan
#: round, before allocating), ``freeze-commit`` (stop itself right after publishing its
#: ready key), ``slow`` (allocate ``timeout_s + 1`` s late), ``freeze-store`` (stop the store
#: host before the first round), ``kill-store`` (kill the store host before the first round),
#: ``raise`` (its memory measurement raises).
FAULTS = (
    "kill",
    "kill-mid",
    "freeze",
    "freeze-mid",
    "freeze-after",
    "freeze-commit",
    "slow",
    "freeze-store",
    "kill-store",
    "raise",
)

#: Faults after which a rank reports nothing (unless it is resumed).
SILENT = frozenset({"kill", "kill-mid", "freeze", "freeze-mid", "freeze-after", "freeze-commit"})


@attrs.frozen(kw_only=True)
class Case:
    """One run of the matrix.

    Attributes:
        scenario: the model, layout, memory and timeout (its ``faults`` are not used).
        faults: ``{rank: fault}`` (see :data:`FAULTS`).
        settings: ``{rank: {argument: value}}``: arguments of ``initialize_kv_caches`` that
            differ on that rank (``max_model_len``, ``policy``, ``num_blocks``).
        run_id: ``TORCHELASTIC_RUN_ID`` of the ranks (``None``: unset, a fresh attempt).
        restart: ``TORCHELASTIC_RESTART_COUNT``.
        resume: frozen ranks to continue once every other rank has reported.
        store_on_rank0: rank 0 hosts the store (``env://`` with ranks started by hand) instead
            of a process of its own; it keeps serving it until every rank has reported.
    """

    scenario: Scenario
    faults: dict[int, str] = attrs.field(factory=dict)
    settings: dict[int, dict[str, Any]] = attrs.field(factory=dict)
    run_id: str | None = None
    restart: int = 0
    resume: frozenset[int] = frozenset()
    store_on_rank0: bool = False


class _FaultyExecutor(RankExecutor):
    def __init__(self, case: Case, rank: int, store_pid: int) -> None:
        super().__init__(attrs.evolve(case.scenario, faults={}), rank, toy_registry())
        self.fault = case.faults.get(rank)
        self.store_pid = store_pid
        self.all_started: Any = None  # waits until every rank is past the start line
        self.timeout_s = case.scenario.timeout_s

    def determine_available_memory(self) -> int:
        if self.fault == "kill":
            os._exit(DEAD)
        if self.fault == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.fault in ("freeze-store", "kill-store"):
            self.all_started()  # no rank may still be waiting for "go" on the store
            os.kill(self.store_pid, signal.SIGSTOP if self.fault == "freeze-store" else signal.SIGKILL)
        if self.fault == "raise":
            raise MemoryProfilingError("the profile run left no room for a KV cache (injected fault)")
        return super().determine_available_memory()

    def initialize(self, plan: Any) -> None:
        if self.fault == "freeze-after":
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.fault == "slow":
            time.sleep(self.timeout_s + 1)
        super().initialize(plan)


def _after_publishing(executor: DistributedExecutor, round_name: str, act: Any) -> None:
    """Run ``act()`` right after this rank sets its key of round ``round_name``."""
    agreement = executor.agreement
    original = agreement._set
    mine = f"/{round_name}/1/{agreement.rank}"

    def publish(key: str, value: str, round_id: str, deadline: float) -> None:
        original(key, value, round_id, deadline)
        if key.endswith(mine):
            act()

    agreement._set = publish  # type: ignore[method-assign]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _wait_for_count(client: Any, key: str, count: int) -> None:
    while client.add(key, 0) < count:
        time.sleep(0.005)


def _rank_main(rank: int, port: int, world: int, job: tuple[Case, int], results: Any) -> None:
    case, store_pid = job
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        os.environ.pop(name, None)
    if case.run_id is not None:
        os.environ.update(TORCHELASTIC_RUN_ID=case.run_id, TORCHELASTIC_RESTART_COUNT=str(case.restart))
    registry = toy_registry()
    hosting = case.store_on_rank0 and rank == 0
    client = dist.TCPStore(
        "127.0.0.1", port, is_master=hosting, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    store = dist.PrefixStore("kvcore", client)
    local = _FaultyExecutor(case, rank, store_pid)
    executor = DistributedExecutor(
        local,
        rank=rank,
        world_size=world,
        store=store,
        tp_size=case.scenario.tp,
        timeout_s=case.scenario.timeout_s,
    )
    fault = case.faults.get(rank)
    if fault == "kill-mid":
        _after_publishing(executor, "plan", lambda: os._exit(DEAD))
    if fault == "freeze-mid":
        _after_publishing(executor, "plan", lambda: os.kill(os.getpid(), signal.SIGSTOP))
    if fault == "freeze-commit":
        _after_publishing(executor, "ready", lambda: os.kill(os.getpid(), signal.SIGSTOP))
    settings = {"max_model_len": case.scenario.max_model_len, **case.settings.get(rank, {})}
    results.put((rank, "up"))
    client.wait(["go"])  # every rank starts the agreement at the same moment
    client.add("started", 1)
    local.all_started = lambda: _wait_for_count(client, "started", world)
    start = time.monotonic()
    try:
        plan = initialize_kv_caches(executor, registry=registry, **settings)
        result: dict[str, Any] = {
            "ok": True,
            "plan": plan_to_dict(plan, registry),
            "plans": _digest([plan_to_dict(p, registry) for p in executor.rank_plans]),
        }
    except Exception as exc:
        result = {
            **error_report(exc),
            "round": getattr(exc, "round_id", None),
            "field": getattr(exc, "field", None),
            "host": getattr(exc, "host", None),
            "agreement_error": isinstance(exc, DistributedAgreementError),
        }
    result["seconds"] = time.monotonic() - start
    results.put((rank, result))
    if hosting:  # keep serving the store until every rank has reported, as a live rank 0 does
        with contextlib.suppress(Exception):
            client.wait(["done"], timedelta(seconds=120))


def _host_store(port_queue: Any) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port_queue.put(store.port)
    time.sleep(3600)


class StoreHost:
    """A TCP store in a process of its own (so it can be frozen or killed); it lives across
    runs, so a second run finds the first one's keys."""

    def __init__(self) -> None:
        ctx = mp.get_context("forkserver")
        ports: Any = ctx.Queue()
        self.process = ctx.Process(target=_host_store, args=(ports,), daemon=True)
        self.process.start()
        self.port: int = ports.get(timeout=60)
        assert self.process.pid is not None
        self.pid: int = self.process.pid
        self.address = f"127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # a rank may have killed it
            os.kill(self.pid, signal.SIGCONT)
        self.process.kill()
        self.process.join(timeout=5)

    def __enter__(self) -> StoreHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_port() -> int:
    """A TCP port free now on 127.0.0.1 (for rank 0's store)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_case(
    case: Case, *, host: StoreHost | None = None, guard_s: float = 180.0
) -> tuple[dict[int, dict[str, Any]], dict[int, int | None]]:
    """Run ``case`` on ``tp x pp`` processes; return each rank's report and exit code.

    Ranks with a ``kill`` or ``freeze`` fault that are not in ``resume`` are not expected to
    report; every other rank must report within ``guard_s`` (else the test fails: a hang). The
    guard is generous: four ranks importing torch on two busy cores took over a minute in CI.
    """
    own_host = host is None and not case.store_on_rank0
    store_host = host if host is not None else (None if case.store_on_rank0 else StoreHost())
    port = store_host.port if store_host is not None else _free_port()
    store_pid = store_host.pid if store_host is not None else -1
    world = case.scenario.parallelism.world_size
    silent = {r for r, f in case.faults.items() if f in SILENT}
    expect = set(range(world)) - (silent - case.resume)
    ctx = mp.get_context("forkserver")
    # a SimpleQueue writes in the caller's thread: a Queue's feeder thread may still hold the
    # queue's write lock when its rank freezes itself (SIGSTOP), and then no rank can report
    results: Any = ctx.SimpleQueue()
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, world, (case, store_pid), results), daemon=True)
        for r in range(world)
    ]
    reports: dict[int, dict[str, Any]] = {}
    up: set[int] = set()
    resumed = False
    deadline = time.monotonic() + guard_s
    control: Any = None
    try:
        for proc in procs:
            proc.start()
        # (on rank 0's store, the client waits until rank 0 has started it)
        control = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        while not expect <= set(reports) and time.monotonic() < deadline:
            if not resumed and case.resume and (expect - case.resume) <= set(reports):
                for rank in case.resume:
                    os.kill(procs[rank].pid, signal.SIGCONT)  # type: ignore[arg-type]
                resumed = True
            if results.empty():
                time.sleep(0.05)
                continue
            rank, result = results.get()
            if result == "up":
                up.add(rank)
                if len(up) == world:
                    control.set("go", "1")
                continue
            reports[rank] = result
    finally:
        if control is not None and case.store_on_rank0:
            with contextlib.suppress(Exception):
                control.set("done", "1")
        for rank, proc in enumerate(procs):
            if rank in reports:
                proc.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        for proc in procs:
            if proc.is_alive():
                if proc.pid is not None:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.join(timeout=5)
        results.close()
        del control
        if own_host and store_host is not None:
            store_host.close()
    missing = sorted(expect - set(reports))
    assert not missing, f"ranks {missing} did not report within {guard_s} s: a hang"
    return reports, {r: proc.exitcode for r, proc in enumerate(procs)}


def check_no_split(reports: dict[int, dict[str, Any]]) -> str:
    """Every rank returned the same plans, or every rank raised: ``"ok"`` or ``"raised"``."""
    outcomes = {report["ok"] for report in reports.values()}
    assert len(outcomes) == 1, f"split outcome: {reports}"
    if outcomes == {True}:
        assert len({report["plans"] for report in reports.values()}) == 1, "ranks returned different plans"
        return "ok"
    return "raised"
