"""Block pool speed: an engine's pool calls through a 10,000-request trace (issue 17).

A scheduler like an engine's (chunked prefill of up to ``max_num_batched_tokens`` per step,
decodes first, first-come-first-served admission of up to ``--max-num-seqs`` requests,
preemption of the latest admitted request when the pool is out of ids) drives a
:class:`~kvcore.runtime.block_pool.BlockPool` the way an engine does: every running request
is reserved every step, released after it (:meth:`~BlockPool.release_stale`), freed when it
finishes, and the persistent block tables (:class:`~kvcore.runtime.block_tables.BlockTables`)
follow every change. The trace is synthetic (prompts log-normal with a mean of 1,024 tokens,
outputs log-normal with a mean of 128, all arriving at once), once with every prompt its own and
once with 70 % of them starting with one shared 1,024-token system prompt; each is run with prefix
caching off and on. The plan is ``google/gemma-3-27b-it`` (five sliding-window groups and a
full-attention one) at 24 GiB, max_model_len 8,192, with the null block vLLM keeps.

Prints steps per second, pool calls per second and the prefix-cache hit rate (cached prompt
tokens over prompt tokens looked up) per run, and beside them the same trace through vLLM
0.33's ``KVCacheManager`` on the same plan where vLLM (and ``kvcore.integrations.vllm``) is
importable, else ``vLLM not installed``: made and called as vLLM's scheduler makes and calls it
(see :func:`run_vllm`; its hit rate is the one vLLM's own prefix-cache statistics report), with
its steps, seconds and how many times kvcore's time it took. vLLM caches every full block, so it
also hits a preempted request's own blocks when the request comes back (the "own prompts" rows
may hit with vLLM and not with kvcore, which caches shared prefixes only). Target: kvcore at
least as fast as vLLM. Run it with ``taskset -c 0`` (the vLLM column in vLLM's environment)::

    taskset -c 0 python benchmarks/pool_speed.py
    PYTHONPATH=$PWD VLLM_TARGET_DEVICE=cpu taskset -c 0 .venv-vllm/bin/python benchmarks/pool_speed.py

``--policy kind_pools`` runs the same trace on a plan of one pool per retention kind (one ``BlockPool``
serving several pools).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kvcore.errors import BlockPoolExhaustedError
from kvcore.frontends.hf_config import model_layer_specs
from kvcore.plan import KVCachePlan
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.policy import PlanOptions
from kvcore.runtime.block_pool import BlockPool
from kvcore.runtime.block_tables import BlockTables
from kvcore.runtime.prefix_cache import PrefixKey
from kvcore.simulation.workload import Request, Workload, parse_length, synthetic
from kvcore.spec import SizingContext

MODEL = "google/gemma-3-27b-it"
MEMORY = 24 * 2**30
MAX_MODEL_LEN = 8192
STEP = 2048


def drive(
    workload: Workload,
    budget: int,
    max_num_seqs: int,
    *,
    admit: Callable[[int, Request], int],
    grow: Callable[[int, int], bool],
    after: Callable[[int, int], None],
    finish: Callable[[int], None],
) -> tuple[int, int]:
    """Run the scheduler; returns (steps, pool calls). ``admit`` looks a request up and returns
    its cached tokens (the request is then known to the pool); ``grow(r, tokens)`` reserves and
    says whether it got the ids; ``after(r, computed)`` runs after the step; ``finish(r)`` frees
    (on a preemption too)."""
    requests = workload.requests
    waiting = deque(range(len(requests)))
    running: list[int] = []
    computed = [0] * len(requests)
    known = [r.prompt_tokens for r in requests]
    end = [r.total_tokens - 1 for r in requests]
    steps = calls = 0
    while waiting or running:
        left = budget
        scheduled: list[int] = []
        preempted = False
        for r in list(running):
            if not left or r not in running:
                continue
            new = min(known[r] - computed[r], left)
            while not grow(r, computed[r] + new):
                calls += 1
                victim = running.pop()
                finish(victim)
                calls += 1
                computed[victim] = 0
                known[victim] = requests[victim].prompt_tokens
                waiting.appendleft(victim)
                preempted = True
                if victim == r:
                    break
            calls += 1
            if r not in running:
                continue
            computed[r] += new
            left -= new
            scheduled.append(r)
        while not preempted and waiting and left and len(running) < max_num_seqs:
            r = waiting[0]
            hit = admit(r, requests[r])
            calls += 1
            new = min(known[r] - hit, left)
            if not grow(r, hit + new):
                finish(r)
                calls += 2
                break
            calls += 1
            waiting.popleft()
            running.append(r)
            computed[r] = hit + new
            left -= new
            scheduled.append(r)
        for r in scheduled:
            if computed[r] == known[r]:
                if computed[r] >= end[r]:
                    finish(r)
                    calls += 1
                    running.remove(r)
                    continue
                known[r] += 1
            after(r, computed[r])
            calls += 1
        steps += 1
    return steps, calls


def timed_drive(
    workload: Workload,
    max_num_seqs: int,
    hit_rate: Callable[[], float],
    *,
    admit: Callable[[int, Request], int],
    grow: Callable[[int, int], bool],
    after: Callable[[int, int], None],
    finish: Callable[[int], None],
) -> dict[str, float]:
    """:func:`drive` at ``STEP`` tokens a step, timed: one row's figures for a pool behind the
    callbacks; ``hit_rate`` reads the pool's prefix-cache hit rate once the run is over."""
    start = time.perf_counter()
    steps, calls = drive(workload, STEP, max_num_seqs, admit=admit, grow=grow, after=after, finish=finish)
    seconds = time.perf_counter() - start
    return {
        "steps": steps,
        "seconds": seconds,
        "steps/s": steps / seconds,
        "calls/s": calls / seconds,
        "hit rate": hit_rate(),
    }


