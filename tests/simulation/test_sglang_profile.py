"""The ``sglang`` scheduler profile: hand-computed cases (admission by new_token_ratio, a
retraction, radix hits on a shared prefix, LRU eviction of idle cached pages, sliding slots out
of the window) and the pool's invariants through every step of random workloads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvcore import InvalidInputError, SizingContext, Workload, plan_kv_cache, simulate
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.offload import with_host_memory
from kvcore.planning.registry import Registry
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.simulation.profiles.radix import HiRadixTree, Node
from kvcore.simulation.profiles.sglang import (
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO_FACTOR,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    SglangPools,
    SglangProfile,
    SglangSimulator,
    default_max_running_requests,
    sglang_pools,
)
from kvcore.simulation.workload import Request
from tests.helpers import full, mix, sliding
from tests.simulation._workloads import random_workload

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
DECAY = INIT_NEW_TOKEN_RATIO * (1 - MIN_NEW_TOKEN_RATIO_FACTOR) / NEW_TOKEN_RATIO_DECAY_STEPS


def _plan(specs, max_model_len=4096, *, num_blocks=None, step=2048, policy="auto", memory=2**34):
    context = SizingContext(max_model_len=max_model_len, max_num_batched_tokens=step)
    return plan_kv_cache(specs, memory, context, registry=REGISTRY, policy=policy, num_blocks=num_blocks)


def _tokens(page, tokens):
    """A one-layer full-attention plan whose pool holds ``tokens`` tokens in pages of ``page``."""
    return _plan({"model.layers.0": full(block_size=page)}, tokens, num_blocks=tokens // page)


def _sim(plan, requests, *, caching=False, overlap_schedule=False, **settings):
    """The hand-computed cases follow SGLang's normal event loop unless they say otherwise."""
    settings["overlap_schedule"] = overlap_schedule
    workload = Workload(tuple(requests), name="hand")
    return SglangProfile(**settings).simulator(
        plan, workload, max_num_batched_tokens=None, prefix_caching=caching
    )


def _run(sim):
    while not sim.done:
        sim.step()
        _check_invariants(sim)
    return sim.result()


# -- admission -------------------------------------------------------------------------------


@pytest.mark.parametrize(("prompt", "admitted_at"), [(19, 1), (20, 100)])
def test_admission_reserves_new_token_ratio_of_what_running_requests_may_still_generate(prompt, admitted_at):
    """A (10 + 100 tokens) runs alone in 200 tokens; B arrives at step 1. A may still generate 99
    tokens, of which SGLang reserves 0.7 x 99 = 69.3: 190 free - 69.3 = 120.7 left. B asks for its
    prompt + 100 output + a page: 119 + 1 = 120 < 120.7 fits, 121 does not, and B then waits for
    A to leave (the batch is full until a request leaves it): A's 100th token is at step 99."""
    sim = _sim(_tokens(1, 200), [Request(0, 10, 100, 0), Request(1, prompt, 100, 1)])
    result = _run(sim)
    assert sim._first == [0, admitted_at]
    # each request computes its prompt and all but its last output token (and, admitted at
    # step 1, B outgrows the pool beside A: the ratio's bet does not always pay)
    assert result.preemptions == (1 if admitted_at == 1 else 0)
    assert result.total_tokens == (10 + 99) + (prompt + 99) + result.recomputed_tokens


def test_with_the_overlap_scheduler_a_finished_request_frees_its_pages_a_step_later():
    """As above with prompt 20, under the overlap scheduler: A's last token (step 99) is
    processed after step 100 was scheduled: at step 100 A no longer decodes but still holds its
    109 tokens (B's 121 do not fit 91), so the step runs nothing; B is admitted at step 101."""
    sim = _sim(_tokens(1, 200), [Request(0, 10, 100, 0), Request(1, 20, 100, 1)], overlap_schedule=True)
    for _ in range(101):
        sim.step()
        _check_invariants(sim)
    assert sim._first == [0, -1] and sim.finished == 1 and sim.full_free == 200
    result = _run(sim)
    assert sim._first == [0, 101]
    assert result.steps == 102 + 99  # B: its prefill at 101, 99 decodes
    assert result.running[100] == 0  # the step that waited for A's result
    assert result.total_tokens == 109 + 119


