"""Hypothesis strategies for kvcore objects (public API, like ``hypothesis.extra``).

Every strategy is a function returning a ``SearchStrategy`` and takes keyword arguments to
narrow what it draws. Sizes stay small by default so that plans built from the draws allocate
in a test in milliseconds.

Example::

    from hypothesis import given
    from kvcore.testing import strategies as kst

    @given(specs=kst.layer_specs(), context=kst.sizing_contexts())
    def test_my_policy(specs, context): ...

Specs of any registered kind: the built-in kinds have strategies here
(:data:`BUILTIN_SPEC_STRATEGIES`); a plugin's kind gets one from its author, either for one call
(``specs(strategies={"acme.ring": ring_specs()})``) or for the test session with
:func:`register_spec_strategy` (from a ``conftest.py``). ``specs(registry=registry)`` then
draws from every kind the registry holds. Why a registration function and not a hook:
``docs/how-to/test-your-plugin.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
import torch
from hypothesis import reject
from hypothesis import strategies as st

from kvcore.errors import InvalidInputError, KVCoreError, PolicyNotApplicableError
from kvcore.plan import KVCacheConfig
from kvcore.planning.capacity import request_bytes
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext

#: Dtypes drawn for caches: the common ones, fp8 included.
CACHE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)

#: Block sizes drawn by default.
BLOCK_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


def dtypes() -> st.SearchStrategy[torch.dtype]:
    """A cache dtype from :data:`CACHE_DTYPES`."""
    return st.sampled_from(CACHE_DTYPES)


def block_sizes() -> st.SearchStrategy[int]:
    """A block size from :data:`BLOCK_SIZES`."""
    return st.sampled_from(BLOCK_SIZES)


def _attention_fields(max_heads: int, max_head_size: int) -> dict[str, st.SearchStrategy[object]]:
    return {
        "block_size": block_sizes(),
        "num_kv_heads": st.integers(1, max_heads),
        "head_size": st.sampled_from([d for d in (8, 16, 32, 64, 96, 128, 256) if d <= max_head_size] or [1]),
        "dtype": dtypes(),
    }


def full_attention_specs(
    *, max_heads: int = 8, max_head_size: int = 128
) -> st.SearchStrategy[FullAttentionSpec]:
    """A ``full_attention`` spec."""
    return st.builds(FullAttentionSpec, **_attention_fields(max_heads, max_head_size))


def sliding_window_specs(
    *, max_heads: int = 8, max_head_size: int = 128, max_window: int = 4096
) -> st.SearchStrategy[SlidingWindowSpec]:
    """A ``sliding_window`` spec."""
    return st.builds(
        SlidingWindowSpec,
        sliding_window=st.integers(1, max_window),
        **_attention_fields(max_heads, max_head_size),
    )


def chunked_local_attention_specs(
    *, max_heads: int = 8, max_head_size: int = 128, max_chunk: int = 8192
) -> st.SearchStrategy[ChunkedLocalAttentionSpec]:
    """A ``chunked_local_attention`` spec."""
    return st.builds(
        ChunkedLocalAttentionSpec,
        attention_chunk_size=st.integers(1, max_chunk),
        **_attention_fields(max_heads, max_head_size),
    )


def mla_specs() -> st.SearchStrategy[MLAAttentionSpec]:
    """An ``mla`` spec (latent sizes around DeepSeek's, scaled down)."""
    return st.builds(
        MLAAttentionSpec,
        block_size=block_sizes(),
        kv_lora_rank=st.sampled_from([16, 32, 64, 128, 512]),
        qk_rope_head_dim=st.sampled_from([8, 16, 32, 64]),
        dtype=dtypes(),
    )


@st.composite
def state_specs(draw: st.DrawFn, *, max_parts: int = 3, max_dim: int = 32) -> StateSpec:
    """A ``state`` spec: 1 to ``max_parts`` tensors (``conv``, ``ssm``, ...) of up to three
    dimensions of at most ``max_dim``, each of its own dtype (so parts need alignment)."""
    count = draw(st.integers(1, max_parts))
    parts = [
        StatePart(
            name=name,
            shape=tuple(draw(st.lists(st.integers(1, max_dim), min_size=1, max_size=3))),
            dtype=draw(dtypes()),
        )
        for name in ("conv", "ssm", "extra")[:count]
    ]
    return StateSpec(block_size=draw(block_sizes()), parts=tuple(parts))


#: Strategy factories for the built-in kinds, by kind name.
BUILTIN_SPEC_STRATEGIES: dict[str, Callable[[], st.SearchStrategy[KVCacheSpec]]] = {
    "full_attention": full_attention_specs,
    "sliding_window": sliding_window_specs,
    "chunked_local_attention": chunked_local_attention_specs,
    "mla": mla_specs,
    "state": state_specs,
}


class MissingStrategyError(KVCoreError, LookupError):
    """No strategy is known for a spec kind; the message says how to supply one."""


#: Strategies for plugin kinds, by spec class; filled by :func:`register_spec_strategy`.
_REGISTERED_SPEC_STRATEGIES: dict[type[KVCacheSpec], st.SearchStrategy[KVCacheSpec]] = {}


def register_spec_strategy(spec_cls: type[KVCacheSpec], strategy: st.SearchStrategy[KVCacheSpec]) -> None:
    """Make ``strategy`` the strategy :func:`specs` draws for ``spec_cls``, for this process.

    Call it from test code (a ``conftest.py``), never from a plugin module: the plugin must not
    need hypothesis at run time. Registering a class again replaces its strategy.

    Args:
        spec_cls: a :class:`~kvcore.KVCacheSpec` subclass with a non-empty ``kind``.
        strategy: draws valid instances of ``spec_cls``.

    Raises:
        InvalidInputError: ``spec_cls`` is not a spec class with a kind, or ``strategy`` is not a
            hypothesis strategy.
    """
    if not isinstance(spec_cls, type) or not issubclass(spec_cls, KVCacheSpec) or not spec_cls.kind:
        raise InvalidInputError(
            f"register_spec_strategy takes a KVCacheSpec subclass with a 'kind' (got {spec_cls!r})"
        )
    if not isinstance(strategy, st.SearchStrategy):
        raise InvalidInputError(
            f"register_spec_strategy({spec_cls.__qualname__}, ...) takes a hypothesis strategy "
            f"(got {strategy!r}); pass e.g. my_specs(), not my_specs"
        )
    _REGISTERED_SPEC_STRATEGIES[spec_cls] = strategy


def spec_strategy(
    spec_cls: type[KVCacheSpec],
    *,
    strategies: Mapping[str, st.SearchStrategy[KVCacheSpec]] | None = None,
) -> st.SearchStrategy[KVCacheSpec]:
    """The strategy for one spec class.

    Looks in ``strategies`` (by kind), then among :func:`register_spec_strategy`'s classes, then
    in :data:`BUILTIN_SPEC_STRATEGIES` (by kind).

    Raises:
        MissingStrategyError: none of them has one; the message says how to add one.
    """
    kind = spec_cls.kind
    if strategies is not None and kind in strategies:
        return strategies[kind]
    registered = _REGISTERED_SPEC_STRATEGIES.get(spec_cls)
    if registered is not None:
        return registered
    factory = BUILTIN_SPEC_STRATEGIES.get(kind)
    if factory is not None:
        return factory()
    raise MissingStrategyError(
        f"no hypothesis strategy for spec kind {kind!r} ({spec_cls.__module__}.{spec_cls.__qualname__}); "
        "call kvcore.testing.strategies.register_spec_strategy(cls, my_specs()) in a conftest.py, "
        f"or pass strategies={{{kind!r}: my_specs()}}"
    )


def _class_for_kind(kind: str, registry: Registry | None) -> type[KVCacheSpec] | None:
    if registry is not None:
        return registry.spec_class(kind)
    return next((cls for cls in _REGISTERED_SPEC_STRATEGIES if cls.kind == kind), None)


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
        registry: where kind names are looked up (and, with ``kinds=None``, which kinds).
        strategies: strategies by kind name that take precedence over registered ones.

    Raises:
        MissingStrategyError: a kind has no strategy (see :func:`spec_strategy`).
        UnknownSpecKindError: ``registry`` does not have one of ``kinds``.
    """
    if kinds is not None:
        names = list(kinds)
    elif registry is not None:
        names = list(registry.kinds)
    else:
        names = list(BUILTIN_SPEC_STRATEGIES)
    if not names:
        raise InvalidInputError("specs() needs at least one kind to draw from (got none)")
    chosen = []
    for name in names:
        cls = _class_for_kind(name, registry)
        if cls is not None:
            chosen.append(spec_strategy(cls, strategies=strategies))
        elif strategies is not None and name in strategies:
            chosen.append(strategies[name])
        elif name in BUILTIN_SPEC_STRATEGIES:
            chosen.append(BUILTIN_SPEC_STRATEGIES[name]())
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
) -> st.SearchStrategy[SizingContext]:
    """A :class:`SizingContext` (lengths up to 8192 by default)."""
    return st.builds(
        SizingContext,
        max_model_len=max_model_len if max_model_len is not None else st.integers(1, 8192),
        max_num_batched_tokens=max_num_batched_tokens
        if max_num_batched_tokens is not None
        else st.integers(1, 4096),
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
    ) -> KVCacheConfig:
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
) -> st.SearchStrategy[KVCacheConfig]:
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
    def draw_plan(draw: st.DrawFn) -> KVCacheConfig:
        problem = draw(source)
        try:
            return problem.plan(policy, reg, options=options)
        except PolicyNotApplicableError:
            reject()

    return draw_plan()
