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
from kvcore.planning.serialization import spec_from_dict, spec_to_dict
from kvcore.spec import KVCacheSpec, check_layer_specs

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry


def load_json_file(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file the way transformers reads configs (``Infinity`` and ``NaN`` allowed).

    Raises:
        InvalidInputError: the file is missing, unreadable or not JSON.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInputError(f"file not found: {p}") from None
    except OSError as exc:
        raise InvalidInputError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"{p} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def specs_from_dict(data: Any, registry: Registry, source: str = "spec file") -> dict[str, KVCacheSpec]:
    """Build ``{layer name: spec}`` from a parsed spec file.

    Raises:
        InvalidSpecError: naming the layer and field at fault.
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
    specs: dict[str, KVCacheSpec] = {}
    for name, entry in layers.items():
        try:
            specs[name] = spec_from_dict(entry, registry)
        except KVCoreError as exc:
            raise type(exc)(f"{source}: layer {name!r}: {exc}") from None
    check_layer_specs(specs)
    return specs


def read_spec_file(path: str | os.PathLike[str], registry: Registry) -> dict[str, KVCacheSpec]:
    """Read a spec file into ``{layer name: spec}``; see :func:`specs_from_dict`."""
    return specs_from_dict(load_json_file(path), registry, source=str(path))


def specs_to_dict(specs: Mapping[str, KVCacheSpec], registry: Registry) -> dict[str, Any]:
    """The spec-file form of ``specs``."""
    return {"layers": {name: spec_to_dict(spec, registry) for name, spec in specs.items()}}
