"""The reference runner refuses what it cannot run faithfully, with a typed error that says why,
and gives the model its attention implementation back."""

from __future__ import annotations

import attrs
import pytest
import torch

from kvcore import (
    BlockPoolExhaustedError,
    InsufficientMemoryError,
    InvalidInputError,
    KVCacheBindingError,
    ModelOptions,
    SizingContext,
    SpecMismatchError,
    allocate,
    bind_to_modules,
    layer_specs_from_config,
    plan_kv_cache,
    scan_module,
)
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.testing.reference import DecodeRequest, PagedAttentionRunner, ScheduledRequest, decode_greedy
from kvcore.testing.reference.pages import LayerPages
from tests.engine.decode._tiny import BLOCK_SIZE, CONTEXT, MODELS, ROOMY_BYTES, kvcore_runner
from tests.helpers import full

pytest.importorskip("transformers")


@pytest.fixture
def gemma2(subjects):
    return subjects("gemma2").model


def _modules(model, plan):
    named = dict(model.named_modules())
    return {name: named[name] for name in plan.layer_names}


def test_calling_the_model_outside_the_runner_is_refused(gemma2, registry):
    runner = kvcore_runner(gemma2, registry)
    with pytest.raises(InvalidInputError, match="needs the 'kvcore_step' argument"):
        runner.model(torch.tensor([[5, 6, 7]]))


def test_a_plan_whose_window_differs_from_the_model_is_refused(gemma2, registry):
    specs = {
        name: attrs.evolve(spec, sliding_window=16) if isinstance(spec, SlidingWindowSpec) else spec
        for name, spec in scan_module(gemma2, registry, {"block_size": BLOCK_SIZE}).items()
    }
    plan = plan_kv_cache(specs, ROOMY_BYTES, CONTEXT, registry=registry)
    runner = kvcore_runner(gemma2, registry, plan=plan)
    with pytest.raises(SpecMismatchError, match="sliding window of 8 tokens but the plan gives it"):
        runner.step([ScheduledRequest(request_id="a", token_ids=[5, 6, 7], num_computed=0)])


def test_views_bound_to_the_wrong_modules_are_refused(gemma2, registry):
    plan = kvcore_runner(gemma2, registry).plan
    modules = _modules(gemma2, plan)
    names = list(modules)
    swapped = dict(zip(names, [modules[names[-1]], *[modules[n] for n in names[:-1]]], strict=True))
    with pytest.raises(KVCacheBindingError, match="bound to a Gemma2Attention with layer_idx"):
        PagedAttentionRunner(gemma2, plan, swapped)


def test_a_layer_without_a_view_is_refused(gemma2, registry):
    plan = kvcore_runner(gemma2, registry).plan
    with pytest.raises(KVCacheBindingError, match="has no 'missing' view"):
        PagedAttentionRunner(gemma2, plan, _modules(gemma2, plan), attribute="missing")
    with pytest.raises(KVCacheBindingError, match="has no module"):
        PagedAttentionRunner(gemma2, plan, {})


