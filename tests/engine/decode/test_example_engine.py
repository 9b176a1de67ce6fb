"""The example engine (examples/engine/engine.py) gives transformers' own greedy tokens.

Tiny Llama, Gemma-3 and gpt-oss models (the session's fixtures) decode four concurrent requests
through the engine: with a roomy pool, with a pool so small that requests are preempted and
recomputed, with other policies, with rejected tokens rolled back mid-decode, and with prefix
caching over a shared system prompt. Every token must equal ``generate()``'s; every block comes
back; ``close()`` releases the caches.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import attrs
import pytest
import torch

from kvcore.testing.reference import DecodeRequest
from tests.engine.decode._tiny import BLOCK_SIZE, CONTEXT, reference_generate

pytest.importorskip("transformers")

ENGINE = Path(__file__).parents[3] / "examples" / "engine" / "engine.py"
MODELS = ("llama", "gemma3", "gpt_oss")


@pytest.fixture(scope="module")
def engine_module():
    spec = importlib.util.spec_from_file_location("kvcore_example_engine", ENGINE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _engine(engine_module, subject, **kwargs):
    return engine_module.Engine(
        subject.model,
        max_model_len=CONTEXT.max_model_len,
        max_num_batched_tokens=CONTEXT.max_num_batched_tokens,
        block_size=BLOCK_SIZE,
        kv_cache_bytes=1 << 21,
        **kwargs,
    )


def _add(engine, subject):
    for request in subject.requests:
        engine.add_request(request.request_id, request.prompt, request.max_new_tokens)


def _expected(subject):
    return {rid: list(ref.tokens) for rid, ref in subject.reference.items()}


def _finish(engine):
    pool = engine.pool
    assert pool.num_free_blocks == pool.num_usable_blocks and pool.requests == ()
    assert engine.close() == engine.plan.kv_cache_bytes


@pytest.mark.parametrize("name", MODELS)
def test_the_engine_decodes_exactly_like_generate(subjects, engine_module, name):
    subject = subjects(name)
    engine = _engine(engine_module, subject)
    assert engine.plan.policy == subject.tiny.policy
    _add(engine, subject)
    assert engine.generate() == _expected(subject)
    assert engine.num_preemptions == 0
    _finish(engine)


@pytest.mark.parametrize("name", MODELS)
def test_a_small_pool_preempts_and_recomputes_with_the_same_tokens(subjects, engine_module, name):
    subject = subjects(name)
    probe = _engine(engine_module, subject)
    worst = max(
        sum(
            probe.pool.blocks_needed(g, len(r.prompt) + r.max_new_tokens)
            for g in range(len(probe.plan.groups))
        )
        for r in subject.requests
    )
    least = max(worst, probe.plan.blocks_per_request()) + 1  # one request of max_model_len must fit
    probe.close()
    engine = _engine(engine_module, subject, num_blocks=least)
    _add(engine, subject)
    assert engine.generate() == _expected(subject)
    assert engine.num_preemptions > 0, "the pool holds one request at its longest, not four"
    _finish(engine)


@pytest.mark.parametrize(("name", "policy"), [("gemma3", "equal_groups"), ("gpt_oss", "equal_groups")])
def test_other_policies_give_the_same_tokens(subjects, engine_module, name, policy):
    subject = subjects(name)
    engine = _engine(engine_module, subject, policy=policy)
    assert engine.plan.policy == policy
    _add(engine, subject)
    assert engine.generate() == _expected(subject)
    _finish(engine)


@pytest.mark.parametrize("name", MODELS)
def test_rolled_back_tokens_are_decoded_again_the_same(subjects, engine_module, name):
    subject = subjects(name)
    engine = _engine(engine_module, subject)
    _add(engine, subject)
    rolled = set()
    while engine.waiting or engine.running:
        engine.step()
        for request in list(engine.running):
            if request.request_id not in rolled and len(request.output) >= 6:
                engine.rollback(request.request_id, 3)  # as if 3 speculative tokens were rejected
                assert len(request.output) == 3 and request.num_computed <= len(request.tokens) - 1
                rolled.add(request.request_id)
    assert rolled == {r.request_id for r in subject.requests}
    assert {rid: r.output for rid, r in engine.finished.items()} == _expected(subject)
    _finish(engine)


def test_the_check_can_fail_an_engine_that_mixes_up_k_and_v_is_caught(subjects, engine_module):
    subject = subjects("gemma3")

    class Broken(engine_module.Engine):
        def attend(self, call, step):
            return super().attend(attrs.evolve(call, key=call.value, value=call.key), step)  # K and V swapped

    engine = Broken(
        subject.model,
        max_model_len=CONTEXT.max_model_len,
        max_num_batched_tokens=CONTEXT.max_num_batched_tokens,
        block_size=BLOCK_SIZE,
        kv_cache_bytes=1 << 21,
    )
    _add(engine, subject)
    got = engine.generate()
    engine.close()
    assert all(got[rid] != tokens for rid, tokens in _expected(subject).items())


def _shared_prompt_requests(vocab_size: int) -> list[DecodeRequest]:
    """Four requests whose prompts start with one 24-token system prompt (6 blocks of 4)."""
    generator = torch.Generator().manual_seed(77)
    system = torch.randint(3, vocab_size, (24,), generator=generator).tolist()
    return [
        DecodeRequest(
            request_id=f"s{i}",
            prompt=system + torch.randint(3, vocab_size, (extra,), generator=generator).tolist(),
            max_new_tokens=12,
        )
        for i, extra in enumerate((5, 9, 3, 14))
    ]


@pytest.mark.slow  # every model, twice, through a shared system prompt (~5 s)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("rollback", [False, True])
def test_prefix_caching_over_a_shared_system_prompt_gives_the_same_tokens(
    subjects, engine_module, name, rollback
):
    subject = subjects(name)
    asked = _shared_prompt_requests(subject.model.config.vocab_size)
    expected = {r.request_id: list(reference_generate(subject.model, r).tokens) for r in asked}
    engine = _engine(engine_module, subject, prefix_caching=True)
    first, *rest = asked
    engine.add_request(first.request_id, list(first.prompt), first.max_new_tokens)
    while engine.running or engine.waiting:  # the first request computes (and caches) the prefix
        engine.step()
    for request in rest:
        engine.add_request(request.request_id, list(request.prompt), request.max_new_tokens)
    rolled = set()
    while engine.waiting or engine.running:
        engine.step()
        for request in list(engine.running):
            if rollback and request.request_id not in rolled and len(request.output) >= 6:
                engine.rollback(request.request_id, 2)
                rolled.add(request.request_id)
    stats = engine.pool.prefix_cache_stats
    assert stats.enabled and stats.hits == 3 and stats.hit_tokens >= 3 * 20
    assert not rollback or rolled
    assert {rid: r.output for rid, r in engine.finished.items()} == expected
    _finish(engine)
