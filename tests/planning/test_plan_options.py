"""``PlanOptions.uniform_block_size`` and ``PlanOptions.max_groups``: honoured by every built-in
policy, checked by the planner for any policy, off by default (the snapshots pin that)."""

from __future__ import annotations

import attrs
import pytest

from kvcore import (
    GroupLimitError,
    InvalidInputError,
    PlanOptions,
    PolicyNotApplicableError,
    SizingContext,
    model_layer_specs,
    plan_kv_cache,
)
from kvcore.error_messages import render
from kvcore.frontends.hf_config import bundled_models
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.policies.shared_buffer import SharedBufferPolicy
from tests.helpers import full, mix, sliding

BUDGET = 24 * 2**30
CONTEXT = SizingContext(max_model_len=32768)
BUILT_IN = ("uniform", "shared_buffer", "equal_groups")


def _state() -> StateSpec:
    return StateSpec(
        block_size=16,
        parts=(
            StatePart(name="conv", shape=(3, 64), dtype="bfloat16"),
            StatePart(name="ssm", shape=(64, 16), dtype="float32"),
        ),
    )


def _block_sizes(plan):
    return {g.spec.block_size for g in plan.groups if g.spec.page_scales_with_block_size}


def test_the_defaults_ask_for_nothing_new():
    options = PlanOptions()
    assert options.uniform_block_size is False and options.max_groups is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_groups", 0),
        ("max_groups", True),
        ("max_groups", 2.0),
        ("uniform_block_size", 1),
        ("uniform_block_size", "yes"),
    ],
)
def test_bad_values_are_refused(field, value):
    with pytest.raises(InvalidInputError, match=field):
        PlanOptions(**{field: value})


def test_gemma3_gets_one_block_size_where_it_would_enlarge_one(registry):
    specs = model_layer_specs("google/gemma-3-27b-it", registry)
    default = plan_kv_cache(specs, BUDGET, CONTEXT, registry=registry)
    assert len(_block_sizes(default)) > 1, "without the option a remainder group gets larger blocks"

    plan = plan_kv_cache(
        specs, BUDGET, CONTEXT, registry=registry, options=PlanOptions(uniform_block_size=True)
    )

    assert _block_sizes(plan) == {16}


def test_specs_of_several_block_sizes_meet_at_their_least_common_multiple(registry):
    specs = mix((6, full(block_size=16)), (6, sliding(1024, block_size=32)))
    plan = plan_kv_cache(
        specs, BUDGET, CONTEXT, registry=registry, options=PlanOptions(uniform_block_size=True)
    )
    assert _block_sizes(plan) == {32}


def test_states_keep_their_block_size_and_attention_shares_one(registry):
    specs = {**mix((5, full(block_size=16)), (3, sliding(512, block_size=64))), "model.layers.99": _state()}
    plan = plan_kv_cache(
        specs, BUDGET, CONTEXT, registry=registry, options=PlanOptions(uniform_block_size=True)
    )
    assert _block_sizes(plan) == {64}
    assert plan.group_of("model.layers.99").spec == _state()


def test_block_sizes_without_a_common_multiple_in_bounds_are_refused(registry):
    specs = mix((4, full(block_size=16)), (4, sliding(1024, block_size=24)))
    with pytest.raises(InvalidInputError, match=r"\[16, 24\].*48.*max_block_size=32"):
        plan_kv_cache(
            specs,
            BUDGET,
            CONTEXT,
            registry=registry,
            options=PlanOptions(uniform_block_size=True, max_block_size=32),
        )


@pytest.mark.parametrize("model", [m.name for m in bundled_models()])
@pytest.mark.parametrize("policy", BUILT_IN)
def test_every_built_in_policy_keeps_within_max_groups_or_names_the_fewest(registry, model, policy):
    specs = model_layer_specs(model, registry)
    try:
        free = plan_kv_cache(specs, BUDGET, CONTEXT, registry=registry, policy=policy, check_fit=False)
    except PolicyNotApplicableError:
        pytest.skip(f"{policy} does not plan {model}")
    smallest = None
    for bound in range(1, len(free.groups) + 1):
        options = PlanOptions(max_groups=bound)
        try:
            plan = plan_kv_cache(
                specs, BUDGET, CONTEXT, registry=registry, policy=policy, options=options, check_fit=False
            )
        except GroupLimitError as exc:
            assert exc.max_groups == bound and exc.smallest_groups > bound and exc.policy == policy
            smallest = exc.smallest_groups
            continue
        assert len(plan.groups) <= bound
        if smallest is not None:
            assert bound == smallest, "the fewest named in the error is the fewest that plans"
            smallest = None
        if bound == len(free.groups):
            assert plan == free, "a bound the unbounded plan keeps does not change it"


def test_the_best_layout_within_the_bound_is_chosen(registry):
    """Gemma-3: three groups at most is what the tolerance alone would not give; no
    three-group layout of the candidate rows holds more requests."""
    specs = model_layer_specs("google/gemma-3-27b-it", registry)
    plan = plan_kv_cache(specs, BUDGET, CONTEXT, registry=registry, options=PlanOptions(max_groups=3))
    assert len(plan.groups) <= 3
    strict = plan_kv_cache(
        specs, BUDGET, CONTEXT, registry=registry, options=PlanOptions(max_groups=3, grouping_tolerance=0)
    )
    assert plan.max_concurrency() >= strict.max_concurrency() * (1 - PlanOptions().grouping_tolerance)


def test_the_error_names_the_fewest_groups_and_the_setting(registry):
    specs = model_layer_specs("google/gemma-3-27b-it", registry)
    with pytest.raises(GroupLimitError) as caught:
        plan_kv_cache(specs, BUDGET, CONTEXT, registry=registry, options=PlanOptions(max_groups=1))
    error = caught.value
    assert isinstance(error, PolicyNotApplicableError)
    assert error.smallest_groups == 2
    assert "raise max_groups to 2" in str(error)
    from kvcore.cli.inputs import FLAG_NAMES

    assert "raise --max-groups to 2" in render(error, FLAG_NAMES)


class _Ignorant(SharedBufferPolicy):
    """A third-party policy that ignores both options (it enlarges blocks and groups freely)."""

    name = "test.ignorant"

    def group(self, specs, context, options):
        return super().group(specs, context, attrs.evolve(options, uniform_block_size=False, max_groups=None))


def test_a_policy_that_ignores_the_options_is_caught_by_the_planner(registry):
    specs = model_layer_specs("google/gemma-3-27b-it", registry)

    def plan(**options):
        return plan_kv_cache(
            specs, BUDGET, CONTEXT, registry=registry, policy=_Ignorant(), options=PlanOptions(**options)
        )

    with pytest.raises(PolicyNotApplicableError, match="max_groups"):
        plan(max_groups=3)
    # the planner gives it specs of one block size already; it enlarges a remainder group anyway
    with pytest.raises(PolicyNotApplicableError, match="uniform_block_size"):
        plan(uniform_block_size=True)