def run_kvcore(plan: KVCachePlan, workload: Workload, caching: bool, max_num_seqs: int) -> dict[str, float]:
    pool = BlockPool(plan, prefix_caching=caching)
    tables = BlockTables(pool, max_requests=max_num_seqs)
    keys = [PrefixKey(r.prefix_id if r.prefix_tokens else None, r.prefix_tokens) for r in workload.requests]

    def admit(r: int, request: Request) -> int:
        return pool.attach_prefix(r, keys[r], request.prompt_tokens)

    def grow(r: int, tokens: int) -> bool:
        try:
            tables.update(r, pool.reserve(r, tokens))
        except BlockPoolExhaustedError:
            return False
        return True

    def after(r: int, computed: int) -> None:
        tables.update(r, pool.release_stale(r, computed))

    def finish(r: int) -> None:
        if r in tables:
            tables.remove(r)
        pool.free_request(r)

    return timed_drive(
        workload,
        max_num_seqs,
        lambda: pool.prefix_cache_stats.hit_rate,
        admit=admit,
        grow=grow,
        after=after,
        finish=finish,
    )


def _vllm_manager(plan: KVCachePlan, caching: bool) -> tuple[Any, Callable[[int, list[int], int], Any]]:
    """vLLM's ``KVCacheManager`` for ``plan`` as its scheduler makes it
    (:func:`kvcore.integrations.vllm.admission.make_manager`: the scheduler's copy of the
    converted config, the block sizes the engine core resolves, ``max_in_flight_tokens``, and
    ``log_stats`` so that the prefix-cache statistics the scheduler records are kept), and a
    maker of vLLM ``Request`` objects whose block hashes vLLM's own request block hasher computes
    (``get_request_block_hasher`` at the manager's hash block size, as the engine core does)."""
    from vllm.sampling_params import SamplingParams  # type: ignore[import-not-found]
    from vllm.utils.hashing import sha256  # type: ignore[import-not-found]
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # type: ignore[import-not-found]
    from vllm.v1.request import Request as VllmRequest  # type: ignore[import-not-found]

    from kvcore.integrations.vllm.admission import make_manager  # type: ignore[import-not-found]
    from kvcore.integrations.vllm.convert import plan_to_vllm_config  # type: ignore[import-not-found]
    from kvcore.integrations.vllm.rules import VllmRules  # type: ignore[import-not-found]

    rules = VllmRules(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=STEP, async_scheduling=False)
    manager = make_manager(plan_to_vllm_config(plan), rules, enable_caching=caching, log_stats=True)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(manager.block_pool.hash_block_size, sha256)

    def request(r: int, tokens: list[int], max_tokens: int) -> Any:
        return VllmRequest(str(r), tokens, SamplingParams(max_tokens=max_tokens), None, block_hasher=hasher)

    return manager, request


