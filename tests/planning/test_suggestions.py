"""The suggested max_model_len holds: planning at it succeeds and at one more token fails.

Over random mixes of full-attention, sliding-window and chunked-local layers (whose grouping
changes with the length), budgets around one request's need, both hybrid policies, with and
without a forced block count (issue 12, "Suggestions that hold")."""

import pytest
from hypothesis import event, given, settings, strategies as st

from kvcore import InsufficientMemoryError, SizingContext, plan_kv_cache, request_bytes
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.policy import PlanOptions

pytestmark = pytest.mark.property


POLICIES = ["auto", "shared_buffer", "equal_groups"]


@st.composite
def hybrids(draw):
    """A model of full, sliding and chunked layers in a random order, and a refused context."""
    attn = {
        "block_size": draw(st.sampled_from([8, 16, 32])),
        "num_kv_heads": draw(st.sampled_from([1, 2, 8])),
        "head_size": draw(st.sampled_from([64, 128])),
        "dtype": "bfloat16",
    }
    kinds = [FullAttentionSpec(**attn)]
    for window in draw(st.lists(st.integers(16, 8192), min_size=1, max_size=3)):
        kinds.append(SlidingWindowSpec(**attn, sliding_window=window))
    if draw(st.booleans()):
        kinds.append(
            ChunkedLocalAttentionSpec(**attn, attention_chunk_size=draw(st.sampled_from([512, 2048, 8192])))
        )
    layers = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=48))
    specs = {f"model.layers.{i}": spec for i, spec in enumerate(layers)}
    context = SizingContext(
        max_model_len=draw(st.integers(64, 65536)),
        max_num_batched_tokens=draw(st.sampled_from([256, 2048, 8192])),
    )
    share = draw(st.floats(0.01, 1.2))
    budget = int(share * request_bytes(specs, context)) + draw(st.integers(0, 2**20))
    return specs, context, budget


def _admitted(registry, specs, context, budget, length, **kwargs):
    try:
        plan_kv_cache(specs, budget, context.with_max_model_len(length), registry=registry, **kwargs)
    except InsufficientMemoryError:
        return False
    return True


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=60, deadline=None)
@given(case=hybrids(), tolerance=st.sampled_from([0.0, 0.01, 0.05]))
def test_the_suggestion_plans_and_one_more_token_does_not(module_registry, policy, case, tolerance):
    specs, context, budget = case
    kwargs = {"policy": policy, "options": PlanOptions(grouping_tolerance=tolerance)}
    try:
        plan_kv_cache(specs, budget, context, registry=module_registry, **kwargs)
    except InsufficientMemoryError as exc:
        suggestion = exc.largest_fitting_len
    else:
        event("admitted as asked")
        return
    event("refused: a suggestion")
    assert 0 <= suggestion < context.max_model_len
    if suggestion:
        assert _admitted(module_registry, specs, context, budget, suggestion, **kwargs)
    assert not _admitted(module_registry, specs, context, budget, suggestion + 1, **kwargs)


@settings(max_examples=40, deadline=None)
@given(case=hybrids(), fewer=st.floats(0.05, 0.95))
def test_a_forced_block_count_gets_a_suggestion_that_holds(module_registry, case, fewer):
    specs, context, budget = case
    budget = max(budget, request_bytes(specs, context) * 2)  # room for the forced blocks
    loose = plan_kv_cache(specs, budget, context, registry=module_registry, check_fit=False)
    forced = max(1, int(loose.blocks_per_request() * fewer))
    kwargs = {"num_blocks": forced}
    try:
        plan_kv_cache(specs, budget, context, registry=module_registry, **kwargs)
    except InsufficientMemoryError as exc:
        if exc.reason == "forced_num_blocks":
            return
        suggestion = exc.largest_fitting_len
    else:
        return
    if suggestion:
        assert _admitted(module_registry, specs, context, budget, suggestion, **kwargs)
    assert not _admitted(module_registry, specs, context, budget, suggestion + 1, **kwargs)


@settings(max_examples=40, deadline=None)
@given(case=hybrids())
def test_auto_plans_the_longest_admitted_length(module_registry, case):
    specs, context, budget = case
    try:
        plan = plan_kv_cache(specs, budget, context, registry=module_registry, max_model_len="auto")
    except InsufficientMemoryError:
        assert not _admitted(module_registry, specs, context, budget, 1)
        return
    length = plan.context.max_model_len
    assert 1 <= length <= context.max_model_len and plan.fits()
    if length < context.max_model_len:
        assert not _admitted(module_registry, specs, context, budget, length + 1)
