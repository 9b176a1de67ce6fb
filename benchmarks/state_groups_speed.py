"""The ``vllm`` profile on a Mamba hybrid with prefix caching (vLLM's ``mamba_cache_mode='align'``):
CPU seconds of the fast path (event bounds and steady decoders on, the other speed paths stepping
aside for state groups), the fast path with no speed path, and the plain reference.

``ai21labs/AI21-Jamba-1.5-Mini``'s ``shared_buffer`` plan sized for two states a request
(``state_cache_mode='align'``), 8 GiB, max_model_len 8,192, replays ``examples/traces/
chat-system-prompts.jsonl`` repeated ``--copies`` times (each copy 1,500 steps after the one
before, its system prompts its own), prefix caching on. Prints CPU seconds
(``time.process_time``), the prefix hits, and whether every figure is the reference's (it must
be: ``tests/simulation/test_vllm_reference.py``).

    taskset -c 0 python benchmarks/state_groups_speed.py              # 10 copies: 3,000 requests
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import attrs

from kvcore.frontends.hf_config import model_layer_specs
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.simulation.profiles.vllm import VllmProfile, VllmSimulator
from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler
from kvcore.simulation.result import SimulationResult
from kvcore.simulation.workload import Workload, read_trace
from kvcore.spec import SizingContext

MODEL = "ai21labs/AI21-Jamba-1.5-Mini"
TRACE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "chat-system-prompts.jsonl"


def _copies(count: int) -> Workload:
    """The trace ``count`` times, each copy 1,500 steps later with prefixes of its own."""
    base = read_trace(TRACE).requests
    requests = []
    for copy in range(count):
        for request in base:
            prefix = (copy, request.prefix_id) if request.prefix_id is not None else None
            requests.append(
                attrs.evolve(
                    request,
                    id=len(requests),
                    arrival_step=request.arrival_step + 1500 * copy,
                    prefix_id=prefix,
                )
            )
    return Workload(tuple(requests), name=f"chat-system-prompts x {count}")


def _run(stepper: VllmSimulator | VllmReferenceScheduler) -> tuple[float, SimulationResult]:
    start = time.process_time()
    while not stepper.done:
        stepper.step()
    return time.process_time() - start, stepper.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10, help="copies of the trace (default 10)")
    args = parser.parse_args()
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    context = SizingContext(max_model_len=8192, state_cache_mode="align")
    plan = plan_kv_cache(
        model_layer_specs(MODEL, registry), 8 * 2**30, context, registry=registry, policy="shared_buffer"
    )
    workload = _copies(args.copies)
    profile = VllmProfile()
    count = len(workload.requests)
    print(f"{MODEL}, shared_buffer, 8 GiB, max_model_len 8,192; {workload.name}: {count:,} requests\n")
    runs = {
        "fast path": VllmSimulator(plan, workload, profile, prefix_caching=True),
        "no speed path": VllmSimulator(plan, workload, profile, prefix_caching=True, speed_paths=()),
        "reference": VllmReferenceScheduler(plan, workload, profile, prefix_caching=True),
    }
    timed = {name: _run(stepper) for name, stepper in runs.items()}
    reference = timed["reference"][1]
    print(f"{'run':<14} {'CPU s':>7} {'steps':>7} {'prefix hits':>11}  same figures")
    for name, (seconds, result) in timed.items():
        same = "yes" if result == reference else "NO"
        print(f"{name:<14} {seconds:>7.2f} {result.steps:>7,} {result.prefix_hit_rate:>10.1%}  {same}")


if __name__ == "__main__":
    main()
