"""What one planning call needs, in one checked value: :class:`PlanRequest`, and the request
length it plans for, a number or "the longest that fits, up to a cap" (:class:`MaxModelLen`).

The planner's entry point :func:`kvcore.planning.planner.plan` takes a request, and so do
the entry points above it (``compare_policies``, ``policy_frontier``, the engines'
``plan_for_vllm(request, rules)``, an executor's ``agree_on_plan``); the keyword functions
(:func:`~kvcore.plan_kv_cache`, :func:`~kvcore.planning.ranks.plan_for_ranks`) build one and
call it. The keyword form the entry points took before 0.2 was removed in 0.3: it is refused
naming the request form (:func:`takes_request`). Every input is checked here, once, when the request is
made, so a bad value is named before any planning runs and the planner itself reads only
checked fields.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, TypedDict, TypeVar, cast

import attrs

from kvcore.errors import InvalidInputError, InvalidSpecError
from kvcore.limits import MAX_BYTES, MAX_TOKENS, check_at_most
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.removed import removed_message
from kvcore.spec import KVCacheSpec, SizingContext, check_layer_specs
from kvcore.validators import boolean, check_int, is_int


def _length_tokens(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    tokens = check_int(value, "'max_model_len'", minimum=1)
    check_at_most(
        tokens, MAX_TOKENS, "'max_model_len'", "kvcore.limits.MAX_TOKENS is the longest kvcore plans"
    )


@attrs.frozen
class MaxModelLen:
    """The request length to plan for: a number of tokens, or ``auto``: the longest request the
    budget admits, at most a cap.

    Attributes:
        tokens: the length (``auto=False``), or the cap (``auto=True``; a model's
            ``max_position_embeddings``, or :data:`~kvcore.limits.MAX_TOKENS` for no cap: memory
            alone bounds the length).
        auto: choose the length by planning (:func:`kvcore.planning.planner.plan`).
    """

    tokens: int = attrs.field(validator=_length_tokens)
    auto: bool = attrs.field(default=False, validator=boolean)

    @classmethod
    def fixed(cls, tokens: int) -> MaxModelLen:
        """A length given as a number."""
        return cls(tokens)

    @classmethod
    def up_to(cls, cap: int | None = None) -> MaxModelLen:
        """``auto``: the longest request the budget admits, at most ``cap`` (``None``: no cap)."""
        return cls(MAX_TOKENS if cap is None else cap, auto=True)

    @classmethod
    def of(cls, value: int | Literal["auto"] | MaxModelLen, *, cap: int | None = None) -> MaxModelLen:
        """A length as callers give it: a number, ``"auto"`` (at most ``cap``) or a :class:`MaxModelLen`.

        Raises:
            InvalidInputError: anything else (a string other than ``"auto"``, a float, ...).
        """
        if isinstance(value, MaxModelLen):
            return value
        if value == "auto":
            return cls.up_to(cap)
        if not is_int(value):
            raise InvalidInputError(f"max_model_len must be a number of tokens or 'auto' (got {value!r})")
        return cls(value)

    @property
    def cap(self) -> int | None:
        """The most ``auto`` may choose; ``None`` for a fixed length or an ``auto`` without a cap."""
        return self.tokens if self.auto and self.tokens < MAX_TOKENS else None


def is_auto(max_model_len: object) -> bool:
    """Whether the keyword planning functions' ``max_model_len`` (``"auto"`` or ``None``; the
    number is the context's) asks for ``auto``.

    Raises:
        InvalidInputError: anything else.
    """
    if max_model_len is not None and max_model_len != "auto":
        raise InvalidInputError(
            f"max_model_len takes 'auto' or None here (got {max_model_len!r}); a number goes in the context"
        )
    return max_model_len == "auto"


def sizing_of(
    context: SizingContext | None, max_model_len: int | Literal["auto"] | MaxModelLen | None
) -> tuple[SizingContext, MaxModelLen]:
    """The context and length of a caller that takes both (``context=`` and ``max_model_len=``,
    as :func:`kvcore.engine.workflow.initialize_kv_caches` does), reconciled once.

    ``"auto"`` caps the length at ``context.max_model_len`` when a context is given, else nothing
    does (memory alone bounds it); a number or a :class:`MaxModelLen` must agree with a context
    given beside it.

    Returns:
        The context (its ``max_model_len`` the length, or ``auto``'s cap) and the length.

    Raises:
        InvalidInputError: neither given, or two lengths that differ.
    """
    if max_model_len == "auto":
        length = MaxModelLen.up_to(context.max_model_len if context is not None else None)
    elif max_model_len is None:
        if context is None:
            raise InvalidInputError(
                "give the request length to size for: max_model_len=N or context=SizingContext(...)"
            )
        length = MaxModelLen(context.max_model_len)
    else:
        length = MaxModelLen.of(max_model_len)
        if context is not None and context.max_model_len != length.tokens:
            given = max_model_len if not isinstance(max_model_len, MaxModelLen) else length.tokens
            raise InvalidInputError(
                f"got context.max_model_len={context.max_model_len} and max_model_len={given}; "
                "give one of them"
            )
    if context is None:
        context = SizingContext(max_model_len=length.tokens)
    return context, length


class KeywordFields(TypedDict, total=False):
    """The request fields the keyword functions take (:func:`~kvcore.plan_kv_cache`,
    :func:`~kvcore.planning.ranks.plan_for_ranks`), written once; :func:`request_from_keywords`
    makes the request of them. Each is optional, with :class:`PlanRequest`'s default.

    Attributes:
        policy: a policy name, ``"auto"``, or a policy object.
        options: policy knobs (``None``: :class:`~kvcore.PlanOptions`'s defaults).
        num_blocks: block ids to force instead of filling the budget (one count per pool for a
            policy of several pools).
        check_fit: refuse a plan that cannot hold one request of ``context.max_model_len``.
        max_model_len: ``"auto"``: plan for the longest request the budgets admit, at most
            ``context.max_model_len``; ``None``: plan for ``context.max_model_len``.
    """

    policy: str | AllocationPolicy
    options: PlanOptions | None
    num_blocks: int | Sequence[int] | None
    check_fit: bool
    max_model_len: Literal["auto"] | None


def request_from_keywords(
    specs: Mapping[str, KVCacheSpec],
    budgets: int | Sequence[int],
    context: SizingContext,
    fields: KeywordFields,
) -> PlanRequest:
    """The request of a keyword function's arguments: :meth:`PlanRequest.for_context`, with the
    length mode ``fields["max_model_len"]`` (``"auto"`` or ``None``) as ``auto_length``.

    Raises:
        InvalidInputError: ``max_model_len`` other than ``"auto"`` or ``None`` (a number goes in
            the context), or a field out of range.
    """
    rest = dict(fields)
    auto = is_auto(rest.pop("max_model_len", None))
    return PlanRequest.for_context(specs, budgets, context, auto_length=auto, **rest)


def _specs(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_specs(value)


def check_specs(value: object) -> None:
    """Check layer specs as a request takes them: a mapping of layer names to specs, or an
    empty mapping (a model with nothing to cache).

    Raises:
        InvalidSpecError: anything else (names the first offending entry).
    """
    if not isinstance(value, Mapping):
        raise InvalidSpecError(
            f"layer specs must be a mapping of layer name to spec (got a {type(value).__name__})"
        )
    if value:  # no layers is a model with nothing to cache: planned, as no blocks
        check_layer_specs(value)


def _budgets(value: int | Sequence[int]) -> tuple[int, ...]:
    # one budget is a rank of one; a sequence becomes a tuple (the request is frozen)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return (value,)  # type: ignore[return-value]  # a non-int is named by the validator
    return tuple(value)


def _check_budgets(instance: PlanRequest, attribute: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    if not value:
        raise InvalidInputError("no rank budgets given (got an empty list)")
    for rank, memory in enumerate(value):
        check_budget(memory, instance.rank_prefix(rank))


def check_budget(available_bytes: object, owner: str = "") -> None:
    """Check a byte budget: a non-negative ``int`` of at most :data:`~kvcore.limits.MAX_BYTES`.

    Args:
        available_bytes: the budget.
        owner: who reported it, for the message (e.g. ``"rank 3: "``).

    Raises:
        InvalidInputError: anything else.
    """
    check_int(available_bytes, "available memory in bytes", minimum=0, owner=owner)
    check_at_most(
        available_bytes,  # type: ignore[arg-type]  # an int: checked above
        MAX_BYTES,
        f"{owner}available memory in bytes",
        "1 EiB (kvcore.limits.MAX_BYTES) is the most kvcore plans",
    )


def _context(instance: PlanRequest, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, SizingContext):
        raise InvalidInputError(f"context must be a kvcore.SizingContext (got a {type(value).__name__})")
    length = instance.max_model_len
    if value.max_model_len != length.tokens:
        said = f"the cap of max_model_len='auto', {length.tokens}" if length.auto else str(length.tokens)
        raise InvalidInputError(
            f"got context.max_model_len={value.max_model_len} but max_model_len {said}; give the length "
            "once (PlanRequest.max_model_len), or a context made with context.with_max_model_len"
        )


def _max_model_len(value: int | Literal["auto"] | MaxModelLen) -> MaxModelLen:
    return MaxModelLen.of(value)


def _policy(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, str):
        return
    if not (isinstance(getattr(value, "name", None), str) and callable(getattr(value, "group", None))):
        raise InvalidInputError(
            f"policy must be a policy name, 'auto', or a policy object (a kvcore.AllocationPolicy: "
            f"name, group(), layout()); got {value!r}"
        )


def _options(value: PlanOptions | None) -> PlanOptions:
    return PlanOptions() if value is None else value


def _check_options(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, PlanOptions):
        raise InvalidInputError(f"options must be a kvcore.PlanOptions (got a {type(value).__name__})")


def _num_blocks(value: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    if value is None or isinstance(value, (int, str, bytes)) or not isinstance(value, Sequence):
        return value  # type: ignore[return-value]  # a non-int is named by the validator
    return tuple(value)


def _check_num_blocks(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    counts = value if isinstance(value, tuple) else (value,)
    if not counts:
        raise InvalidInputError("'num_blocks' must be an int >= 1 or one count per pool (got an empty list)")
    for count in counts:
        check_int(count, "'num_blocks'", minimum=1)


def _rank_layers(value: Sequence[Collection[str]] | None) -> tuple[frozenset[str], ...] | None:
    if value is None or isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return value  # type: ignore[return-value]  # named by the validator
    return tuple(_layer_set(layers) for layers in value)


def _layer_set(layers: object) -> Any:
    # a set answers "is this layer the rank's?" in one step, whatever collection the caller gave
    if isinstance(layers, Collection) and not isinstance(layers, (str, bytes)):
        return layers if isinstance(layers, frozenset) else frozenset(layers)
    return layers  # named by the validator


def _check_rank_layers(instance: PlanRequest, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        ranks = len(instance.budgets)
        if ranks > 1 and instance.specs:  # (a model with nothing to cache needs no layers per rank)
            raise InvalidInputError(
                f"got the memory of {ranks} ranks but not their layers; give rank_layers, one "
                "collection of layer names per rank (or one budget)"
            )
        return
    if not isinstance(value, tuple) or not all(isinstance(layers, frozenset) for layers in value):
        raise InvalidInputError(f"rank_layers must be one collection of layer names per rank (got {value!r})")
    if len(value) != len(instance.budgets):
        raise InvalidInputError(
            f"got the layers of {len(value)} rank(s) but memory of {len(instance.budgets)}; "
            "every rank needs both"
        )


def _rank_names(value: Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None or isinstance(value, str) or not isinstance(value, Sequence):
        return value  # type: ignore[return-value]  # named by the validator
    return tuple(value)


def _check_rank_names(instance: PlanRequest, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, tuple) or not all(isinstance(name, str) for name in value):
        raise InvalidInputError(f"rank_names must be one string per rank (got {value!r})")
    if len(value) != len(instance.budgets):
        raise InvalidInputError(f"got {len(value)} rank names for {len(instance.budgets)} ranks")


@attrs.frozen(kw_only=True)
class PlanRequest:
    """Everything one planning call needs: the layers, the budgets, the request length and step
    size, the policy and its options, a forced block count and the ranks.

    A request of one rank has one budget and no ``rank_layers``; one of several ranks has a
    budget and the layers of each (the policy groups the whole model, and every rank gets the
    groups projected onto its own layers and the same block count).

    Attributes:
        specs: the whole model's ``{layer name: spec}`` in model order (empty: a model with
            nothing to cache).
        budgets: one KV-cache byte budget per rank (an int for one rank).
        max_model_len: the request length (a number, or ``auto`` with its cap); an int or
            ``"auto"`` (no cap) is taken as :meth:`MaxModelLen.of` reads it.
        context: the step size and serving options; its ``max_model_len`` is
            ``max_model_len.tokens`` (the length, or ``auto``'s cap). Default: a context of
            that length with the default step size.
        policy: a policy name, ``"auto"``, or a policy object.
        options: policy knobs (``None``: :class:`~kvcore.PlanOptions`'s defaults).
        num_blocks: block ids to force instead of filling the budget (one count per pool for a
            policy of several pools); ``None`` to fill the budget.
        check_fit: refuse a plan that cannot hold one request of the length (a fixed length
            only: ``auto`` chooses one that fits).
        rank_layers: the layers each rank holds, in rank order; ``None`` for one rank holding
            every layer.
        rank_names: how messages name each rank (``'rank 3 (pp stage 1)'``); ``None`` to
            name none (one rank).

    Raises:
        InvalidSpecError: ``specs`` is not a mapping of layer names to specs.
        InvalidInputError: any other field out of its type or range, or fields that disagree
            (a budget count other than the ranks', a context of another length).
    """

    specs: Mapping[str, KVCacheSpec] = attrs.field(validator=_specs)
    budgets: tuple[int, ...] = attrs.field(converter=_budgets, validator=_check_budgets)
    max_model_len: MaxModelLen = attrs.field(converter=_max_model_len)
    context: SizingContext = attrs.field(
        default=attrs.Factory(
            lambda self: SizingContext(max_model_len=self.max_model_len.tokens), takes_self=True
        ),
        validator=_context,
    )
    policy: str | AllocationPolicy = attrs.field(default="auto", validator=_policy)
    options: PlanOptions = attrs.field(default=None, converter=_options, validator=_check_options)
    num_blocks: int | tuple[int, ...] | None = attrs.field(
        default=None, converter=_num_blocks, validator=_check_num_blocks
    )
    check_fit: bool = attrs.field(default=True, validator=boolean)
    rank_layers: tuple[frozenset[str], ...] | None = attrs.field(
        default=None, converter=_rank_layers, validator=_check_rank_layers
    )
    rank_names: tuple[str, ...] | None = attrs.field(
        default=None, converter=_rank_names, validator=_check_rank_names
    )

    @classmethod
    def for_context(
        cls,
        specs: Mapping[str, KVCacheSpec],
        budgets: int | Sequence[int],
        context: SizingContext,
        *,
        auto_length: bool = False,
        **fields: Any,
    ) -> PlanRequest:
        """A request sized by ``context``: its ``max_model_len`` is the length, or with
        ``auto_length`` the cap of ``auto`` (:data:`~kvcore.limits.MAX_TOKENS`: no cap).

        Args:
            specs, budgets: as the attributes.
            context: the sizing context.
            auto_length: choose the length by planning, at most ``context.max_model_len``.
            fields: the other attributes.
        """
        if not isinstance(context, SizingContext):
            raise InvalidInputError(
                f"context must be a kvcore.SizingContext (got a {type(context).__name__})"
            )
        length = MaxModelLen(context.max_model_len, auto=auto_length)
        return cls(specs=specs, budgets=budgets, max_model_len=length, context=context, **fields)

    def rank_prefix(self, rank: int) -> str:
        """How messages start when they are about ``rank``: ``'rank 3 (pp stage 1): '``, ``'rank
        1: '`` for ranks without names, or nothing for one rank."""
        names = self.rank_names
        if names is not None and rank < len(names):  # a count that disagrees is named by its validator
            return f"{names[rank]}: "
        return f"rank {rank}: " if len(self.budgets) > 1 else ""

    def at_length(self, tokens: int) -> PlanRequest:
        """This request for a fixed length of ``tokens``."""
        return attrs.evolve(
            self, max_model_len=MaxModelLen(tokens), context=self.context.with_max_model_len(tokens)
        )


def one_budget(request: PlanRequest, owner: str) -> int:
    """The budget of a request that planning of one rank at one length takes (a comparison, a
    frontier, an engine's plan).

    Args:
        request: the request.
        owner: what takes it, for the message (``"compare_policies"``).

    Raises:
        InvalidInputError: the request has several ranks' budgets, or a length ``auto`` chooses.
    """
    if len(request.budgets) != 1:
        raise InvalidInputError(
            f"{owner} plans one rank; the request has the budgets of {len(request.budgets)} ranks "
            "(give one budget)"
        )
    if request.max_model_len.auto:
        raise InvalidInputError(
            f"{owner} plans at a given length; the request has max_model_len='auto' (give a number)"
        )
    return request.budgets[0]


_F = TypeVar("_F", bound=Callable[..., Any])


def takes_request(old: str, new: str, *, method: bool = False) -> Callable[[_F], _F]:
    """Mark an entry point whose first argument is a :class:`PlanRequest`: a call in the keyword
    form it took before 0.2 (deprecated in 0.2, removed in 0.3) is refused naming the request
    form, instead of failing on whatever the old arguments happen to break.

    Args:
        old: the old form's leading arguments (``"specs, available_bytes, rules"``).
        new: the replacement (``{name}`` stands for the entry point's own name).
        method: the entry point is a method (its first argument, ``self``, is passed as is).

    Returns:
        The decorator.
    """

    def wrap(function: _F) -> _F:
        name = function.__qualname__

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            given = args[1:] if method else args
            if "request" in kwargs or not given or isinstance(given[0], PlanRequest):
                return function(*args, **kwargs)  # a request (or nothing: Python names what is missing)
            raise InvalidInputError(
                removed_message(f"{name}({old}, ...)", new.format(name=name))
                + f" (got {type(given[0]).__name__} where the request goes)"
            )

        return cast(_F, checked)

    return wrap
