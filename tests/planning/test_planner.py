"""The core planning path shared by every policy: budget, forced blocks, admission, one layout
call per plan, and one implementation for one rank and many."""

import attrs
import pytest

from kvcore import (
    BlockPlacement,
    InsufficientMemoryError,
    InvalidInputError,
    InvalidSpecError,
    PlanOptions,
    PluginValidationError,
    PolicyNotApplicableError,
    SizingContext,
    TensorPlacement,
    plan_for_ranks,
    plan_kv_cache,
)
from kvcore.plan import KVCacheGroup
from kvcore.planning.invariants import check_plan
from kvcore.planning.planner import plan as plan_request
from kvcore.planning.request import PlanRequest
from kvcore.policies.equal_groups import EqualGroupsPolicy
from kvcore.policies.shared_buffer import SharedBufferPolicy
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
    assert "num_blocks=16" in str(err) and "raise num_blocks to at least 32" in str(err)


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
        "lower max_model_len to 20480",
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


# -- one planning implementation, one layout call ----------------------------------------------


class CountingPolicy:
    """Wraps a policy and counts the calls kvcore makes to it."""

    def __init__(self, inner):
        self.inner = inner
        self.name = f"counting_{inner.name}"
        self.description = inner.description
        self.auto_priority = None
        self.calls = {"why_not": 0, "group": 0, "layout": 0}

    def why_not(self, specs):
        self.calls["why_not"] += 1
        return self.inner.why_not(specs)

    def group(self, specs, context, options):
        self.calls["group"] += 1
        return self.inner.group(specs, context, options)

    def layout(self, groups):
        self.calls["layout"] += 1
        return self.inner.layout(groups)


@pytest.mark.parametrize("inner", [UniformPolicy(), SharedBufferPolicy(), EqualGroupsPolicy()])
@pytest.mark.parametrize("forced", [None, 8])
def test_the_planner_asks_for_the_layout_once_per_plan(registry, inner, forced):
    specs = {"a": full(), "b": full(), "c": full()}
    counting = CountingPolicy(inner)
    plan = plan_kv_cache(
        specs, 2**30, SizingContext(max_model_len=64), registry=registry, policy=counting, num_blocks=forced
    )
    assert counting.calls == {"why_not": 1, "group": 1, "layout": 1}
    assert attrs.evolve(plan, policy=inner.name) == plan_kv_cache(
        specs, 2**30, SizingContext(max_model_len=64), registry=registry, policy=inner.name, num_blocks=forced
    )


def test_the_planner_asks_for_the_layout_once_per_rank(registry):
    ranks = [{"a": full(), "b": sliding(64)}, {"c": full(), "d": sliding(64)}]
    counting = CountingPolicy(SharedBufferPolicy())
    plans = plan_for_ranks(
        ranks, [2**30, 2**30], SizingContext(max_model_len=64), registry=registry, policy=counting
    )
    assert len(plans) == 2
    assert counting.calls == {"why_not": 1, "group": 1, "layout": 2}


@pytest.mark.parametrize("policy", ["auto", "uniform", "shared_buffer", "equal_groups"])
@pytest.mark.parametrize("forced", [None, 64])
def test_one_rank_through_plan_for_ranks_is_plan_kv_cache(registry, policy, forced):
    specs = {f"l{i}": full() for i in range(6)}
    ctx = SizingContext(max_model_len=512)
    alone = plan_kv_cache(specs, 2**28, ctx, registry=registry, policy=policy, num_blocks=forced)
    (ranked,) = plan_for_ranks([specs], [2**28], ctx, registry=registry, policy=policy, num_blocks=forced)
    assert ranked == alone
    result = plan_request(
        PlanRequest.for_context(specs, [2**28], ctx, policy=policy, num_blocks=forced), registry=registry
    )
    assert result.plans == (alone,)
    assert result.choice.name == alone.policy


def test_one_rank_errors_read_the_same_both_ways(registry):
    ctx = SizingContext(max_model_len=131072)
    specs = {f"l{i}": full() for i in range(32)}
    with pytest.raises(InsufficientMemoryError) as alone:
        plan_kv_cache(specs, 2**30, ctx, registry=registry)
    with pytest.raises(InsufficientMemoryError) as ranked:
        plan_for_ranks([specs], [2**30], ctx, registry=registry)
    assert str(alone.value) == str(ranked.value)


