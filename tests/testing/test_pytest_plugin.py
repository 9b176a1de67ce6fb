"""kvcore's pytest plugin and suites, as a plugin author meets them: a pytest session in a folder
outside this checkout, with nothing but kvcore installed (run in this process: the inner suites
carry their own hypothesis settings and change no profile)."""

import pytest

pytest_plugins = ["pytester"]

RING = '''
import attrs
import torch
from hypothesis import strategies as st
from kvcore import CacheLayout, KVCacheGroup, BlockPlacement, KVCacheSpec, TensorPlacement, hookimpl
from kvcore.spec import cdiv, positive_int


@attrs.frozen(kw_only=True)
class RingSpec(KVCacheSpec):
    kind = "acme.ring"
    slots: int = attrs.field(validator=positive_int)

    @property
    def page_size_bytes(self):
        return self.block_size * self.slots

    def live_pages(self, num_tokens, num_computed_tokens=0):  # a ring of 64 tokens' pages
        return range(min(cdiv(num_tokens, self.block_size), cdiv(64, self.block_size)))


@attrs.frozen(kw_only=True)
class ShrinkingSpec(RingSpec):
    kind = "acme.shrinking"

    def max_num_blocks(self, context):
        return 1 if context.max_model_len > 1000 else cdiv(context.max_model_len, self.block_size)


class StackedPolicy:
    """Broken on purpose: every layer of a group on the same bytes."""

    name = "acme.stacked"
    description = "puts every layer of a group on the same bytes"
    auto_priority = None

    def why_not(self, specs):
        return None

    def group(self, specs, context, options):
        buckets = {}
        for name, spec in specs.items():
            buckets.setdefault(spec.group_key, []).append(name)
        return [KVCacheGroup(layer_names=names, spec=specs[names[0]]) for names in buckets.values()]

    def layout(self, groups):
        row = max(g.spec.page_size_bytes for g in groups)
        tensors = [
            TensorPlacement(offset=0, page_stride=row, shared_by=[name])
            for g in groups
            for name in g.layer_names
        ]
        return BlockPlacement(bytes_per_block=row, single_buffer=True, tensors=tensors)


@hookimpl
def kvcore_register_spec_kinds(register):
    register(RingSpec)
    register(ShrinkingSpec)


@hookimpl
def kvcore_register_policies(register):
    register(StackedPolicy())


@hookimpl
def kvcore_cache_layout(spec):
    if isinstance(spec, RingSpec):
        return CacheLayout.single("ring", (spec.block_size, spec.slots), torch.uint8)


def ring_specs(cls=RingSpec):
    return st.builds(cls, block_size=st.integers(1, 64), slots=st.integers(1, 16))
'''

