"""Real models in: a Hugging Face ``config.json`` becomes ``{layer name: spec}``.

Model families are plugins: each registers a :class:`~kvcore.model_family.ModelFamily` that
claims the configs whose ``model_type`` it knows (the built-in families live in
``kvcore.plugins.models``; a generic fallback honours ``layer_types`` for any other model
type), and the registry (:meth:`~kvcore.planning.registry.Registry.layer_specs`) calls the one
that claims a config. This module reads configs:

- the way transformers does (``Infinity`` and ``NaN``, bare or tagged as
  ``{"__float__": "Infinity"}``), from a file, a folder holding ``config.json``, by the name
  of a model bundled with kvcore (:func:`bundled_models`), from the local Hugging Face cache,
  or from the Hub (:func:`find_model_config`; only this last one touches the network);
- :func:`layer_specs_from_config` and :func:`model_layer_specs`, which hand a config and the
  :class:`~kvcore.model_options.ModelOptions` to the registry.

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
from typing import TYPE_CHECKING, Any, Literal

import attrs

from kvcore.error_messages import did_you_mean
from kvcore.errors import (
    HubUnavailableError,
    InvalidInputError,
    ModelAccessError,
    ModelConfigError,
    UnknownModelError,
)
from kvcore.frontends.hf_hub import HubConfig
from kvcore.frontends.specfile import load_json_file
from kvcore.model_weights import CheckpointWeights
from kvcore.spec import KVCacheSpec
from kvcore.validators import is_int

if TYPE_CHECKING:
    from kvcore.model_options import ModelOptions
    from kvcore.planning.registry import Registry

#: Package and folder of the bundled configs.
ZOO_PACKAGE = "kvcore.data"
ZOO_FOLDER = "zoo"

_FLOAT_TAG = "__float__"
_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


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


#: Where a model's config came from: a path given, the bundled zoo, the local Hugging Face
#: cache, or the Hugging Face Hub.
ModelOrigin = Literal["path", "zoo", "cache", "hub"]


@attrs.frozen(kw_only=True)
class ModelConfig:
    """A model's config and where it came from (:func:`find_model_config`).

    Attributes:
        name: the model as asked for (a path, a bundled name, ``org/name``).
        config: the parsed config.
        origin: ``"path"``, ``"zoo"``, ``"cache"`` or ``"hub"``.
        source: where it came from, for messages (``'bundled google/gemma-3-27b-it'``,
            ``'org/name (Hugging Face cache /.../config.json)'``).
        folder: the folder the config lies in (a model folder, a cache snapshot), where a
            safetensors checkpoint beside it is looked for; ``None`` for a bundled model.
        hub: the Hub's answer, for a model read from the Hub.
    """

    name: str
    config: dict[str, Any]
    origin: ModelOrigin
    source: str
    folder: Path | None = None
    hub: HubConfig | None = None

    def checkpoint_weights(self) -> tuple[CheckpointWeights | None, str]:
        """The checkpoint's weights read from its safetensors headers, and a note for messages.

        The headers are read beside the config (a model folder, a cache snapshot holding the
        whole checkpoint), else on the Hub: for a model read from there, and for a cached one
        whose snapshot lacks the weights while the Hub may be asked (huggingface_hub installed,
        not offline; the snapshot's commit is read). ``None`` where there are none (a bundled
        model ships its config only; no safetensors checkpoint), and the weights are then
        counted from the config; the note says why where a Hub read failed for a cached model.

        Raises:
            HubUnavailableError, ModelAccessError, UnknownModelError: a Hub request failed for a
                model read from the Hub.
            InvalidInputError: an index or header that is not what safetensors writes.
        """
        from kvcore.frontends.hf_hub import fetch_weights, hub_available, hub_endpoint
        from kvcore.frontends.safetensors_header import local_weights

        if self.hub is not None:
            return fetch_weights(self.hub), ""
        if self.folder is None:
            return None, ""
        where = "the Hugging Face cache" if self.origin == "cache" else str(self.folder)
        weights = local_weights(self.folder, where)
        if weights is not None or self.origin != "cache" or not hub_available():
            return weights, ""
        snapshot = HubConfig(
            name=self.name.strip(),
            path=self.folder / "config.json",
            commit=self.folder.name,
            revision=None,
            endpoint=hub_endpoint(),
        )
        try:
            return fetch_weights(snapshot), ""
        except (HubUnavailableError, ModelAccessError, UnknownModelError) as exc:
            return None, f"weights counted from the config: their safetensors headers were not read ({exc})"


def find_model_config(name_or_path: str | os.PathLike[str], *, revision: str | None = None) -> ModelConfig:
    """The config of a model given as a path (file or folder), a bundled model's name, an
    ``org/name`` in the local Hugging Face cache (:mod:`kvcore.frontends.hf_cache`), or an
    ``org/name`` on the Hugging Face Hub (:mod:`kvcore.frontends.hf_hub`, with the
    ``kvcore[hub]`` extra), in that order: the Hub is asked only for what is not here.

    Args:
        name_or_path: the path or name.
        revision: a branch, tag or commit of a Hub repository: the bundled configs are then
            passed over (each is one published revision), and the cache and the Hub are asked
            for that revision.

    Raises:
        UnknownModelError: not found (the message lists the bundled names and the cache folder
            looked in; in offline mode it names HF_HUB_OFFLINE).
        ModelAccessError: a gated or private repository refused the request.
        HubUnavailableError: the Hub could not be reached.
        MissingDependencyError: the model must come from the Hub and huggingface_hub is missing.
        InvalidInputError: the file is unreadable or not JSON, or a revision with a path.
        ModelConfigError: the JSON is not an object.
    """
    from kvcore.frontends.hf_cache import find_cached_config, hub_cache_dir, is_repo_id

    text = os.fspath(name_or_path)
    if Path(text).exists():
        if revision is not None:
            raise InvalidInputError(
                f"a revision ({revision!r}) names a version of a Hugging Face repository; {text} is a "
                "path here"
            )
        path = Path(text)
        folder = path if path.is_dir() else path.parent
        config = read_config_file(text)
        return ModelConfig(name=text, config=config, origin="path", source=text, folder=folder)
    bundled = find_bundled_model(text) if revision is None else None
    if bundled is not None:
        return ModelConfig(name=text, config=bundled.config(), origin="zoo", source=f"bundled {bundled.name}")
    cached = find_cached_config(text, revision=revision)
    if cached is not None:
        return ModelConfig(
            name=text,
            config=read_config_file(cached),
            origin="cache",
            source=f"{text} (Hugging Face cache {cached})",
            folder=cached.parent,
        )
    models = bundled_models()
    # 'gemma-3-27b' is close to the short name, 'google/gemma-3-27b' to the full one
    close = did_you_mean(text, [m.name for m in models]) or did_you_mean(
        text, [m.name.split("/", 1)[-1] for m in models]
    )
    if is_repo_id(text):
        from kvcore.frontends.hf_hub import fetch_config

        try:
            hub = fetch_config(text.strip(), revision)
        except UnknownModelError as exc:
            raise UnknownModelError(f"{close}{exc}" if close else str(exc)) from None
        return ModelConfig(
            name=text,
            config=read_config_file(hub.path),
            origin="hub",
            source=hub.describe(),
            folder=None,
            hub=hub,
        )
    names = ", ".join(m.name for m in models)
    raise UnknownModelError(
        f"{text!r} is neither a file or folder here, nor a bundled model, nor in the Hugging Face cache "
        f"({hub_cache_dir()}); {close}pass the path of a config.json (or of its folder), org/name of a model "
        f"in that cache or on the Hugging Face Hub (set HF_HUB_CACHE or HF_HOME to use another cache), "
        f"or one of: {names}"
    )


def load_model_config(
    name_or_path: str | os.PathLike[str], *, revision: str | None = None
) -> tuple[dict[str, Any], str]:
    """The config of a model and where it came from (:func:`find_model_config`, which says in
    what order it looks: a path, the bundled zoo, the local Hugging Face cache, the Hub).

    Returns:
        ``(config, source)``: the parsed config and where it came from, for messages.

    Raises:
        UnknownModelError, ModelAccessError, HubUnavailableError, MissingDependencyError,
        InvalidInputError, ModelConfigError: as :func:`find_model_config`.
    """
    found = find_model_config(name_or_path, revision=revision)
    return found.config, found.source


# -- configs to specs ----------------------------------------------------------------------


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of ``config``: its ``text_config`` when it has one."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


#: The fields that state a model's longest context; an encoder-decoder states its decoder's
#: as ``max_target_positions`` (Whisper: 448).
#: ``model_max_length``: where KimiLinearConfig keeps its ``max_position_embeddings`` (an
#: ``attribute_map`` alias, transformers 5.24 ``models/kimi_linear/configuration_kimi_linear.py``).
LENGTH_KEYS = ("max_position_embeddings", "max_target_positions", "model_max_length")


@attrs.frozen(kw_only=True)
class ModelLength:
    """The longest context a model was trained for, and where the figure came from.

    Attributes:
        value: the length in tokens.
        key: the field (``"max_position_embeddings"`` or ``"max_target_positions"``).
        default: the config omits the field and ``value`` is what its transformers config class
            supplies (:attr:`~kvcore.model_family.ModelFamily.config_defaults`), as for
            gemma-3-27b-it (``Gemma3TextConfig``: 131,072).
    """

    value: int
    key: str
    default: bool = False

    def describe(self) -> str:
        """The field for messages: ``'max_position_embeddings'``, with ``' (the config class's
        default; the config omits it)'`` for a default."""
        return self.key + (" (its config class's default; the config omits it)" if self.default else "")


