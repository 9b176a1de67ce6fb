"""How the store agreement scales with the rank count: 4, 16 and 64 ranks on one host.

Each rank is a process with a TCP-store client (no ``torch.distributed`` process group: the
agreement needs only the store); the parent hosts the store, as torchrun's agent does. Every
rank runs the two rounds of :func:`kvcore.initialize_kv_caches` (``plan``: a fingerprint and 24
layer specs; ``ready``: plan digests) with :class:`kvcore.engine.agreement.StoreAgreement`,
starting together on a ``go`` key. The table shows, per rank count, the median over the trials
of the time until the last rank returned, that time per rank, and the store calls per rank
(``check``, ``get``, ``set``, ``compare_set``, ``multi_get``): rank 0 makes two calls per poll
and every other rank one, so the calls per rank stay flat and the store's load grows linearly.

    python benchmarks/agreement_scale.py            # 4, 16, 64 ranks, 3 trials
    python benchmarks/agreement_scale.py --ranks 4 16 --trials 5

On a small machine the processes share few cores, so the time includes the operating system
scheduling 64 busy pollers; the calls per rank are what the protocol decides.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.distributed as dist

from kvcore.cli.table import render_table
from kvcore.engine.agreement import StoreAgreement

LAYERS = 24


def _payload(rank: int) -> dict[str, Any]:
    return {
        "fingerprint": {"kvcore version": "bench", "tp_size": 2, "policy": "auto", "max_model_len": 8192},
        "layers": {
            f"model.layers.{i}.self_attn": {
                "kind": "full_attention",
                "block_size": 16,
                "num_kv_heads": 8,
                "head_size": 128,
                "dtype": "bfloat16",
            }
            for i in range(LAYERS)
        },
        "memory": 2**34 + rank,
    }


class _Counting:
    """A store that counts the calls made through it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def call(*args: Any) -> Any:
            self.calls += 1
            return method(*args)

        return call


def _rank(rank: int, world: int, trial: int, ports: Any, results: Any) -> None:
    port = ports.get()
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    store = _Counting(dist.PrefixStore("kvcore", client))
    agreement = StoreAgreement(store, rank, world, timeout_s=120, run_id=f"bench-{world}-{trial}")
    results.put(("up", rank))
    client.wait(["go"])
    start = time.monotonic()
    answers = agreement.exchange("plan", _payload(rank))
    agreement.exchange("ready", {"plans": str(len(answers))})
    results.put((rank, start, time.monotonic(), store.calls))


def trial(world: int, number: int) -> tuple[float, float]:
    """One agreement of ``world`` ranks: (seconds until the last rank returned, store calls per rank)."""
    ctx = mp.get_context("forkserver")  # clean children, with torch imported once
    ports: Any = ctx.Queue()
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, world, number, ports, results), daemon=True) for r in range(world)
    ]
    for proc in procs:
        proc.start()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for _ in procs:
        ports.put(server.port)
    for _ in procs:  # every rank has connected and waits for "go"
        results.get(timeout=300)
    time.sleep(0.2)
    go = time.monotonic()
    server.set("go", "1")
    reports = [results.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    del server
    return max(end for _, _, end, _ in reports) - go, sum(calls for *_, calls in reports) / world


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    mp.set_forkserver_preload(["torch", "torch.distributed", "kvcore.engine.agreement"])
    rows = []
    for world in args.ranks:
        runs = [trial(world, n) for n in range(args.trials)]
        seconds = statistics.median(s for s, _ in runs)
        calls = statistics.median(c for _, c in runs)
        rows.append([f"{world}", f"{seconds * 1e3:,.0f}", f"{seconds * 1e3 / world:,.1f}", f"{calls:,.0f}"])
    print(render_table(["ranks", "agreement ms", "ms per rank", "store calls per rank"], rows, align="rrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
