"""The ``vllm`` profile, its fast path and its plain reference, against vLLM 0.33's real v1
``Scheduler`` on cases nobody picked.

Each case is drawn from a seed: a model of two to six layers (full attention only, full with
sliding windows of 32 to 128 tokens, full with chunked local attention of 64 or 128 tokens,
sliding only, full attention with MLA, MLA only, full attention with Mamba-style state layers,
sliding windows with state layers), planned by ``plan_for_vllm`` with a random policy in a budget of 1.5 to 3
requests of ``max_model_len`` (256 to 1,024 tokens, so requests wait, preempt and evict), and
a trace of 2 to 24 requests in bursts and gaps, short and long prompts, about half leading with
one of two shared prefixes; vLLM's settings are drawn too: sync or async scheduling, prefix
caching off or on, the admission gate (``scheduler_reserve_full_isl``) on or off,
``max_num_seqs`` of 2, 8 or 128 (2 binds), ``long_prefill_token_threshold`` 0 or 32, 128 or 256
tokens a step, ``prefix_cache_retention_interval`` 0 (vLLM's default), ``None`` (dense) or 64 (with
sliding windows or state layers, which it thins).
With prefix caching, vLLM runs the state layers in ``mamba_cache_mode='align'``
(chunks cut to block boundaries, states kept and hit per block), else in ``'none'``. Every
figure must agree: steps, running requests and pool usage at every step,
tokens, preemptions, recomputed tokens, queue delays and prefix hits. A failure names its seed;
``KVCORE_SCHEDULER_SEEDS=START:STOP`` runs other seeds (``0:2000`` for a long hunt).
"""

from __future__ import annotations

import os
import random

import attrs
import pytest

from kvcore import Registry, simulate
from kvcore.errors import KVCoreError
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.integrations.vllm.scheduler import run_vllm_scheduler
from kvcore.plan import KVCachePlan
from kvcore.planning.capacity import request_bytes
from kvcore.plugins.state import StatePart
from kvcore.policy import PlanOptions
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.workload import Request, Workload
from tests.integrations.vllm.scheduler_cases import align_mode_differs

REGISTRY = Registry.default()
FULL = REGISTRY.spec_class("full_attention")
SLIDING = REGISTRY.spec_class("sliding_window")
CHUNKED = REGISTRY.spec_class("chunked_local_attention")
MLA = REGISTRY.spec_class("mla")
STATE = REGISTRY.spec_class("state")
SHAPES = ("full", "full+sliding", "full+chunked", "sliding", "full+mla", "mla", "full+state", "sliding+state")
#: what the figures are compared on (pool usage apart: floats)
FIELDS = (
    "steps",
    "running",
    "total_tokens",
    "preemptions",
    "recomputed_tokens",
    "mean_queue_delay",
    "p99_queue_delay",
    "cached_tokens",
)


def _seeds() -> range:
    start, _, stop = os.environ.get("KVCORE_SCHEDULER_SEEDS", "0:60").partition(":")
    return range(int(start), int(stop))


