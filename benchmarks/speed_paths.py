"""What each of the ``vllm`` profile's speed paths buys: CPU seconds with it on and off.

Each speed path (:data:`kvcore.simulation.profiles.vllm.SPEED_PATHS`) is turned off on its own,
the others left on (a path that needs it goes off with it: ``steady_decoders`` needs
``event_bounds``, ``compact_tables`` and ``shared_runs`` need ``lazy_hashing``, the ``lean_*``
paths need ``compact_tables``, ``preempted_runs`` needs ``shared_runs``, ``unread_runs`` needs
``preempted_runs``), then all of them
together, on representative workloads: the requests of ``simulation_speed.py`` (prompts
log-normal around 1,024 tokens, outputs around 200, a Poisson process of 0.6 a step) through
Gemma-3-27B plans (max_model_len 32,768), with and without half of them sharing a 512-token
prefix, caching on and off, a tight pool (16 GiB: it preempts and evicts) and a roomy one
(80 GiB). Prints CPU seconds (``time.process_time``) per run and the slowdown against every
path on, and checks that every run gives the same result (it must:
``tests/simulation/test_vllm_reference.py``). Run it on one core::

    taskset -c 0 python benchmarks/speed_paths.py               # 2,000 requests
    taskset -c 0 python benchmarks/speed_paths.py --count 5000
"""

from __future__ import annotations

import argparse
import time

from _speed_workload import MAX_MODEL_LEN, speed_workload

from kvcore.frontends.hf_config import model_layer_specs
from kvcore.plan import KVCachePlan
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.simulation.profiles.vllm import SPEED_PATHS, VllmProfile, VllmSimulator
from kvcore.simulation.result import SimulationResult
from kvcore.simulation.workload import Workload
from kvcore.spec import SizingContext

MODEL = "google/gemma-3-27b-it"
GIB = 2**30
#: (policy, GiB, caching, shared prefix): the workloads, one column each.
WORKLOADS = (
    ("equal_groups", 16, True, False),
    ("equal_groups", 16, True, True),
    ("kind_pools", 80, True, False),
    ("shared_buffer", 80, False, False),
)
#: What goes off with a path: the paths that need it.
NEEDS = {
    "event_bounds": ("steady_decoders",),
    "lazy_hashing": (
        "compact_tables",
        "lean_decode",
        "lean_finish",
        "shared_runs",
        "preempted_runs",
        "unread_runs",
    ),
    "shared_runs": ("preempted_runs", "unread_runs"),
    "preempted_runs": ("unread_runs",),
    "compact_tables": ("lean_decode", "lean_finish"),
}


def _run(
    plan: KVCachePlan, workload: Workload, caching: bool, paths: frozenset[str]
) -> tuple[float, SimulationResult]:
    start = time.process_time()
    stepper = VllmSimulator(plan, workload, VllmProfile(), prefix_caching=caching, speed_paths=paths)
    while not stepper.done:
        stepper.step()
    return time.process_time() - start, stepper.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2_000, help="requests (default 2,000)")
    args = parser.parse_args()
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    specs = model_layer_specs(MODEL, registry)
    context = SizingContext(max_model_len=MAX_MODEL_LEN)
    every = frozenset(SPEED_PATHS)
    rows: list[tuple[str, frozenset[str]]] = [("every path on", every)]
    rows += [(f"without {path}", every - {path, *NEEDS.get(path, ())}) for path in SPEED_PATHS]
    rows.append(("none (speed_paths=())", frozenset()))
    columns = []
    for policy, gib, caching, shared in WORKLOADS:
        plan = plan_kv_cache(specs, gib * GIB, context, registry=registry, policy=policy)
        columns.append((plan, speed_workload(args.count, shared), caching))
    print(f"{MODEL}, max_model_len {MAX_MODEL_LEN:,}, {args.count:,} requests")
    print("CPU seconds (x every path on)\n")
    names = [
        f"{policy} {gib}G {'cache' if caching else 'nocache'}{' shared' if shared else ''}"
        for policy, gib, caching, shared in WORKLOADS
    ]
    header = f"{'speed paths':<28}" + "".join(f"{name:>34}" for name in names)
    print(header)
    print("-" * len(header))
    base: list[tuple[float, SimulationResult]] = []
    for label, paths in rows:
        cells = []
        for index, (plan, workload, caching) in enumerate(columns):
            seconds, result = _run(plan, workload, caching, paths)
            if not base or len(base) <= index:
                base.append((seconds, result))
            same = result == base[index][1]
            cells.append(f"{seconds:>8.2f} s ({seconds / base[index][0]:>4.2f}x){'' if same else ' DIFFERS'}")
        print(f"{label:<28}" + "".join(f"{cell:>34}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