def _hit_rate(manager: Any) -> float:
    stats = manager.make_prefix_cache_stats()
    return stats.hits / stats.queries if stats is not None and stats.queries else 0.0


def run_vllm(plan: KVCachePlan, workload: Workload, caching: bool, max_num_seqs: int) -> dict[str, float]:
    """The same trace through vLLM's ``KVCacheManager`` on the same plan (needs vLLM and
    ``kvcore.integrations.vllm``), called as vLLM's scheduler calls it: a waiting request is
    looked up (``get_computed_blocks``) and given slots for the tokens past its hit
    (``allocate_slots`` with ``num_new_computed_tokens`` and ``new_computed_blocks``; its
    ``num_computed_tokens`` stays 0 until it is scheduled), its hit recorded once admitted
    (``record_prefix_cache_stats``); a running request is given slots for its new tokens; a
    preempted or finished one is freed. Token ids: a shared prefix's tokens are the same for
    every request that has it, the rest are the request's own. Each request's ``Request`` (and
    its block hashes) is made before the clock starts, as an engine makes it when the request
    arrives; one preempted is made again when it is admitted again (the trace restarts it from
    its prompt)."""
    manager, make = _vllm_manager(plan, caching)
    requests = workload.requests

    def tokens(r: int) -> list[int]:
        request = requests[r]
        shared = [7 + (i % 30_000) for i in range(request.prefix_tokens)]
        own = [40_000 + (r * 131 + i) % 20_000 for i in range(request.prompt_tokens - request.prefix_tokens)]
        return shared + own

    made = {r: make(r, tokens(r), request.output_tokens) for r, request in enumerate(requests)}
    holding: set[int] = set()  # requests that hold blocks
    pending: dict[int, tuple[Any, int]] = {}  # admitted this step: (cached blocks, hit)

    def admit(r: int, request: Request) -> int:
        vreq = made.get(r)
        if vreq is None:  # preempted: it starts again from its prompt
            vreq = made[r] = make(r, tokens(r), request.output_tokens)
        blocks, hit = manager.get_computed_blocks(vreq)[:2]  # 0.33 adds a third value
        pending[r] = (blocks, hit)
        return int(hit)

    def grow(r: int, tokens: int) -> bool:
        vreq = made[r]
        if r in pending:  # the admission: slots past the hit, the hit's blocks handed over
            blocks, hit = pending.pop(r)
            got = manager.allocate_slots(
                vreq, tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks
            )
            if got is not None:
                manager.record_prefix_cache_stats(vreq, hit)
                vreq.num_computed_tokens = hit
        else:
            got = manager.allocate_slots(vreq, tokens - vreq.num_computed_tokens)
        if got is not None:
            holding.add(r)
        return got is not None

    def after(r: int, computed: int) -> None:
        vreq = made[r]
        vreq.num_computed_tokens = computed
        if computed >= vreq.num_tokens:
            vreq.append_output_token_ids(1)  # the request block hasher hashes what it completes

    def finish(r: int) -> None:
        pending.pop(r, None)
        if r in holding:  # preempted or finished (a request that did not fit keeps its Request)
            holding.discard(r)
            manager.free(made.pop(r))

    return timed_drive(
        workload,
        max_num_seqs,
        lambda: _hit_rate(manager),
        admit=admit,
        grow=grow,
        after=after,
        finish=finish,
    )