def _layers(
    rng: random.Random, shapes: tuple[str, ...] = SHAPES, checkpoint_alignment: int | None = None
) -> tuple[str, dict]:
    shape = rng.choice(shapes)
    # a Mamba-2-like state (one prefill checkpoint block, alignment 1) or a GDN-like one (the
    # checkpoint grid is the block), where asked for; else one without checkpoint blocks
    checkpoints = (
        {"checkpoint_slots": 1, "checkpoint_alignment": checkpoint_alignment}
        if checkpoint_alignment is not None
        else {}
    )
    layers = {}
    for i in range(rng.randint(2, 6)):
        first = i % 3 == 0
        if shape == "full" or (first and shape.startswith("full")):
            spec = FULL(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
        elif shape == "full+chunked":
            size = rng.choice([64, 128])
            spec = CHUNKED(
                block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16", attention_chunk_size=size
            )
        elif "mla" in shape:
            spec = MLA(block_size=16, kv_lora_rank=64, qk_rope_head_dim=16, dtype="bfloat16")
        elif "state" in shape and not (first and shape == "sliding+state"):
            spec = STATE(block_size=16, parts=_STATE_PARTS, **checkpoints)
        else:
            window = rng.choice([32, 100, 128])
            spec = SLIDING(
                block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16", sliding_window=window
            )
        layers[f"model.layers.{i}"] = spec
    return shape, layers


#: a small Mamba-2-like state, a conv and an SSM part, of one attention page (4 KiB: vLLM pads a
#: state page to the attention page, and every policy then gives a page one block id)
_STATE_PARTS = (
    StatePart(name="conv", shape=(4, 64), dtype="bfloat16"),
    StatePart(name="ssm", shape=(7, 16, 16), dtype="bfloat16"),
)


def _trace(rng: random.Random, length: int) -> Workload:
    prefixes = [rng.randint(16, length // 2) for _ in range(2)]
    requests, arrival = [], 0
    for i in range(rng.randint(2, 24)):
        arrival += rng.choice([0, 0, 0, 1, 5, 20])
        prompt = rng.randint(1, length - 2) if rng.random() < 0.4 else rng.randint(1, min(200, length - 2))
        output = rng.randint(1, max(1, min(length - prompt, rng.choice([8, 64, 300]))))
        share = rng.choice([None, 0, 0, 1])
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
    return Workload(tuple(requests), name="random")


def draw_case(
    seed: int,
    shapes: tuple[str, ...] = SHAPES,
    *,
    caching: bool | None = None,
    checkpoint_alignment: int | None = None,
) -> tuple[KVCachePlan, Workload, VllmProfile, bool, int] | None:
    """The case of ``seed`` (plan, trace, settings, prefix caching, tokens a step), or ``None``
    when ``plan_for_vllm`` refuses the drawn model and budget; ``shapes`` and ``caching``, where
    given, narrow the draw (a seed draws the same numbers either way); ``checkpoint_alignment``,
    where given, gives the state layers one prefill checkpoint block of that alignment."""
    rng = random.Random(seed)
    length = rng.choice([256, 512, 1024])
    shape, layers = _layers(rng, shapes, checkpoint_alignment)
    asynchronous = rng.random() < 0.5
    batch = rng.choice([128, 256])
    rules = VllmRules(max_model_len=length, max_num_batched_tokens=batch, async_scheduling=asynchronous)
    need = request_bytes(layers, rules.context())
    budget = rng.randint(need * 3 // 2, 3 * need)
    policy = rng.choice(["shared_buffer", "equal_groups", "uniform" if shape == "full" else "shared_buffer"])
    # full attention and MLA layers of different pages are one kind to vLLM: kvcore would put them
    # in one mixed-page group (a UniformTypeKVCacheSpecs), which vLLM's scheduler has no manager for
    options = PlanOptions(mixed_pages=False) if "mla" in shape else None
    try:
        plan = plan_for_vllm(
            rules.request(layers, budget, policy=policy, options=options), rules, registry=REGISTRY
        )
    except KVCoreError:
        return None  # vLLM's per-group admission rule does not admit one request
    workload = _trace(rng, length)
    profile = VllmProfile(
        async_scheduling=asynchronous,
        max_num_seqs=rng.choice([2, 8, 128]),
        reserve_full_isl=rng.random() < 0.75,
        long_prefill_token_threshold=rng.choice([0, 0, 32]),
    )
    drawn = rng.random() < 0.6
    caching = drawn if caching is None else caching
    # vLLM's prefix_cache_retention_interval: its default 0 (a sliding window or a state layer
    # caches only where a later request can resume), dense, or a multiple of the scheduler's
    # block (16) where a sliding window or a state layer can take one (without prefix caching, a
    # state layer's block is max_model_len, which vLLM's check then counts: 0 there)
    thinned = "sliding" in shape or "state" in shape
    retention = rng.choice([0, 0, None, 64 if thinned and (caching or "state" not in shape) else 0])
    return plan, workload, attrs.evolve(profile, prefix_cache_retention_interval=retention), caching, batch


def _differences(ours, theirs) -> list[str]:
    differ = [name for name in FIELDS if getattr(ours, name) != getattr(theirs, name)]
    if ours.pool_usage != pytest.approx(theirs.pool_usage, abs=1e-12):
        differ.append("pool_usage")
    return differ


@pytest.mark.parametrize("seed", _seeds())
def test_the_profile_is_vllms_scheduler_on_random_cases(seed):
    case = draw_case(seed)
    if case is None:
        pytest.skip(f"seed {seed}: plan_for_vllm refuses the drawn model and budget")
    plan, caching = case[0], case[3]
    if caching and any(g.spec.kind == "state" for g in plan.groups) and (why := align_mode_differs()):
        pytest.skip(f"seed {seed}: {why}")
    _assert_both_paths_are_vllms(case, f"seed {seed} (rerun: KVCORE_SCHEDULER_SEEDS={seed}:{seed + 1})")


def _assert_both_paths_are_vllms(case, label: str) -> None:
    """The fast path and the reference give every figure vLLM's real scheduler gives on ``case``."""
    plan, workload, profile, caching, batch = case
    theirs = run_vllm_scheduler(plan, workload, profile, max_num_batched_tokens=batch, prefix_caching=caching)
    for reference in (False, True):
        ours = simulate(
            plan,
            workload,
            scheduler=attrs.evolve(profile, reference=reference),
            prefix_caching=caching,
            max_num_batched_tokens=batch,
            registry=REGISTRY,
        )
        differ = _differences(ours, theirs)
        path = "reference" if reference else "fast path"
        assert not differ, (
            f"{label}: the {path} differs from vLLM on {differ}; {profile.settings()}, prefix caching "
            f"{caching}, {batch} tokens a step, policy {plan.policy}"
        )


#: the state shapes, and the prefill checkpoint alignment of the seed's state layers: Mamba-2's
#: (1, even seeds) or a GDN layer's under FlashInfer (its grid, the block: odd seeds)
STATE_SHAPES = ("full+state", "sliding+state")


def _checkpoint_alignment(seed: int) -> int:
    return 1 if seed % 2 == 0 else 16


@pytest.mark.parametrize("seed", range(30))
def test_prefill_checkpoints_of_mamba2_like_states_are_vllms_on_random_cases(seed):
    """Mamba-2-like and GDN-like state layers (vLLM 0.33's ``num_prefill_checkpoint_blocks=1``)
    beside attention, prefix caching on (``mamba_cache_mode='align'``, the seed's retention): the
    prompt's last chunk exports its last block boundary's state into a block of its own instead
    of stopping there. Every figure as vLLM's, from the fast path and the reference."""
    if why := align_mode_differs():
        pytest.skip(why)
    case = draw_case(seed, STATE_SHAPES, caching=True, checkpoint_alignment=_checkpoint_alignment(seed))
    if case is None:
        pytest.skip(f"seed {seed}: plan_for_vllm refuses the drawn model and budget")
    _assert_both_paths_are_vllms(case, f"seed {seed} (prefill checkpoints)")


def test_prefill_checkpoints_move_the_figures():
    """The checkpoint cases above differ from the same cases without checkpoint blocks (fewer
    prefill steps, a block more held in them), else the comparison would not tell them apart."""
    moved = 0
    for seed in range(30):
        cases = [
            draw_case(seed, STATE_SHAPES, caching=True, checkpoint_alignment=alignment)
            for alignment in (_checkpoint_alignment(seed), None)
        ]
        if None in cases:
            continue
        results = [
            simulate(plan, workload, scheduler=profile, prefix_caching=True, max_num_batched_tokens=batch)
            for plan, workload, profile, _, batch in cases
        ]
        moved += (results[0].steps, results[0].pool_usage) != (results[1].steps, results[1].pool_usage)
    assert moved >= 10, moved


@pytest.mark.parametrize("seed", range(40))
def test_sliding_windows_retain_their_prefix_cache_as_vllm_does_on_random_cases(seed):
    """Sliding windows (beside full attention, or alone) under prefix caching: vLLM's sparse
    retention (``prefix_cache_retention_interval`` 0 by default, or 64) caches only the window
    blocks a later request can resume at, dense retention (``None``) every one the scheduler's
    block allows. Every figure as vLLM's, from the fast path and the reference."""
    case = draw_case(seed, ("full+sliding", "sliding"), caching=True)
    if case is None:
        pytest.skip(f"seed {seed}: plan_for_vllm refuses the drawn model and budget")
    _assert_both_paths_are_vllms(case, f"seed {seed}")


def _retention_moves_the_figures(case) -> bool:
    """Whether a drawn case with caching on hits or steps otherwise under its sparse retention
    than under dense retention (``None``)."""
    plan, workload, profile, _, batch = case
    sparse, dense = (
        simulate(
            plan,
            workload,
            scheduler=attrs.evolve(profile, prefix_cache_retention_interval=retention),
            prefix_caching=True,
            max_num_batched_tokens=batch,
        )
        for retention in (profile.prefix_cache_retention_interval, None)
    )
    return (sparse.cached_tokens, sparse.steps) != (dense.cached_tokens, dense.steps)


def test_sliding_windows_retain_sparsely_and_that_moves_the_figures():
    """The sliding cases above include sparse retention that changes what a dense cache would
    give (else the comparison would not tell the two apart)."""
    moved = 0
    for seed in range(40):
        case = draw_case(seed, ("full+sliding", "sliding"), caching=True)
        if case is None or case[2].prefix_cache_retention_interval is None:
            continue
        moved += _retention_moves_the_figures(case)
    assert moved >= 3, moved


@pytest.mark.parametrize("seed", range(30))
def test_state_layers_retain_their_states_as_vllm_does_on_random_cases(seed):
    """State layers (beside full attention or sliding windows) under prefix caching, with no
    prefill checkpoint blocks: vLLM's sparse retention (``prefix_cache_retention_interval`` 0 by
    default, or 64) hashes only the states a later request can resume at
    (``MambaManager.reachable_block_mask``), dense retention (``None``) every state a chunk
    leaves. Every figure as vLLM's, from the fast path and the reference."""
    if why := align_mode_differs():
        pytest.skip(why)
    case = draw_case(seed, STATE_SHAPES, caching=True)
    if case is None:
        pytest.skip(f"seed {seed}: plan_for_vllm refuses the drawn model and budget")
    _assert_both_paths_are_vllms(case, f"seed {seed} (state retention)")


def test_state_layers_retain_sparsely_and_that_moves_the_figures():
    """The state cases above (with and without prefill checkpoints) include sparse retention
    that changes what a dense cache would give (else the comparison would not tell the two
    apart)."""
    moved = 0
    for seed in range(30):
        for alignment in (None, _checkpoint_alignment(seed)):
            case = draw_case(seed, STATE_SHAPES, caching=True, checkpoint_alignment=alignment)
            if case is None or case[2].prefix_cache_retention_interval is None:
                continue
            moved += _retention_moves_the_figures(case)
    assert moved >= 5, moved


def test_the_random_cases_preempt_hit_and_bind():
    """The seeds' cases exercise what the comparison is for: preemptions, prefix hits, a
    ``max_num_seqs`` that binds, async scheduling and the gate off (else it proves less)."""
    seen = {"preempts": 0, "hits": 0, "binds": 0, "async": 0, "gate off": 0}
    for seed in range(20):
        case = draw_case(seed)
        if case is None:
            continue
        plan, workload, profile, caching, batch = case
        result = simulate(
            plan, workload, scheduler=profile, prefix_caching=caching, max_num_batched_tokens=batch
        )
        seen["preempts"] += result.preemptions > 0
        seen["hits"] += result.cached_tokens > 0
        seen["binds"] += result.peak_running == profile.max_num_seqs
        seen["async"] += profile.async_scheduling
        seen["gate off"] += not profile.reserve_full_isl
    assert all(count >= 2 for count in seen.values()), seen
