"""Real models in: a Hugging Face ``config.json`` becomes ``{layer name: spec}``.

Model families are plugins: each implements the ``kvcore_layer_specs`` hook and claims the
configs whose ``model_type`` it knows (the built-in families live in ``kvcore.plugins.models``;
a generic fallback honours ``layer_types`` for any other model type). This module owns what
every family shares:

- :class:`ModelOptions`: tensor parallelism, the KV-cache and state dtypes, the block size;
- reading a config the way transformers does (``Infinity`` and ``NaN``, bare or tagged as
  ``{"__float__": "Infinity"}``), from a file, a folder holding ``config.json``, or by the name
  of a model bundled with kvcore (:func:`bundled_models`). Nothing here touches the network;
- :func:`layer_specs_from_config`, which asks the plugins and checks what they answer.

Layer names are the qualified names of the modules that hold the cache in the transformers
model class the config's ``architectures`` names, e.g. ``model.layers.3.self_attn``, so that a
scan of the instantiated model (:func:`kvcore.frontends.module_scan.scan_module`) gives the same names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from kvcore.dtypes import dtype_name, to_dtype
from kvcore.errors import (
    InvalidInputError,
    InvalidSpecError,
    ModelConfigError,
    PluginValidationError,
    UnknownModelError,
)
from kvcore.frontends.specfile import load_json_file
from kvcore.spec import KVCacheSpec, check_layer_specs

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry

#: Value of a dtype option that means "the model's own dtype".
AUTO = "auto"
#: Block size of config-derived attention specs unless ``block_size`` says otherwise.
DEFAULT_BLOCK_SIZE = 16
#: The dtype a config is read as when it names none (``dtype`` / ``torch_dtype``): what
#: inference engines serve such models in.
DEFAULT_MODEL_DTYPE = torch.bfloat16
#: Package and folder of the bundled configs.
ZOO_PACKAGE = "kvcore.data"
ZOO_FOLDER = "zoo"
#: Where the how-to for new families lives (named in errors).
ADD_FAMILY_DOC = "docs/how-to/add-a-model-family.md"

_FLOAT_TAG = "__float__"
_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _positive_option(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"model option {attribute.name!r} must be an int >= 1 (got {value!r})")


def _dtype_option(value: object) -> torch.dtype | None:
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
            the model's dtype. Strings such as ``"fp8"``, ``"fp8_e5m2"`` or ``"bfloat16"``
            are converted.
        state_dtype: element type of SSM / linear-attention states; ``None`` (``"auto"``)
            means the model's dtype. ``kv_cache_dtype`` never applies to states.
        block_size: tokens per block of every attention-like layer.
    """

    tp: int = attrs.field(default=1, validator=_positive_option)
    kv_cache_dtype: torch.dtype | None = attrs.field(default=None, converter=_dtype_option)
    state_dtype: torch.dtype | None = attrs.field(default=None, converter=_dtype_option)
    block_size: int = attrs.field(default=DEFAULT_BLOCK_SIZE, validator=_positive_option)

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype of attention / MLA caches for a model of ``model_dtype``."""
        return self.kv_cache_dtype or model_dtype

    def state_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype of SSM / linear-attention states for a model of ``model_dtype``."""
        return self.state_dtype or model_dtype

    def kv_heads_per_rank(self, kv_heads: int) -> int:
        """``max(1, kv_heads // tp)``: KV heads one tensor-parallel rank holds."""
        return max(1, kv_heads // self.tp)

    def to_hook_options(self) -> dict[str, Any]:
        """The options as the ``kvcore_layer_specs`` / ``kvcore_spec_for_module`` hooks get them.

        Keys: ``tp``, ``kv_cache_dtype`` and ``state_dtype`` (a torch dtype name or
        ``"auto"``), ``block_size``. :meth:`from_hook_options` reads them back.
        """
        return {
            "tp": self.tp,
            "kv_cache_dtype": dtype_name(self.kv_cache_dtype) if self.kv_cache_dtype else AUTO,
            "state_dtype": dtype_name(self.state_dtype) if self.state_dtype else AUTO,
            "block_size": self.block_size,
        }

    @classmethod
    def from_hook_options(cls, options: Mapping[str, Any] | ModelOptions | None) -> ModelOptions:
        """Read the mapping a hook receives (missing keys take their defaults).

        Raises:
            InvalidInputError: an unknown key or a bad value.
        """
        if isinstance(options, ModelOptions):
            return options
        values = dict(options or {})
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InvalidInputError(f"unknown model options {unknown}; known options: {sorted(known)}")
        return cls(**values)


# -- reading configs -----------------------------------------------------------------------


def decode_special_floats(value: Any) -> Any:
    """Replace transformers' tagged floats (``{"__float__": "Infinity"}``) by the floats."""
    if isinstance(value, dict):
        if set(value) == {_FLOAT_TAG} and value[_FLOAT_TAG] in _FLOAT_TAGS:
            return _FLOAT_TAGS[value[_FLOAT_TAG]]
        return {key: decode_special_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode_special_floats(item) for item in value]
    return value


_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _as_config(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        got = "null" if data is None else _JSON_TYPES.get(type(data), type(data).__name__)
        raise ModelConfigError(f"{source}: a model config must be a JSON object (got {got})")
    return decode_special_floats(data)  # type: ignore[no-any-return]


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``config.json`` from a file, or from a folder that holds one.

    JSON is read as transformers reads it: bare ``Infinity``/``NaN`` and tagged floats.

    Raises:
        InvalidInputError: the file is missing, unreadable or not JSON.
        ModelConfigError: the JSON is not an object.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise InvalidInputError(f"folder {p} holds no config.json; pass the config file or its folder")
        p = p / "config.json"
    return _as_config(load_json_file(p), str(p))


@attrs.frozen(kw_only=True)
class BundledModel:
    """A model whose published ``config.json`` ships with kvcore.

    Attributes:
        name: the Hugging Face repository id, e.g. ``"google/gemma-3-27b-it"``.
        filename: the file in ``kvcore/data/zoo/`` (``"google__gemma-3-27b-it.json"``).
    """

    name: str
    filename: str

    def config(self) -> dict[str, Any]:
        """The parsed config (a fresh dict each call)."""
        text = (
            resources.files(ZOO_PACKAGE)
            .joinpath(ZOO_FOLDER)
            .joinpath(self.filename)
            .read_text(encoding="utf-8")
        )
        return _as_config(json.loads(text), f"bundled {self.name}")


@cache
def bundled_models() -> tuple[BundledModel, ...]:
    """Every bundled model, sorted by name."""
    folder = resources.files(ZOO_PACKAGE).joinpath(ZOO_FOLDER)
    models = [
        BundledModel(name=entry.name.removesuffix(".json").replace("__", "/", 1), filename=entry.name)
        for entry in folder.iterdir()
        if entry.name.endswith(".json")
    ]
    return tuple(sorted(models, key=lambda m: m.name.lower()))


def find_bundled_model(name: str) -> BundledModel | None:
    """The bundled model called ``name`` (``"org/model"``, or ``"model"`` alone when that is
    unambiguous; case-insensitive), or ``None``."""
    wanted = name.strip().lower()
    models = bundled_models()
    exact = [m for m in models if m.name.lower() == wanted]
    if exact:
        return exact[0]
    short = [m for m in models if m.name.lower().split("/", 1)[-1] == wanted]
    return short[0] if len(short) == 1 else None


def load_model_config(name_or_path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    """The config of a model given as a path (file or folder) or as a bundled model's name.

    An existing path wins over a bundled name. Nothing is downloaded.

    Returns:
        ``(config, source)``: the parsed config and where it came from, for messages.

    Raises:
        UnknownModelError: neither an existing path nor a bundled name; lists the bundled names.
        InvalidInputError: the file is unreadable or not JSON.
        ModelConfigError: the JSON is not an object.
    """
    text = os.fspath(name_or_path)
    if Path(text).exists():
        return read_config_file(text), text
    bundled = find_bundled_model(text)
    if bundled is not None:
        return bundled.config(), f"bundled {bundled.name}"
    names = ", ".join(m.name for m in bundled_models())
    raise UnknownModelError(
        f"{text!r} is neither a file or folder here nor a bundled model; kvcore never downloads, "
        f"so pass the path of a config.json (or of its folder) or one of: {names}"
    )


# -- configs to specs ----------------------------------------------------------------------


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of ``config``: its ``text_config`` when it has one."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def max_position_embeddings(config: Mapping[str, Any]) -> int | None:
    """The longest context the config states (``text_config`` first), or ``None``."""
    for part in (text_config(config), config):
        value = part.get("max_position_embeddings")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def layer_specs_from_config(
    config: Mapping[str, Any], registry: Registry, options: ModelOptions | None = None
) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` for a parsed ``config.json``, from the model-family plugins.

    Args:
        config: the parsed config (wrappers such as gemma3 / llama4 included).
        registry: whose plugins answer ``kvcore_layer_specs`` (first result wins).
        options: tensor parallelism, dtypes, block size; default :class:`ModelOptions`.

    Returns:
        The cache-holding layers in model order.

    Raises:
        ModelConfigError: the config is not an object or a field is missing or out of range;
            the message names the model type and the field.
        UnknownModelError: no plugin knows the model type and there is no ``layer_types``.
        PluginValidationError: a plugin answered something other than ``{name: spec}``.
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"a model config must be a JSON object (got a {type(config).__name__})")
    opts = options if options is not None else ModelOptions()
    result = registry.pm.hook.kvcore_layer_specs(config=config, options=opts.to_hook_options())
    if result is None:
        model_type = config.get("model_type")
        what = f"model type {model_type!r}" if model_type is not None else "a config without 'model_type'"
        raise UnknownModelError(
            f"no model-family plugin knows {what} and the config has no 'layer_types'; install or "
            f"write a plugin that implements kvcore_layer_specs for it ({ADD_FAMILY_DOC})"
        )
    if not isinstance(result, Mapping):
        raise PluginValidationError(
            f"kvcore_layer_specs returned {type(result).__name__} for model type "
            f"{config.get('model_type')!r}; expected a mapping of layer name to spec or None"
        )
    specs = dict(result)
    try:
        check_layer_specs(specs)
    except InvalidSpecError as exc:
        raise PluginValidationError(
            f"kvcore_layer_specs answered badly for model type {config.get('model_type')!r}: {exc}"
        ) from None
    return specs


def model_layer_specs(
    name_or_path: str | os.PathLike[str], registry: Registry, options: ModelOptions | None = None
) -> dict[str, KVCacheSpec]:
    """:func:`load_model_config` then :func:`layer_specs_from_config`; errors name the source.

    Raises:
        UnknownModelError, InvalidInputError, ModelConfigError: as those two functions.
    """
    config, source = load_model_config(name_or_path)
    try:
        return layer_specs_from_config(config, registry, options)
    except (ModelConfigError, UnknownModelError) as exc:
        raise type(exc)(f"{source}: {exc}") from None
