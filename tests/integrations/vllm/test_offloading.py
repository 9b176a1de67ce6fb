"""The ``vllm`` profile's CPU tier (vLLM's native offloading, ``--kv-offloading-size``) against
vLLM 0.33's real ``Scheduler`` with its ``OffloadingConnector``.

vLLM's side: :func:`~kvcore.integrations.vllm.scheduler.run_vllm_scheduler` configures
``kv_offloading_size`` (the plan's host tier, in GiB) and the native backend, so that the
scheduler builds the connector's scheduler half (the CPU manager with its LRU policy); no worker
runs, and the fake model runner reports every load and store job finished in the output of the
step that issued it, the timing the profile assumes. Every figure must agree, the tier's
included (loads, chunks loaded and stored, evictions, chunks held, the tokens the tier gave).

The fixed cases are small pools that preempt (Llama-3.1-8B in 0.5 GiB: the chat trace preempts
about a hundred times) with a tier that evicts (128 MiB) and one that does not (1 GiB), and a
trace of five shared prefixes that the device evicts and the tier gives back. The random cases
draw full-attention models, budgets, tiers of a few chunks to several pools' worth, traces with
shared prefixes and bursts, and vLLM's settings; a failure names its seed
(``KVCORE_OFFLOAD_SEEDS=START:STOP`` runs others).

vLLM's connector walks a step's finished requests as a set of request ids, in the order of the
strings' hashes (``PYTHONHASHSEED``); it matters when several finish in one step and their
tails compete for the last free chunks. The profile is run here with vLLM's order for this
process (the same set of the driver's ids), so that the comparison is exact under every seed.
"""

from __future__ import annotations

import os
import random

import pytest
import vllm

from kvcore import Registry, simulate
from kvcore.errors import KVCoreError
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.integrations.vllm.scheduler import run_vllm_scheduler
from kvcore.planning.capacity import request_bytes
from kvcore.planning.offload import with_host_memory
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.profiles.vllm_reference.offloading import chunk_bytes
from kvcore.simulation.profiles.vllm_reference.offloading_scheduler import OffloadingReferenceScheduler
from kvcore.simulation.workload import Request, Workload
from tests.integrations.vllm.scheduler_cases import BATCH, GIB, vllm_plan, workload

pytestmark = pytest.mark.skipif(
    not vllm.__version__.startswith("0.33"),
    reason="the profile models vLLM 0.33's OffloadingConnector (other releases differ)",
)

REGISTRY = Registry.default()
FULL = REGISTRY.spec_class("full_attention")
FIELDS = (
    "steps",
    "running",
    "total_tokens",
    "preemptions",
    "recomputed_tokens",
    "mean_queue_delay",
    "p99_queue_delay",
    "cached_tokens",
    "prefix_hit_rate",
    "host_tier",
)


def _differences(ours, theirs) -> list[str]:
    differ = [name for name in FIELDS if getattr(ours, name) != getattr(theirs, name)]
    if ours.pool_usage != pytest.approx(theirs.pool_usage, abs=1e-12):
        differ.append("pool_usage")
    return differ


def _vllms_set_order(finished: list[int]) -> list[int]:
    """The order vLLM walks these finished requests in: its ``finished_req_ids``, a fresh set
    to which they were added in this order, of the driver's ids (``r0``, ``r1``, ...)."""
    ids: set[str] = set()
    for r in finished:
        ids.add(f"r{r}")
    return [int(rid[1:]) for rid in ids]


def _ours(plan, requests, profile, batch):
    """The profile's replay (the ``vllm`` profile with a tier runs this reference), with
    vLLM's order of a step's finished requests."""
    stepper = OffloadingReferenceScheduler(
        plan,
        requests,
        profile,
        max_num_batched_tokens=batch,
        prefix_caching=True,
        finished_order=_vllms_set_order,
    )
    while not stepper.done:
        stepper.step()
    return stepper.result()