#: The admission micro-benchmark: prompts of this many tokens admitted into a pool filled half
#: way with requests of random lengths, every other one then freed (a fragmented pool).
ADMITTED_TOKENS = 8000
ADMISSIONS = 300


def _fragmented(
    reserve: Callable[[int, int], None], free: Callable[[int], None], free_ids: Callable[[], int]
) -> None:
    """Fill a pool half way with requests of random lengths, then free every other one."""
    rng = random.Random(0)
    live: list[int] = []
    r = 10**6
    start = free_ids()
    while free_ids() > start // 2:
        reserve(r, rng.randint(16, MAX_MODEL_LEN))
        live.append(r)
        r += 1
    for request in live[::2]:
        free(request)


def admission_kvcore(plan: KVCachePlan, caching: bool) -> tuple[float, float]:
    """(µs per admission, blocks per admission) of :data:`ADMITTED_TOKENS`-token prompts of their
    own into a fragmented pool: the prefix lookup (with caching) and the one ``reserve``."""
    pool = BlockPool(plan, prefix_caching=caching)

    def reserve(r: int, tokens: int) -> None:
        if caching:
            pool.attach_prefix(r, PrefixKey(r, 0), 0)
        pool.reserve(r, tokens)

    _fragmented(reserve, pool.free_request, lambda: pool.num_free_blocks)
    total = 0.0
    blocks = 0
    for i in range(ADMISSIONS):
        start = time.perf_counter()
        if caching:
            pool.attach_prefix(i, PrefixKey(i, ADMITTED_TOKENS), ADMITTED_TOKENS)
        taken = pool.reserve(i, ADMITTED_TOKENS)
        total += time.perf_counter() - start
        blocks += sum(len(pages) for pages in taken.values())
        pool.free_request(i)
    return total / ADMISSIONS * 1e6, blocks / ADMISSIONS


