"""Hypothesis strategies for kvcore objects (public API, like ``hypothesis.extra``).

Every strategy is a function returning a ``SearchStrategy`` and takes keyword arguments to
narrow what it draws. Sizes stay small by default so that plans built from the draws allocate
in a test in milliseconds.

Example::

    from hypothesis import given
    from kvcore.testing import strategies as kst

    @given(specs=kst.layer_specs(), context=kst.sizing_contexts())
    def test_my_policy(specs, context): ...

Specs of any registered kind: each kind's plugin registers its strategy through the
``kvcore_register_spec_strategies`` hook (the built-in kinds do too), which this module calls
when a test first asks for a kind's strategy. A test may also supply one for one call
(``specs(strategies={"acme.ring": ring_specs()})``) or for the test session with
:func:`register_spec_strategy` (from a ``conftest.py``). ``specs(registry=registry)`` then
draws from every kind the registry holds. Why a hook, and how a plugin keeps hypothesis out of
its run time: ``docs/how-to/test-your-plugin.md``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from hypothesis import reject, strategies as st

from kvcore import dtypes as kv_dtypes
from kvcore.dtypes import DType
from kvcore.errors import InvalidInputError, KVCoreError, PolicyNotApplicableError
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.planning.capacity import request_bytes
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.spec import STATE_CACHE_MODES, KVCacheSpec, SizingContext

#: Dtypes drawn for caches: the common ones, fp8 included.
CACHE_DTYPES: tuple[DType, ...] = (
    kv_dtypes.float32,
    kv_dtypes.bfloat16,
    kv_dtypes.float16,
    kv_dtypes.float8_e4m3fn,
    kv_dtypes.float8_e5m2,
)

#: Block sizes drawn by default.
BLOCK_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


def dtypes() -> st.SearchStrategy[DType]:
    """A cache dtype from :data:`CACHE_DTYPES`."""
    return st.sampled_from(CACHE_DTYPES)


def block_sizes() -> st.SearchStrategy[int]:
    """A block size from :data:`BLOCK_SIZES`."""
    return st.sampled_from(BLOCK_SIZES)


class MissingStrategyError(KVCoreError, LookupError):
    """No strategy is known for a spec kind; the message says how to supply one."""


#: Strategies for plugin kinds, by spec class; filled by :func:`register_spec_strategy`.
_REGISTERED_SPEC_STRATEGIES: dict[type[KVCacheSpec], st.SearchStrategy[KVCacheSpec]] = {}


def _check_strategy(spec_cls: object, strategy: object, who: str) -> None:
    if not isinstance(spec_cls, type) or not issubclass(spec_cls, KVCacheSpec) or not spec_cls.kind:
        raise InvalidInputError(f"{who} takes a KVCacheSpec subclass with a 'kind' (got {spec_cls!r})")
    if not isinstance(strategy, st.SearchStrategy):
        raise InvalidInputError(
            f"{who}({spec_cls.__qualname__}, ...) takes a hypothesis strategy "
            f"(got {strategy!r}); pass e.g. my_specs(), not my_specs"
        )


def register_spec_strategy(spec_cls: type[KVCacheSpec], strategy: st.SearchStrategy[KVCacheSpec]) -> None:
    """Make ``strategy`` the strategy :func:`specs` draws for ``spec_cls``, for this process.

    It takes precedence over the strategy the kind's plugin registers through the
    ``kvcore_register_spec_strategies`` hook. Call it from test code (a ``conftest.py``),
    never from a plugin module. Registering a class again replaces its strategy.

    Args:
        spec_cls: a :class:`~kvcore.KVCacheSpec` subclass with a non-empty ``kind``.
        strategy: draws valid instances of ``spec_cls``.

    Raises:
        InvalidInputError: ``spec_cls`` is not a spec class with a kind, or ``strategy`` is not a
            hypothesis strategy.
    """
    _check_strategy(spec_cls, strategy, "register_spec_strategy")
    _REGISTERED_SPEC_STRATEGIES[spec_cls] = strategy


def plugin_spec_strategies(registry: Registry) -> dict[type[KVCacheSpec], st.SearchStrategy[KVCacheSpec]]:
    """The strategies the plugins of ``registry`` register through ``kvcore_register_spec_strategies``.

    Implementations are called in hook order (plugins registered later first); when two
    register a strategy for one class, the first one wins.

    Args:
        registry: whose plugins are asked.

    Returns:
        ``{spec class: strategy}``.

    Raises:
        InvalidInputError: an implementation registered something that is not a spec class with
            a kind and a hypothesis strategy; the message names the plugin.
    """
    found: dict[type[KVCacheSpec], st.SearchStrategy[KVCacheSpec]] = {}
    for origin, spec_cls, strategy in registry.spec_strategies(block_sizes=block_sizes(), dtypes=dtypes()):
        _check_strategy(spec_cls, strategy, f"plugin {origin.name!r}: register")
        found.setdefault(spec_cls, strategy)
    return found


@functools.lru_cache(maxsize=1)
def _builtin_registry() -> Registry:
    return Registry.default(autoload=False)


def spec_strategy(
    spec_cls: type[KVCacheSpec],
    *,
    strategies: Mapping[str, st.SearchStrategy[KVCacheSpec]] | None = None,
    registry: Registry | None = None,
) -> st.SearchStrategy[KVCacheSpec]:
    """The strategy for one spec class.

    Looks in ``strategies`` (by kind), then among :func:`register_spec_strategy`'s classes, then
    among the strategies the plugins of ``registry`` register through the
    ``kvcore_register_spec_strategies`` hook.

    Args:
        spec_cls: the spec class to draw.
        strategies: strategies by kind name that take precedence.
        registry: whose plugins are asked (default: a registry of the built-ins).

    Raises:
        MissingStrategyError: none of them has one; the message says how to add one.
    """
    kind = spec_cls.kind
    if strategies is not None and kind in strategies:
        return strategies[kind]
    registered = _REGISTERED_SPEC_STRATEGIES.get(spec_cls)
    if registered is not None:
        return registered
    from_plugins = plugin_spec_strategies(registry if registry is not None else _builtin_registry())
    if spec_cls in from_plugins:
        return from_plugins[spec_cls]
    raise MissingStrategyError(
        f"no hypothesis strategy for spec kind {kind!r} ({spec_cls.__module__}.{spec_cls.__qualname__}); "
        "implement the kvcore_register_spec_strategies hook in its plugin (and pass the registry that "
        "holds the plugin), call kvcore.testing.strategies.register_spec_strategy(cls, my_specs()) in a "
        f"conftest.py, or pass strategies={{{kind!r}: my_specs()}}"
    )


def _class_for_kind(kind: str, registry: Registry | None) -> type[KVCacheSpec] | None:
    if registry is not None:
        return registry.spec_class(kind)
    registered = next((cls for cls in _REGISTERED_SPEC_STRATEGIES if cls.kind == kind), None)
    if registered is not None:
        return registered
    return _builtin_registry().kinds.get(kind)


def specs(
    kinds: Sequence[str] | None = None,
    *,
    registry: Registry | None = None,
    strategies: Mapping[str, st.SearchStrategy[KVCacheSpec]] | None = None,
) -> st.SearchStrategy[KVCacheSpec]:
    """A spec of one of ``kinds``.

    Args:
        kinds: kind names; default: every kind of ``registry``, or every built-in kind when no
            registry is given.
        registry: where kind names are looked up (and, with ``kinds=None``, which kinds), and
            whose plugins give the kinds' strategies.
        strategies: strategies by kind name that take precedence over registered ones.

    Raises:
        MissingStrategyError: a kind has no strategy (see :func:`spec_strategy`).
        UnknownSpecKindError: ``registry`` does not have one of ``kinds``.
    """
    if kinds is not None:
        names = list(kinds)
    else:
        names = list((registry if registry is not None else _builtin_registry()).kinds)
    if not names:
        raise InvalidInputError("specs() needs at least one kind to draw from (got none)")
    chosen = []
    for name in names:
        cls = _class_for_kind(name, registry)
        if cls is not None:
            chosen.append(spec_strategy(cls, strategies=strategies, registry=registry))
        elif strategies is not None and name in strategies:
            chosen.append(strategies[name])
        else:
            raise MissingStrategyError(
                f"no hypothesis strategy for spec kind {name!r}; register one with "
                "kvcore.testing.strategies.register_spec_strategy, pass strategies=..., or pass the "
                "registry that holds the kind"
            )
    return st.one_of(chosen)


@st.composite
def layer_specs(
    draw: st.DrawFn,
    *,
    min_layers: int = 1,
    max_layers: int = 24,
    max_distinct: int = 4,
    spec_strategy: st.SearchStrategy[KVCacheSpec] | None = None,
    prefix: str = "model.layers.",
) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` like a real model: a few distinct specs repeated over the layers.

    Args:
        min_layers: fewest layers.
        max_layers: most layers.
        max_distinct: most distinct specs (a hybrid model has 2-4).
        spec_strategy: where the distinct specs come from (default: :func:`specs`).
        prefix: layer names are ``f"{prefix}{i}"``.
    """
    source = spec_strategy if spec_strategy is not None else specs()
    distinct = draw(st.lists(source, min_size=1, max_size=max_distinct))
    n = draw(st.integers(min_layers, max_layers))
    choice = draw(st.lists(st.integers(0, len(distinct) - 1), min_size=n, max_size=n))
    return {f"{prefix}{i}": distinct[c] for i, c in enumerate(choice)}


