"""How a model is served, as far as its cache is concerned: the options every model front end
and model-family plugin receives.

:class:`ModelOptions` is what the hooks get (``kvcore_spec_for_module``) and what registered
model families are called with: a frozen, validated object, never a dict. A caller that holds a
plain mapping (``{"tp": 2, "kv_cache_dtype": "fp8"}``) turns it into options once, with
:func:`to_model_options`, where it enters kvcore (``scan_module``, ``LocalExecutor``).

This module is part of the contract: it imports no torch, and dtypes are
:class:`kvcore.dtypes.DType` values named as torch names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvcore.dtypes import DType, DTypeLike, to_dtype
from kvcore.errors import InvalidInputError, InvalidSpecError
from kvcore.validators import int_at_least

#: Value of a dtype option that means "the model's own dtype".
AUTO = "auto"
#: Block size of config-derived attention specs unless ``block_size`` says otherwise.
DEFAULT_BLOCK_SIZE = 16
#: The dtype a config is read as when it names none (``dtype`` / ``torch_dtype``): what
#: inference engines serve such models in.
DEFAULT_MODEL_DTYPE: DType = to_dtype("bfloat16")
#: Draft models whose layers ``speculative`` adds to a model's plan: ``mtp`` the model's own
#: multi-token-prediction layers (``num_nextn_predict_layers``), ``eagle`` one EAGLE-style
#: full-attention layer with the model's attention geometry.
SPECULATIVE_METHODS = ("mtp", "eagle")
#: attrs validator of a count or size option: an int >= 1.
_positive_option = int_at_least(1, owner="model option ")


def _speculative(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and value not in SPECULATIVE_METHODS:
        methods = ", ".join(SPECULATIVE_METHODS)
        raise InvalidInputError(f"model option 'speculative' must be {methods} or None (got {value!r})")


def _dtype_option(value: object) -> DType | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == AUTO):
        return None
    try:
        return to_dtype(value)  # type: ignore[arg-type]
    except InvalidSpecError as exc:
        raise InvalidInputError(f"{exc}, or 'auto' for the model's own dtype") from None


@attrs.frozen(kw_only=True)
class ModelOptions:
    """How a model is served, as far as its cache is concerned.

    Attributes:
        tp: tensor-parallel size. An attention layer keeps ``max(1, kv_heads // tp)`` KV heads
            per rank (heads are replicated when ``tp`` exceeds them); an MLA latent is
            replicated on every rank; SSM / linear-attention state heads and channels are
            sharded (they must divide by ``tp``).
        kv_cache_dtype: element type of attention and MLA caches; ``None`` (``"auto"``) means
            the model's dtype. Names such as ``"fp8"``, ``"fp8_e5m2"`` or ``"bfloat16"`` are
            converted with :func:`kvcore.dtypes.to_dtype`.
        state_dtype: element type of SSM / linear-attention states; ``None`` (``"auto"``)
            means the model's dtype. ``kv_cache_dtype`` never applies to states.
        block_size: tokens per block of every attention-like layer.
        speculative: the draft model whose cache-holding layers join the model's own
            (:data:`SPECULATIVE_METHODS`), named after the model's last layer index
            (``model.layers.61.self_attn`` on DeepSeek-V3); ``None``: none.

    Raises:
        InvalidInputError: a size that is not an int >= 1, or a dtype that cannot hold a cache.
    """

    tp: int = attrs.field(default=1, validator=_positive_option)
    kv_cache_dtype: DType | None = attrs.field(default=None, converter=_dtype_option)
    state_dtype: DType | None = attrs.field(default=None, converter=_dtype_option)
    block_size: int = attrs.field(default=DEFAULT_BLOCK_SIZE, validator=_positive_option)
    speculative: str | None = attrs.field(default=None, validator=_speculative)

    def cache_dtype(self, model_dtype: DTypeLike) -> DType:
        """The dtype of attention / MLA caches.

        Args:
            model_dtype: the model's own dtype (read only when ``kv_cache_dtype`` is auto).

        Returns:
            ``kv_cache_dtype``, else ``model_dtype``.
        """
        return self.kv_cache_dtype or to_dtype(model_dtype)

    def state_cache_dtype(self, model_dtype: DTypeLike) -> DType:
        """The dtype of SSM / linear-attention states: ``state_dtype``, else ``model_dtype``
        (as :meth:`cache_dtype` is for attention caches)."""
        return self.state_dtype or to_dtype(model_dtype)

    def kv_heads_per_rank(self, kv_heads: int) -> int:
        """``max(1, kv_heads // tp)``: KV heads one tensor-parallel rank holds."""
        return max(1, kv_heads // self.tp)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelOptions:
        """Options from a plain mapping (missing keys take their defaults).

        Args:
            values: any of ``tp``, ``kv_cache_dtype``, ``state_dtype`` (a dtype, its name or
                ``"auto"``), ``block_size`` and ``speculative``.

        Returns:
            The validated options.

        Raises:
            InvalidInputError: an unknown key (the message lists the known ones) or a bad value.
        """
        known = [a.name for a in attrs.fields(cls)]
        unknown = sorted(str(key) for key in values if key not in known)
        if unknown:
            raise InvalidInputError(f"unknown model options {unknown}; known options: {sorted(known)}")
        return cls(**values)


def to_model_options(options: ModelOptions | Mapping[str, Any] | None) -> ModelOptions:
    """The options a caller handed in, validated once where they enter kvcore.

    Args:
        options: :class:`ModelOptions` (returned as it is), a plain mapping (read with
            :meth:`ModelOptions.from_mapping`), or ``None`` for the defaults.

    Returns:
        The options as the object hooks and families receive.

    Raises:
        InvalidInputError: an unknown key, a bad value, or something that is neither options
            nor a mapping.
    """
    if isinstance(options, ModelOptions):
        return options
    if options is None:
        return ModelOptions()
    if not isinstance(options, Mapping):
        raise InvalidInputError(
            f"model options must be kvcore.ModelOptions or a mapping such as {{'tp': 2}} "
            f"(got {type(options).__name__})"
        )
    return ModelOptions.from_mapping(options)
