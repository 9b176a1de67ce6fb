"""The simulator with prefix caching: shared prefixes in traces and synthetic workloads, hits
counted, the figures unchanged without shared prefixes, and the pool's sharing invariants at
every step."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, strategies as st

from kvcore import (
    InvalidInputError,
    Request,
    SizingContext,
    Workload,
    model_layer_specs,
    plan_kv_cache,
    read_trace,
    simulate as _simulate,
    synthetic,
)
from kvcore.runtime.block_pool import NULL_PAGE
from kvcore.simulation.simulator import Simulator
from kvcore.simulation.workload import parse_length
from tests.simulation.test_simulator import ONE_LAYER, PLANS, REGISTRY, _plan


def simulate(*args, **kwargs):
    """These tests state the ``kvcore`` scheduler profile's rules (the default is ``vllm``)."""
    return _simulate(*args, scheduler="kvcore", **kwargs)


def _served(workload):
    return sum(r.prompt_tokens + r.output_tokens - 1 for r in workload.requests)


def test_requests_after_the_first_find_its_prefix_cached():
    plan = _plan(ONE_LAYER, 512, num_blocks=200)
    first = Request(0, 300, 4, 0, prefix_id="system", prefix_tokens=260)
    others = tuple(Request(i, 300, 4, 5, prefix_id="system", prefix_tokens=260) for i in range(1, 10))
    workload = Workload((first, *others), name="shared")
    off = simulate(plan, workload)
    on = simulate(plan, workload, prefix_caching=True)
    assert not off.prefix_caching and off.cached_tokens == 0
    assert on.prefix_caching and on.cached_tokens == 9 * 256  # 16 full blocks of the 260 shared tokens
    assert on.prefix_hit_rate == pytest.approx(9 * 256 / (10 * 300))
    assert on.total_tokens == off.total_tokens - 9 * 256
    assert on.total_tokens - on.recomputed_tokens + on.cached_tokens == _served(workload)


requests_strategy = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 150), st.integers(0, 40), st.sampled_from([None, 0, 1])),
    min_size=1,
    max_size=14,
)


def _workload(shapes, prefix=200):
    return Workload(
        tuple(
            Request(i, p, o, a, prefix_id=k, prefix_tokens=0 if k is None else min(prefix, p))
            for i, (p, o, a, k) in enumerate(shapes)
        ),
        name="random",
    )


@given(name=st.sampled_from(sorted(PLANS)), shapes=requests_strategy, budget=st.sampled_from([7, 64, 4096]))
def test_without_shared_prefixes_prefix_caching_changes_no_figure(name, shapes, budget):
    workload = _workload([(p, o, a, None) for p, o, a, _ in shapes])
    off = simulate(PLANS[name], workload, max_num_batched_tokens=budget)
    on = simulate(PLANS[name], workload, max_num_batched_tokens=budget, prefix_caching=True)
    assert on.cached_tokens == 0
    assert (on.steps, on.running, on.total_tokens, on.preemptions) == (
        off.steps,
        off.running,
        off.total_tokens,
        off.preemptions,
    )


def _checkpoint_plans():
    """Jamba's layers with states kept for prefix caching, pools of three requests."""
    jamba = model_layer_specs("ai21labs/AI21-Jamba-1.5-Mini", REGISTRY)
    for mode in ("align", "all"):
        context = SizingContext(max_model_len=512, max_num_batched_tokens=64, state_cache_mode=mode)
        sized = plan_kv_cache(jamba, 2**36, context, registry=REGISTRY)
        blocks = 3 * sized.blocks_per_request()
        yield f"jamba {mode}", plan_kv_cache(jamba, 2**36, context, registry=REGISTRY, num_blocks=blocks)


CACHING_PLANS = {**PLANS, **dict(_checkpoint_plans())}


@given(
    name=st.sampled_from(sorted(CACHING_PLANS)),
    shapes=requests_strategy,
    budget=st.sampled_from([5, 64, 4096]),
)
def test_shared_blocks_are_counted_and_every_token_is_served_once(name, shapes, budget):
    workload = _workload(shapes)
    simulator = Simulator(CACHING_PLANS[name], workload, max_num_batched_tokens=budget, prefix_caching=True)
    pool = simulator.pool
    while not simulator.done:
        simulator.step()
        held: Counter[int] = Counter()
        for request in pool.requests:
            for group in range(len(pool.groups)):
                for page in pool.block_table(request, group):
                    if page != NULL_PAGE:
                        for block in pool.blocks_of(group, page):
                            held[block] += 1
        for block, count in held.items():
            assert count == 1 or pool.is_cached(block)
            assert not pool.prefix_caching or pool.ref_count(block) == count
        assert pool.num_free_blocks + len(held) == pool.num_usable_blocks
    assert pool.num_free_blocks == pool.num_usable_blocks and not pool.requests
    result = simulator.result()
    assert result.total_tokens - result.recomputed_tokens + result.cached_tokens == _served(workload)
    if not pool.prefix_caching:  # a plan with a state group caches nothing, and says so
        assert result.cached_tokens == 0 and "not cached" in pool.prefix_cache_stats.reason


# -- shared prefixes in workloads ----------------------------------------------------------------


