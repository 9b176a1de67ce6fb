"""Each conformance check catches the bug it is there for (and passes a kind that has none)."""

import attrs
import pytest
import torch

from kvcore import CacheLayout, KVCacheGroup, KVCachePlan, KVCacheSpec, KVCacheTensor, PagePart, hookimpl
from kvcore.errors import InvalidInputError
from kvcore.spec import SizingContext, cdiv
from kvcore.testing import checks
from kvcore.testing.strategies import PlanningProblem
from tests.helpers import full
from tests.testing._ring import Ring


@attrs.frozen(kw_only=True)
class FlatPage(Ring):
    kind = "test.flat_page"

    @property
    def page_size_bytes(self):
        return 64  # does not grow with the block size, yet claims it does


@attrs.frozen(kw_only=True)
class PaddedPage(Ring):
    kind = "test.padded_page"

    @property
    def page_size_bytes(self):
        return -(-self.block_size * 8 // 576) * 576  # 8 bytes a token, padded to 576 as vLLM pads


@attrs.frozen(kw_only=True)
class ShrinkingPage(Ring):
    kind = "test.shrinking_page"

    @property
    def page_size_bytes(self):
        return 4096 // self.block_size


@attrs.frozen(kw_only=True)
class GrowingState(Ring):
    kind = "test.growing_state"
    page_scales_with_block_size = False  # claims a fixed state, yet its page grows


@attrs.frozen(kw_only=True)
class Shrinking(Ring):
    kind = "test.shrinking"

    def max_num_blocks(self, context):
        return 1 if context.max_model_len > 1000 else cdiv(context.max_model_len, self.block_size)


@attrs.frozen(kw_only=True)
class Empty(Ring):
    kind = "test.empty"

    def max_num_blocks(self, context):
        return 0


@attrs.frozen(kw_only=True)
class CappedOnlyInThePlan(Ring):
    """The planner's cap without the pool's (the bug of a fixed-size kind before live_pages):
    the plan counts 64 tokens' pages, but a request holds a page for every token."""

    kind = "test.capped_only_in_the_plan"

    def live_pages(self, num_tokens, num_computed_tokens=0):
        return KVCacheSpec.live_pages(self, num_tokens, num_computed_tokens)

    def max_num_blocks(self, context):
        return cdiv(min(context.max_model_len, 64), self.block_size)


@attrs.frozen(kw_only=True)
class Forgetful(Ring):
    """Frees every page once an odd number of tokens is cached, then wants them back."""

    kind = "test.forgetful"

    def live_pages(self, num_tokens, num_computed_tokens=0):
        return KVCacheSpec.live_pages(self, num_tokens, num_computed_tokens)

    def first_retained_token(self, num_tokens):
        return num_tokens if num_tokens % 2 else 0


@attrs.frozen(kw_only=True)
class Unstable(Ring):
    kind = "test.unstable"

    @property
    def group_key(self):
        return (type(self), id(self))  # equal copies get different keys


@attrs.frozen(kw_only=True)
class ListKey(Ring):
    kind = "test.list_key"

    @property
    def group_key(self):
        return [self.slots]


def _raise_value_error(instance, attribute, value):
    if value > 100:
        raise ValueError("too many slots")


@attrs.frozen(kw_only=True)
class PlainValueError(Ring):
    kind = "test.plain_value_error"
    slots: int = attrs.field(default=4, validator=_raise_value_error)


@attrs.frozen(kw_only=True)
class Drifting(Ring):
    kind = "test.drifting"
    slots: int = attrs.field(default=4, converter=lambda v: v + 1)  # a re-read adds one again


@attrs.frozen(kw_only=True)
class Resizing(Ring):
    kind = "test.resizing"

    def with_block_size(self, block_size):
        return attrs.evolve(self, block_size=block_size, slots=self.slots * 2)


@attrs.frozen(kw_only=True)
class BadMerge(Ring):
    kind = "test.bad_merge"

    @classmethod
    def merge(cls, specs):
        return attrs.evolve(specs[0], slots=specs[0].slots + 1)


@attrs.define(kw_only=True)
class Mutable:
    block_size: int = 16


LAYOUTS = {
    "test.ring": lambda s: CacheLayout.single("ring", (s.block_size, s.slots), torch.uint8),
    "test.overlapping": lambda s: CacheLayout(
        parts=(
            PagePart(name="a", shape=(s.block_size, s.slots), dtype=torch.uint8),
            PagePart(name="b", shape=(s.block_size,), dtype=torch.uint8, offset_bytes=s.block_size),
        )
    ),
    "test.too_big": lambda s: CacheLayout.single("ring", (s.block_size, s.slots + 1), torch.uint8),
    "test.odd_elements": lambda s: CacheLayout.single("ring", (s.block_size * s.slots // 2,), torch.float16),
}


def ring_named(name, kind):
    """A :class:`Ring` under another kind: all that differs is its layout in ``LAYOUTS`` (or none)."""
    return attrs.frozen(kw_only=True)(type(name, (Ring,), {"kind": kind, "__module__": __name__}))


Overlapping = ring_named("Overlapping", "test.overlapping")
TooBig = ring_named("TooBig", "test.too_big")
OddElements = ring_named("OddElements", "test.odd_elements")
NoLayout = ring_named("NoLayout", "test.no_layout")


KINDS = (
    Ring,
    FlatPage,
    GrowingState,
    Shrinking,
    Empty,
    CappedOnlyInThePlan,
    Forgetful,
    Unstable,
    ListKey,
    PlainValueError,
    Drifting,
    Resizing,
    BadMerge,
    Overlapping,
    TooBig,
    OddElements,
    NoLayout,
)


class Plugin:
    @hookimpl
    def kvcore_register_spec_kinds(self, register):
        for cls in KINDS:
            register(cls)

    @hookimpl
    def kvcore_cache_layout(self, spec):
        make = LAYOUTS.get(spec.kind)
        return make(spec) if make else None


@pytest.fixture
def kinds(make_kvcore_registry):
    return make_kvcore_registry(Plugin())


def test_a_sound_kind_passes_every_check(kinds):
    spec = Ring(block_size=3, slots=5)
    checks.check_frozen_and_hashable(spec)
    checks.check_kind_registered(Ring, kinds)
    checks.check_json_round_trip(spec, kinds)
    checks.check_page_size(spec)
    checks.check_page_size_vs_block_size(spec, 4)
    checks.check_with_block_size(spec, 7)
    checks.check_max_usage_monotone(spec, SizingContext(max_model_len=10), SizingContext(max_model_len=5000))
    checks.check_group_key_stable(spec, kinds)
    checks.check_merge_of_equal_specs(spec)
    checks.check_rejects_arguments(spec, {"slots": 0})
    checks.check_bad_json_rejected(spec, kinds)
    checks.check_cache_layout(spec, kinds)
    checks.check_pool_follows_spec(
        spec, SizingContext(max_model_len=300, max_num_batched_tokens=7), [1, 5, 7]
    )
    checks.check_joint_peak(spec, SizingContext(max_model_len=300, max_num_batched_tokens=7))


@attrs.frozen(kw_only=True)
class Windowed(Ring):
    """The default ``live_pages``, freeing all but the last 8 tokens, with a ``growth_steps``
    that claims its pages never grow: the joint peak would count only its first step."""

    kind = "test.windowed"

    def live_pages(self, num_tokens, num_computed_tokens=0):
        return KVCacheSpec.live_pages(self, num_tokens, num_computed_tokens)

    def first_retained_token(self, num_tokens):
        return max(0, num_tokens - 8)

    def growth_steps(self, context):
        return range(0)


def test_catches_growth_steps_that_miss_a_step_where_pages_grow():
    with pytest.raises(AssertionError, match=r"growth_steps\(.*\) must list every step start"):
        checks.check_joint_peak(
            Windowed(block_size=4), SizingContext(max_model_len=64, max_num_batched_tokens=4)
        )


def test_catches_a_pool_that_holds_more_than_the_plan():
    # at 4,096 tokens of block 16 the pool holds 256 pages; the plan counted 4 (64 tokens)
    with pytest.raises(
        AssertionError,
        match=r"a request holds 5 pages \(live_pages is range\(0, 5\)\) but the plan counts at most 4",
    ):
        checks.check_pool_follows_spec(
            CappedOnlyInThePlan(block_size=16),
            SizingContext(max_model_len=4096, max_num_batched_tokens=16),
            [],
        )


def test_catches_a_pool_that_holds_fewer_pages_than_the_spec_needs():
    with pytest.raises(AssertionError, match=r"after a step from 2 to 3 tokens .* lacks the entries \[0\]"):
        checks.check_pool_follows_spec(Forgetful(block_size=1), SizingContext(max_model_len=8), [1, 1, 1])


def test_misused_pool_check_says_so():
    with pytest.raises(InvalidInputError, match="every step must be an int from 1 to 8"):
        checks.check_pool_follows_spec(Ring(block_size=1), SizingContext(max_model_len=8), [9])


def test_catches_a_mutable_class():
    with pytest.raises(AssertionError, match="not an attrs class"):
        checks.check_frozen_and_hashable(object())
    with pytest.raises(AssertionError, match="accepts assignments to 'block_size'"):
        checks.check_frozen_and_hashable(Mutable())


def test_catches_an_unregistered_or_nameless_kind(kinds, make_kvcore_registry):
    with pytest.raises(AssertionError, match=r"spec kind 'test\.ring' is not in the registry"):
        checks.check_kind_registered(Ring, make_kvcore_registry())

    class Nameless(Ring):
        kind = ""

    with pytest.raises(AssertionError, match="needs a non-empty 'kind'"):
        checks.check_kind_registered(Nameless, kinds)


def test_catches_a_kind_another_installed_plugin_also_registers(install):
    install()  # an installed distribution registering its own class as 'acme.ring'

    @attrs.frozen(kw_only=True)
    class AcmeRing(Ring):
        kind = "acme.ring"

    class Mine:
        @hookimpl
        def kvcore_register_spec_kinds(self, register):
            register(AcmeRing)

    with pytest.raises(AssertionError, match=r"spec kind 'acme\.ring' is registered twice"):
        checks.check_kind_unique(AcmeRing, [Mine()])


def test_catches_pages_that_ignore_the_block_size():
    with pytest.raises(AssertionError, match=r"must grow with the block size \(block 4 -> 64 bytes"):
        checks.check_page_size_vs_block_size(FlatPage(block_size=4), 8)
    with pytest.raises(AssertionError, match="sets page_scales_with_block_size = False but its page changes"):
        checks.check_page_size_vs_block_size(GrowingState(block_size=4), 8)
    with pytest.raises(AssertionError, match=r"must not shrink as the block size grows \(block 4 -> 1024"):
        checks.check_page_size_vs_block_size(ShrinkingPage(block_size=4), 8)


def test_a_padded_page_may_keep_its_size_over_a_run_of_block_sizes():
    # 4 and 8 tokens both pad to 576 bytes; the page grows once the tokens outgrow the padding
    checks.check_page_size_vs_block_size(PaddedPage(block_size=4), 8)
    checks.check_page_size_vs_block_size(PaddedPage(block_size=64), 80)


def test_catches_usage_that_shrinks_or_is_empty():
    short, long = SizingContext(max_model_len=900), SizingContext(max_model_len=2000)
    with pytest.raises(AssertionError, match="a request of 2000 tokens needs 64 bytes but one of 900"):
        checks.check_max_usage_monotone(Shrinking(block_size=16), short, long)
    with pytest.raises(AssertionError, match="max_num_blocks must be an int >= 1"):
        checks.check_max_usage_monotone(Empty(block_size=16), short, long)


def test_catches_unstable_or_unhashable_group_keys(kinds):
    with pytest.raises(AssertionError, match="group_key changes after an equal copy"):
        checks.check_group_key_stable(Unstable(block_size=16), kinds)
    with pytest.raises(AssertionError, match=r"group_key \[4\] is not hashable"):
        checks.check_group_key_stable(ListKey(block_size=16), kinds)


def test_catches_bad_arguments_that_are_accepted_or_raise_the_wrong_error():
    with pytest.raises(AssertionError, match=r"accepted bad arguments \{'slots': 7\}"):
        checks.check_rejects_arguments(Ring(block_size=1), {"slots": 7})
    with pytest.raises(AssertionError, match="raised ValueError: too many slots; bad arguments must raise"):
        checks.check_rejects_arguments(PlainValueError(block_size=1), {"slots": 101})


def test_misused_kit_says_so():
    with pytest.raises(InvalidInputError, match=r"lacks: \['heads'\]"):
        checks.check_rejects_arguments(Ring(block_size=1), {"heads": 0})


def test_catches_json_that_reads_back_different(kinds):
    with pytest.raises(AssertionError, match="reads back from"):
        checks.check_json_round_trip(Drifting(block_size=1, slots=4), kinds)


def test_catches_with_block_size_and_merge_that_change_fields():
    with pytest.raises(AssertionError, match=r"also changed \['slots'\]"):
        checks.check_with_block_size(Resizing(block_size=4), 8)
    with pytest.raises(AssertionError, match="merging two copies"):
        checks.check_merge_of_equal_specs(BadMerge(block_size=4))


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (Overlapping, "parts 'a' and 'b' overlap in page 0"),
        (TooBig, "layout part 'ring' ends at byte 30 but a page has only 24 bytes"),
        (OddElements, r"page of 15 bytes is not a whole number of float16 elements"),
        (NoLayout, "no plugin gives a cache layout for spec kind 'test.no_layout'"),
    ],
)
def test_catches_layouts_that_leave_the_page(kinds, cls, match):
    spec = cls(block_size=3, slots=5) if cls is OddElements else cls(block_size=6, slots=4)
    with pytest.raises(AssertionError, match=match):
        checks.check_cache_layout(spec, kinds)


# -- policies ------------------------------------------------------------------------------


def _plan(num_blocks=4, **kw):
    """Two layers of one group whose pages sit on the same bytes (a broken layout)."""
    fields = dict(
        policy="test",
        num_blocks=num_blocks,
        bytes_per_block=256,
        single_buffer=True,
        groups=[KVCacheGroup(layer_names=["a", "b"], spec=Ring(block_size=64))],
        tensors=[
            KVCacheTensor(size=num_blocks * 256, offset=0, page_stride=256, shared_by=["a"]),
            KVCacheTensor(size=num_blocks * 256, offset=0, page_stride=256, shared_by=["b"]),
        ],
        context=SizingContext(max_model_len=64),
        available_memory_bytes=1024,
    )
    return KVCachePlan(**{**fields, **kw})


def _problem(budget=1024, layers=("a", "b")):
    return PlanningProblem(
        specs={name: Ring(block_size=64) for name in layers},
        context=SizingContext(max_model_len=64),
        available_bytes=budget,
    )


def test_catches_plans_over_budget_or_missing_layers():
    with pytest.raises(AssertionError, match=r"allocates 1024 bytes .* but the budget is 1000"):
        checks.check_within_budget(_plan(available_memory_bytes=1000), _problem(budget=1000))
    with pytest.raises(AssertionError, match=r"the groups miss layers \['c'\]"):
        checks.check_every_layer_placed_once(_plan(), _problem(layers=("a", "b", "c")))


def test_catches_live_pages_on_the_same_bytes_and_capacity_above_ideal():
    # both layers of one group on the same bytes: a block id's page of 'a' overwrites 'b''s
    stacked = _plan()
    with pytest.raises(
        AssertionError, match=r"overlaps live pages: bytes 0\.\.256 are used by pages of one group"
    ):
        checks.check_no_live_overlap(stacked)
    with pytest.raises(
        AssertionError, match=r"claims 4\.0000 requests at once but no layout can hold more than 2"
    ):
        checks.check_not_above_ideal(stacked, _problem())


def test_catches_nondeterminism_and_shrinking_plans():
    with pytest.raises(AssertionError, match="two different plans"):
        checks.check_same_plan(_plan(), _plan(num_blocks=3))
    with pytest.raises(AssertionError, match="2048 bytes give 3 blocks"):
        checks.check_more_memory_not_worse(_plan(), _plan(num_blocks=3, available_memory_bytes=2048))


def test_catches_silent_refusals(registry):
    class Silent:
        name = "uniform"

        def why_not(self, specs):
            return ""

    with pytest.raises(AssertionError, match="why_not must return None or a non-empty sentence"):
        checks.check_refusal(Silent(), _problem(), registry)
    mixed = PlanningProblem(
        specs={"a": full(), "b": full(heads=4)},
        context=SizingContext(max_model_len=64),
        available_bytes=2**20,
    )
    assert checks.check_refusal(registry.policy("uniform"), mixed, registry) is False
    assert checks.check_refusal(registry.policy("shared_buffer"), mixed, registry) is True


# -- offload units -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RingAsBlocks(Ring):
    kind = "test.ring_as_blocks"
    offload_unit = "block"  # but it reuses its first pages: entry k does not hold tokens [kT, (k+1)T)


@attrs.frozen(kw_only=True)
class TokensAsCheckpoint(Ring):
    kind = "test.tokens_as_checkpoint"
    offload_unit = "checkpoint"


@attrs.frozen(kw_only=True)
class GrowingRequest(Ring):
    kind = "test.growing_request"
    offload_unit = "request"  # yet its pages grow with the request's tokens (up to its ring)


@attrs.frozen(kw_only=True)
class UnknownUnit(Ring):
    kind = "test.unknown_unit"
    offload_unit = "sometimes"


def test_a_sound_offload_unit_passes(kinds):
    checks.check_offload_unit(full(block_size=4), [1, 4, 5, 1000])
    checks.check_offload_unit(Ring(block_size=4), [1, 1000])  # "none" claims nothing
    checks.check_offload_round_trip(full(block_size=4, heads=1, head_size=8), kinds, [0, 3, 7])
    checks.check_offload_round_trip(Ring(block_size=4), kinds, [1])  # "none" is refused


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (RingAsBlocks, r"a request of 100 tokens has 16 entries, not 25"),
        (TokensAsCheckpoint, "'checkpoint' is for states"),
        (GrowingRequest, "live_pages differs with the length"),
        (UnknownUnit, "offload_unit is 'sometimes'"),
    ],
)
def test_catches_an_offload_unit_that_live_pages_contradicts(cls, match):
    with pytest.raises(AssertionError, match=match):
        checks.check_offload_unit(cls(block_size=4), [1, 30, 100])


def test_the_registry_refuses_an_unknown_offload_unit(make_kvcore_registry):
    from kvcore.errors import KVCoreError

    class Plugin:
        @hookimpl
        def kvcore_register_spec_kinds(self, register):
            register(UnknownUnit)

    with pytest.raises(KVCoreError, match="offload_unit is 'sometimes'; it must be one of none, block"):
        make_kvcore_registry(Plugin())


def test_catches_pages_that_do_not_come_back(kinds, monkeypatch):
    from kvcore.runtime.host_tier import HostTier

    monkeypatch.setattr(HostTier, "restore", lambda self, group, slots, pages: None)
    with pytest.raises(
        AssertionError, match="part 'kv' of pages \\[2\\] came back from the host tier changed"
    ):
        checks.check_offload_round_trip(full(block_size=4, heads=1, head_size=8), kinds, [2])


def test_catches_a_none_kind_whose_pages_are_taken(kinds, monkeypatch):
    from kvcore.runtime.host_tier import HostTier

    monkeypatch.setattr(HostTier, "offload", lambda self, group, pages: [0])
    with pytest.raises(AssertionError, match="offload_unit is 'none' but the host tier took its pages"):
        checks.check_offload_round_trip(Ring(block_size=4), kinds, [1])