def model_length(config: Mapping[str, Any], registry: Registry | None = None) -> ModelLength | None:
    """The longest context of the model ``config`` describes: the field the config states
    (``text_config`` first), else the default of its config class, which the family that
    reads the config gives (none without ``registry``); ``None`` when neither says.

    Args:
        config: the parsed config.
        registry: whose model families give the defaults.
    """
    for part in (text_config(config), config):
        for key in LENGTH_KEYS:
            value = part.get(key)
            if is_int(value) and value > 0:
                return ModelLength(value=value, key=key)
    family = registry.family_for(config) if registry is not None else None
    if family is None:
        return None
    defaults = family.defaults_for(config.get("model_type"))
    for key in LENGTH_KEYS:
        value = defaults.get(key)
        if is_int(value) and value > 0:
            return ModelLength(value=value, key=key, default=True)
    return None


def max_position_embeddings(config: Mapping[str, Any], registry: Registry | None = None) -> int | None:
    """The longest context of ``config``'s model in tokens (:func:`model_length`), or ``None``."""
    length = model_length(config, registry)
    return length.value if length is not None else None


def layer_specs_from_config(
    config: Mapping[str, Any], registry: Registry, options: ModelOptions | Mapping[str, Any] | None = None
) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` for a parsed ``config.json``, from the model-family plugins.

    Args:
        config: the parsed config (wrappers such as gemma3 / llama4 included).
        registry: whose families read it (:meth:`~kvcore.planning.registry.Registry.layer_specs`).
        options: tensor parallelism, dtypes, block size, draft layers (``speculative``,
            :mod:`kvcore.frontends.draft_layers`); default
            :class:`~kvcore.model_options.ModelOptions` (a plain mapping is validated first).

    Returns:
        The cache-holding layers in model order.

    Raises:
        ModelConfigError: the config is not an object or a field is missing or out of range;
            the message names the model type and the field.
        UnknownModelError: no family claims the model type and there is no ``layer_types``.
        PluginValidationError: a family answered something other than ``{name: spec}``.
        InvalidInputError: bad options.
    """
    from kvcore.frontends.draft_layers import with_draft_layers
    from kvcore.model_options import to_model_options

    opts = to_model_options(options)
    return with_draft_layers(config, registry.layer_specs(config, opts), opts, registry)


def model_layer_specs(
    name_or_path: str | os.PathLike[str],
    registry: Registry,
    options: ModelOptions | Mapping[str, Any] | None = None,
) -> dict[str, KVCacheSpec]:
    """:func:`load_model_config` then :func:`layer_specs_from_config`; errors name the source.

    Raises:
        UnknownModelError, InvalidInputError, ModelConfigError: as those two functions.
    """
    config, source = load_model_config(name_or_path)
    return config_layer_specs(config, source, registry, options)


def config_layer_specs(
    config: Mapping[str, Any],
    source: str,
    registry: Registry,
    options: ModelOptions | Mapping[str, Any] | None = None,
) -> dict[str, KVCacheSpec]:
    """:func:`layer_specs_from_config` of a config already loaded (the command line loads one
    once per command); errors name ``source``, where it came from.

    Raises:
        UnknownModelError, InvalidInputError, ModelConfigError: as :func:`layer_specs_from_config`.
    """
    try:
        return layer_specs_from_config(config, registry, options)
    except (ModelConfigError, UnknownModelError) as exc:
        raise type(exc)(f"{source}: {exc}") from None
