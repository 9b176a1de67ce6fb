"""The ``vllm`` profile's fast path beside its plain reference (``vllm-reference``): CPU seconds.

The workload of ``simulation_speed.py`` (prompts log-normal around 1,024 tokens, outputs
log-normal around 200, a Poisson process of 0.6 requests a step), optionally with half the
requests leading with one shared 512-token prefix, replayed by
:func:`kvcore.simulation.simulate` through each built-in policy's plan of
``google/gemma-3-27b-it`` (80 GiB, max_model_len 32,768; ``uniform`` on Llama-3.1-8B), with
``vllm`` (the fast path) and ``vllm-reference`` (vLLM's scheduler and KV-cache manager written
plainly, no speed path), prefix caching off and on. Prints CPU seconds
(``time.process_time``) for each, the reference's slowdown, and whether every figure of the two
results is the same (it must be: ``tests/simulation/test_vllm_reference.py``).

    taskset -c 0 python benchmarks/reference_speed.py                       # 2,000 requests
    taskset -c 0 python benchmarks/reference_speed.py --count 5000 --shared-prefix
"""

from __future__ import annotations

import argparse
import time

import attrs
from _speed_workload import MAX_MODEL_LEN, speed_workload

from kvcore.errors import KVCoreError
from kvcore.frontends.hf_config import model_layer_specs
from kvcore.plan import KVCachePlan
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.simulation.result import SimulationResult
from kvcore.simulation.simulator import simulate
from kvcore.simulation.workload import Workload
from kvcore.spec import SizingContext

MODEL = "google/gemma-3-27b-it"
FALLBACK_MODEL = "meta-llama/Llama-3.1-8B"
MEMORY = 80 * 2**30


def _run(
    plan: KVCachePlan, workload: Workload, profile: str, caching: bool, registry: Registry
) -> tuple[float, SimulationResult]:
    start = time.process_time()
    result = simulate(plan, workload, scheduler=profile, prefix_caching=caching, registry=registry)
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2_000, help="requests (default 2,000)")
    parser.add_argument("--shared-prefix", action="store_true", help="half the requests share 512 tokens")
    parser.add_argument("--policy", nargs="+", help="these policies only (default: every built-in)")
    args = parser.parse_args()
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    context = SizingContext(max_model_len=MAX_MODEL_LEN)
    workload = speed_workload(args.count, args.shared_prefix)
    shared = ", half sharing a 512-token prefix" if args.shared_prefix else ""
    print(f"{MODEL}, 80 GiB, max_model_len {MAX_MODEL_LEN:,}; {args.count:,} requests{shared}\n")
    header = f"{'policy':<14} {'groups':>6} {'caching':<7} {'fast s':>8} {'reference s':>11} {'ratio':>6}"
    header += "  same figures"
    print(header)
    print("-" * len(header))
    fallback: list[str] = []
    for policy in args.policy or list(registry.policies):
        name = policy
        try:
            plan = plan_kv_cache(
                model_layer_specs(MODEL, registry), MEMORY, context, registry=registry, policy=policy
            )
        except KVCoreError:
            specs = model_layer_specs(FALLBACK_MODEL, registry)
            plan = plan_kv_cache(specs, MEMORY, context, registry=registry, policy=policy)
            name = f"{policy}*"
            fallback.append(policy)
        for caching in (False, True):
            fast_s, fast = _run(plan, workload, "vllm", caching, registry)
            reference_s, reference = _run(plan, workload, "vllm-reference", caching, registry)
            same = fast == attrs.evolve(reference, scheduler=fast.scheduler)  # the names differ
            print(
                f"{name:<14} {len(plan.groups):>6} {'on' if caching else 'off':<7} {fast_s:>8.2f} "
                f"{reference_s:>11.2f} {reference_s / fast_s:>5.1f}x  {'yes' if same else 'NO'}",
                flush=True,
            )
    if fallback:
        print(f"* on {FALLBACK_MODEL} ({', '.join(fallback)} refuses {MODEL}'s mixed layers)")


if __name__ == "__main__":
    main()