def sizing_contexts(
    *,
    max_model_len: st.SearchStrategy[int] | None = None,
    max_num_batched_tokens: st.SearchStrategy[int] | None = None,
    serving: bool = False,
) -> st.SearchStrategy[SizingContext]:
    """A :class:`SizingContext` (lengths up to 8192 by default); with ``serving``, also its
    serving options (:func:`serving_options`)."""
    lengths: st.SearchStrategy[dict[str, int]] = st.builds(
        dict,
        max_model_len=max_model_len if max_model_len is not None else st.integers(1, 8192),
        max_num_batched_tokens=max_num_batched_tokens
        if max_num_batched_tokens is not None
        else st.integers(1, 4096),
    )
    extra = serving_options() if serving else st.just({})
    return st.builds(lambda a, b: SizingContext(**a, **b), lengths, extra)


def serving_options(
    *, max_speculative_tokens: int = 4, max_encoder_tokens: int = 256
) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments of a :class:`SizingContext`'s serving options, each often left unset:
    ``num_speculative_tokens``, ``state_cache_mode`` and ``max_encoder_tokens``
    (``SizingContext(max_model_len=..., **drawn)``)."""
    return st.fixed_dictionaries(
        {
            "num_speculative_tokens": st.one_of(st.just(0), st.integers(0, max_speculative_tokens)),
            "state_cache_mode": st.one_of(st.none(), st.sampled_from(STATE_CACHE_MODES)),
            "max_encoder_tokens": st.one_of(st.just(0), st.integers(1, max_encoder_tokens)),
        }
    )


def budgets(*, max_bytes: int = 64 * 2**20) -> st.SearchStrategy[int]:
    """A byte budget up to ``max_bytes`` (64 MiB by default)."""
    return st.integers(0, max_bytes)


def _layer_map(value: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    return dict(value)


@attrs.frozen(kw_only=True)
class PlanningProblem:
    """What a policy is asked to plan: layer specs, a sizing context and a byte budget.

    Attributes:
        specs: ``{layer name: spec}`` in model order.
        context: the request length (and step size) to size for.
        available_bytes: the KV-cache byte budget.
    """

    specs: dict[str, KVCacheSpec] = attrs.field(converter=_layer_map, hash=False)
    context: SizingContext
    available_bytes: int

    def plan(
        self,
        policy: str | AllocationPolicy,
        registry: Registry,
        *,
        options: PlanOptions | None = None,
        available_bytes: int | None = None,
        num_blocks: int | None = None,
    ) -> KVCachePlan:
        """Plan this problem with ``policy`` (no admission check: small budgets are valid input).

        Args:
            policy: a policy name, ``"auto"`` or a policy object.
            registry: where the policy is looked up.
            options: policy knobs (default :class:`~kvcore.PlanOptions`).
            available_bytes: another budget for the same specs and context.
            num_blocks: force this many block ids.
        """
        return plan_kv_cache(
            self.specs,
            self.available_bytes if available_bytes is None else available_bytes,
            self.context,
            registry=registry,
            policy=policy,
            options=options,
            num_blocks=num_blocks,
            check_fit=False,
        )


@st.composite
def planning_problems(
    draw: st.DrawFn,
    *,
    layer_maps: st.SearchStrategy[dict[str, KVCacheSpec]] | None = None,
    contexts: st.SearchStrategy[SizingContext] | None = None,
    max_requests: int = 6,
) -> PlanningProblem:
    """A :class:`PlanningProblem` whose budget is sized to the specs.

    The budget is drawn from 0 up to ``max_requests`` requests of ``context.max_model_len``
    tokens (plus up to 64 KiB), so plans range from empty to a few requests: the sizes where
    rounding and admission mistakes show.

    Args:
        layer_maps: where the specs come from (default :func:`layer_specs` with up to 12 layers).
        contexts: where the context comes from (default: lengths up to 2048 tokens).
        max_requests: the largest budget, in requests of ``max_model_len`` tokens.
    """
    specs = draw(layer_maps if layer_maps is not None else layer_specs(max_layers=12))
    context = draw(
        contexts
        if contexts is not None
        else sizing_contexts(max_model_len=st.integers(1, 2048), max_num_batched_tokens=st.integers(1, 2048))
    )
    need = request_bytes(specs, context)
    budget = draw(st.integers(0, max_requests * need + draw(st.integers(0, 64 * 2**10))))
    return PlanningProblem(specs=specs, context=context, available_bytes=budget)


def plans(
    policy: str | AllocationPolicy = "auto",
    *,
    registry: Registry | None = None,
    problems: st.SearchStrategy[PlanningProblem] | None = None,
    options: PlanOptions | None = None,
) -> st.SearchStrategy[KVCachePlan]:
    """A plan made by ``policy`` for a drawn :class:`PlanningProblem`.

    Problems the policy refuses (its ``why_not`` gives a reason) are rejected, so pass
    ``problems`` that the policy can plan (e.g. ``layer_specs(max_distinct=1)`` for ``uniform``).

    Args:
        policy: a policy name, ``"auto"`` or a policy object.
        registry: where the policy is looked up (default: a registry of the built-ins).
        problems: where the problems come from (default :func:`planning_problems`).
        options: policy knobs.
    """
    reg = registry if registry is not None else Registry.default(autoload=False)
    source = problems if problems is not None else planning_problems()

    @st.composite
    def draw_plan(draw: st.DrawFn) -> KVCachePlan:
        problem = draw(source)
        try:
            return problem.plan(policy, reg, options=options)
        except PolicyNotApplicableError:
            reject()

    return draw_plan()


# -- plans of several pools ------------------------------------------------------------------


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@st.composite
def page_siblings(draw: st.DrawFn, spec: KVCacheSpec, *, registry: Registry | None = None) -> KVCacheSpec:
    """``spec`` with the fields that only change its page (its kind's
    :attr:`~kvcore.spec.KVCacheSpec.page_fields`: head counts, head sizes, dtype, ...) taken
    from another drawn spec of its kind: same block size and
    :attr:`~kvcore.spec.KVCacheSpec.retention_key`, so it may share ``spec``'s block table
    with a page of its own size (a mixed-page group). ``spec`` itself for a kind without page
    fields, or when the mix is not a valid spec.
    """
    fields = type(spec).page_fields
    if not fields:
        return spec
    other = draw(spec_strategy(type(spec), registry=registry))
    try:
        sibling = attrs.evolve(spec, **{name: getattr(other, name) for name in fields})
    except (KVCoreError, TypeError, ValueError):
        return spec
    return sibling if sibling.retention_key == spec.retention_key else spec


@st.composite
def retention_mixes(
    draw: st.DrawFn,
    *,
    kinds: Sequence[str] | None = None,
    registry: Registry | None = None,
    min_keys: int = 2,
    max_layers: int = 10,
    prefix: str = "model.layers.",
) -> dict[str, KVCacheSpec]:
    """``{layer: spec}`` of several retention kinds (distinct
    :attr:`~kvcore.spec.KVCacheSpec.retention_key`), whose layers of one kind often differ in
    page size (:func:`page_siblings`: other head counts, head sizes or dtypes): what
    ``kind_pools`` plans as several pools of mixed-page groups.

    Args:
        kinds: the kinds to draw from (default: every kind of ``registry``, see :func:`specs`).
        registry: where kinds and their strategies come from (default: the built-ins).
        min_keys: fewest distinct retention keys.
        max_layers: most layers.
        prefix: layer names are ``f"{prefix}{i}"``.
    """
    bases = draw(st.lists(specs(kinds, registry=registry), min_size=min_keys, max_size=max(min_keys, 4)))
    if len({spec.retention_key for spec in bases}) < min_keys:
        reject()
    count = draw(st.integers(len(bases), max(len(bases), max_layers)))
    out: dict[str, KVCacheSpec] = {}
    for i in range(count):
        base = bases[i] if i < len(bases) else draw(st.sampled_from(bases))
        out[f"{prefix}{i}"] = draw(st.one_of(st.just(base), page_siblings(base, registry=registry)))
    return out


@st.composite
def hand_built_multi_pool_plans(
    draw: st.DrawFn,
    *,
    kinds: Sequence[str] | None = None,
    registry: Registry | None = None,
    max_pools: int = 3,
    max_blocks: int = 24,
    context: SizingContext | None = None,
    null_block: bool | None = None,
) -> KVCachePlan:
    """A plan of several pools built by hand through ``KVCachePlan(pools=...)``, as a
    third-party policy might lay one out, with no planner involved.

    Each pool has one to three groups, each of one drawn spec and its :func:`page_siblings`
    (so groups are often mixed-page), and its own block count. Its layers are laid out either
    one tensor per layer side by side in the pool's rows, or the ``k``-th layers of its groups
    sharing one tensor (the shared-buffer way), each at its spec's alignment. Pools lie end to
    end in one buffer, or (sometimes) every tensor is its own allocation. The plan is sound:
    every check of :func:`kvcore.planning.invariants.plan_problems` passes (each pool has at
    least the blocks one request of the context's ``max_model_len`` needs).

    Args:
        kinds: the kinds to draw from (default: every kind of ``registry``, see :func:`specs`).
        registry: where kinds and their strategies come from (default: the built-ins).
        max_pools: most pools (at least two).
        max_blocks: most block ids in one pool drawn (more where one request needs more).
        context: the context the plan is sized for (default: 64 tokens, steps of 16).
        null_block: reserve block 0 of every pool (default: drawn).
    """
    from kvcore.plan import KVCachePool, KVCacheTensor

    ctx = context if context is not None else SizingContext(max_model_len=64, max_num_batched_tokens=16)
    single_buffer = draw(st.sampled_from([True, True, True, False]))
    reserve = draw(st.booleans()) if null_block is None else null_block
    source = specs(kinds, registry=registry)
    pools: list[KVCachePool] = []
    groups: list[KVCacheGroup] = []
    tensors: list[KVCacheTensor] = []
    drawn: list[tuple[int, bool, list[list[tuple[str, KVCacheSpec]]]]] = []
    layer = 0
    for _ in range(draw(st.integers(2, max(2, max_pools)))):
        num_blocks = draw(st.integers(1, max_blocks))
        pool_groups = _draw_pool_groups(draw, source, registry, first_layer=layer)
        layer += sum(len(members) for members in pool_groups)
        # room for one request of ctx.max_model_len (and the null block): the plan check refuses
        # a plan that serves no request
        need = sum(members[0][1].max_num_blocks(ctx) for members in pool_groups) + int(reserve)
        drawn.append((max(num_blocks, need), draw(st.booleans()), pool_groups))
    # every row a multiple of every alignment, so that pools laid end to end stay aligned
    align_all = math.lcm(*(s.alignment_bytes for _, _, pg in drawn for m in pg for _, s in m))
    offset = 0
    for p, (num_blocks, shared, pool_groups) in enumerate(drawn):
        places, stride = _pool_row(pool_groups, shared=shared, align_all=align_all)
        start = offset if single_buffer else 0
        for names, width, place in places:
            if single_buffer:
                size = (num_blocks - 1) * stride + width
                tensors.append(
                    KVCacheTensor(size=size, offset=start + place, page_stride=stride, shared_by=names)
                )
            else:
                tensors.append(KVCacheTensor(size=num_blocks * width, page_stride=width, shared_by=names))
        bytes_per_block = stride if single_buffer else sum(width for _, width, _ in places)
        groups += _pool_groups_of(pool_groups, p)
        pools.append(KVCachePool(num_blocks=num_blocks, bytes_per_block=bytes_per_block, offset=start))
        offset = start + num_blocks * bytes_per_block
    return KVCachePlan(
        policy="hand_built",
        pools=pools,
        single_buffer=single_buffer,
        groups=groups,
        tensors=tensors,
        context=ctx,
        available_memory_bytes=sum(pool.nbytes for pool in pools),
        null_block=0 if reserve else None,
    )


def _draw_pool_groups(
    draw: st.DrawFn, source: st.SearchStrategy[KVCacheSpec], registry: Registry | None, *, first_layer: int
) -> list[list[tuple[str, KVCacheSpec]]]:
    """One to three groups of one pool, each a drawn spec and up to two of its page siblings,
    named ``model.layers.{i}`` from ``first_layer`` on."""
    layer = first_layer
    pool_groups: list[list[tuple[str, KVCacheSpec]]] = []
    for _ in range(draw(st.integers(1, 3))):
        base = draw(source)
        members: list[tuple[str, KVCacheSpec]] = [(f"model.layers.{layer}", base)]
        layer += 1
        for _ in range(draw(st.integers(0, 2))):
            sibling = draw(st.one_of(st.just(base), page_siblings(base, registry=registry)))
            members.append((f"model.layers.{layer}", sibling))
            layer += 1
        pool_groups.append(members)
    return pool_groups


def _pool_groups_of(
    pool_groups: Sequence[Sequence[tuple[str, KVCacheSpec]]], pool: int
) -> list[KVCacheGroup]:
    """The groups of one pool: each group's first spec its own, a sibling's kept per layer."""
    groups = []
    for members in pool_groups:
        first = members[0][1]
        groups.append(
            KVCacheGroup(
                layer_names=tuple(n for n, _ in members),
                spec=first,
                pool=pool,
                layer_specs={n: s for n, s in members if s != first},
            )
        )
    return groups


def _pool_row(
    pool_groups: Sequence[Sequence[tuple[str, KVCacheSpec]]], *, shared: bool, align_all: int
) -> tuple[list[tuple[tuple[str, ...], int, int]], int]:
    """One pool's block row, for :func:`hand_built_multi_pool_plans`: ``(layers, width, place)``
    of each tensor side by side (``shared``: the ``k``-th layers of the groups in one tensor),
    each at its alignment, and the row's stride (a multiple of ``align_all``)."""
    row: list[tuple[tuple[str, ...], int, int]] = []  # (layers, width, alignment) of each tensor
    if shared:
        for k in range(max(len(m) for m in pool_groups)):
            sharers = [m[k][1] for m in pool_groups if k < len(m)]
            names = tuple(m[k][0] for m in pool_groups if k < len(m))
            align = math.lcm(*(s.alignment_bytes for s in sharers))
            row.append((names, max(_round_up(s.page_size_bytes, align) for s in sharers), align))
    else:
        row = [
            ((name,), _round_up(spec.page_size_bytes, spec.alignment_bytes), spec.alignment_bytes)
            for m in pool_groups
            for name, spec in m
        ]
    places = []
    at = 0
    for names, width, align in row:
        at = _round_up(at, align)
        places.append((names, width, at))
        at += width
    return places, _round_up(at, align_all)


def multi_pool_plans(
    *,
    kinds: Sequence[str] | None = None,
    registry: Registry | None = None,
    context: SizingContext | None = None,
    max_requests: int = 4,
) -> st.SearchStrategy[KVCachePlan]:
    """Plans of several pools: ``kind_pools`` plans of :func:`retention_mixes` (a budget of
    one to ``max_requests`` requests), or :func:`hand_built_multi_pool_plans`.

    Args:
        kinds: the kinds to draw from (default: every kind of ``registry``, see :func:`specs`).
        registry: where ``kind_pools`` and the kinds are looked up (default: the built-ins).
        context: the context to plan for (default: 64 tokens, steps of 16).
        max_requests: the largest budget of a planned plan, in requests of ``max_model_len``.
    """
    ctx = context if context is not None else SizingContext(max_model_len=64, max_num_batched_tokens=16)
    reg = registry if registry is not None else _builtin_registry()

    @st.composite
    def planned(draw: st.DrawFn) -> KVCachePlan:
        mix = draw(retention_mixes(kinds=kinds, registry=reg))
        need = request_bytes(mix, ctx)
        budget = draw(st.integers(need, max_requests * need + 4096))
        try:
            plan = plan_kv_cache(mix, budget, ctx, registry=reg, policy="kind_pools", check_fit=False)
        except PolicyNotApplicableError:
            reject()
        if len(plan.pools) < 2 or not plan.fits():  # (a plan that holds no request is refused)
            reject()
        return plan

    return st.one_of(planned(), hand_built_multi_pool_plans(kinds=kinds, registry=reg, context=ctx))