def _shared_prefixes(count: int, seed: int) -> Workload:
    """Requests that lead with one of five prefixes of 256 or 512 tokens, arriving in bursts."""
    rng = random.Random(seed)
    requests, arrival = [], 0
    for i in range(count):
        arrival += rng.choice([0, 0, 1, 3, 8])
        requests.append(
            Request(
                id=i,
                prompt_tokens=rng.randint(600, 1500),
                output_tokens=rng.randint(5, 120),
                arrival_step=arrival,
                prefix_id=f"p{rng.randrange(5)}",
                prefix_tokens=rng.choice([0, 256, 512]),
            )
        )
    return Workload(tuple(requests), name="shared prefixes")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("tier", [GIB // 8, GIB], ids=["128MiB", "1GiB"])
@pytest.mark.parametrize("trace", ["chat", "shared prefixes"])
def test_the_cpu_tier_is_vllms_offloading_connector(trace, tier, mode):
    asynchronous = mode == "async"
    plan = with_host_memory(
        vllm_plan("meta-llama/Llama-3.1-8B", GIB // 2, 2048, asynchronous=asynchronous, registry=REGISTRY),
        tier,
    )
    requests = workload("chat", 80) if trace == "chat" else _shared_prefixes(80, 1)
    profile = VllmProfile(async_scheduling=asynchronous)
    ours = _ours(plan, requests, profile, BATCH)
    theirs = run_vllm_scheduler(plan, requests, profile, max_num_batched_tokens=BATCH, prefix_caching=True)
    # simulate() runs the same replay (the order of a step's finished requests apart)
    simulated = simulate(plan, requests, scheduler=profile, prefix_caching=True, max_num_batched_tokens=BATCH)
    assert simulated.scheduler == "vllm" and simulated.host_tier is not None
    assert not _differences(ours, theirs), _differences(ours, theirs)
    # the case is what the comparison is for: the tier gives back blocks the device evicted
    tier_stats = ours.host_tier
    assert tier_stats is not None and tier_stats.host_hits > 0 and tier_stats.host_hit_tokens > 0
    assert tier_stats.host_blocks == tier // chunk_bytes(plan)
    if tier == GIB // 8:
        assert tier_stats.host_evictions > 0
    if trace == "chat":
        assert ours.preemptions > 50


def _seeds() -> range:
    start, _, stop = os.environ.get("KVCORE_OFFLOAD_SEEDS", "0:30").partition(":")
    return range(int(start), int(stop))


def draw_case(seed: int):
    """The case of ``seed``: a full-attention plan with a host tier, a trace, vLLM's settings."""
    rng = random.Random(seed)
    length = rng.choice([256, 512, 1024])
    block = rng.choice([16, 32])
    heads = rng.choice([1, 2])
    layers = {
        f"model.layers.{i}": FULL(block_size=block, num_kv_heads=heads, head_size=64, dtype="bfloat16")
        for i in range(rng.randint(1, 4))
    }
    asynchronous = rng.random() < 0.5
    batch = rng.choice([128, 256])
    rules = VllmRules(max_model_len=length, max_num_batched_tokens=batch, async_scheduling=asynchronous)
    need = request_bytes(layers, rules.context())
    try:
        plan = plan_for_vllm(
            rules.request(layers, rng.randint(need * 3 // 2, 3 * need)), rules, registry=REGISTRY
        )
        chunks = rng.choice([2, 8, plan.usable_blocks // 2, 3 * plan.usable_blocks])
        plan = with_host_memory(plan, chunks * chunk_bytes(plan))
    except KVCoreError:
        return None
    prefixes = [rng.randint(block, length // 2) for _ in range(3)]
    requests, arrival = [], 0
    for i in range(rng.randint(4, 30)):
        arrival += rng.choice([0, 0, 0, 1, 5, 20])
        prompt = rng.randint(1, length - 2) if rng.random() < 0.4 else rng.randint(1, min(300, length - 2))
        output = rng.randint(1, max(1, min(length - prompt, rng.choice([8, 64, 300]))))
        share = rng.choice([None, 0, 1, 2, 2])
        prefix = min(prefixes[share], prompt) if share is not None else 0
        requests.append(
            Request(
                id=i,
                prompt_tokens=prompt,
                output_tokens=output,
                arrival_step=arrival,
                prefix_id=share if prefix else None,
                prefix_tokens=prefix,
            )
        )
    profile = VllmProfile(
        async_scheduling=asynchronous,
        max_num_seqs=rng.choice([2, 8, 128]),
        reserve_full_isl=rng.random() < 0.75,
        long_prefill_token_threshold=rng.choice([0, 0, 32]),
    )
    return plan, Workload(tuple(requests), name="random"), profile, batch


@pytest.mark.parametrize("seed", _seeds())
def test_the_cpu_tier_is_vllms_on_random_cases(seed):
    case = draw_case(seed)
    if case is None:
        pytest.skip(f"seed {seed}: plan_for_vllm refuses the drawn model and budget")
    plan, requests, profile, batch = case
    theirs = run_vllm_scheduler(plan, requests, profile, max_num_batched_tokens=batch, prefix_caching=True)
    ours = _ours(plan, requests, profile, batch)
    differ = _differences(ours, theirs)
    assert not differ, (
        f"seed {seed} (rerun: KVCORE_OFFLOAD_SEEDS={seed}:{seed + 1}): the profile differs from vLLM "
        f"on {differ}; "
        f"{profile.settings()}, {batch} tokens a step, tier {ours.host_tier}, vLLM's {theirs.host_tier}"
    )


def test_the_random_cases_load_evict_and_preempt():
    """The seeds' cases exercise the tier: loads, host evictions, preemptions, async scheduling."""
    seen = {"loads": 0, "evictions": 0, "preempts": 0, "async": 0}
    for seed in range(30):
        case = draw_case(seed)
        if case is None:
            continue
        plan, requests, profile, batch = case
        result = simulate(
            plan, requests, scheduler=profile, prefix_caching=True, max_num_batched_tokens=batch
        )
        assert result.host_tier is not None
        seen["loads"] += result.host_tier.host_hits > 0
        seen["evictions"] += result.host_tier.host_evictions > 0
        seen["preempts"] += result.preemptions > 0
        seen["async"] += profile.async_scheduling
    assert all(count >= 3 for count in seen.values()), seen