def test_equal_specs_in_separate_objects_plan_like_one_object(registry):
    shared = {f"l{i}": (full() if i % 3 else sliding(64)) for i in range(12)}
    one, window = full(), sliding(64)
    same_object = {f"l{i}": (one if i % 3 else window) for i in range(12)}
    ctx = SizingContext(max_model_len=1024)
    assert plan_kv_cache(shared, 2**28, ctx, registry=registry) == plan_kv_cache(
        same_object, 2**28, ctx, registry=registry
    )


def test_the_core_sizes_each_tensor_for_the_block_count(registry):
    class TwoLanes(UniformPolicy):
        name = "two_lanes"

        def layout(self, groups):
            (group,) = groups
            page = group.spec.page_size_bytes
            first, *rest = group.layer_names
            # one tensor per layer, each page followed by three pages of padding
            return BlockPlacement(
                bytes_per_block=4 * page * len(group.layer_names),
                single_buffer=False,
                tensors=[
                    TensorPlacement(offset=0, page_stride=4 * page, shared_by=[name])
                    for name in (first, *rest)
                ],
            )

    plan = plan_kv_cache(
        {"a": SPEC, "b": SPEC},
        10**9,
        SizingContext(max_model_len=16),
        registry=registry,
        policy=TwoLanes(),
        num_blocks=5,
    )
    # 5 pages at a stride of 4 pages: the tensor ends where the last page ends
    assert [t.size for t in plan.tensors] == [4 * 4 * P + P] * 2
    assert plan.tensors[0].shared_by == ("a",)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            [
                TensorPlacement(offset=0, page_stride=P, shared_by=["a"]),
                TensorPlacement(offset=0, page_stride=P, shared_by=["x"]),
            ],
            "places layer 'x' \\(tensor 1\\), which is in no group",
        ),
        ([TensorPlacement(offset=0, page_stride=P, shared_by=[])], "tensor 0 shared by no layer"),
        ([TensorPlacement(offset=-1, page_stride=P, shared_by=["a"])], "tensor 0 with .*offset=-1"),
        ([TensorPlacement(offset=0, page_stride=0, shared_by=["a"])], "tensor 0 with .*page_stride=0"),
    ],
)
def test_a_bad_layout_names_the_policy_and_the_tensor(registry, tensors, message):
    class Bad(UniformPolicy):
        name = "bad_layout"

        def layout(self, groups):
            return BlockPlacement(bytes_per_block=P, single_buffer=False, tensors=tensors)

    with pytest.raises(PluginValidationError, match=f"policy 'bad_layout': layout\\(\\) .*{message}"):
        plan_kv_cache({"a": SPEC}, 10**9, SizingContext(max_model_len=16), registry=registry, policy=Bad())


def test_a_layout_that_is_not_a_layout_is_caught(registry):
    class NotALayout(UniformPolicy):
        name = "not_a_layout"

        def layout(self, groups):
            return {"bytes_per_block": P}

    with pytest.raises(PluginValidationError, match=r"expected a kvcore\.BlockPlacement"):
        plan_kv_cache(
            {"a": SPEC}, 10**9, SizingContext(max_model_len=16), registry=registry, policy=NotALayout()
        )


@pytest.mark.parametrize("policy", ["shared_buffer", "equal_groups"])
def test_planning_works_per_distinct_spec_not_per_layer(registry, monkeypatch, policy):
    # The spec's own figures are asked for per distinct spec and per group, never per layer: 5,000
    # sliding layers of one spec must not cost 5,000 calls of any of them.
    calls: dict[str, int] = {}
    cls = type(sliding(1024))
    for name in ("page_size_bytes", "max_num_blocks", "with_block_size"):
        original = getattr(cls, name)
        if isinstance(original, property):

            def counted_property(self, _get=original.fget, _name=name):
                calls[_name] = calls.get(_name, 0) + 1
                return _get(self)

            monkeypatch.setattr(cls, name, property(counted_property))
        else:

            def counted(self, *args, _call=original, _name=name, **kwargs):
                calls[_name] = calls.get(_name, 0) + 1
                return _call(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, counted)
    ctx = SizingContext(max_model_len=4096)

    def asked(num_layers):
        # built first: every spec checks its page once when it is made, which is the front end's cost
        specs = {f"l{i}": (full() if i % 6 == 5 else sliding(1024)) for i in range(num_layers)}
        calls.clear()
        plan_kv_cache(specs, 2**44, ctx, registry=registry, policy=policy)
        return dict(calls)

    small, large = asked(600), asked(6000)
    assert small and set(small) == set(large)
    assert max(large.values()) < 100, large
