"""What a model-family plugin registers: the model types it reads, and how it reads a config.

A plugin registers its families through the ``kvcore_register_model_families`` hook::

    from kvcore import ModelFamily, hookimpl

    @hookimpl
    def kvcore_register_model_families(register):
        register(ModelFamily(name="acme", model_types=("acme",), layer_specs=acme_specs,
                             config_defaults={"acme": {"max_position_embeddings": 32768}}))

Each ``model_type`` is claimed by one family only: two plugins claiming the same one is a
:class:`~kvcore.errors.DuplicateRegistrationError` naming both. A *fallback* family claims
configs by a test instead (``fallback``); it is asked only when no family claims the model
type. The registry (:meth:`kvcore.planning.registry.Registry.layer_specs`) picks the family and
checks what it answers. A family also states the defaults its transformers config class
supplies for fields a published ``config.json`` may omit (``config_defaults``), so that a model
whose config leaves out ``max_position_embeddings`` (gemma-3-27b-it) still has its length.
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


def _defaults(value: object) -> dict[str, dict[str, Any]]:
    shape = "{'gemma3_text': {'max_position_embeddings': 131072}}"
    if not isinstance(value, Mapping) or not all(
        isinstance(t, str) and t and isinstance(f, Mapping) and all(isinstance(k, str) and k for k in f)
        for t, f in value.items()
    ):
        raise PluginValidationError(
            f"a model family's config_defaults must map model types to {{field: default}}, such as {shape} "
            f"(got {value!r})"
        )
    return {model_type: dict(fields) for model_type, fields in value.items()}


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
        config_defaults: per model type, what its transformers config class supplies for
            fields a ``config.json`` may omit, for the language model's part of the config (its
            ``text_config`` when it has one), e.g. ``{"gemma3": {"max_position_embeddings":
            131072}}`` (``Gemma3TextConfig``'s default). Read by
            :func:`kvcore.frontends.hf_config.max_position_embeddings`; empty by default.

    Raises:
        PluginValidationError: no name, ``model_types`` that are not names, a ``layer_specs``
            or ``fallback`` that is not callable, neither model types nor a fallback, or
            ``config_defaults`` that is not a mapping of field names.
    """

    name: str = attrs.field(validator=_name)
    layer_specs: LayerSpecsFunction = attrs.field(validator=_callable)
    model_types: tuple[str, ...] = attrs.field(default=(), converter=_model_types)
    fallback: FallbackTest | None = attrs.field(default=None, validator=attrs.validators.optional(_callable))
    config_defaults: Mapping[str, Mapping[str, Any]] = attrs.field(
        factory=dict, converter=_defaults, hash=False
    )

    def __attrs_post_init__(self) -> None:
        if not self.model_types and self.fallback is None:
            raise PluginValidationError(
                f"model family {self.name!r} claims nothing: give it model_types, or a fallback test"
            )
        unclaimed = sorted(set(self.config_defaults) - set(self.model_types))
        if unclaimed and self.fallback is None:
            raise PluginValidationError(
                f"model family {self.name!r} gives config_defaults for model types it does not claim: "
                f"{unclaimed}; it claims {list(self.model_types)}"
            )

    def defaults_for(self, model_type: object) -> Mapping[str, Any]:
        """The defaults the config class of ``model_type`` supplies (empty when none given)."""
        return self.config_defaults.get(model_type, {}) if isinstance(model_type, str) else {}
