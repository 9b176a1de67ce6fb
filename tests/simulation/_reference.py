"""The scheduler written plainly: every running request reserves and releases at every step.

:class:`kvcore.simulation.simulator.Simulator` calls the pool only when a table changes and
drives a stacked pool (``lowest_first=False``); this one calls it every step on a default pool.
Both must give the same figures step by step (``test_simulator.py``).
"""

from __future__ import annotations

from collections import deque

from kvcore import BlockPool, BlockPoolExhaustedError, KVCachePlan
from kvcore.simulation.workload import Workload


def reference_run(plan: KVCachePlan, workload: Workload, budget: int) -> dict:
    """Replay ``workload``; the per-step series and totals, in plain Python."""
    pool = BlockPool(plan)
    requests = workload.requests
    computed = [0] * len(requests)
    generated = [0] * len(requests)
    first = [-1] * len(requests)
    waiting: deque[int] = deque()
    running: list[int] = []
    arrived = finished = step = preemptions = tokens_total = recomputed = 0
    series_running: list[int] = []
    series_usage: list[float] = []
    while finished < len(requests):
        while arrived < len(requests) and requests[arrived].arrival_step <= step:
            waiting.append(arrived)
            arrived += 1
        left = budget
        scheduled: list[tuple[int, int]] = []
        preempted = False
        index = 0
        while index < len(running) and left > 0:
            r = running[index]
            new = min(requests[r].prompt_tokens + generated[r] - computed[r], left)
            ok = True
            while True:
                try:
                    pool.reserve(r, computed[r] + new)
                    break
                except BlockPoolExhaustedError:
                    victim = running.pop()
                    pool.free_request(victim)
                    recomputed += computed[victim]
                    computed[victim] = 0
                    waiting.appendleft(victim)
                    preemptions += 1
                    preempted = True
                    if victim == r:
                        ok = False
                        break
            if not ok:
                break
            scheduled.append((r, new))
            left -= new
            index += 1
        if not preempted:
            while waiting and left > 0:
                r = waiting[0]
                new = min(requests[r].prompt_tokens + generated[r], left)
                try:
                    pool.reserve(r, new)
                except BlockPoolExhaustedError:
                    break
                waiting.popleft()
                running.append(r)
                scheduled.append((r, new))
                left -= new
                if first[r] < 0:
                    first[r] = step
        if not scheduled and not running and not waiting:  # idle until the next arrival
            series_running.append(0)
            series_usage.append(0.0)
            step += 1
            continue
        assert scheduled, "the reference stalled"
        tokens_total += budget - left
        series_running.append(len(running))
        series_usage.append((pool.num_blocks - pool.num_free_blocks) / pool.num_blocks)
        for r, new in scheduled:
            computed[r] += new
            if computed[r] == requests[r].prompt_tokens + generated[r]:
                generated[r] += 1
                if generated[r] == requests[r].output_tokens:
                    pool.free_request(r)
                    running.remove(r)
                    finished += 1
                    continue
            pool.release_stale(r, computed[r])
        step += 1
    assert pool.num_free_blocks == pool.num_blocks and not pool.requests
    return {
        "steps": step,
        "running": tuple(series_running),
        "pool_usage": tuple(series_usage),
        "total_tokens": tokens_total,
        "recomputed_tokens": recomputed,
        "preemptions": preemptions,
        "delays": sorted(f - r.arrival_step for f, r in zip(first, requests, strict=True)),
    }
