"""Conformance suites for spec kinds and allocation policies: subclass one in your tests.

Override the fixtures that describe your plugin and pytest runs every check on it (the
fsspec pattern)::

    import pytest
    from kvcore.testing.conformance import SpecKindConformance

    class TestRingSpec(SpecKindConformance):
        @pytest.fixture
        def spec_cls(self):
            return RingSpec

        @pytest.fixture
        def kvcore_plugins(self):
            return (ring_plugin,)

The checks themselves are plain functions in :mod:`kvcore.testing.checks`; the suites draw
objects with hypothesis and call them, with the settings of your hypothesis profile unless the
subclass sets ``hypothesis_settings``. A check
that your plugin fails on purpose goes in the ``expected_failures`` fixture with its reason; it
is then marked ``xfail(strict=True)``, so the day it passes you hear about it.

The fixtures ``kvcore_plugins`` and ``kvcore_registry`` come from kvcore's pytest plugin
(:mod:`kvcore.testing.pytest_plugin`), which pytest loads when kvcore is installed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given, reject, settings, strategies as st

from kvcore.errors import KVCoreError, UnknownPolicyError
from kvcore.plan import KVCachePlan
from kvcore.planning.registry import Registry
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.testing import checks
from kvcore.testing.registries import build_registry
from kvcore.testing.strategies import (
    PlanningProblem,
    layer_specs,
    planning_problems,
    serving_options,
    sizing_contexts,
    spec_strategy,
    specs,
)

#: Requests drawn for the length checks are at most this long.
MAX_CHECKED_LEN = 2**17
#: Requests a block pool is driven through are at most this long (every step is simulated).
MAX_POOL_LEN = 1024


_Check = Callable[[Any, st.DataObject], None]


def _drawing(check: _Check, hypothesis_settings: settings | None = None) -> Callable[[Any], None]:
    """Make ``check`` a hypothesis test that draws through ``data``.

    Every subclass of a suite gets its own wrapper (:meth:`_Conformance.__init_subclass__`):
    hypothesis refuses to run one wrapped method from instances of several classes.
    """
    test: Any = given(data=st.data())(check)
    if hypothesis_settings is not None:
        test = hypothesis_settings(test)
    test.kvcore_check = check
    return test  # type: ignore[no-any-return]


class _Conformance:
    """What both suites share: the ``expected_failures`` fixture and how it is applied."""

    #: Hypothesis settings for this suite's checks, e.g. ``settings(max_examples=25)``; by
    #: default they follow the loaded hypothesis profile.
    hypothesis_settings: settings | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            check = getattr(getattr(cls, name), "kvcore_check", None)
            if name.startswith("test_") and check is not None:
                setattr(cls, name, _drawing(check, cls.hypothesis_settings))

    @pytest.fixture
    def expected_failures(self) -> Mapping[str, str]:
        """``{check name: reason}`` for checks this plugin fails on purpose (default: none)."""
        return {}

    @classmethod
    def check_names(cls) -> tuple[str, ...]:
        """The names of every check of this suite (the ``test_*`` methods)."""
        return tuple(sorted(name for name in dir(cls) if name.startswith("test_")))

    def _apply_expected_failures(self, request: pytest.FixtureRequest, expected: Mapping[str, str]) -> None:
        unknown = sorted(set(expected) - set(self.check_names()))
        if unknown:
            pytest.fail(
                f"expected_failures names checks this suite does not have: {unknown}; "
                f"the checks are {', '.join(self.check_names())}",
                pytrace=False,
            )
        name = getattr(request.node, "originalname", request.node.name)
        reason = expected.get(name)
        if reason is None:
            return
        if not isinstance(reason, str) or not reason.strip():
            pytest.fail(f"expected_failures[{name!r}] must give the reason as a sentence", pytrace=False)
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


def _draw_pool_context(data: st.DataObject) -> SizingContext:
    """A context a block pool is driven through: requests up to :data:`MAX_POOL_LEN` tokens,
    steps up to 512, and drawn serving options (speculative tokens, state-cache mode, encoder
    tokens)."""
    return SizingContext(
        max_model_len=data.draw(st.integers(1, MAX_POOL_LEN), label="max_model_len"),
        max_num_batched_tokens=data.draw(st.integers(1, 512), label="max_num_batched_tokens"),
        **data.draw(serving_options(), label="serving options"),
    )


def _must_override(fixture: str, what: str) -> Any:
    pytest.fail(f"override the {fixture!r} fixture in your subclass: return {what}", pytrace=False)


@attrs.frozen(kw_only=True)
class SpecKit:
    """What the spec-kind checks run on, read from the fixtures once per test.

    Attributes:
        spec_cls: the kind under test.
        specs: draws valid instances of it.
        invalid_kwargs: overlays that must make a valid spec invalid.
        registry: built-ins plus the plugins under test.
        plugins: the plugins under test (``kvcore_plugins``).
    """

    spec_cls: type[KVCacheSpec]
    specs: st.SearchStrategy[KVCacheSpec]
    invalid_kwargs: tuple[Mapping[str, Any], ...]
    registry: Registry
    plugins: tuple[object, ...]


class SpecKindConformance(_Conformance):
    """Every check a spec kind must pass. Override ``spec_cls`` and, unless the kind's plugin
    registers a strategy (the ``kvcore_register_spec_strategies`` hook, or
    :func:`kvcore.testing.strategies.register_spec_strategy` in a ``conftest.py``),
    ``valid_specs``; list the plugin in ``kvcore_plugins`` unless it is a built-in.
    """

    kit: SpecKit

    @pytest.fixture
    def spec_cls(self) -> type[KVCacheSpec]:
        """The :class:`~kvcore.KVCacheSpec` subclass under test (override it)."""
        return _must_override("spec_cls", "your KVCacheSpec subclass")  # type: ignore[no-any-return]

    @pytest.fixture
    def valid_specs(
        self, spec_cls: type[KVCacheSpec], kvcore_registry: Registry
    ) -> st.SearchStrategy[KVCacheSpec]:
        """A strategy drawing valid instances (default: the one registered for ``spec_cls``)."""
        return spec_strategy(spec_cls, registry=kvcore_registry)

    @pytest.fixture
    def invalid_kwargs(self) -> Sequence[Mapping[str, Any]]:
        """Field overlays that make any valid spec invalid, e.g. ``[{"num_kv_heads": 0}]``.

        Each is applied to the fields of a drawn valid spec and must raise
        :class:`~kvcore.InvalidSpecError`; give every field for a rule that spans several. Bad
        block sizes are always checked.
        """
        return ()

    @pytest.fixture(autouse=True)
    def _kvcore_spec_kit(
        self,
        request: pytest.FixtureRequest,
        spec_cls: type[KVCacheSpec],
        valid_specs: st.SearchStrategy[KVCacheSpec],
        invalid_kwargs: Sequence[Mapping[str, Any]],
        kvcore_registry: Registry,
        kvcore_plugins: Sequence[object],
        expected_failures: Mapping[str, str],
    ) -> None:
        self._apply_expected_failures(request, expected_failures)
        self.kit = SpecKit(
            spec_cls=spec_cls,
            specs=valid_specs,
            invalid_kwargs=tuple(invalid_kwargs),
            registry=kvcore_registry,
            plugins=tuple(kvcore_plugins),
        )

    def _draw(self, data: st.DataObject) -> KVCacheSpec:
        spec = data.draw(self.kit.specs, label="spec")
        if not isinstance(spec, self.kit.spec_cls):
            pytest.fail(f"valid_specs drew {spec!r}, not a {self.kit.spec_cls.__qualname__}", pytrace=False)
        return spec

    def test_kind_is_registered(self) -> None:
        checks.check_kind_registered(self.kit.spec_cls, self.kit.registry)

    def test_kind_is_unique_among_installed_plugins(self) -> None:
        checks.check_kind_unique(self.kit.spec_cls, self.kit.plugins)

    @_drawing
    def test_is_frozen_and_hashable(self, data: st.DataObject) -> None:
        checks.check_frozen_and_hashable(self._draw(data))

    @_drawing
    def test_json_round_trip(self, data: st.DataObject) -> None:
        checks.check_json_round_trip(self._draw(data), self.kit.registry)

    @_drawing
    def test_page_size_is_a_positive_int(self, data: st.DataObject) -> None:
        checks.check_page_size(self._draw(data))

    @_drawing
    def test_page_size_follows_block_size(self, data: st.DataObject) -> None:
        spec = self._draw(data)
        larger = data.draw(st.integers(spec.block_size + 1, 16 * spec.block_size + 16), label="larger")
        checks.check_page_size_vs_block_size(spec, larger)

    @_drawing
    def test_with_block_size_changes_only_the_block_size(self, data: st.DataObject) -> None:
        spec = self._draw(data)
        checks.check_with_block_size(spec, data.draw(st.integers(1, 1024), label="block_size"))

    @_drawing
    def test_max_usage_never_shrinks_with_length(self, data: st.DataObject) -> None:
        spec = self._draw(data)
        a, b = sorted(data.draw(st.lists(st.integers(1, MAX_CHECKED_LEN), min_size=2, max_size=2)))
        step = data.draw(st.integers(1, 8192), label="max_num_batched_tokens")
        checks.check_max_usage_monotone(
            spec,
            SizingContext(max_model_len=a, max_num_batched_tokens=step),
            SizingContext(max_model_len=b, max_num_batched_tokens=step),
        )

    @_drawing
    def test_block_pool_holds_what_the_spec_says_within_the_plan(self, data: st.DataObject) -> None:
        spec = self._draw(data)
        context = _draw_pool_context(data)
        steps = st.lists(st.integers(1, context.max_tokens_per_step), max_size=24)
        # the planner sizes the spec for the context's serving options (sized_for) first
        sized = checks.check_sized_for(spec, context)
        checks.check_pool_follows_spec(sized, context, data.draw(steps, label="steps"))

    @_drawing
    def test_joint_peak_covers_every_step(self, data: st.DataObject) -> None:
        spec = self._draw(data)
        context = _draw_pool_context(data)
        checks.check_joint_peak(checks.check_sized_for(spec, context), context)

    @_drawing
    def test_group_key_is_stable(self, data: st.DataObject) -> None:
        checks.check_group_key_stable(self._draw(data), self.kit.registry)

    @_drawing
    def test_merge_of_equal_specs(self, data: st.DataObject) -> None:
        checks.check_merge_of_equal_specs(self._draw(data))

    @_drawing
    def test_bad_arguments_raise_invalid_spec_error(self, data: st.DataObject) -> None:
        spec = self._draw(data)
        for value in checks.BAD_BLOCK_SIZES:
            checks.check_rejects_arguments(spec, {"block_size": value})
        for overlay in self.kit.invalid_kwargs:
            checks.check_rejects_arguments(spec, overlay)

    @_drawing
    def test_bad_json_raises_invalid_spec_error(self, data: st.DataObject) -> None:
        checks.check_bad_json_rejected(self._draw(data), self.kit.registry)

    @_drawing
    def test_cache_layout_fits_in_one_page(self, data: st.DataObject) -> None:
        checks.check_cache_layout(self._draw(data), self.kit.registry)

    @_drawing
    def test_offload_unit_matches_live_pages(self, data: st.DataObject) -> None:
        lengths = data.draw(st.lists(st.integers(1, MAX_POOL_LEN), min_size=1, max_size=6), label="lengths")
        checks.check_offload_unit(self._draw(data), lengths)

    @_drawing
    def test_offloaded_pages_come_back(self, data: st.DataObject) -> None:
        pages = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True), label="pages")
        checks.check_offload_round_trip(self._draw(data), self.kit.registry, pages)


@attrs.frozen(kw_only=True)
class PolicyKit:
    """What the policy checks run on, read from the fixtures once per test.

    Attributes:
        policy: the policy under test, as registered.
        problems: draws planning problems.
        options: the plan options every plan is made with.
        registry: built-ins plus the plugins under test.
        plugins: the plugins under test (``kvcore_plugins``).
    """

    policy: AllocationPolicy
    problems: st.SearchStrategy[PlanningProblem]
    options: PlanOptions
    registry: Registry
    plugins: tuple[object, ...]

    def plan(self, problem: PlanningProblem, **kwargs: Any) -> KVCachePlan:
        """Plan ``problem`` with the policy under test (keyword arguments as for PlanningProblem.plan)."""
        return problem.plan(self.policy.name, self.registry, options=self.options, **kwargs)


class PolicyConformance(_Conformance):
    """Every invariant a policy's plans must keep. Override ``policy_name``; override
    ``layer_maps`` when the policy plans only some mixes (e.g. one spec for all layers), and list
    the plugin in ``kvcore_plugins`` unless it is a built-in.
    """

    kit: PolicyKit

    @pytest.fixture
    def policy_name(self) -> str:
        """The registered name of the policy under test (override it)."""
        return _must_override("policy_name", "the policy's registered name")  # type: ignore[no-any-return]

    @pytest.fixture
    def layer_maps(self, kvcore_registry: Registry) -> st.SearchStrategy[dict[str, KVCacheSpec]]:
        """``{layer: spec}`` maps to plan (default: up to 12 layers of every registered kind)."""
        return layer_specs(max_layers=12, spec_strategy=specs(registry=kvcore_registry))

    @pytest.fixture
    def contexts(self) -> st.SearchStrategy[SizingContext]:
        """Sizing contexts to plan for (default: requests up to 2048 tokens)."""
        return sizing_contexts(
            max_model_len=st.integers(1, 2048), max_num_batched_tokens=st.integers(1, 2048)
        )

    @pytest.fixture
    def plan_options(self) -> PlanOptions:
        """The options every plan is made with (default :class:`~kvcore.PlanOptions`)."""
        return PlanOptions()

    @pytest.fixture(autouse=True)
    def _kvcore_policy_kit(
        self,
        request: pytest.FixtureRequest,
        policy_name: str,
        layer_maps: st.SearchStrategy[dict[str, KVCacheSpec]],
        contexts: st.SearchStrategy[SizingContext],
        plan_options: PlanOptions,
        kvcore_registry: Registry,
        kvcore_plugins: Sequence[object],
        expected_failures: Mapping[str, str],
    ) -> None:
        self._apply_expected_failures(request, expected_failures)
        try:
            policy = kvcore_registry.policy(policy_name)
        except UnknownPolicyError as exc:
            pytest.fail(f"{exc}; list the plugin that registers it in kvcore_plugins", pytrace=False)
        self.kit = PolicyKit(
            policy=policy,
            problems=planning_problems(layer_maps=layer_maps, contexts=contexts),
            options=plan_options,
            registry=kvcore_registry,
            plugins=tuple(kvcore_plugins),
        )

    def _draw_plannable(self, data: st.DataObject) -> PlanningProblem:
        problem = data.draw(self.kit.problems, label="problem")
        if self.kit.policy.why_not(problem.specs) is not None:
            reject()
        return problem

    def test_policy_is_registered(self) -> None:
        policy = self.kit.policy
        if not isinstance(policy, AllocationPolicy):
            pytest.fail(f"{policy!r} does not follow kvcore.AllocationPolicy", pytrace=False)
        for attribute in ("name", "description"):
            value = getattr(policy, attribute)
            if not isinstance(value, str) or not value.strip():
                pytest.fail(f"policy {policy!r}: {attribute!r} must be a non-empty string (got {value!r})")

    def test_policy_is_unique_among_installed_plugins(self) -> None:
        try:
            installed = build_registry(*self.kit.plugins, autoload=True)
        except KVCoreError as exc:
            pytest.fail(f"{exc}", pytrace=False)
        if type(installed.policy(self.kit.policy.name)) is not type(self.kit.policy):
            pytest.fail(f"policy name {self.kit.policy.name!r} belongs to another installed plugin")

    @_drawing
    def test_refuses_only_with_a_reason(self, data: st.DataObject) -> None:
        problem = data.draw(self.kit.problems, label="problem")
        checks.check_refusal(self.kit.policy, problem, self.kit.registry)

    @_drawing
    def test_plan_stays_within_budget(self, data: st.DataObject) -> None:
        problem = self._draw_plannable(data)
        checks.check_within_budget(self.kit.plan(problem), problem)

    @_drawing
    def test_every_layer_is_placed_once(self, data: st.DataObject) -> None:
        problem = self._draw_plannable(data)
        checks.check_every_layer_placed_once(self.kit.plan(problem), problem)

    @_drawing
    def test_ranges_stay_in_bounds(self, data: st.DataObject) -> None:
        checks.check_ranges_in_bounds(self.kit.plan(self._draw_plannable(data)))

    @_drawing
    def test_live_pages_never_overlap(self, data: st.DataObject) -> None:
        checks.check_no_live_overlap(self.kit.plan(self._draw_plannable(data)))

    @_drawing
    def test_capacity_never_beats_the_ideal(self, data: st.DataObject) -> None:
        problem = self._draw_plannable(data)
        checks.check_not_above_ideal(self.kit.plan(problem), problem)

    @_drawing
    def test_equal_inputs_give_equal_plans(self, data: st.DataObject) -> None:
        problem = self._draw_plannable(data)
        copy = PlanningProblem(
            specs={name: attrs.evolve(spec) for name, spec in problem.specs.items()},
            context=attrs.evolve(problem.context),
            available_bytes=problem.available_bytes,
        )
        fresh = build_registry(*self.kit.plugins)  # a new policy instance: no state carried over
        again = copy.plan(self.kit.policy.name, fresh, options=attrs.evolve(self.kit.options))
        checks.check_same_plan(self.kit.plan(problem), again)

    @_drawing
    def test_more_memory_never_gives_fewer_blocks(self, data: st.DataObject) -> None:
        problem = self._draw_plannable(data)
        extra = data.draw(st.integers(0, 2**24), label="extra bytes")
        checks.check_more_memory_not_worse(
            self.kit.plan(problem), self.kit.plan(problem, available_bytes=problem.available_bytes + extra)
        )

    @_drawing
    def test_forced_block_count_is_honoured(self, data: st.DataObject) -> None:
        problem = self._draw_plannable(data)
        full = self.kit.plan(problem)
        if any(pool.num_blocks < 1 for pool in full.pools):
            reject()
        # one count per pool for a policy that makes several (a plain int for one)
        counts = tuple(
            data.draw(st.integers(1, pool.num_blocks), label=f"num_blocks of pool {p}")
            for p, pool in enumerate(full.pools)
        )
        forced = self.kit.plan(problem, num_blocks=counts[0] if len(counts) == 1 else counts)
        got = tuple(pool.num_blocks for pool in forced.pools)
        sizes = tuple(pool.bytes_per_block for pool in forced.pools)
        wanted = tuple(pool.bytes_per_block for pool in full.pools)
        if got != counts or sizes != wanted:
            raise AssertionError(
                f"policy {full.policy!r}: forcing {counts} blocks gave {got} blocks of {sizes} bytes "
                f"(unforced: {wanted} bytes per block)"
            )
        checks.check_within_budget(forced, problem)
        checks.check_ranges_in_bounds(forced)
        checks.check_no_live_overlap(forced)

    @_drawing
    def test_plan_json_round_trip(self, data: st.DataObject) -> None:
        checks.check_plan_json_round_trip(self.kit.plan(self._draw_plannable(data)), self.kit.registry)
