"""A checkpoint's weight bytes from its safetensors headers, never its tensor data.

A safetensors file starts with an 8-byte little-endian header length and a JSON header that
gives each tensor's ``dtype``, ``shape`` and ``data_offsets`` (``[begin, end)`` in the data
that follows; format: https://huggingface.co/docs/safetensors/index#format). A sharded
checkpoint names its files in ``model.safetensors.index.json`` (``weight_map``: tensor ->
file). This module reads those headers from a local folder (a model folder, a Hugging Face
cache snapshot) and sums them into a :class:`~kvcore.model_weights.CheckpointWeights`;
:mod:`kvcore.frontends.hf_hub` reads the same headers from the Hub with range requests.

Nothing here runs a repository's code or imports torch.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvcore.errors import InvalidInputError
from kvcore.model_weights import CheckpointWeights
from kvcore.validators import is_int

#: The single file of an unsharded checkpoint, and the index of a sharded one (the names
#: transformers and huggingface_hub use).
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: The longest header read (safetensors' own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000


def header_sizes(header: Mapping[str, Any], source: str) -> tuple[int, int, dict[str, int]]:
    """``(bytes, elements, {dtype: bytes})`` of one parsed header.

    Args:
        header: the JSON header (its ``__metadata__`` entry is skipped).
        source: the file, for messages.

    Raises:
        InvalidInputError: a tensor entry without a dtype, shape or ``[begin, end)`` offsets.
    """
    total = elements = 0
    by_dtype: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, Mapping) else None
        shape = info.get("shape") if isinstance(info, Mapping) else None
        dtype = info.get("dtype") if isinstance(info, Mapping) else None
        if (
            not isinstance(dtype, str)
            or not isinstance(shape, list)
            or not all(is_int(n) and n >= 0 for n in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(is_int(n) for n in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise InvalidInputError(
                f"{source}: tensor {name!r} is not a safetensors header entry "
                '({"dtype": str, "shape": [int, ...], "data_offsets": [begin, end]}): got '
                f"{json.dumps(info)[:200]}"
            )
        size = offsets[1] - offsets[0]
        total += size
        elements += math.prod(shape)
        by_dtype[dtype] = by_dtype.get(dtype, 0) + size
    return total, elements, by_dtype


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of the safetensors file ``path`` (its first bytes only).

    Raises:
        InvalidInputError: the file is unreadable, shorter than its header, or the header is
            not a JSON object.
    """
    try:
        with path.open("rb") as file:
            prefix = file.read(8)
            if len(prefix) != 8:
                raise InvalidInputError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise InvalidInputError(
                    f"{path}: not a safetensors file (a header of {length:,} bytes, over the "
                    f"{MAX_HEADER_BYTES:,} safetensors allows)"
                )
            raw = file.read(length)
    except OSError as exc:
        raise InvalidInputError(
            f"{path}: cannot read its safetensors header: {exc.strerror or exc}"
        ) from None
    if len(raw) != length:
        raise InvalidInputError(f"{path}: the safetensors header is cut short ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"{path}: the safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise InvalidInputError(f"{path}: the safetensors header is not a JSON object")
    return header


def summarize(headers: Iterable[tuple[str, Mapping[str, Any]]], source: str) -> CheckpointWeights:
    """Sum ``(file, header)`` pairs into the checkpoint's weights.

    Args:
        headers: each file's name and parsed header.
        source: where they were read, for messages (``"the Hugging Face Hub ..."``).
    """
    total = elements = files = 0
    by_dtype: dict[str, int] = {}
    for name, header in headers:
        size, count, dtypes = header_sizes(header, name)
        total += size
        elements += count
        files += 1
        for dtype, nbytes in dtypes.items():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    return CheckpointWeights(
        total=total,
        elements=elements,
        by_dtype=tuple(sorted(by_dtype.items(), key=lambda item: (-item[1], item[0]))),
        files=files,
        source=f"{files} safetensors header{'s' if files != 1 else ''} ({source})",
    )


def _relative_file(name: object) -> bool:
    """A file name inside the checkpoint's folder: no absolute path, no ``..``."""
    return isinstance(name, str) and bool(name) and not name.startswith("/") and ".." not in name.split("/")


def shard_names(index: Any, source: str) -> list[str]:
    """The files a ``model.safetensors.index.json`` names, sorted.

    Raises:
        InvalidInputError: no ``weight_map`` of ``{tensor: file}``.
    """
    weight_map = index.get("weight_map") if isinstance(index, Mapping) else None
    if (
        not isinstance(weight_map, Mapping)
        or not weight_map
        or not all(_relative_file(name) for name in weight_map.values())
    ):
        raise InvalidInputError(f"{source}: no weight_map of {{tensor: file}} in the safetensors index")
    return sorted(set(weight_map.values()))


def local_weights(folder: Path, source: str) -> CheckpointWeights | None:
    """The weights of the checkpoint in ``folder`` (a model folder or a cache snapshot), read
    from its safetensors headers; ``None`` when it holds no safetensors checkpoint, or only part
    of one (a shard the index names is missing: a partial download).

    Raises:
        InvalidInputError: an unreadable index or header.
    """
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidInputError(f"{index_path}: cannot read the safetensors index: {exc}") from None
        names = shard_names(index, str(index_path))
    elif (folder / SINGLE_FILE).is_file():
        names = [SINGLE_FILE]
    else:
        return None
    paths = [folder / name for name in names]
    if not all(path.is_file() for path in paths):
        return None
    return summarize(((str(path), read_header(path)) for path in paths), source)
