"""transformers' continuous batching (``generate_batch``) on a paged cache kvcore planned.

kvcore plans each tiny model for transformers (:mod:`kvcore.integrations.transformers`), the
plan becomes a ``ContinuousBatchingConfig``, and transformers builds its ``PagedAttentionCache``
from it: the cache must be the one planned (allocators, page size, sectors), the tokens must
be greedy ``generate()``'s, on a cache roomy enough for every request at once and on one that
holds two of the four (so transformers queues and preempts). Then the requests transformers
holds at once on kvcore's cache against those it holds when its own sizing spends the same
budget.
"""

from __future__ import annotations

import logging

import pytest
import torch

from kvcore.integrations.transformers.rules import TRASH_SECTORS, TransformersRules, own_layout

transformers = pytest.importorskip("transformers")

from kvcore.integrations.transformers.convert import (  # noqa: E402
    check_cache,
    continuous_batching_config,
    model_specs,
    plan_for_model,
)
from kvcore.integrations.transformers.measure import generate_and_watch  # noqa: E402
from kvcore.integrations.transformers.rules import TransformersIntegrationError, plan_for_transformers  # noqa: E402
from tests.engine.decode._tiny import NEW_TOKENS, PROMPT_LENGTHS, ROOMY_BYTES  # noqa: E402

#: The models: full attention only, and two sliding + full hybrids (3:1 and 1:1).
NAMES = ("llama", "gemma3", "gpt_oss")
#: The longest request of the fixture's four (prompt plus new tokens).
MAX_MODEL_LEN = max(PROMPT_LENGTHS) + max(NEW_TOKENS)
#: Prompts of more than 16 tokens are prefilled in chunks, beside other requests' decoding.
MAX_BATCH_TOKENS = 16
#: What the runs here share: no flash kernels or graphs on the CPU.
CPU = {"auto_switch_to_flash": False, "use_cuda_graph": False}

#: each ``generate_batch`` ends in two full collections: the heap the worker holds is frozen for them
pytestmark = pytest.mark.usefixtures("frozen_heap")


@pytest.fixture(autouse=True)
def quiet():
    """transformers logs each run's sizing and, without psutil, that it cannot read host memory."""
    logger = logging.getLogger("ContinuousBatchingLogger")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _greedy():
    return transformers.GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)


def _run(subject, plan):
    """generate_batch on the plan's cache, every request to the longest output; the cache checked."""
    model = subject.model
    model.set_attn_implementation("eager")
    run = generate_and_watch(
        model,
        [r.prompt for r in subject.requests],
        max_new_tokens=max(NEW_TOKENS),
        generation_config=_greedy(),
        continuous_batching_config=continuous_batching_config(plan, **CPU),
    )
    check_cache(run.cache, plan)
    return run


def _differences(run, subject):
    """Requests whose first tokens differ from generate()'s (greedy: a longer run extends a shorter)."""
    return [
        f"{r.request_id}: {list(tokens[: len(subject.reference[r.request_id].tokens)])} != "
        f"{list(subject.reference[r.request_id].tokens)}"
        for r, tokens in zip(subject.requests, run.tokens, strict=True)
        if tokens[: len(subject.reference[r.request_id].tokens)] != subject.reference[r.request_id].tokens
    ]


@pytest.mark.parametrize("name", NAMES)
def test_generate_batch_on_kvcores_roomy_cache_gives_generates_tokens(subjects, registry, name):
    subject = subjects(name)
    rules = TransformersRules(max_model_len=MAX_MODEL_LEN, max_batch_tokens=MAX_BATCH_TOKENS)
    plan = plan_for_model(subject.model, ROOMY_BYTES, rules, registry=registry)
    assert plan.sequences_held >= len(subject.requests)

    run = _run(subject, plan)

    assert _differences(run, subject) == []
    assert run.peak_held == len(subject.requests), "a roomy cache holds every request at once"
    assert run.starved_batches == 0
    assert run.cache.cache_tensor.numel() == plan.layout.cache_bytes <= ROOMY_BYTES