SUITES = """
import pytest
from hypothesis import Phase, settings
from kvcore.testing import strategies as kst
from kvcore.testing.conformance import PolicyConformance, SpecKindConformance

import ring

# a short, derandomized run without shrinking or a database (the same examples every time, so
# the failures below, which are on purpose, are found every time)
SHORT = settings(max_examples=15, deadline=None, phases=[Phase.generate], database=None, derandomize=True)


class TestRing(SpecKindConformance):
    hypothesis_settings = SHORT

    @pytest.fixture
    def spec_cls(self):
        return ring.RingSpec

    @pytest.fixture
    def valid_specs(self):
        return ring.ring_specs()

    @pytest.fixture
    def invalid_kwargs(self):
        return ({"slots": 0},)

    @pytest.fixture
    def kvcore_plugins(self):
        return (ring,)


class TestShrinking(TestRing):
    @pytest.fixture
    def spec_cls(self):
        return ring.ShrinkingSpec

    @pytest.fixture
    def valid_specs(self):
        return ring.ring_specs(ring.ShrinkingSpec)

    @pytest.fixture
    def expected_failures(self):
        return {"test_max_usage_never_shrinks_with_length": "shrinks past 1000 tokens on purpose"}


class TestShrinkingUndeclared(TestShrinking):
    @pytest.fixture
    def expected_failures(self):
        return {}


class TestPassingCheckDeclaredFailing(TestRing):
    @pytest.fixture
    def expected_failures(self):
        return {"test_json_round_trip": "it does not fail, so strict xfail reports it"}


class TestTypo(TestRing):
    @pytest.fixture
    def expected_failures(self):
        return {"test_jsn_round_trip": "misspelt"}


class TestForgotSpecCls(SpecKindConformance):
    pass


class TestStacked(PolicyConformance):
    hypothesis_settings = SHORT

    @pytest.fixture
    def policy_name(self):
        return "acme.stacked"

    @pytest.fixture
    def kvcore_plugins(self):
        return (ring,)

    @pytest.fixture
    def layer_maps(self):
        return kst.layer_specs(min_layers=2, max_layers=6, spec_strategy=kst.specs(["full_attention"]))

    @pytest.fixture
    def expected_failures(self):
        # every layer of a group on the same bytes: the planner refuses every plan it makes, so
        # every check that plans fails
        refused = "the planner refuses its plans: layers of one group share bytes"
        return dict.fromkeys(
            [
                "test_live_pages_never_overlap",
                "test_capacity_never_beats_the_ideal",
                "test_forced_block_count_is_honoured",
                "test_equal_inputs_give_equal_plans",
                "test_every_layer_is_placed_once",
                "test_more_memory_never_gives_fewer_blocks",
                "test_plan_json_round_trip",
                "test_plan_stays_within_budget",
                "test_ranges_stay_in_bounds",
            ],
            refused,
        )
"""

FIXTURES = """
import ring


def test_fixtures_come_from_the_plugin(kvcore_registry, make_kvcore_registry):
    assert "full_attention" in kvcore_registry.kinds
    assert "acme.ring" in make_kvcore_registry(ring).kinds
"""


@pytest.fixture
def outer_pytest(pytester):
    pytester.makepyfile(ring=RING, test_suites=SUITES, test_fixtures=FIXTURES)
    return pytester


@pytest.mark.slow  # a whole pytest run of an author's project inside this one (~8 s)
def test_the_suites_run_in_an_authors_project(outer_pytest):
    # every check of TestRing and TestStacked; two checks of the other classes
    selection = "TestRing or TestStacked or max_usage or json_round_trip or fixtures"
    result = outer_pytest.runpytest_inprocess("-p", "no:cacheprovider", "-rA", "-k", selection)
    outcomes = result.parseoutcomes()
    # TestRing 17; TestShrinking, TestShrinkingUndeclared, TestPassingCheckDeclaredFailing one
    # each; TestStacked 12 - 9 declared failures (the planner refuses its plans); the fixture test
    assert outcomes.get("passed") == 17 + 3 + 3 + 1, result.stdout.str()
    assert outcomes.get("xfailed") == 1 + 9
    assert outcomes.get("failed") == 2  # the undeclared failure and the strict xpass
    assert outcomes.get("errors") == 2 + 2  # TestTypo and TestForgotSpecCls run no check
    result.stdout.fnmatch_lines(
        [
            "*FAILED*TestShrinkingUndeclared::test_max_usage_never_shrinks_with_length*",
            "*FAILED*TestPassingCheckDeclaredFailing::test_json_round_trip*",
        ]
    )
    out = result.stdout.str()
    assert "the worst case must not shrink as requests grow" in out
    assert "expected_failures names checks this suite does not have: ['test_jsn_round_trip']" in out
    assert "override the 'spec_cls' fixture in your subclass" in out


def test_the_fixtures_go_away_with_the_plugin(outer_pytest):
    result = outer_pytest.runpytest_inprocess("-p", "no:kvcore", "-p", "no:cacheprovider", "test_fixtures.py")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'kvcore_registry' not found*"])