def test_new_token_ratio_decays_every_decode_step_to_its_floor():
    sim = _sim(_tokens(1, 4096), [Request(0, 10, 1000, 0)])
    sim.step()  # the prefill: no decay
    assert sim.ratio == INIT_NEW_TOKEN_RATIO
    for _ in range(10):
        sim.step()
    assert sim.ratio == pytest.approx(INIT_NEW_TOKEN_RATIO - 10 * DECAY)
    _run(sim)
    assert sim.ratio == pytest.approx(INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR)  # 999 decodes > 600


def test_requests_admitted_together_reserve_their_whole_output():
    """Three requests of 10 + 50 arrive at once in 130 tokens: the first reserves 10 + 1 + 50 =
    61, leaving 69 > 61 for the second, then 8: the third waits for one of them to leave."""
    sim = _sim(_tokens(1, 130), [Request(i, 10, 50, 0) for i in range(3)])
    sim.step()
    assert sim.running == (0, 1) and sim.waiting == (2,)
    result = _run(sim)
    assert sim._first == [0, 0, 50]  # the two finish at step 49 (1 prefill + 49 decodes)
    assert result.preemptions == 0


def test_max_running_requests_caps_the_request_slots():
    sim = _sim(_tokens(16, 4096), [Request(i, 20, 5, 0) for i in range(6)], max_running_requests=4)
    result = _run(sim)
    assert result.peak_running == 4
    assert default_max_running_requests(10_000, 4096) == 2048
    assert default_max_running_requests(1_000, 4096) == 500  # at most half the pool's tokens
    assert default_max_running_requests(10**7, 1024) == 4096


def test_a_long_prompt_is_chunked_and_continues_first():
    """A prompt of 100 with chunks of 32 takes four prefill steps (32, 32, 32, 4); the second
    request (arriving at step 1) waits behind the chunked one, then joins at step 3 when the
    last chunk leaves room in the chunk budget (4 + 10 <= 32)."""
    plan = _plan({"model.layers.0": full(block_size=1)}, 4096, num_blocks=4096, step=32)
    sim = _sim(plan, [Request(0, 100, 3, 0), Request(1, 10, 3, 1)])
    sizes = []
    while not sim.done:
        before = sim.total_tokens
        sim.step()
        sizes.append(sim.total_tokens - before)
        _check_invariants(sim)
    assert sizes[:4] == [32, 32, 32, 4 + 10]
    assert sim._first == [0, 3]


# -- retraction ------------------------------------------------------------------------------


def test_decodes_are_retracted_when_the_pool_runs_out_and_the_ratio_is_re_estimated():
    """200 tokens, requests of 10 + 100 arriving at steps 0, 1, 2 (hand-computed).

    Step 0 prefills A; step 1 admits B (111 < 190 - 0.7 x 99 = 120.7); at step 2 C (111) does not
    fit 180 - 0.7 x (98 + 99) = 42.1 and the batch is full. A and B decode (2 tokens a step)
    from 180 free tokens: 90 steps (steps 2-91) fit, the 91st (step 92) does not: B, last among
    equals (same outputs, same prompt), is retracted, freeing its 100 tokens, and goes behind C;
    the ratio becomes (91 outputs + 20 x 1) / (100 + 1) > 1, so 1."""
    sim = _sim(_tokens(1, 200), [Request(0, 10, 100, 0), Request(1, 10, 100, 1), Request(2, 10, 100, 2)])
    for _ in range(92):
        sim.step()
        _check_invariants(sim)
    assert sim.preemptions == 0 and sim.running == (0, 1) and sim.waiting == (2,)
    assert sim.ratio == pytest.approx(INIT_NEW_TOKEN_RATIO - 90 * DECAY)
    sim.step()
    assert sim.preemptions == 1 and sim.recomputed_tokens == 100
    assert sim.running == (0,) and sim.waiting == (2, 1)
    assert sim.ratio == 1.0
    result = _run(sim)
    assert result.preemptions == 1
    # B computes its prompt and 91 outputs again (100 of them a second time)
    assert result.total_tokens == 3 * (10 + 99) + 100


# -- the radix cache -------------------------------------------------------------------------