def admission_vllm(plan: KVCachePlan, caching: bool) -> tuple[float, float]:
    """:func:`admission_kvcore` through vLLM's ``KVCacheManager`` on the same plan, as its
    scheduler admits: the lookup (``get_computed_blocks``) and one ``allocate_slots`` of the
    prompt past the hit."""
    manager, make = _vllm_manager(plan, caching)

    def request(r: int, tokens: int) -> Any:
        return make(r, [1 + (r * 131 + i) % 30_000 for i in range(tokens)], 1)

    made: dict[int, Any] = {}

    def reserve(r: int, tokens: int) -> None:
        made[r] = vreq = request(r, tokens)
        blocks, hit = manager.get_computed_blocks(vreq)[:2]  # 0.33 adds a third value
        manager.allocate_slots(vreq, tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)

    pool = manager.block_pool
    _fragmented(reserve, lambda r: manager.free(made.pop(r)), pool.get_num_free_blocks)
    prompts = [request(i, ADMITTED_TOKENS) for i in range(ADMISSIONS)]  # hashed outside the timing
    total = 0.0
    blocks = 0
    for vreq in prompts:
        before = pool.get_num_free_blocks()
        start = time.perf_counter()
        computed, hit = manager.get_computed_blocks(vreq)[:2]
        manager.allocate_slots(
            vreq, ADMITTED_TOKENS - hit, num_new_computed_tokens=hit, new_computed_blocks=computed
        )
        total += time.perf_counter() - start
        blocks += before - pool.get_num_free_blocks()
        manager.free(vreq)
    return total / ADMISSIONS * 1e6, blocks / ADMISSIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument(
        "--policy", default="auto", help="the plan's policy (kind_pools: one pool per retention kind)"
    )
    args = parser.parse_args()
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    specs = model_layer_specs(MODEL, registry)
    context = SizingContext(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=STEP)
    plan = plan_kv_cache(
        specs,
        MEMORY,
        context,
        registry=registry,
        policy=args.policy,
        options=PlanOptions(reserve_null_block=True),
    )
    prompt, output = parse_length("lognormal:1024:1.0"), parse_length("lognormal:128:1.0")
    traces = {
        "own prompts": synthetic(args.requests, prompt, output, seed=0, max_model_len=MAX_MODEL_LEN),
        "70% share 1,024": synthetic(
            args.requests,
            prompt,
            output,
            seed=0,
            max_model_len=MAX_MODEL_LEN,
            prefix_share=0.7,
            prefix_tokens=1024,
        ),
    }
    print(
        f"{MODEL}, {plan.policy}, 24 GiB, max_model_len {MAX_MODEL_LEN:,}, {STEP:,} tokens/step: "
        f"{' + '.join(f'{p.num_blocks:,}' for p in plan.pools)} blocks (null block 0"
        f"{' of each pool' if len(plan.pools) > 1 else ''}), {len(plan.groups)} groups"
    )
    print(
        f"trace: {args.requests:,} requests, prompt {prompt}, output {output}, at once; "
        f"at most {args.max_num_seqs} running\n"
    )
    try:
        import vllm  # type: ignore[import-not-found]  # noqa: F401

        have_vllm = True
    except ImportError:
        have_vllm = False
    header = (
        f"{'trace':<16} {'caching':<7} {'steps':>7} {'kvcore s':>8} {'steps/s':>8} {'calls/s':>9} "
        f"{'hit rate':>8}   {'vLLM steps':>10} {'vLLM s':>7} {'steps/s':>8} {'hit rate':>8} "
        f"{'vLLM/kvcore':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, workload in traces.items():
        for caching in (False, True):
            ours = run_kvcore(plan, workload, caching, args.max_num_seqs)
            if have_vllm:
                try:
                    theirs = run_vllm(plan, workload, caching, args.max_num_seqs)
                    vllm_cells = (
                        f"{theirs['steps']:>10,} {theirs['seconds']:>7.2f} {theirs['steps/s']:>8,.0f} "
                        f"{100 * theirs['hit rate']:>7.1f}% {theirs['seconds'] / ours['seconds']:>10.1f}x"
                    )
                except Exception as exc:
                    vllm_cells = f"vLLM failed: {type(exc).__name__}: {exc}"[:80]
            else:
                vllm_cells = "vLLM not installed"
            print(
                f"{name:<16} {'on' if caching else 'off':<7} {ours['steps']:>7,} {ours['seconds']:>8.2f} "
                f"{ours['steps/s']:>8,.0f} {ours['calls/s']:>9,.0f} {100 * ours['hit rate']:>7.1f}%   "
                f"{vllm_cells}"
            )
    print(
        f"\nadmitting an {ADMITTED_TOKENS:,}-token prompt of its own into a pool half full and fragmented "
        f"(mean of {ADMISSIONS}; target: kvcore's µs per block <= vLLM's)\n"
    )
    header = f"{'caching':<7} {'blocks':>6} {'kvcore µs':>9} {'ns/block':>8}   {'vLLM µs':>8} {'ns/block':>8}"
    print(header)
    print("-" * len(header))
    for caching in (False, True):
        micros, blocks = admission_kvcore(plan, caching)
        theirs = "vLLM not installed"
        if have_vllm:
            try:
                their_micros, their_blocks = admission_vllm(plan, caching)
                theirs = f"{their_micros:>8,.0f} {their_micros / their_blocks * 1e3:>8,.0f}"
            except Exception as exc:
                theirs = f"vLLM failed: {type(exc).__name__}: {exc}"[:80]
        print(
            f"{'on' if caching else 'off':<7} {blocks:>6,.0f} {micros:>9,.0f} "
            f"{micros / blocks * 1e3:>8,.0f}   {theirs}"
        )


if __name__ == "__main__":
    main()
