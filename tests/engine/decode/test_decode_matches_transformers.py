"""Real transformers models decode on kvcore's caches and give transformers' own tokens and logits.

Four requests of different prompt lengths decode together, interleaved step by step (prompt
chunks beside other requests' decode tokens), on caches kvcore planned, allocated and bound;
each request's tokens must equal greedy ``generate()`` of the same model exactly and its logits
agree within 1e-4. Then the same with a pool too small to hold all four at once.
"""

from __future__ import annotations

import itertools

import pytest

from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.testing.reference import decode_greedy
from tests.engine.decode._tiny import (
    MODELS,
    block_holders,
    kvcore_runner,
    mismatches,
    shared_groups,
    tight_num_blocks,
)

pytest.importorskip("transformers")


def _forgetting_groups(plan):
    keeping = (FullAttentionSpec, CrossAttentionSpec)
    return {index for index, group in enumerate(plan.groups) if not isinstance(group.spec, keeping)}


@pytest.mark.parametrize("name", list(MODELS))
def test_concurrent_requests_decode_exactly_like_transformers(subjects, registry, name):
    subject = subjects(name)
    runner = kvcore_runner(subject.model, registry)
    plan = runner.plan
    assert plan.policy == subject.tiny.policy

    generations = decode_greedy(runner, subject.requests)

    assert mismatches(generations, subject.reference) == []
    assert {g.admitted_step for g in generations.values()} == {0}, "a roomy pool runs everyone at once"
    assert max(g.finished_step for g in generations.values()) == runner.num_steps - 1
    assert runner.pool.num_free_blocks == plan.num_blocks, "finished requests give every block back"
    stale = {event.group for event in runner.events if event.action == "stale"}
    assert stale == _forgetting_groups(plan), "exactly the sliding / chunked groups free pages mid-request"
    assert bool(stale) == subject.tiny.forgets
    taken: dict[str, list[int]] = {}
    for event in runner.events:
        if event.action == "take":
            taken.setdefault(event.request_id, []).append(event.page)
    assert any(any(b != a + 1 for a, b in itertools.pairwise(p)) for p in taken.values()), (
        "pages of different requests interleave in the pool"
    )


@pytest.mark.parametrize("name", [n for n, tiny in MODELS.items() if tiny.policy == "shared_buffer"])
def test_hybrid_models_get_a_shared_buffer_whose_bytes_groups_share(subjects, registry, name):
    model = subjects(name).model
    runner = kvcore_runner(model, registry)
    plan = runner.plan
    assert plan.policy == "shared_buffer" and plan.single_buffer
    assert len(plan.groups) > 1
    assert any(len(groups) > 1 for groups in shared_groups(plan)), "layers of several groups view one tensor"
    modules = dict(model.named_modules())
    storages = set()
    for name in plan.layer_names:
        pages = runner.layer_of(modules[name]).pages
        storages |= {pages.keys.untyped_storage().data_ptr(), pages.values.untyped_storage().data_ptr()}
        assert pages.keys.stride(0) * pages.keys.element_size() == plan.bytes_per_block  # a page step = a row
    assert len(storages) == 1, "every layer reads and writes the one buffer allocate() made"


@pytest.mark.parametrize("name", list(MODELS))
def test_a_pool_too_small_for_everyone_frees_and_reuses_blocks(subjects, registry, name):
    subject = subjects(name)
    num_blocks = tight_num_blocks(kvcore_runner(subject.model, registry), subject.requests)
    runner = kvcore_runner(subject.model, registry, num_blocks=num_blocks)
    assert runner.plan.num_blocks == num_blocks

    generations = decode_greedy(runner, subject.requests)

    assert mismatches(generations, subject.reference) == []
    assert any(g.admitted_step > 0 for g in generations.values()), "some request waited for blocks"
    holders = block_holders(runner)
    assert max(holders) < num_blocks
    assert any(len({request for request, _ in h}) > 1 for h in holders.values()), (
        "a block id a finished (or windowed-out) request gave back served another request"
    )
    stale = [event for event in runner.events if event.action == "stale"]
    assert bool(stale) == subject.tiny.forgets
    if runner.plan.policy == "shared_buffer":
        assert any(len({group for _, group in h}) > 1 for h in holders.values()), (
            "a block id served two groups: one group's layers rewrote bytes another group had used"
        )