@pytest.mark.parametrize(("page", "hit"), [(1, 10), (4, 8)])
def test_a_shared_prefix_is_found_in_whole_pages(page, hit):
    """A and B share a 10-token prefix of their 20-token prompts; B arrives after A finished.
    B finds the prefix's whole pages (10 tokens with pages of 1, 8 with pages of 4) and computes
    the rest."""
    requests = [
        Request(0, 20, 2, 0, prefix_id="sys", prefix_tokens=10),
        Request(1, 20, 2, 5, prefix_id="sys", prefix_tokens=10),
    ]
    result = _run(_sim(_tokens(page, 400), requests, caching=True))
    assert result.cached_tokens == hit
    assert result.prefix_hit_rate == pytest.approx(hit / 40)
    assert result.total_tokens == 2 * 21 - hit


def test_a_request_never_finds_its_whole_prompt_and_a_partial_page_is_not_cached():
    """The lookup stops one token short of the prompt (SGLang computes the last token's
    logits), in whole pages: identical 16-token prompts with pages of 4 find 12 tokens."""
    requests = [Request(i, 16, 1, 2 * i, prefix_id="same", prefix_tokens=16) for i in range(2)]
    result = _run(_sim(_tokens(4, 400), requests, caching=True))
    assert result.cached_tokens == 12


def test_idle_cached_pages_count_as_free_and_are_evicted_least_recently_used_first():
    """A (prefix a) then B (prefix b), 40 + 5 tokens each, run and finish: 2 x 44 tokens stay
    cached, idle (the pool counts them free). C (100 + 5) needs 100 pages of the 72 free: the
    least recently used leaves go, A's output then A's prompt (44 >= 28). E (prefix b) then finds
    B's prefix less its last token (39), and D (prefix a) nothing."""
    a = dict(prefix_id="a", prefix_tokens=40)
    b = dict(prefix_id="b", prefix_tokens=40)
    requests = [
        Request(0, 40, 5, 0, **a),
        Request(1, 40, 5, 10, **b),
        Request(2, 100, 5, 20),
        Request(3, 40, 1, 30, **b),
        Request(4, 40, 1, 31, **a),
    ]
    sim = _sim(_tokens(1, 160), requests, caching=True)
    while sim.steps < 20:
        sim.step()
        _check_invariants(sim)
    assert sim.tree.size == sim.tree.evictable == 2 * 44
    assert sim.result().pool_usage[19] == 0.0
    sim.step()
    _check_invariants(sim)
    assert ("p", "a", 0) not in sim.tree.root.children and ("p", "b", 0) in sim.tree.root.children
    assert sim.tree.size == 44 + 100
    result = _run(sim)
    assert result.cached_tokens == 39
    assert result.prefix_hit_rate == pytest.approx(39 / (40 + 40 + 100 + 40 + 40))  # of the prompts looked up


# -- sliding pools -----------------------------------------------------------------------------


def test_a_sliding_pool_frees_out_of_window_slots_every_128_tokens():
    """gpt-oss-like: full and sliding layers in pools of their own (pages of 1, window 64). A
    decoding request frees its sliding slots once 128 tokens slid out of the window, keeping the
    window."""
    specs = mix((1, full(block_size=1)), (1, sliding(64, block_size=1)))
    plan = _plan(specs, 4096, policy="kind_pools", memory=2**28)
    pools = sglang_pools(plan)
    assert pools.window == 64 and pools.swa_tokens > 0
    sim = _sim(plan, [Request(0, 10, 400, 0)])
    held = []
    while not sim.done:
        sim.step()
        _check_invariants(sim)
        held.append(sim.swa_pages - sim.swa_free)
    # after the prefill (10) and k decodes it holds 10 + k, until 64 + 128 tokens fall behind
    assert held[:3] == [10, 11, 12]
    assert max(held) == 64 + 128  # at 192 tokens it frees the first 128, keeping 64
    assert held[-1] == 0


def test_sglangs_own_pools_can_replace_the_plans():
    """``SglangProfile(pools=...)`` replays SGLang's own sizing on a plan's context: the same run
    as a plan whose pool holds those tokens."""
    requests = [Request(0, 10, 100, 0), Request(1, 10, 100, 1), Request(2, 10, 100, 2)]
    workload = Workload(tuple(requests), name="hand")
    big = _plan({"model.layers.0": full(block_size=1)}, 200, num_blocks=5000)
    given = SglangProfile(pools=SglangPools(page_size=1, full_tokens=200), overlap_schedule=False)
    ours = simulate(big, workload, scheduler=given, registry=REGISTRY)
    same = simulate(_tokens(1, 200), workload, scheduler=given, registry=REGISTRY)
    assert dict(ours.scheduler_settings)["full_tokens"] == 200
    assert ours.preemptions == same.preemptions == 1
    assert (ours.steps, ours.total_tokens, ours.running) == (same.steps, same.total_tokens, same.running)
    with pytest.raises(InvalidInputError, match="both tokens and a window"):
        SglangPools(page_size=16, full_tokens=1024, swa_tokens=512)


