"""What the rules of every engine integration share: the sizing context a plan for the engine
is made with, and the :class:`~kvcore.planning.request.PlanRequest` of that context.

An engine's planning function (``plan_for_vllm(request, rules)``, ``plan_for_sglang``,
``plan_for_transformers``) takes a request and the engine's rules; the request's length and
step size must be the ones the rules size for (:meth:`EngineRules.context`: vLLM counts the
batches in flight as the step, SGLang the chunks in flight), so :meth:`EngineRules.request`
makes it and :meth:`EngineRules.check_request` refuses any other, instead of planning for a
length or a step the engine does not run.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from kvcore.errors import InvalidInputError
from kvcore.planning.request import PlanRequest, one_budget, takes_request
from kvcore.spec import KVCacheSpec, SizingContext

#: What an engine's planning function (``plan_for_vllm(request, rules, *, registry)``, ...) is
#: decorated with: its 0.1 keyword form, ``(specs, available_bytes, rules, *, registry,
#: policy=..., ...)``, removed in 0.3, is refused naming the request ``rules.request`` makes.
takes_engine_request = takes_request(
    "specs, available_bytes, rules",
    "{name}(rules.request(specs, available_bytes, policy=...), rules, registry=...)",
)


class EngineRules(abc.ABC):
    """The base of an engine's rules (an attrs value class of the engine's settings)."""

    __slots__ = ()

    #: The engine's name, as messages give it.
    engine: ClassVar[str]
    #: The policy :meth:`request` plans with when none is given.
    default_policy: ClassVar[str] = "auto"

    @abc.abstractmethod
    def context(self) -> SizingContext:
        """The sizing context of a plan the engine runs."""

    def request(self, specs: Mapping[str, KVCacheSpec], available_bytes: int, **fields: Any) -> PlanRequest:
        """The request of a plan for the engine: ``specs`` in ``available_bytes``, sized by
        :meth:`context`.

        Args:
            specs: ``{layer name: spec}`` in model order.
            available_bytes: the engine's KV-cache budget in bytes.
            fields: the request's other fields (``policy``: :attr:`default_policy` unless
                given; ``options``, ``num_blocks``, ...).

        Raises:
            InvalidInputError, InvalidSpecError: as :class:`PlanRequest` checks its fields.
        """
        fields.setdefault("policy", self.default_policy)
        return PlanRequest.for_context(specs, available_bytes, self.context(), **fields)

    def check_request(self, request: PlanRequest) -> None:
        """Refuse a request the engine would not run as planned: one not sized by
        :meth:`context`, a length ``auto`` chooses, or several ranks' budgets
        (:func:`~kvcore.planning.request.one_budget`).

        Raises:
            InvalidInputError: says what differs and how to make the request.
        """
        fix = "make it with rules.request(specs, available_bytes, ...)"
        if not isinstance(request, PlanRequest):
            raise InvalidInputError(f"expected a kvcore.PlanRequest (got a {type(request).__name__}); {fix}")
        own = self.context()
        if request.max_model_len.auto:
            raise InvalidInputError(
                f"the request plans for max_model_len='auto', but {self.engine} runs a plan of its "
                f"rules' max_model_len, {own.max_model_len}; {fix}"
            )
        differ = [
            f"{field.name}={getattr(request.context, field.name)} (the rules': {getattr(own, field.name)})"
            for field in attrs.fields(SizingContext)
            if getattr(request.context, field.name) != getattr(own, field.name)
        ]
        if differ:
            raise InvalidInputError(
                f"the request's context has {', '.join(differ)}, but {self.engine} runs a plan sized by "
                f"its rules' context; {fix}"
            )
        one_budget(request, f"a plan for {self.engine}")
