"""The deprecated keyword form of the planning entry points, turned into a
:class:`~kvcore.planning.request.PlanRequest` in one place.

Before 0.2 every entry point took the same bundle of arguments (``specs, available_bytes,
context_or_rules, *, registry, policy, options, num_blocks, ...``); since 0.2 they take one
request (:func:`~kvcore.planning.planner.plan`, ``plan_for_vllm(request, rules)``,
``agree_on_plan(request)``, ``compare_policies(request)``, ...). The old calls keep working
until kvcore 0.3, with a ``DeprecationWarning`` naming the new form: :func:`keyword_form` wraps
an entry point so that it takes either, and :func:`keyword_request` is the one conversion
every deprecated form uses.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kvcore.planning.request import KeywordFields, PlanRequest, request_from_keywords
from kvcore.spec import KVCacheSpec, SizingContext

#: The release that removes the keyword forms.
REMOVED_IN = "0.3"

#: The keyword arguments of the old forms that go into the request: the keyword functions'
#: (:class:`~kvcore.planning.request.KeywordFields`, ``max_model_len="auto"`` among them) and
#: the ranks' layers and names ``plan_model`` took.
REQUEST_FIELDS: frozenset[str] = frozenset(KeywordFields.__annotations__) | {"rank_layers", "rank_names"}

_F = TypeVar("_F", bound=Callable[..., Any])


def keyword_request(
    old: str,
    new: str,
    specs: Mapping[str, KVCacheSpec],
    budgets: int | Sequence[int],
    sizing: Any,
    fields: dict[str, Any],
    *,
    stacklevel: int = 3,
) -> PlanRequest:
    """Warn that ``old`` is deprecated for ``new``, and make the request its arguments describe.

    Args:
        old: the deprecated call, as the warning names it (``"plan_for_vllm(specs, ...)"``).
        new: its replacement, as the warning names it.
        specs, budgets: the old form's first two arguments (a budget or one per rank).
        sizing: the old form's third: a :class:`~kvcore.spec.SizingContext`, or an engine's
            rules (anything with ``request(specs, budgets, **fields)``, e.g.
            :meth:`kvcore.integrations.vllm.rules.VllmRules.request`), which size the request
            as the engine runs it.
        fields: the old form's keyword arguments: its :data:`REQUEST_FIELDS` are taken out
            into the request; what is left is for the entry point itself (``registry``, ...).
        stacklevel: the frame the warning names (the caller of the deprecated form).

    Returns:
        The request.

    Raises:
        InvalidInputError: a field out of range (as :class:`PlanRequest` checks it).
    """
    warnings.warn(
        f"{old} is deprecated: use {new} (the keyword form is removed in kvcore {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    taken: Any = {name: fields.pop(name) for name in REQUEST_FIELDS & fields.keys()}
    if isinstance(sizing, SizingContext):
        return request_from_keywords(specs, budgets, sizing, taken)
    return sizing.request(specs, budgets, **taken)  # type: ignore[no-any-return]  # engine rules


def keyword_form(
    old: Sequence[str], new: str, *, passes_sizing: bool = False, method: bool = False
) -> Callable[[_F], _F]:
    """Let an entry point that takes a :class:`PlanRequest` first also take its deprecated
    keyword form (three leading arguments and request fields as keywords), with a warning.

    Args:
        old: the names of the old form's three leading arguments (``("specs",
            "available_bytes", "rules")``); they may also come as keywords.
        new: the replacement, as the warning names it (``{name}`` stands for the entry
            point's own name).
        passes_sizing: the third argument (an engine's rules) stays an argument of the new
            form, after the request (``plan_for_vllm(request, rules)``); otherwise (a context)
            it goes into the request only.
        method: the entry point is a method (its first argument, ``self``, is passed as is).

    Returns:
        The decorator.
    """

    def wrap(function: _F) -> _F:
        name = function.__qualname__
        call = f"{name}({', '.join(old)}, *, ...)"
        replacement = new.format(name=name)

        @functools.wraps(function)
        def either(*args: Any, **kwargs: Any) -> Any:
            owner, given = (args[:1], args[1:]) if method else ((), args)
            if (given and isinstance(given[0], PlanRequest)) or "request" in kwargs:
                return function(*args, **kwargs)
            leading = list(given[: len(old)])
            leading += [kwargs.pop(key) for key in old[len(leading) :] if key in kwargs]
            if len(leading) < len(old):  # neither form: let Python name what is missing
                return function(*args, **kwargs)
            specs, budgets, sizing = leading
            request = keyword_request(call, replacement, specs, budgets, sizing, kwargs, stacklevel=3)
            passed = (request, sizing) if passes_sizing else (request,)
            return function(*owner, *passed, *given[len(old) :], **kwargs)

        return either  # type: ignore[return-value]  # the new signature is the one callers should see

    return wrap
