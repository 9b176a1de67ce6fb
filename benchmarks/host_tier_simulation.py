"""What a host tier costs the simulator: the ``kvcore`` profile with prefix caching on requests
behind 64 shared system prompts, without a tier and with tiers of 4, 16 and 64 GiB.

Prints, per request count and tier: seconds, µs per request, prefix hits, the share the host
gave, and the time over the run without a tier (target: a tier costs at most 1.5x the run
without). Run it with ``taskset -c 0``::

    python benchmarks/host_tier_simulation.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import time

from kvcore.frontends.hf_config import model_layer_specs
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.offload import with_host_memory
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.simulation.simulator import simulate
from kvcore.simulation.workload import Request, Workload
from kvcore.spec import SizingContext

GIB = 2**30


def workload(count: int, seed: int = 0) -> Workload:
    """``count`` chat turns (log-normal prompts of mean 160 and outputs of mean 300 tokens,
    Poisson at 0.5 per step) behind 64 system prompts of 1,000 to 3,000 tokens, Zipf-popular."""
    rng = random.Random(seed)
    lengths = [rng.randint(1000, 3000) for _ in range(64)]
    weights = [1 / (i + 1) for i in range(64)]
    now, requests = 0.0, []
    for i in range(count):
        now += rng.expovariate(0.5)
        system = rng.choices(range(64), weights)[0]
        prompt = lengths[system] + min(1024, max(4, int(rng.lognormvariate(4.6, 1.0))))
        output = min(1024, max(4, int(rng.lognormvariate(5.3, 0.9))))
        requests.append(Request(i, prompt, output, int(now), prefix_id=system, prefix_tokens=lengths[system]))
    return Workload(tuple(requests), name=f"{count} chat turns behind 64 system prompts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 requests only")
    args = parser.parse_args()
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    specs = model_layer_specs("meta-llama/Llama-3.1-8B", registry)
    context = SizingContext(max_model_len=8192, max_num_batched_tokens=2048)
    plan = plan_kv_cache(specs, 4 * GIB, context, registry=registry)
    print("| requests | host memory | seconds | µs/request | prefix hits | from host | x no tier |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for count in (1000,) if args.quick else (1000, 10_000):
        work = workload(count)
        base = 0.0
        for host in (0, 4, 16, 64):
            tiered = with_host_memory(plan, host * GIB)
            start = time.perf_counter()
            result = simulate(tiered, work, prefix_caching=True, scheduler="kvcore")
            seconds = time.perf_counter() - start
            base = base or seconds
            tier = result.host_tier
            share = tier.host_hit_tokens / max(result.cached_tokens, 1) if tier is not None else 0.0
            print(
                f"| {count:,} | {host} GiB | {seconds:.2f} | {1e6 * seconds / count:,.0f} | "
                f"{100 * result.prefix_hit_rate:.1f}% | {100 * share:.1f}% | {seconds / base:.2f} |"
            )


if __name__ == "__main__":
    main()