@pytest.mark.parametrize("name", NAMES)
def test_generate_batch_on_a_cache_for_two_of_four_requests_preempts_and_gives_generates_tokens(
    subjects, registry, name
):
    subject = subjects(name)
    rules = TransformersRules(max_model_len=MAX_MODEL_LEN, max_batch_tokens=MAX_BATCH_TOKENS)
    roomy = plan_for_model(subject.model, ROOMY_BYTES, rules, registry=registry)
    layout = roomy.layout
    # the bytes of two longest requests' sectors and the trash, at the roomy plan's page size
    budget = (layout.sectors_for(2, MAX_MODEL_LEN) + TRASH_SECTORS) * layout.bytes_per_sector
    specs = model_specs(subject.model, registry)
    plan = plan_for_transformers(
        rules.request(specs, budget), rules, registry=registry, page_sizes=(layout.page_size,)
    )
    assert plan.sequences_held == 2 < len(subject.requests)

    run = _run(subject, plan)

    assert _differences(run, subject) == []
    assert _transformers_count(run.cache, plan.layout, MAX_MODEL_LEN) == 2
    assert run.starved_batches > 0, "requests ran out of room: transformers preempted or held them back"


#: Requests of one length for the held-at-once runs: more than either cache holds.
HELD_REQUESTS, HELD_PROMPT, HELD_NEW = 10, 12, 12
#: The budget of those runs: a few of them at once.
HELD_BUDGET = 1 << 15


def _held(model, config):
    prompts = torch.randint(3, 128, (HELD_REQUESTS, HELD_PROMPT), generator=torch.Generator().manual_seed(7))
    return generate_and_watch(
        model,
        prompts.tolist(),
        max_new_tokens=HELD_NEW,
        generation_config=_greedy(),
        continuous_batching_config=config,
    )


def _transformers_count(cache, layout, tokens):
    """transformers' own count (``count_storable_requests``, on the emptied cache) of the
    requests of ``tokens`` tokens it could admit one by one."""
    cache.reset()
    needs = {a.attention: a.blocks_per_request(tokens) for a in layout.allocators}
    return cache.count_storable_requests([needs] * (layout.sequences_held(tokens) + 2))


@pytest.mark.parametrize("name", NAMES)
def test_kvcores_cache_holds_at_least_what_transformers_own_sizing_holds(subjects, registry, name):
    model = subjects(name).model
    model.set_attn_implementation("eager")
    length = HELD_PROMPT + HELD_NEW
    rules = TransformersRules(max_model_len=length, max_batch_tokens=256)
    plan = plan_for_model(model, HELD_BUDGET, rules, registry=registry)
    # no safety margin: the scheduler admits while sectors are free, the figure the layout counts
    ours = _held(model, continuous_batching_config(plan, safety_margin=0.0, **CPU))
    check_cache(ours.cache, plan)
    # transformers' own: the budget in whole-model blocks at its default page size
    own = own_layout(model_specs(model, registry), HELD_BUDGET)
    theirs_held = 0
    if own.sequences_held(length) >= 1:
        config = transformers.ContinuousBatchingConfig(
            num_blocks=HELD_BUDGET // own.bytes_per_model_block,
            max_batch_tokens=256,
            safety_margin=0.0,
            **CPU,
        )
        theirs = _held(model, config)
        assert theirs.cache.num_sectors == own.num_sectors
        assert theirs.tokens == ours.tokens
        theirs_held = theirs.peak_held
    else:
        with pytest.raises(TransformersIntegrationError):
            config = transformers.ContinuousBatchingConfig(
                num_blocks=HELD_BUDGET // own.bytes_per_model_block, max_batch_tokens=256, **CPU
            )
            _held(model, config)

    assert 1 <= plan.sequences_held < HELD_REQUESTS
    assert _transformers_count(ours.cache, plan.layout, length) == plan.sequences_held
    assert ours.peak_held >= plan.sequences_held, "transformers holds at least the requests the plan counts"
    assert plan.sequences_held >= own.sequences_held(length)
    assert ours.peak_held >= theirs_held


def test_a_cache_other_than_planned_is_caught(subjects, registry):
    model = subjects("gemma3").model
    model.set_attn_implementation("eager")
    rules = TransformersRules(max_model_len=MAX_MODEL_LEN, max_batch_tokens=MAX_BATCH_TOKENS)
    plan = plan_for_model(model, ROOMY_BYTES, rules, registry=registry)
    fields = {**plan.config_fields(), "num_blocks": plan.layout.num_blocks // 2}
    run = generate_and_watch(
        model,
        [[5, 6, 7]],
        max_new_tokens=2,
        generation_config=_greedy(),
        continuous_batching_config=transformers.ContinuousBatchingConfig(**fields, **CPU),
    )

    with pytest.raises(TransformersIntegrationError, match=f"sectors, planned {plan.layout.num_sectors}"):
        check_cache(run.cache, plan)
    with pytest.raises(TransformersIntegrationError, match="num_blocks"):
        continuous_batching_config(plan, num_blocks=plan.layout.num_blocks + 1)
