"""Plan, allocate and bind the KV cache of one model across tensor x pipeline parallel ranks.

Run it with torchrun, one process per rank (gloo on CPU here; pass ``--backend nccl --device
cuda`` on GPUs)::

    torchrun --nproc-per-node 4 examples/distributed_plan.py \\
        --model meta-llama/Llama-3.2-1B --tp 2 --pp 2 --memory 256MiB --max-model-len 8192

Every rank reads the model's config (a bundled name or a ``config.json``), keeps the layers of
its pipeline stage (kvcore's rule: contiguous stages, balanced by layer count) with the specs
of one tensor-parallel rank, and stands in a parameter-free module for each of them. The ranks
then agree on the plan through :class:`kvcore.engine.distributed.DistributedExecutor`; each one
allocates and binds only its own layers. Rank 0 prints the ranks' plans and what each rank
allocated (gathered over the process group).

``--fail-rank R`` makes rank R raise while it measures its memory, to show how the other ranks
stop: each prints one line naming rank R.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from kvcore import LocalExecutor, ModelOptions, Registry, initialize_kv_caches, model_layer_specs
from kvcore.cli.inputs import positive_int, size
from kvcore.cli.report import format_ranks, layer_ranges
from kvcore.engine.agreement import DEFAULT_TIMEOUT_S
from kvcore.engine.distributed import DistributedExecutor
from kvcore.engine.stand_in import stand_in_model
from kvcore.engine.workflow import capacity_summary
from kvcore.errors import KVCoreError, MemoryProfilingError
from kvcore.planning.ranks import Parallelism, simulate_rank_specs
from kvcore.runtime.allocation import allocation_sizes
from kvcore.units import format_bytes


class FailingExecutor(LocalExecutor):
    """A local executor whose memory measurement fails (``--fail-rank``)."""

    def determine_available_memory(self) -> int:
        raise MemoryProfilingError("the profile run left no room for a KV cache (--fail-rank)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a bundled model name or a config.json")
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per stage")
    parser.add_argument("--pp", type=positive_int, default=1, help="pipeline stages")
    parser.add_argument("--memory", type=size, required=True, help="each rank's KV-cache budget, e.g. 2GiB")
    parser.add_argument("--max-model-len", type=positive_int, required=True, help="longest request")
    parser.add_argument("--backend", default="gloo", help="process-group backend: gloo (CPU) or nccl")
    parser.add_argument("--device", default="cpu", help="where each rank allocates: cpu or cuda")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="agreement timeout, s")
    parser.add_argument("--fail-rank", type=int, help="make this rank fail while measuring memory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    parallelism = Parallelism(tp_size=args.tp, pp_size=args.pp)
    if parallelism.world_size != world:
        print(
            f"[rank {rank}] launch --tp x --pp = {parallelism.world_size} processes, not {world}",
            file=sys.stderr,
        )
        return 2
    # one GPU per process: torchrun numbers the processes of a node with LOCAL_RANK
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if args.device == "cuda" else args.device
    registry = Registry.default()
    try:
        specs = model_layer_specs(args.model, registry, ModelOptions(tp=args.tp))
        own = simulate_rank_specs(specs, parallelism)[rank]
        local_type = FailingExecutor if rank == args.fail_rank else LocalExecutor
        local = local_type(
            stand_in_model(own), device, registry=registry, specs=own, kv_cache_bytes=args.memory
        )
        executor = DistributedExecutor.from_process_group(
            local, tp_size=args.tp, timeout_s=args.timeout, identity={"model": args.model}
        )
        plan = initialize_kv_caches(executor, registry=registry, max_model_len=args.max_model_len)
    except KVCoreError as exc:
        print(f"[rank {rank}] kvcore: error: {exc}", file=sys.stderr)
        return 1

    sizes = allocation_sizes(plan)
    line = (
        f"{parallelism.describe(rank)}: allocated {format_bytes(sum(sizes))} on {local.device} in "
        f"{len(sizes)} "
        f"tensor(s), bound {len(local.bound)} layers ({layer_ranges(list(local.bound))})"
    )
    lines: list[str | None] = [None] * world
    dist.all_gather_object(lines, line)  # over the process group, once the caches exist
    if rank == 0:
        print(format_ranks(executor.rank_plans, parallelism))
        print()
        print(capacity_summary(plan))
        print()
        print("\n".join(str(text) for text in lines))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
