"""A pool split chosen from a workload rather than from the worst case.

``kind_pools`` gives each retention kind its own block pool and, by default, splits the budget
so that requests of ``max_model_len`` exhaust every pool together. Served traffic is shorter:
a full-attention pool's pages grow with the request while a sliding-window pool's stay at the
window, so the worst-case split starves one pool and leaves the other idle. :func:`workload_split`
measures what the workload itself holds of each pool, in bytes, averaged over the time its
requests run (Little's law: pages held in steady state are proportional to page-steps), and
returns the fractions :attr:`kvcore.policy.PlanOptions.pool_split` takes.

A request of ``P`` prompt and ``O`` output tokens is counted as its scheduler runs it: the
prompt in chunks of ``max_num_batched_tokens`` (one step each, each chunk holding what the
spec keeps while computing it), then ``O`` decode steps. The decode steps' pages are sampled
at :data:`DECODE_SAMPLES` evenly spaced lengths. The pools are sized for as many such requests
running as the budget holds plus the room to admit one more (a scheduler admits a request only
when its prompt's pages are free: vLLM's whole-prompt gate). Each pool then gets at least the
share that holds one request of the plan's ``max_model_len`` (its worst case), so that the plan
still admits every request the worst-case split does.

What no split can do: the demand it averages shifts between the pools from step to step. A
request being admitted holds its whole window (under vLLM's admission gate, the window plus the
tokens in flight: 321 sliding pages of Gemma-3-27B against about 66 while it decodes) while its
full-attention pages grow with every token, and a long-document workload runs a handful of
requests at once, so the pool that binds changes with each admission. On the first 60 long
documents at 8 GiB the best fixed split of Gemma-3-27B's two pools, searched in steps of 2 %
of the budget, serves 0.94 of what ``shared_buffer`` serves (Llama-4-Scout: 0.96), and the
split this module derives 0.93 (0.96) (``benchmarks/pool_split_grid.py``). The ``unified_pool`` policy
(:mod:`kvcore.policies.unified_pool`) keeps one block table per kind and lends the kinds one
pool's rows instead, which follows the demand step by step (``benchmarks/tune.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvcore.errors import InvalidInputError
from kvcore.plan import KVCachePlan
from kvcore.simulation.workload import Request, Workload
from kvcore.spec import KVCacheSpec

#: Decode lengths sampled per request (the pages of a decode grow by at most one per block).
DECODE_SAMPLES = 8

#: Headroom over a pool's worst-case share, so that float rounding never leaves it a block short.
FLOOR_MARGIN = 1.001


def _pages(spec: KVCacheSpec, num_tokens: int, computed: int) -> int:
    return len(spec.live_pages(num_tokens, computed))


def request_pages(
    request: Request, specs: Sequence[KVCacheSpec], max_num_batched_tokens: int
) -> tuple[list[float], list[int], int]:
    """What one request holds of each of ``specs`` (one per group) over its life.

    Args:
        request: the request.
        specs: each group's spec.
        max_num_batched_tokens: the prompt is computed in chunks of this many tokens.

    Returns:
        Pages x steps of each spec; the most pages of each spec while the prompt is computed
        (what admitting it takes); and the steps it runs.
    """
    prompt, output = request.prompt_tokens, request.output_tokens
    held = [0.0] * len(specs)
    peak = [0] * len(specs)
    steps = 0
    for start in range(0, prompt, max_num_batched_tokens):
        end = min(start + max_num_batched_tokens, prompt)
        steps += 1
        for i, spec in enumerate(specs):
            pages = _pages(spec, end, start)
            held[i] += pages
            peak[i] = max(peak[i], pages)
    if output > 1:
        samples = min(DECODE_SAMPLES, output - 1)
        steps += output - 1
        for k in range(samples):
            # the midpoints of ``samples`` equal slices of the decode, each slice's share of steps
            n = prompt + 1 + ((2 * k + 1) * (output - 1)) // (2 * samples)
            for i, spec in enumerate(specs):
                held[i] += (output - 1) / samples * _pages(spec, n, n - 1)
    return held, peak, steps


def workload_split(
    plan: KVCachePlan, workload: Workload, *, max_num_batched_tokens: int | None = None
) -> tuple[float, ...]:
    """The share of ``plan``'s budget each of its pools should get for ``workload``.

    With ``avg[p]`` the block ids of pool ``p`` a running request holds on average over its
    steps and ``admit[p]`` those a request takes while its prompt is computed (on average over
    the requests: the room a scheduler wants free to admit the next one), the pools are sized
    for ``N`` requests running plus one being admitted: pool ``p`` gets
    ``(N x avg[p] + admit[p]) x bytes[p]``, with ``N`` as large as the budget allows. Each pool
    gets at least the share that holds one request of the plan's ``max_model_len``.

    Args:
        plan: a plan of several pools (any split: only its groups and bytes per block id are
            read), e.g. ``kind_pools``' plan of the model.
        workload: the requests.
        max_num_batched_tokens: the prompt chunk (default: the plan's context's).

    Returns:
        One fraction per pool, summing to 1 (for :attr:`~kvcore.policy.PlanOptions.pool_split`).

    Raises:
        InvalidInputError: a plan of one pool, an empty workload, or a budget whose pools cannot
            each hold one request of the plan's ``max_model_len`` together.
    """
    pools = len(plan.pools)
    if pools < 2:
        raise InvalidInputError(
            f"a pool split needs a plan of several pools; policy {plan.policy!r} made one "
            "(plan with kind_pools)"
        )
    if not workload.requests:
        raise InvalidInputError(f"workload {workload.name!r} has no requests to size the pools by")
    chunk = max_num_batched_tokens or plan.context.max_num_batched_tokens
    specs = [group.spec for group in plan.groups]
    held = [0.0] * len(specs)
    admit = [0.0] * len(specs)
    steps = 0
    for request in workload.requests:
        pages, peak, runs = request_pages(request, specs, chunk)
        steps += runs
        for i in range(len(specs)):
            held[i] += pages[i]
            admit[i] += peak[i]
    per_block = [pool.bytes_per_block for pool in plan.pools]
    running = [0.0] * pools  # bytes a running request holds on average, by pool
    admitting = [0.0] * pools  # bytes admitting one takes, by pool
    for group, h, a in zip(plan.groups, held, admit, strict=True):
        running[group.pool] += h / max(steps, 1) * per_block[group.pool]
        admitting[group.pool] += a / len(workload.requests) * per_block[group.pool]
    budget = plan.available_memory_bytes
    reserved = 1 if plan.null_block is not None else 0
    floors = [
        min(1.0, FLOOR_MARGIN * (need + reserved + 1) * size / budget) if budget else 1.0
        for need, size in zip(plan.blocks_per_request_by_pool(), per_block, strict=True)
    ]
    if math.fsum(floors) >= 1:
        raise InvalidInputError(
            f"{budget:,} bytes cannot hold one request of {plan.context.max_model_len:,} tokens in each of "
            f"the {pools} pools with room to move: no pool split to choose; give more memory or lower "
            "max_model_len"
        )
    per_request = math.fsum(running)
    count = max(0.0, (budget - math.fsum(admitting)) / per_request) if per_request else 0.0
    wanted = [count * r + a for r, a in zip(running, admitting, strict=True)]
    total = math.fsum(wanted)
    shares = [w / total if total else 1 / pools for w in wanted]
    return _with_floors(shares, floors)


def _with_floors(shares: Sequence[float], floors: Sequence[float]) -> tuple[float, ...]:
    """``shares`` with every share raised to its floor, the others scaled down to keep the sum 1
    (repeated while scaling pushes another below its floor)."""
    fixed: dict[int, float] = {}
    while True:
        free = [p for p in range(len(shares)) if p not in fixed]
        left = 1 - math.fsum(fixed.values())
        weight = math.fsum(shares[p] for p in free)
        scaled = {p: (shares[p] / weight * left if weight else left / len(free)) for p in free}
        below = [p for p in free if scaled[p] < floors[p]]
        if not below:
            out = {**fixed, **scaled}
            return tuple(out[p] for p in range(len(shares)))
        for p in below:
            fixed[p] = floors[p]


def blend(a: Sequence[float], b: Sequence[float], weight: float) -> tuple[float, ...]:
    """``weight`` of split ``a`` and the rest of ``b`` (both summing to 1, so the blend does)."""
    return tuple(weight * x + (1 - weight) * y for x, y in zip(a, b, strict=True))


def need_split(plan: KVCachePlan) -> tuple[float, ...]:
    """The worst-case split of ``plan`` as fractions: each pool's bytes for one request of
    ``max_model_len`` over the request's bytes in all pools."""
    need = [n * p.bytes_per_block for n, p in zip(plan.blocks_per_request_by_pool(), plan.pools, strict=True)]
    total = sum(need)
    return tuple(n / total for n in need) if total else tuple(1 / len(need) for _ in need)


def tokens_held(plan: KVCachePlan) -> tuple[int, ...]:
    """Usable block ids of each pool (what a split bought), for reports."""
    return tuple(plan.usable_blocks_in(p) for p in range(len(plan.pools)))
