"""The core planning path shared by every policy: budget, forced blocks, admission."""

import pytest

from kvcore import (
    InsufficientMemoryError,
    InvalidInputError,
    InvalidSpecError,
    PlanOptions,
    PluginValidationError,
    PolicyNotApplicableError,
    SizingContext,
    plan_kv_cache,
)
from kvcore.plan import KVCacheGroup
from kvcore.planning.invariants import check_plan
from kvcore.policies.uniform import UniformPolicy
from tests.helpers import full, mix, sliding

SPEC = full(block_size=16, heads=2, head_size=64, dtype="float32")
P = SPEC.page_size_bytes


def test_two_full_layers_hand_computed(registry):
    plan = plan_kv_cache(
        {"l1": SPEC, "l2": SPEC}, P * 2 * 32, SizingContext(max_model_len=16), registry=registry
    )
    assert plan.num_blocks == 32
    assert plan.policy == "uniform"
    assert [t.size for t in plan.tensors] == [P * 32, P * 32]
    assert plan.bytes_per_block == 2 * P


def test_forced_num_blocks(registry):
    plan = plan_kv_cache(
        {"l1": SPEC, "l2": SPEC},
        P * 2 * 32,
        SizingContext(max_model_len=16),
        registry=registry,
        num_blocks=16,
    )
    assert plan.num_blocks == 16
    assert plan.tensors[0].size == P * 16


def test_forced_num_blocks_checked_against_max_model_len(registry):
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache(
            {"l1": SPEC}, P * 100, SizingContext(max_model_len=512), registry=registry, num_blocks=16
        )
    err = info.value
    assert err.largest_fitting_len == 256
    assert "--num-blocks 16" in str(err) and "raise --num-blocks to at least 32" in str(err)


def test_forced_num_blocks_beyond_budget(registry):
    with pytest.raises(InsufficientMemoryError, match="at most 10 blocks fit"):
        plan_kv_cache({"l1": SPEC}, P * 10, SizingContext(max_model_len=16), registry=registry, num_blocks=11)


def test_admission_error_numbers(registry):
    specs = {f"l{i}": full() for i in range(32)}  # 2 MiB per block, 128 KiB per token
    ctx = SizingContext(max_model_len=131072)
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache(specs, int(2.5 * 2**30), ctx, registry=registry)
    err = info.value
    assert err.required_bytes == 16 * 2**30
    assert err.available_bytes == int(2.5 * 2**30)
    assert err.largest_fitting_len == 20480  # 1280 blocks x 16 tokens
    text = str(err)
    for piece in (
        "131072 tokens",
        "16.00 GiB",
        "2.50 GiB",
        "largest max_model_len that fits is 20480",
        "--max-model-len",
    ):
        assert piece in text
    assert "\n" not in text


def test_admission_when_nothing_fits(registry):
    with pytest.raises(InsufficientMemoryError, match="not even a one-token request fits") as info:
        plan_kv_cache({"l": full()}, 100, SizingContext(max_model_len=16), registry=registry)
    assert info.value.largest_fitting_len == 0


def test_check_fit_can_be_skipped(registry):
    plan = plan_kv_cache(
        {"l": full()}, 100, SizingContext(max_model_len=16), registry=registry, check_fit=False
    )
    assert plan.num_blocks == 0


@pytest.mark.parametrize(
    ("specs", "budget", "error"),
    [
        ({}, 10**9, InvalidSpecError),
        ({"": full()}, 10**9, InvalidSpecError),
        ({"a": "full"}, 10**9, InvalidSpecError),
        ({"a": full()}, -1, InvalidInputError),
        ({"a": full()}, 1.5e9, InvalidInputError),
    ],
)
def test_bad_inputs(registry, specs, budget, error):
    with pytest.raises(error):
        plan_kv_cache(specs, budget, SizingContext(max_model_len=16), registry=registry)


def test_policy_object_is_checked(registry):
    with pytest.raises(PolicyNotApplicableError):
        plan_kv_cache(
            mix((1, full()), (1, sliding(8))),
            10**9,
            SizingContext(max_model_len=16),
            registry=registry,
            policy=UniformPolicy(),
        )


def test_misbehaving_policy_is_caught(registry):
    class LosesLayers(UniformPolicy):
        name = "loses_layers"

        def group(self, specs, context, options):
            return (KVCacheGroup(layer_names=tuple(specs)[:1], spec=next(iter(specs.values()))),)

    class ChangesSpec(UniformPolicy):
        name = "changes_spec"

        def group(self, specs, context, options):
            return (KVCacheGroup(layer_names=tuple(specs), spec=full(heads=1)),)

    specs = {"a": full(), "b": full()}
    ctx = SizingContext(max_model_len=16)
    with pytest.raises(PluginValidationError, match="left layers out of every group: \\['b'\\]"):
        plan_kv_cache(specs, 10**9, ctx, registry=registry, policy=LosesLayers())
    with pytest.raises(PluginValidationError, match="num_kv_heads \\(8 vs 1\\)"):
        plan_kv_cache(specs, 10**9, ctx, registry=registry, policy=ChangesSpec())


def test_options_validate():
    with pytest.raises(InvalidInputError):
        PlanOptions(grouping_tolerance=1.5)
    with pytest.raises(InvalidSpecError):
        PlanOptions(max_block_size=0)


def test_plans_pass_the_byte_check(registry):
    plan = plan_kv_cache(
        mix((3, full()), (7, sliding(64))), 2**26, SizingContext(max_model_len=256), registry=registry
    )
    check_plan(plan)
