"""Both built-in policies pass the same conformance suite a third-party policy does."""

import pytest
from hypothesis import settings

from kvcore import Registry
from kvcore.testing import strategies as kst
from kvcore.testing.conformance import PolicyConformance

BUILTIN_POLICIES = tuple(Registry.default(autoload=False).policies)


class TestBuiltinPolicies(PolicyConformance):
    # tests/property runs the plan invariants with the full profile; here 25 examples per check
    hypothesis_settings = settings(max_examples=25)

    @pytest.fixture(params=BUILTIN_POLICIES)
    def policy_name(self, request):
        return request.param

    @pytest.fixture
    def layer_maps(self, policy_name, kvcore_registry):
        # uniform plans one spec for every layer; any other mix it refuses (checked below)
        distinct = 1 if policy_name == "uniform" else 4
        return kst.layer_specs(
            max_layers=12, max_distinct=distinct, spec_strategy=kst.specs(registry=kvcore_registry)
        )


def test_both_builtin_policies_are_covered():
    assert set(BUILTIN_POLICIES) >= {"uniform", "shared_buffer"}
