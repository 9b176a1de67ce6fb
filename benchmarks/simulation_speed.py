"""Simulation speed: chat-like workloads through a Gemma-3-27B plan (issue 14).

10,000, 30,000 and 100,000 requests (prompts log-normal with a mean of 1,024 tokens, outputs
log-normal with a mean of 200, Poisson arrivals) replayed by :func:`kvcore.simulation.simulator.simulate`
through a ``shared_buffer`` plan of ``google/gemma-3-27b-it`` at 80 GiB and max_model_len 32,768.
Prints the seconds and the microseconds per request side by side; the target is 100,000 requests
in < 30 s on one core, and a flat time per request (linear). A last row replays the first count
again with a step-time model on (the roofline of the model on an H100,
:mod:`kvcore.simulation.timing`) and prints its overhead over the untimed run (best of two
interleaved runs of each). Run it with
``taskset -c 0``::

    taskset -c 0 python benchmarks/simulation_speed.py
"""

from __future__ import annotations

import argparse
import time

from kvcore.frontends.hf_config import load_model_config, model_layer_specs
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.simulation.gpus import find_gpu
from kvcore.simulation.simulator import simulate
from kvcore.simulation.timing import latency_report, roofline
from kvcore.simulation.workload import parse_length, synthetic
from kvcore.spec import SizingContext

MODEL = "google/gemma-3-27b-it"
MAX_MODEL_LEN = 32768
MEMORY = 80 * 2**30
#: Requests per step: about what the plan serves at this mix (the queue neither empties nor grows).
RATE = 0.6
TARGET_SECONDS = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--policy", default="shared_buffer")
    args = parser.parse_args()
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    specs = model_layer_specs(MODEL, registry)
    plan = plan_kv_cache(
        specs, MEMORY, SizingContext(max_model_len=MAX_MODEL_LEN), registry=registry, policy=args.policy
    )
    prompt, output = parse_length("lognormal:1024:1.0"), parse_length("lognormal:200:1.0")
    print(
        f"{MODEL}, {args.policy}, 80 GiB, max_model_len {MAX_MODEL_LEN}: "
        f"{plan.num_blocks} blocks, {len(plan.groups)} groups"
    )
    print(f"workload: prompt {prompt}, output {output}, Poisson {RATE}/step\n")
    header = (
        f"{'requests':>9} {'workload s':>10} {'simulate s':>10} {'us/request':>10} "
        f"{'steps':>8} {'mean run':>8} {'preempt':>7}"
    )
    print(header)
    print("-" * len(header))
    last = 0.0
    untimed: dict[int, float] = {}
    for count in args.counts:
        start = time.perf_counter()
        workload = synthetic(count, prompt, output, rate=RATE, seed=0, max_model_len=MAX_MODEL_LEN)
        made = time.perf_counter() - start
        start = time.perf_counter()
        result = simulate(plan, workload)
        last = time.perf_counter() - start
        untimed[count] = last
        print(
            f"{count:>9,} {made:>10.2f} {last:>10.2f} {last / count * 1e6:>10.1f} {result.steps:>8,} "
            f"{result.mean_running:>8.1f} {result.preemptions:>7,}"
        )
    # the same workload with the time model on: what the StepRecord per step and the clock cost
    count = args.counts[0]
    config, _ = load_model_config(MODEL)
    model = roofline(config, registry, plan, find_gpu("H100"))
    workload = synthetic(count, prompt, output, rate=RATE, seed=0, max_model_len=MAX_MODEL_LEN)
    plain, timed = untimed[count], float("inf")
    for _ in range(2):  # best of interleaved runs: the overhead is smaller than a shared core's noise
        start = time.perf_counter()
        simulate(plan, workload)
        plain = min(plain, time.perf_counter() - start)
        start = time.perf_counter()
        result = simulate(plan, workload, step_time=model)
        timed = min(timed, time.perf_counter() - start)
    assert result.timeline is not None
    report = latency_report(result.timeline, [r.output_tokens for r in workload.requests])
    overhead = 100 * (timed / plain - 1)
    print(
        f"{count:>9,} {'+ time':>10} {timed:>10.2f} {timed / count * 1e6:>10.1f} {result.steps:>8,} "
        f"{result.mean_running:>8.1f} {result.preemptions:>7,}   {overhead:+.0f} % with {model.description} "
        f"(simulated {report.seconds:,.0f} s, TTFT p99 {report.ttft.p99:.2f} s)"
    )
    verdict = "meets" if last < TARGET_SECONDS else "MISSES"
    print(f"\ntarget: {args.counts[-1]:,} requests in < {TARGET_SECONDS:.0f} s: {verdict} ({last:.1f} s)")


if __name__ == "__main__":
    main()