def test_a_trace_names_shared_prefixes(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"prompt_tokens": 900, "output_tokens": 64, "prefix_id": "system-a", "prefix_tokens": 600}\n'
        '{"prompt_tokens": 700, "output_tokens": 8, "prefix_id": 3, "prefix_tokens": 700}\n'
        '{"prompt_tokens": 10, "output_tokens": 8}\n'
    )
    requests = read_trace(path).requests
    assert [(r.prefix_id, r.prefix_tokens) for r in requests] == [("system-a", 600), (3, 700), (None, 0)]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"prompt_tokens": 9, "output_tokens": 1, "prefix_id": "a"}', "missing 'prefix_tokens'"),
        ('{"prompt_tokens": 9, "output_tokens": 1, "prefix_tokens": 4}', "missing 'prefix_id'"),
        (
            '{"prompt_tokens": 9, "output_tokens": 1, "prefix_id": "a", "prefix_tokens": 10}',
            "prefix_tokens (10) is more than its prompt (9 tokens)",
        ),
        (
            '{"prompt_tokens": 9, "output_tokens": 1, "prefix_id": [1], "prefix_tokens": 4}',
            "'prefix_id' must be",
        ),
        ('{"prompt_tokens": 9, "output_tokens": 1, "prefix_id": "a", "prefix_tokens": -1}', "prefix_tokens"),
    ],
)
def test_bad_prefixes_name_the_line(tmp_path, line, says):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt_tokens": 9, "output_tokens": 1}\n' + line + "\n")
    with pytest.raises(InvalidInputError) as info:
        read_trace(path)
    assert str(info.value).startswith(f"{path}:2: ") and says in str(info.value)


def test_a_synthetic_workload_can_share_a_prefix():
    lengths = parse_length("uniform:10:100"), parse_length("20")
    plain = synthetic(400, *lengths, seed=3, max_model_len=1000)
    shared = synthetic(400, *lengths, seed=3, max_model_len=1000, prefix_share=0.5, prefix_tokens=300)
    with_prefix = [r for r in shared.requests if r.prefix_id is not None]
    assert 150 < len(with_prefix) < 250 and all(r.prefix_tokens == 300 for r in with_prefix)
    for before, after in zip(plain.requests, shared.requests, strict=True):
        extra = 300 if after.prefix_id is not None else 0
        assert (
            after.prompt_tokens == before.prompt_tokens + extra
            and after.output_tokens == before.output_tokens
        )
    assert "0.5 share a 300-token prefix" in shared.name
    with pytest.raises(InvalidInputError, match="prefix_share"):
        synthetic(4, *lengths, max_model_len=1000, prefix_share=1.5, prefix_tokens=3)
    with pytest.raises(InvalidInputError, match="prefix_tokens"):
        synthetic(4, *lengths, max_model_len=1000, prefix_share=0.5, prefix_tokens=999)


# -- hybrids: state checkpoints and sliding windows ----------------------------------------------


def _model_plan(model, mode, memory=2**33):
    context = SizingContext(max_model_len=8192, max_num_batched_tokens=2048, state_cache_mode=mode)
    return plan_kv_cache(model_layer_specs(model, REGISTRY), memory, context, registry=REGISTRY)


def test_on_the_shared_prompt_trace_state_and_sliding_groups_hit():
    trace = read_trace("examples/traces/chat-system-prompts.jsonl")
    jamba = simulate(_model_plan("ai21labs/AI21-Jamba-1.5-Mini", "align"), trace, prefix_caching=True)
    gemma = simulate(_model_plan("google/gemma-3-27b-it", None), trace, prefix_caching=True)
    for result, kinds in (
        (jamba, {"state", "full_attention"}),
        (gemma, {"sliding_window", "full_attention"}),
    ):
        by_kind = {k.kind: k for k in result.prefix_hits_by_kind}
        assert set(by_kind) == kinds and result.cached_tokens > 0
        hits = {k.hits for k in by_kind.values()}
        assert len(hits) == 1 and hits.pop() > 0  # every kind took part in every hit
    assert {k.kind: k.hits for k in jamba.prefix_hits_by_kind}["state"] == {
        k.kind: k.pages for k in jamba.prefix_hits_by_kind
    }["state"]  # one checkpoint per hit


def test_align_stops_a_prefill_chunk_at_its_shared_prefix_so_the_next_request_finds_the_state():
    plan = _model_plan("ai21labs/AI21-Jamba-1.5-Mini", "align")
    first = Request(0, 150, 2, 0, prefix_id="system", prefix_tokens=100)
    second = Request(1, 150, 2, 5, prefix_id="system", prefix_tokens=100)
    result = simulate(plan, Workload((first, second), name="two"), prefix_caching=True)
    step = 100 // 16 * 16  # the attention and state blocks are 16 tokens
    assert result.cached_tokens == step  # the first request's prompt went in two chunks: 96, then 54
    assert result.total_tokens == 150 + 1 + 150 - step + 1
    # all: every block boundary keeps a state, so no chunk is cut; the plan's attention block is
    # 128 tokens there (a state per 16 tokens costs pages), and hits come in 128s
    longer = [Request(i, 400, 2, 5 * i, prefix_id="system", prefix_tokens=300) for i in range(2)]
    all_mode = simulate(
        _model_plan("ai21labs/AI21-Jamba-1.5-Mini", "all"),
        Workload(tuple(longer), name="two"),
        prefix_caching=True,
    )
    assert all_mode.cached_tokens == 256 and all_mode.total_tokens == 400 + 1 + 400 - 256 + 1


def test_a_state_without_checkpoints_caches_nothing():
    plan = _model_plan("ai21labs/AI21-Jamba-1.5-Mini", "none")
    first = Request(0, 150, 2, 0, prefix_id="system", prefix_tokens=100)
    second = Request(1, 150, 2, 5, prefix_id="system", prefix_tokens=100)
    result = simulate(plan, Workload((first, second), name="two"), prefix_caching=True)
    assert not result.prefix_caching and result.cached_tokens == 0 and result.prefix_hits_by_kind == ()
