"""Hybrid models decode on a plan of several block pools (``kind_pools``: one pool and one
mixed-page group per retention kind) and give transformers' own tokens and logits, with a roomy
pool and with pools too small to hold every request at once; a corrupted live page breaks the
match, so the passing tests prove something.

None of the tiny models has layers of different head counts (the case a mixed-page group
exists for); mixed-page groups of several head counts are decoded-free but checked to the
byte by tests/runtime/test_multi_pool.py.
"""

from __future__ import annotations

import pytest

from kvcore import plan_kv_cache
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.testing.reference import decode_greedy
from tests.engine.decode._tiny import CONTEXT, ROOMY_BYTES, kvcore_runner, mismatches
from tests.engine.decode.test_the_check_can_fail import CorruptingRunner

pytest.importorskip("transformers")

HYBRIDS = ["gemma3", "gpt_oss"]


def _specs(model, plan):
    """The plan's layer specs, in model order."""
    planned = {name: group.spec_of(name) for group in plan.groups for name in group.layer_names}
    return {name: planned[name] for name, _ in model.named_modules() if name in planned}


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_plan_of_several_pools_decodes_exactly_like_transformers(subjects, registry, name):
    subject = subjects(name)
    runner = kvcore_runner(subject.model, registry, policy="kind_pools")
    plan = runner.plan
    assert plan.policy == "kind_pools" and len(plan.pools) == 2 == len(plan.groups)

    generations = decode_greedy(runner, subject.requests)

    assert mismatches(generations, subject.reference) == []
    assert {g.admitted_step for g in generations.values()} == {0}
    pool = runner.pool
    assert [pool.num_free_blocks_in(p) for p in (0, 1)] == [pool.num_usable_blocks_in(p) for p in (0, 1)]
    taken = {(event.group, event.page) for event in runner.events if event.action == "take"}
    assert {page for group, page in taken if group == 0} & {page for group, page in taken if group == 1}, (
        "the same block ids served both pools at once"
    )


@pytest.mark.parametrize("name", HYBRIDS)
def test_pools_too_small_for_everyone_free_and_reuse_blocks(subjects, registry, name):
    subject = subjects(name)
    roomy = kvcore_runner(subject.model, registry, policy="kind_pools")
    lengths = sorted(len(r.prompt) + r.max_new_tokens for r in subject.requests)
    # room in every pool for the two longest requests at their worst, never for all four
    counts = tuple(
        sum(roomy.pool.blocks_needed(g, n) for g in roomy.plan.groups_in(p) for n in lengths[-2:])
        for p in range(len(roomy.plan.pools))
    )
    plan = plan_kv_cache(
        _specs(subject.model, roomy.plan),
        ROOMY_BYTES,
        CONTEXT,
        registry=registry,
        policy="kind_pools",
        num_blocks=counts,
    )
    assert tuple(p.num_blocks for p in plan.pools) == counts
    runner = kvcore_runner(subject.model, registry, plan=plan)

    generations = decode_greedy(runner, subject.requests)

    assert mismatches(generations, subject.reference) == []
    assert any(g.admitted_step > 0 for g in generations.values()), "some request waited for blocks"


def test_a_corrupted_live_page_of_a_pool_breaks_the_match(subjects, registry):
    subject = subjects("gemma3")
    runner = kvcore_runner(subject.model, registry, policy="kind_pools", runner_class=CorruptingRunner)
    assert len(runner.plan.pools) == 2
    assert any(isinstance(g.spec, FullAttentionSpec) for g in runner.plan.groups)
    generations = decode_greedy(runner, subject.requests)
    assert runner.corrupted is not None
    problems = mismatches(generations, subject.reference)
    assert problems and all(p.startswith("r2:") for p in problems), problems
