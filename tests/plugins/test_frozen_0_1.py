"""A plugin written against kvcore 0.1 still loads and passes the conformance kit, with
DeprecationWarnings only (``third_party/example_0_1/``: the example spec kind and its strategy as they were).

0.1 specs held ``torch.dtype`` values, so the frozen validator compares converted dtypes against
torch dtypes; kvcore keeps that comparison working for one minor version and warns.
"""

import importlib.metadata

import pytest
import torch

from kvcore import InvalidSpecError, PluginValidationError, SizingContext, hookimpl, plan_kv_cache
from kvcore.testing.conformance import SpecKindConformance
from kvcore.testing.strategies import register_spec_strategy
from tests.helpers import full
from tests.plugins.third_party.example_0_1 import quantized_kv_0_1
from tests.plugins.third_party.example_0_1.quantized_kv_0_1 import QuantizedKVSpec
from tests.plugins.third_party.example_0_1.strategies_0_1 import quantized_specs


@pytest.fixture(autouse=True)
def without_the_current_example(monkeypatch):
    """The frozen kind has the current example's kind name: block the installed example."""
    if any(ep.name == "example_quantized" for ep in importlib.metadata.entry_points(group="kvcore")):
        monkeypatch.setenv("KVCORE_BLOCK_PLUGINS", "example_quantized")


class TestFrozen01Kind(SpecKindConformance):
    @pytest.fixture
    def spec_cls(self):
        return QuantizedKVSpec

    @pytest.fixture
    def kvcore_plugins(self):
        return (quantized_kv_0_1,)

    @pytest.fixture
    def valid_specs(self):
        return quantized_specs()

    @pytest.fixture
    def invalid_kwargs(self):
        return (
            {"num_kv_heads": 0},
            {"payload_dtype": "bfloat16"},
            {"scale_dtype": "int8"},
            {"head_size": 128, "scale_group_size": 48},
        )


def test_the_0_1_dtype_check_warns_and_still_decides():
    with pytest.warns(DeprecationWarning, match=r"kvcore.dtypes.int8 .*kvcore 0.3") as caught:
        spec = QuantizedKVSpec(
            block_size=16, num_kv_heads=8, head_size=128, payload_dtype=torch.int8, scale_dtype="float16"
        )
    assert all(issubclass(w.category, DeprecationWarning) for w in caught)
    assert spec.page_size_bytes == 33280
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidSpecError, match="must be one of"):
        QuantizedKVSpec(
            block_size=16, num_kv_heads=8, head_size=128, payload_dtype="bfloat16", scale_dtype="float16"
        )


def test_the_0_1_strategy_registers_as_0_1_did():
    register_spec_strategy(QuantizedKVSpec, quantized_specs())  # 0.1's documented conftest call


def test_the_model_family_kit_keeps_its_0_1_name():
    import importlib
    import sys

    sys.modules.pop("kvcore.plugins.models.common", None)  # warn again, as in a fresh process
    with pytest.warns(DeprecationWarning, match="kvcore.plugins.models.kit"):
        common = importlib.import_module("kvcore.plugins.models.common")
    from kvcore.plugins.models import kit

    assert common.ConfigFields is kit.ConfigFields and common.head_size is kit.head_size
    with pytest.raises(AttributeError, match=r"register kvcore\.ModelFamily"):
        common.claim  # noqa: B018


def test_the_0_1_region_policy_is_refused_naming_the_protocol_change(make_kvcore_registry):
    from tests.plugins.third_party.example_0_1 import separate_regions_0_1

    with pytest.raises(PluginValidationError, match=r"layout\(groups, num_blocks\).*BlockPlacement"):
        make_kvcore_registry(separate_regions_0_1)


def test_a_0_1_policy_without_auto_priority_is_adapted(make_kvcore_registry):
    from kvcore.policies.uniform import UniformPolicy

    class Policy01:  # 0.1 had no auto_priority; its layout already matches 0.2's
        name = "acme.legacy"
        description = "a 0.1 policy"
        _inner = UniformPolicy()

        def why_not(self, specs):
            return self._inner.why_not(specs)

        def group(self, specs, context, options):
            return self._inner.group(specs, context, options)

        def layout(self, groups):
            return self._inner.layout(groups)

    @hookimpl
    def kvcore_register_policies(register):
        register(Policy01())

    plugin = type("Legacy01", (), {"kvcore_register_policies": staticmethod(kvcore_register_policies)})()
    with pytest.warns(DeprecationWarning, match="'acme.legacy' has no auto_priority"):
        registry = make_kvcore_registry(plugin)
    policy = registry.policy("acme.legacy")
    assert policy.auto_priority is None and policy.description == "a 0.1 policy"
    specs = {f"layer{i}": full(block_size=16) for i in range(4)}
    context = SizingContext(max_model_len=256)
    plan = plan_kv_cache(specs, 2**24, context, registry=registry, policy="acme.legacy")
    assert plan.policy == "acme.legacy" and plan.num_blocks > 0
    assert registry.select(specs).name != "acme.legacy"  # auto never picks it


def test_importing_the_removed_claim_names_the_replacement():
    """``from kvcore.plugins.models.common import claim`` (a 0.1 family's first line) says what
    replaced it, not a bare "cannot import name" (issue 38)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ImportError, match=r"removed in kvcore 0\.2: .*ModelFamily\(.*model_types"):
            from kvcore.plugins.models.common import claim  # noqa: F401
        import kvcore.plugins.models.common as common
    assert not hasattr(common, "claim")  # an attribute it is not: hasattr and getattr's default hold
