"""Start CPU ranks with gloo, as torchrun would, and collect what each rank reports.

The parent plays torchrun's agent: it hosts the TCP store (port 0: the OS picks a free port)
and sets the environment torchrun sets (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``, ``TORCHELASTIC_USE_AGENT_STORE=True``), so the ranks run the documented path:
``init_process_group("gloo")`` and :func:`kvcore.engine.distributed.store_from_env`. The store
outlives any rank, as the agent's does.

Ranks start from a ``forkserver`` that has imported torch and kvcore once: a fresh ``spawn``
would import torch in every rank (seconds each on a 2-core CI box). The children are still
clean processes forked from that server, never from pytest.

Every rank puts ``(rank, result)`` on a queue; :func:`run_ranks` waits for the ranks that must
report, within a wall-clock guard, then kills whatever is left, so a bug cannot hang CI.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import queue
import runpy
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

from kvcore import (
    KVCachePlan,
    LocalExecutor,
    Registry,
    SizingContext,
    get_plugin_manager,
    initialize_kv_caches,
)
from kvcore.engine.distributed import DistributedExecutor
from kvcore.errors import MemoryProfilingError
from kvcore.planning.ranks import Parallelism, partition_layers, plan_for_ranks
from kvcore.planning.serialization import plan_to_dict
from tests.runtime._kinds import ToyAttention, ToyAttentionPlugin

HIDDEN = 32
HEAD_SIZE = 8
#: Exit status of a rank told to die during the agreement.
DEAD = 17
EXAMPLE = Path(__file__).parents[3] / "examples" / "distributed_plan.py"


@attrs.frozen(kw_only=True)
class Scenario:
    """One multi-rank run.

    Attributes:
        tp: tensor-parallel size.
        pp: pipeline stages.
        num_layers: layers of the model, ``model.layers.{i}.self_attn``.
        kv_heads: KV heads of every layer (each TP rank keeps ``kv_heads // tp``).
        windows: ``{layer index: sliding window}``; the other layers are full attention.
        memory: each rank's KV-cache bytes (one value, or one per rank).
        max_model_len: the request length to plan for.
        timeout_s: the agreement timeout.
        faults: ``{rank: fault}``: ``"exit"`` (os._exit while measuring memory), ``"hang"``,
            ``"raise"`` (MemoryProfilingError), ``"heads"`` (reports other KV heads for layer 2).
        policy: the policy every rank plans with.
    """

    tp: int = 1
    pp: int = 1
    num_layers: int = 8
    kv_heads: int = 4
    windows: dict[int, int] = attrs.field(factory=dict)
    memory: int | tuple[int, ...] = 4 * 2**20
    max_model_len: int = 256
    timeout_s: float = 20.0
    faults: dict[int, str] = attrs.field(factory=dict)
    policy: str = "auto"

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(tp_size=self.tp, pp_size=self.pp)

    def memory_of(self, rank: int) -> int:
        return self.memory if isinstance(self.memory, int) else self.memory[rank]

    def stage_layers(self, rank: int) -> list[int]:
        names = [str(i) for i in range(self.num_layers)]
        return [int(i) for i in partition_layers(names, self.pp)[self.parallelism.pp_rank(rank)]]


class StageModel(torch.nn.Module):
    """The layers of one pipeline stage at their global indices; the other stages' layers are
    empty placeholders, as pipeline-parallel engines keep them, so layer names stay global."""

    def __init__(self, scenario: Scenario, rank: int) -> None:
        super().__init__()
        self.own = scenario.stage_layers(rank)
        heads = max(1, scenario.kv_heads // scenario.tp)
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList()
        for i in range(scenario.num_layers):
            if i not in self.own:
                self.model.layers.append(torch.nn.Identity())
                continue
            wrong = scenario.faults.get(rank) == "heads" and i == 2
            block = torch.nn.Module()
            block.self_attn = ToyAttention(
                HIDDEN, heads + 1 if wrong else heads, HEAD_SIZE, window=scenario.windows.get(i)
            )
            block.mlp = torch.nn.Linear(HIDDEN, HIDDEN)
            self.model.layers.append(block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.own:
            block = self.model.layers[i]
            x = block.mlp(block.self_attn(x))
        return x


class RankExecutor(LocalExecutor):
    """A local executor with a fixed budget that can fail the way a rank fails."""

    def __init__(self, scenario: Scenario, rank: int, registry: Registry) -> None:
        super().__init__(
            StageModel(scenario, rank), "cpu", registry=registry, kv_cache_bytes=scenario.memory_of(rank)
        )
        self.fault = scenario.faults.get(rank)

    def determine_available_memory(self) -> int:
        if self.fault == "exit":
            os._exit(DEAD)
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "raise":
            raise MemoryProfilingError("the profile run left no room for a KV cache (injected fault)")
        return super().determine_available_memory()


def toy_registry() -> Registry:
    return Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=[ToyAttentionPlugin()]))


def rank_specs(scenario: Scenario) -> list[dict[str, Any]]:
    """What each rank's executor reports, computed in this process (the expectations)."""
    registry = toy_registry()
    return [
        RankExecutor(scenario, r, registry).get_kv_cache_spec()
        for r in range(scenario.parallelism.world_size)
    ]


def error_report(exc: Exception) -> dict[str, Any]:
    """What a rank whose start-up raised reports: the error's type and message, the ranks it names."""
    return {
        "ok": False,
        "error": type(exc).__name__,
        "message": str(exc),
        "ranks": list(getattr(exc, "ranks", ())),
    }


def expected_plans(scenario: Scenario, registry: Registry) -> list[KVCachePlan]:
    """Every rank's plan for ``scenario``, computed in this process: what the ranks must agree on."""
    return plan_for_ranks(
        rank_specs(scenario),
        [scenario.memory_of(r) for r in range(scenario.parallelism.world_size)],
        SizingContext(max_model_len=scenario.max_model_len),
        registry=registry,
        policy=scenario.policy,
        tp_size=scenario.tp,
    )


def _torchrun_env(rank: int, port: int, world: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )


def _rank_main(rank: int, port: int, world: int, scenario: Scenario, results: Any) -> None:
    _torchrun_env(rank, port, world)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    registry = toy_registry()
    local = RankExecutor(scenario, rank, registry)
    start = time.monotonic()
    try:
        executor = DistributedExecutor.from_process_group(
            local, tp_size=scenario.tp, timeout_s=scenario.timeout_s
        )
        plan = initialize_kv_caches(
            executor, registry=registry, policy=scenario.policy, max_model_len=scenario.max_model_len
        )
        counts = torch.tensor([plan.num_blocks, -plan.num_blocks])
        dist.all_reduce(counts, op=dist.ReduceOp.MIN)  # over gloo: every rank's count is the same
        bound = {
            name: module for name, module in local.model.named_modules() if isinstance(module, ToyAttention)
        }
        result: dict[str, Any] = {
            "ok": True,
            "plan": plan_to_dict(plan, registry),
            "rank_plans": len(executor.rank_plans),
            "bound": sorted(local.bound),
            "with_views": sorted(name for name, m in bound.items() if m.kv_cache is not None),
            "fewest_most": [int(counts[0]), -int(counts[1])],
        }
    except Exception as exc:
        result = {**error_report(exc), "seconds": time.monotonic() - start}
    results.put((rank, result))


def _example_main(rank: int, port: int, world: int, argv: list[str], results: Any) -> None:
    """Run ``examples/distributed_plan.py`` as torchrun would; report its exit status and output."""
    _torchrun_env(rank, port, world)
    example = runpy.run_path(str(EXAMPLE), run_name="distributed_plan")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = example["main"](argv)
    results.put((rank, {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}))


def _start_and_collect(
    target: Any, payload: Any, world: int, expect: set[int], guard_s: float
) -> tuple[dict[int, dict[str, Any]], dict[int, int | None]]:
    """Start ``target(rank, port, world, payload, queue)`` on ``world`` ranks and collect reports.

    The wall-clock guard ends the run: a rank in ``expect`` that has not reported by then fails
    the test (a hang), and every process left is killed.
    """
    ctx = mp.get_context("forkserver")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # torchrun's agent store
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(r, store.port, world, payload, results), daemon=True)
        for r in range(world)
    ]
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + guard_s
    try:
        for proc in procs:
            proc.start()
        while not expect <= set(reports) and time.monotonic() < deadline:
            try:
                rank, result = results.get(timeout=0.2)
            except queue.Empty:
                continue
            reports[rank] = result
    finally:
        for rank, proc in enumerate(procs):
            if rank in reports:  # it is on its way out
                proc.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        results.close()
        del store
    missing = sorted(expect - set(reports))
    assert not missing, f"ranks {missing} did not report within {guard_s} s: a hang"
    return reports, {r: proc.exitcode for r, proc in enumerate(procs)}


