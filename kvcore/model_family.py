"""What a model-family plugin registers: the model types it reads, and how it reads a config.

A plugin registers its families through the ``kvcore_register_model_families`` hook::

    from kvcore import ModelFamily, hookimpl

    @hookimpl
    def kvcore_register_model_families(register):
        register(ModelFamily(name="acme", model_types=("acme",), layer_specs=acme_specs))

Each ``model_type`` is claimed by one family only: two plugins claiming the same one is a
:class:`~kvcore.errors.DuplicateRegistrationError` naming both. A *fallback* family claims
configs by a test instead (``fallback``); it is asked only when no family claims the model
type. The registry (:meth:`kvcore.planning.registry.Registry.layer_specs`) picks the family and
checks what it answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.errors import PluginValidationError

if TYPE_CHECKING:
    from kvcore.model_options import ModelOptions
    from kvcore.spec import KVCacheSpec

#: Where the how-to for new model families lives (named in errors).
ADD_FAMILY_DOC = "docs/how-to/add-a-model-family.md"
#: How a family reads a config: ``(config, options) -> {layer name: spec}`` in model order.
LayerSpecsFunction = Callable[[Mapping[str, Any], "ModelOptions"], Mapping[str, "KVCacheSpec"]]
#: How a fallback family says whether it reads a config no family claims.
FallbackTest = Callable[[Mapping[str, Any]], bool]


def _name(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise PluginValidationError(f"a model family needs a non-empty name (got {value!r})")


def _model_types(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise PluginValidationError(
            f"a model family's model_types must be a sequence of names such as ('llama',) (got {value!r})"
        )
    types = tuple(value)
    bad = [t for t in types if not isinstance(t, str) or not t]
    if bad:
        raise PluginValidationError(f"a model family's model_types must be non-empty strings (got {bad!r})")
    return types


def _callable(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not callable(value):
        raise PluginValidationError(f"a model family's {attribute.name} must be callable (got {value!r})")


@attrs.frozen(kw_only=True)
class ModelFamily:
    """A family of models kvcore reads from ``config.json``.

    Attributes:
        name: shown in messages and listings (``"llama"``, ``"acme"``).
        layer_specs: ``layer_specs(config, options)`` returns ``{layer name: spec}`` for every
            cache-holding layer, in model order. ``config`` is the whole parsed config
            (wrappers included); ``options`` is a :class:`~kvcore.model_options.ModelOptions`.
            A bad config raises :class:`~kvcore.errors.ModelConfigError`.
        model_types: the ``model_type`` values this family claims; no other family may claim
            them.
        fallback: for a fallback family, ``fallback(config)`` says whether the family reads a
            config whose model type no family claims (the built-in generic family reads any
            config that lists ``layer_types``). ``None`` for an ordinary family.

    Raises:
        PluginValidationError: no name, ``model_types`` that are not names, a ``layer_specs``
            or ``fallback`` that is not callable, or neither model types nor a fallback.
    """

    name: str = attrs.field(validator=_name)
    layer_specs: LayerSpecsFunction = attrs.field(validator=_callable)
    model_types: tuple[str, ...] = attrs.field(default=(), converter=_model_types)
    fallback: FallbackTest | None = attrs.field(default=None, validator=attrs.validators.optional(_callable))

    def __attrs_post_init__(self) -> None:
        if not self.model_types and self.fallback is None:
            raise PluginValidationError(
                f"model family {self.name!r} claims nothing: give it model_types, or a fallback test"
            )
