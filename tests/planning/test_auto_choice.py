"""``auto`` chooses by the priority each policy declares, and the choice carries its reason."""

import pytest

from kvcore import (
    PluginValidationError,
    PolicyChoice,
    PolicyNotApplicableError,
    SizingContext,
    plan_kv_cache,
)
from kvcore.cli.report import policy_reason
from kvcore.planning.planner import plan as plan_request
from kvcore.planning.request import PlanRequest
from kvcore.policies.shared_buffer import SharedBufferPolicy
from tests.helpers import full, registering, sliding

UNIFORM = {"a": full(), "b": full()}
HYBRID = {"a": full(), "b": sliding(128), "c": full()}


def plugin(*policies):
    return registering("kvcore_register_policies", *policies)


class Eager(SharedBufferPolicy):
    """A third-party policy that plans what shared_buffer plans, at a priority of its choosing."""

    def __init__(self, name, priority, refuse=None):
        self.name = name
        self.auto_priority = priority
        self.refuse = refuse

    def why_not(self, specs):
        return self.refuse


def test_the_builtins_rank_uniform_then_shared_buffer_then_equal_groups_and_never_kind_pools(registry):
    priorities = {name: policy.auto_priority for name, policy in registry.policies.items()}
    assert priorities == {
        "uniform": 200,
        "shared_buffer": 100,
        "equal_groups": 0,
        "kind_pools": None,
        "unified_pool": None,
    }


def test_auto_picks_uniform_for_one_spec_and_says_why(registry):
    choice = registry.select(UNIFORM)
    assert isinstance(choice, PolicyChoice)
    assert (choice.name, choice.auto, choice.reason) == ("uniform", True, "every layer has the same spec")
    assert choice.passed_over == ()
    assert policy_reason(choice) == "auto: every layer has the same spec"


def test_auto_passes_over_uniform_for_a_hybrid_and_records_its_reason(registry):
    choice = registry.select(HYBRID)
    assert (choice.name, choice.reason) == ("shared_buffer", "the layers have 2 different specs")
    ((name, why),) = choice.passed_over
    assert name == "uniform" and "the layers have 2 different specs" in why
    assert policy_reason(choice) == "auto: the layers have 2 different specs"


def test_a_named_policy_is_not_auto(registry):
    choice = registry.select(UNIFORM, "shared_buffer")
    assert (choice.name, choice.auto, choice.reason) == ("shared_buffer", False, "named")
    assert policy_reason(choice) == "named on the command line"


def test_a_third_party_policy_of_higher_priority_wins_where_it_plans(make_registry):
    registry = make_registry(plugin(Eager("acme.eager", 150)))
    # above shared_buffer: it takes the hybrid ...
    choice = registry.select(HYBRID)
    assert choice.name == "acme.eager"
    assert [name for name, _ in choice.passed_over] == ["uniform"]
    # ... below uniform: uniform keeps the layers that all have one spec
    assert registry.select(UNIFORM).name == "uniform"
    plan = plan_kv_cache(HYBRID, 2**30, SizingContext(max_model_len=256), registry=registry)
    assert plan.policy == "acme.eager"


def test_a_third_party_policy_above_every_builtin_wins_everywhere(make_registry):
    registry = make_registry(plugin(Eager("acme.first", 1000)))
    assert registry.select(UNIFORM).name == "acme.first"
    assert registry.select(HYBRID).name == "acme.first"
    result = plan_request(
        PlanRequest.for_context(UNIFORM, [2**30], SizingContext(max_model_len=256)), registry=registry
    )
    assert result.choice.name == result.plans[0].policy == "acme.first"


def test_a_refusing_policy_is_passed_over_with_its_reason(make_registry):
    registry = make_registry(plugin(Eager("acme.picky", 1000, refuse="it plans only odd layers")))
    choice = registry.select(UNIFORM)
    assert choice.name == "uniform"
    assert choice.passed_over == (("acme.picky", "it plans only odd layers"),)


def test_equal_priorities_go_in_registration_order(make_registry):
    registry = make_registry(plugin(Eager("acme.one", 150), Eager("acme.two", 150)))
    assert registry.select(HYBRID).name == "acme.one"


def test_a_policy_without_priority_is_never_picked_by_auto(make_registry):
    only = Eager("acme.named_only", None)
    registry = make_registry(
        plugin(only),
        block=[
            "kvcore.policies.uniform",
            "kvcore.policies.shared_buffer",
            "kvcore.policies.equal_groups",
            "kvcore.policies.kind_pools",
        ],
    )
    with pytest.raises(PolicyNotApplicableError, match="no registered policy can plan these layers"):
        registry.select(HYBRID)
    assert registry.select(HYBRID, "acme.named_only").policy is only


def test_equal_groups_is_the_last_resort(make_registry):
    registry = make_registry(block=["kvcore.policies.uniform", "kvcore.policies.shared_buffer"])
    assert registry.select(UNIFORM).name == "equal_groups"
    with pytest.raises(PolicyNotApplicableError, match=r"equal_groups: it needs every layer's page"):
        registry.select({"a": full(), "b": full(heads=4)})


@pytest.mark.parametrize("priority", ["high", 1.5, True])
def test_a_priority_that_is_not_an_int_is_a_plugin_error(make_registry, priority):
    registry = make_registry(plugin(Eager("acme.odd", priority)))
    with pytest.raises(
        PluginValidationError, match=r"policy 'acme\.odd' .*auto_priority must be an int or None"
    ):
        registry.select(HYBRID)


def test_a_policy_without_the_attribute_is_refused_naming_it(make_registry):
    class Old:
        name = "acme.old"
        description = "before auto_priority"

        def why_not(self, specs):
            return None

        def group(self, specs, context, options):
            return ()

        def layout(self, groups):
            return None

    # a kvcore 0.1 policy: 0.2 registered it (never picked by auto) with a warning; 0.3 refuses it
    with pytest.raises(
        PluginValidationError, match=r"'acme\.old' has no auto_priority.*declare auto_priority"
    ):
        make_registry(plugin(Old()))