def run_ranks(
    scenario: Scenario, *, expect: set[int] | None = None, guard_s: float = 30.0
) -> tuple[dict[int, dict[str, Any]], dict[int, int | None]]:
    """Run ``scenario`` on ``tp x pp`` CPU ranks; return each rank's result and exit code.

    Args:
        scenario: what to run.
        expect: the ranks that must report (default: every rank without an exit/hang fault).
        guard_s: the wall-clock limit of the whole run.
    """
    world = scenario.parallelism.world_size
    if expect is None:
        expect = {r for r in range(world) if scenario.faults.get(r) not in ("exit", "hang")}
    return _start_and_collect(_rank_main, scenario, world, expect, guard_s)


def run_example(argv: list[str], world: int, *, guard_s: float = 60.0) -> dict[int, dict[str, Any]]:
    """Run ``examples/distributed_plan.py argv`` on ``world`` CPU ranks, as torchrun would."""
    reports, _ = _start_and_collect(_example_main, argv, world, set(range(world)), guard_s)
    return reports


def preload_forkserver() -> None:
    """Import torch and kvcore once in the forkserver, before it starts."""
    mp.set_forkserver_preload(
        [
            "torch",
            "torch.distributed",
            "kvcore.engine.distributed",
            "kvcore.engine.agreement",
            "tests.engine.distributed._ranks",
        ]
    )