def test_a_view_of_another_plan_is_refused(gemma2, registry):
    plan = kvcore_runner(gemma2, registry).plan
    smaller = kvcore_runner(gemma2, registry, num_blocks=plan.num_blocks // 2).plan
    with pytest.raises(KVCacheBindingError, match="not an attention view of"):
        PagedAttentionRunner(gemma2, plan, _modules(gemma2, smaller))


def test_a_model_that_is_not_a_transformers_model_is_refused(registry):
    spec = full(block_size=BLOCK_SIZE, heads=1, head_size=4, dtype="float32")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    plan = plan_kv_cache({"0": spec}, 1 << 16, CONTEXT, registry=registry)
    bind_to_modules(model, allocate(plan, "cpu", registry=registry))
    with pytest.raises(InvalidInputError, match="is not a transformers model"):
        PagedAttentionRunner(model, plan, {"0": model[0]})


def test_steps_are_checked(gemma2, registry):
    runner = kvcore_runner(gemma2, registry)
    with pytest.raises(InvalidInputError, match="at least one scheduled request"):
        runner.step([])
    twice = ScheduledRequest(request_id="a", token_ids=[5], num_computed=0)
    with pytest.raises(InvalidInputError, match="appears twice"):
        runner.step([twice, twice])
    with pytest.raises(InvalidInputError, match="scheduled at num_computed=3 but its block tables cover 0"):
        runner.step([ScheduledRequest(request_id="a", token_ids=[5], num_computed=3)])
    gemma2.train()
    try:
        with pytest.raises(InvalidInputError, match="training mode"):
            runner.step([twice])
    finally:
        gemma2.eval()


def test_request_records_are_checked():
    with pytest.raises(InvalidInputError, match="'prompt' must hold at least one token"):
        DecodeRequest(request_id="a", prompt=[], max_new_tokens=1)
    with pytest.raises(InvalidInputError, match="'max_new_tokens' must be an int >= 1"):
        DecodeRequest(request_id="a", prompt=[1], max_new_tokens=0)
    with pytest.raises(InvalidInputError, match="'num_computed' must be an int >= 0"):
        ScheduledRequest(request_id="a", token_ids=[1], num_computed=-1)


def test_the_scheduler_refuses_what_the_pool_cannot_hold(gemma2, registry):
    short = SizingContext(max_model_len=16, max_num_batched_tokens=16)
    runner = kvcore_runner(gemma2, registry, num_blocks=8, context=short)
    with pytest.raises(InsufficientMemoryError, match=r"needs \d+ blocks at its worst but the pool has 8"):
        decode_greedy(runner, [DecodeRequest(request_id="a", prompt=[5] * 40, max_new_tokens=40)])
    with pytest.raises(InvalidInputError, match=r"must be in 1\.\.16"):
        decode_greedy(runner, [], max_num_batched_tokens=32)
    request = DecodeRequest(request_id="a", prompt=[5], max_new_tokens=1)
    with pytest.raises(InvalidInputError, match="must be unique"):
        decode_greedy(runner, [request, request])


def test_a_step_the_pool_cannot_hold_takes_nothing(gemma2, registry):
    short = SizingContext(max_model_len=16, max_num_batched_tokens=16)
    runner = kvcore_runner(gemma2, registry, num_blocks=8, context=short)
    with pytest.raises(InvalidInputError, match="the plan's max_model_len is 16"):  # no request is that long
        runner.step([ScheduledRequest(request_id="a", token_ids=[5] * 40, num_computed=0)])
    assert runner.pool.num_free_blocks == 8 and runner.events == []
    runner.step([ScheduledRequest(request_id="a", token_ids=[5] * 16, num_computed=0)])
    free, events = runner.pool.num_free_blocks, list(runner.events)
    with pytest.raises(BlockPoolExhaustedError):  # a second request of 16 tokens finds too few
        runner.step([ScheduledRequest(request_id="b", token_ids=[5] * 16, num_computed=0)])
    assert runner.pool.num_free_blocks == free and runner.events == events


def test_reading_past_the_block_table_is_refused():
    pages = LayerPages(name="x", keys=torch.zeros(4, 2, 1, 1), values=torch.zeros(4, 2, 1, 1))
    with pytest.raises(InvalidInputError, match="needs block-table entry 2 but the table has 2"):
        pages.read(torch.tensor([0, 1]), 0, 5)


def test_restore_gives_the_model_its_attention_back(gemma2, registry):
    gemma2.set_attn_implementation("eager")
    runner = kvcore_runner(gemma2, registry)
    assert gemma2.config._attn_implementation == "kvcore_reference"
    runner.restore()
    assert gemma2.config._attn_implementation == "eager"


@pytest.mark.parametrize("name", list(MODELS))
def test_the_runner_s_layers_are_named_as_the_config_families_name_them(subjects, registry, name):
    model = subjects(name).model
    runner = kvcore_runner(model, registry)
    config = {**model.config.to_dict(), "dtype": "float32"}  # built in float32, without a dtype field
    from_config = layer_specs_from_config(config, registry, ModelOptions(block_size=BLOCK_SIZE))
    assert list(runner.plan.layer_names) == [n for g in runner.plan.groups for n in g.layer_names]
    assert sorted(runner.plan.layer_names) == sorted(from_config)
    modules = dict(model.named_modules())
    for layer, spec in from_config.items():
        bound = runner.layer_of(modules[layer])
        assert bound.name == layer
        assert bound.spec.with_block_size(BLOCK_SIZE) == spec  # a group may get a larger block
        assert modules[layer].layer_idx == int(layer.split(".")[-2])