def test_plans_sglang_cannot_run_are_refused_with_the_fix():
    specs = mix((1, full(block_size=16)), (1, sliding(64, block_size=16)))
    shared = _plan(specs, 4096, policy="shared_buffer", memory=2**28)
    with pytest.raises(InvalidInputError, match=r"share a block pool.*kind_pools"):
        simulate(shared, Workload((Request(0, 10, 2),), name="x"), scheduler="sglang", registry=REGISTRY)


def test_a_request_that_never_fits_is_refused():
    with pytest.raises(InvalidInputError, match="cannot be admitted even with the pool to itself"):
        simulate(
            _tokens(1, 100), Workload((Request(0, 60, 40),), name="x"), scheduler="sglang", registry=REGISTRY
        )


# -- invariants ------------------------------------------------------------------------------


def _check_invariants(sim: SglangSimulator) -> None:
    """Every page is free, cached or held by exactly one request; the tree's counts and locks
    agree with its nodes and holders."""
    page = sim.page
    holders = [r for r, status in enumerate(sim._status) if sim._committed[r] or sim._node[r] is not None]
    private = sum(-(-sim._committed[r] // page) - sim._protected[r] // page for r in holders)
    assert sim.full_free + sim.tree.size // page + private == sim.full_pages
    assert 0 <= sim.full_free <= sim.full_pages
    assert sim.mamba_free + sum(sim._slot) == sim.mamba_slots  # a slot is free or held by one request
    assert all(sim._status[r] != 0 for r, held in enumerate(sim._slot) if held)  # never a waiting one
    if sim.swa_pages:
        swa = sum(-(-sim._committed[r] // page) - sim._swa_lo[r] // page for r in holders)
        assert sim.swa_free + swa == sim.swa_pages
    nodes: list[Node] = []
    stack = [sim.tree.root]
    while stack:
        node = stack.pop()
        nodes.extend(node.children.values())
        stack.extend(node.children.values())
    on_device = [n for n in nodes if not n.evicted]
    assert sum(n.size for n in on_device) == sim.tree.size
    assert sum(n.size for n in on_device if n.lock_ref == 0) == sim.tree.evictable
    if isinstance(sim.tree, HiRadixTree):  # HiCache: evicted nodes are on the host, below it
        assert sum(n.size for n in nodes if n.backed) == sim.tree.host_used <= sim.tree.host_tokens
        for n in nodes:
            assert not n.evicted or (n.backed and n.lock_ref == 0)
            assert not n.evicted or all(c.evicted for c in n.children.values())
            assert not n.backed or n.parent is sim.tree.root or n.parent.backed
    else:
        assert not any(n.evicted or n.backed for n in nodes)
    held: dict[int, int] = {}
    for r in holders:
        node = sim._node[r]
        while node is not None and node is not sim.tree.root:
            held[id(node)] = held.get(id(node), 0) + 1
            node = node.parent
    for node in nodes:
        assert node.size > 0 and node.size % page == 0
        assert node.lock_ref == held.get(id(node), 0)
    for r in sim.running:
        assert sim._committed[r] == sim._prompt[r] + sim._outputs[r] - 1


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    page=st.sampled_from([1, 4, 16]),
    caching=st.booleans(),
    window=st.sampled_from([0, 48]),
    tokens=st.integers(600, 3000),
    chunk=st.sampled_from([64, 256]),
    overlap=st.booleans(),
    host=st.sampled_from([0, 48, 400]),
)
def test_the_pools_and_the_tree_stay_consistent_and_every_token_is_accounted_for(
    seed, page, caching, window, tokens, chunk, overlap, host
):
    if window:
        specs = mix((1, full(block_size=page)), (1, sliding(window, block_size=page)))
        plan = _plan(specs, 512, policy="kind_pools", memory=tokens * 2 * 2 * 8 * 128 * 2, step=chunk)
    else:
        plan = _plan({"model.layers.0": full(block_size=page)}, 512, num_blocks=tokens // page, step=chunk)
    if host and caching and not window:  # HiCache: a host pool of ``host`` tokens' pages
        plan = with_host_memory(plan, -(-host // page) * page * plan.pools[0].bytes_per_block)
    workload = random_workload(seed, 30, "uniform:16:300", "uniform:1:300", prefix_share=0.6)
    sim = SglangProfile(max_running_requests=32, overlap_schedule=overlap).simulator(
        plan, workload, max_num_batched_tokens=None, prefix_caching=caching
    )
    result = _run(sim)
    requests = workload.requests
    assert result.total_tokens == (
        sum(r.prompt_tokens + r.output_tokens - 1 for r in requests)
        + result.recomputed_tokens
        - result.cached_tokens
    )
    assert result.peak_running <= 32
    assert len(result.running) == result.steps == len(result.pool_usage)
    assert all(0.0 <= u <= 1.0 for u in result.pool_usage)
    if not caching:
        assert result.cached_tokens == 0 and sim.tree.size == 0
    if result.host_tier is not None:
        tier = result.host_tier
        assert tier.device_hit_tokens + tier.host_hit_tokens == result.cached_tokens
        assert tier.restored_blocks * page == tier.host_hit_tokens * plan.groups[0].blocks_per_page


# -- the Mamba pool --------------------------------------------------------------------------


def _state(page=16):
    """A small Mamba layer's state."""
    parts = (
        StatePart(name="conv", shape=(3, 8), dtype="float32"),
        StatePart(name="ssm", shape=(8, 4), dtype="bfloat16"),
    )
    return StateSpec(block_size=page, parts=parts)


def test_a_mamba_hybrids_state_slots_bound_the_running_requests():
    """Each running request holds one of the Mamba pool's slots (``HybridReqToTokenPool``), and
    SGLang caps running requests at the slots (``resolve_max_num_reqs``): with 3 slots and room
    for 40 requests' tokens, at most 3 run, the others wait, none is retracted."""
    plan = _plan(mix((1, full(block_size=16)), (3, _state())), 1024, policy="kind_pools", memory=2**30)
    pools = sglang_pools(plan)
    assert pools.mamba_slots > 3 and pools.full_tokens > 40 * 200
    few = SglangPools(page_size=16, full_tokens=pools.full_tokens, mamba_slots=3)
    requests = [Request(i, 100, 50, 0) for i in range(12)]
    sim = _sim(plan, requests, pools=few)
    result = _run(sim)
    assert result.peak_running == 3 and result.preemptions == 0
    assert dict(result.scheduler_settings)["mamba_slots"] == 3
    assert dict(result.scheduler_settings)["max_running_requests"] == 3
    assert max(result.pool_usage) == 1.0  # every slot held: the Mamba pool is the fuller one
    assert sim.finished == 12
    # the plan's own Mamba pool: as many slots as its state pool has pages
    state_group = next(g for g in plan.groups if g.spec.tokens_per_page is None)
    assert pools.mamba_slots == plan.usable_blocks_in(state_group.pool) // state_group.blocks_per_page
    roomy = _run(_sim(plan, requests))
    assert roomy.peak_running == 12


def test_mamba_slots_free_when_a_request_finishes_or_is_retracted():
    """A slot comes back when its request leaves (finished, or retracted and re-admitted later):
    the slots never leak and every request finishes, with the overlap scheduler too."""
    plan = _plan(mix((1, full(block_size=4)), (2, _state(4))), 512, policy="kind_pools", memory=2**30)
    tight = SglangPools(page_size=4, full_tokens=800, mamba_slots=5)
    workload = random_workload(7, 40, "uniform:16:100", "uniform:50:300", prefix_share=0.0)
    retracted = 0
    for overlap in (False, True):
        sim = SglangProfile(pools=tight, overlap_schedule=overlap).simulator(
            plan, workload, max_num_batched_tokens=None, prefix_caching=False
        )
        result = _run(sim)
        assert sim.finished == 40 and result.peak_running <= 5
        sim._process_results()  # overlap: the last step's releases
        assert sim.mamba_free == 5 and not any(sim._slot)
        retracted += result.preemptions
    assert retracted > 0  # the full pool was tight enough to retract


def test_prefix_caching_on_a_mamba_hybrid_is_refused_by_name():
    plan = _plan(mix((1, full(block_size=16)), (3, _state())), 1024, policy="kind_pools", memory=2**30)
    refused = r"MambaRadixCache.*without prefix caching \(prefix_caching=False"
    with pytest.raises(InvalidInputError, match=refused):
        _sim(plan, [Request(0, 10, 2)], caching=True)
    with pytest.raises(InvalidInputError, match="state and sliding-window groups"):
        sglang_pools(
            _plan(
                mix((1, full(block_size=16)), (1, sliding(64, block_size=16)), (2, _state())),
                1024,
                policy="kind_pools",
                memory=2**30,
            )
        )


# -- HiCache ---------------------------------------------------------------------------------


def _hicache_case(host_tokens):
    """The eviction case above (A, B, then C evicts A's 44 tokens), with a host tier of
    ``host_tokens`` tokens (one layer: a token is a block)."""
    a = dict(prefix_id="a", prefix_tokens=40)
    b = dict(prefix_id="b", prefix_tokens=40)
    requests = [
        Request(0, 40, 5, 0, **a),
        Request(1, 40, 5, 10, **b),
        Request(2, 100, 5, 20),
        Request(3, 40, 1, 30, **b),
        Request(4, 40, 1, 31, **a),
    ]
    plan = _tokens(1, 160)
    if host_tokens:
        plan = with_host_memory(plan, host_tokens * plan.pools[0].bytes_per_block)
    return _sim(plan, requests, caching=True)


def test_hicache_brings_an_evicted_prefix_back_from_the_host():
    """With a host tier (SGLang's HiCache, write-through), the nodes C evicts stay in the tree
    on the host: D (prefix a) finds A's 39 tokens there and loads them back instead of
    computing them; without the tier it finds nothing."""
    without = _run(_hicache_case(0))
    sim = _hicache_case(1000)
    with_host = _run(sim)
    assert isinstance(sim.tree, HiRadixTree)
    assert without.cached_tokens == 39 and without.host_tier is None
    assert with_host.cached_tokens == 39 + 39
    assert with_host.total_tokens == without.total_tokens - 39  # D computed 1 token, not 40
    tier = with_host.host_tier
    assert tier is not None and tier.enabled
    assert (tier.host_hits, tier.host_hit_tokens, tier.device_hit_tokens) == (1, 39, 39)
    assert tier.restored_blocks == 39 and tier.host_blocks == 1000
    # write-through: every node the tree took was copied once (A, B: 44 each, C: 104; D's and
    # E's prompts were all in the tree already)
    assert tier.offloaded_blocks == 44 + 44 + 104 and tier.host_evictions == 0


def test_hicache_drops_host_copies_least_recently_used_first_when_the_host_is_full():
    """A host of 50 tokens holds A's copy (44); B's finds no room (nothing is evicted yet, so
    nothing can leave the host) and stays on the device only. When C's 104 tokens are written,
    the host drops its evicted leaves, A's output then A's prompt (``evict_host``), and C's
    copy still does not fit: D (prefix a) finds nothing anywhere. A host of 200 keeps A's."""
    small = _run(_hicache_case(50)).host_tier
    assert small is not None
    assert small.host_evictions == 2 and small.host_hits == 0 and small.held_blocks <= 50
    roomy = _run(_hicache_case(200)).host_tier
    assert roomy is not None and roomy.host_hit_tokens == 39


def test_a_host_tier_beside_a_sliding_pool_is_refused_by_name():
    specs = mix((1, full(block_size=16)), (1, sliding(64, block_size=16)))
    plan = with_host_memory(_plan(specs, 4096, policy="kind_pools", memory=2**28), 2**26)
    with pytest.raises(InvalidInputError, match=r"host tier beside a sliding pool.*HiCache"):
        _sim(plan, [Request(0, 10, 2)], caching=True)
    # the default (vllm) profile's CPU tier is one full-attention group's: it refuses this plan too
    with pytest.raises(InvalidInputError, match="block pools; vLLM's native CPU offloading"):
        simulate(plan, Workload((Request(0, 10, 2),), name="x"), prefix_caching=True, registry=REGISTRY)
