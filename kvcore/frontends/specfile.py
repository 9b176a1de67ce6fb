"""Spec files: ``{"layers": {"<layer name>": {"kind": ..., <fields>}, ...}}``.

Layer order in the file is model order. The format is documented in
``docs/reference/json-formats.md``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcore.errors import InvalidInputError, InvalidSpecError, KVCoreError
from kvcore.json_input import loads, read_bounded
from kvcore.limits import check_layer_count, check_layer_name
from kvcore.planning.serialization import spec_from_dict, spec_to_dict
from kvcore.spec import KVCacheSpec, check_layer_specs

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(key)
        result[key] = value
    return result


def load_json_file(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file the way transformers reads configs (``Infinity`` and ``NaN`` allowed).

    A key that appears twice in one object (a layer named twice) is refused: JSON readers keep
    the last one silently.

    Raises:
        InvalidInputError: the file is missing, unreadable, larger than
            :data:`kvcore.limits.MAX_INPUT_BYTES`, not UTF-8, not JSON, nests deeper than
            :data:`kvcore.limits.MAX_JSON_DEPTH`, names a key twice in one object, or holds a
            number of more than 4,300 digits; the message names the file.
    """
    p = Path(path)
    try:
        text = read_bounded(p).decode("utf-8")
    except FileNotFoundError:
        raise InvalidInputError(f"file not found: {p}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"{p} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            "spec files and config.json files are JSON in UTF-8"
        ) from None
    except OSError as exc:
        raise InvalidInputError(f"cannot read {p}: {exc.strerror or exc}") from None
    return parse_json(text, str(p))


def parse_json(text: str, source: str) -> Any:
    """Parse JSON text as :func:`load_json_file` does; errors name ``source``.

    Args:
        text: the JSON.
        source: where it came from (a path), for messages.

    Returns:
        The parsed value.

    Raises:
        InvalidInputError: not JSON, a key twice in one object, a number too long, or nesting
            too deep.
    """
    try:
        return loads(text, source, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except _DuplicateKeyError as exc:
        raise InvalidInputError(
            f"{source}: {exc.key!r} appears twice in one JSON object (a layer or field named twice); "
            "JSON readers would keep only the last, so kvcore refuses it: remove or rename one"
        ) from None


def specs_from_dict(data: Any, registry: Registry, source: str = "spec file") -> dict[str, KVCacheSpec]:
    """Build ``{layer name: spec}`` from a parsed spec file.

    Raises:
        InvalidSpecError: naming the file, the layer and the field at fault; more than
            :data:`~kvcore.limits.MAX_LAYERS`, or a layer name that breaks the layer-name rule
            (:func:`~kvcore.limits.check_layer_name`), checked before any spec is built.
        UnknownSpecKindError: a layer names a kind no plugin registered.
    """
    if not isinstance(data, Mapping):
        raise InvalidSpecError(
            f"{source}: expected a JSON object with a 'layers' key (got {type(data).__name__})"
        )
    layers = data.get("layers")
    if not isinstance(layers, Mapping):
        raise InvalidSpecError(
            f"{source}: expected 'layers' to map layer names to specs, e.g. "
            '{"layers": {"model.layers.0": {"kind": "full_attention", ...}}} '
            f"(got {type(layers).__name__})"
        )
    unknown = sorted(set(data) - {"layers"})
    if unknown:
        raise InvalidSpecError(f"{source}: unknown top-level keys {unknown}; a spec file has only 'layers'")
    try:
        check_layer_count(len(layers), source)
        for name in layers:
            check_layer_name(name)
    except InvalidSpecError as exc:
        raise InvalidSpecError(f"{source}: {exc}") from None
    specs: dict[str, KVCacheSpec] = {}
    for name, entry in layers.items():
        try:
            specs[name] = spec_from_dict(entry, registry)
        except KVCoreError as exc:
            raise type(exc)(f"{source}: layer {name!r}: {exc}") from None
    try:
        check_layer_specs(specs)
    except InvalidSpecError as exc:
        raise InvalidSpecError(f"{source}: {exc}") from None
    return specs


def read_spec_file(path: str | os.PathLike[str], registry: Registry) -> dict[str, KVCacheSpec]:
    """Read a spec file into ``{layer name: spec}``; see :func:`specs_from_dict`."""
    return specs_from_dict(load_json_file(path), registry, source=str(path))


def specs_to_dict(specs: Mapping[str, KVCacheSpec], registry: Registry) -> dict[str, Any]:
    """The spec-file form of ``specs``."""
    return {"layers": {name: spec_to_dict(spec, registry) for name, spec in specs.items()}}
