"""Torch dtypes as they appear in spec files, configs and plans.

Specs hold real :class:`torch.dtype` objects; JSON holds their torch names (``"bfloat16"``,
``"float8_e4m3fn"``). :func:`to_dtype` also accepts the short spellings engines use on the
command line (``"bf16"``, ``"fp8"``, ``"fp8_e5m2"``).
"""

from __future__ import annotations

import torch

from kvcore.errors import InvalidSpecError

#: Short spellings accepted besides torch's own dtype names.
ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp64": "float64",
    "double": "float64",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "fp8_e4m3fnuz": "float8_e4m3fnuz",
    "fp8_e5m2fnuz": "float8_e5m2fnuz",
}

#: Dtypes a KV cache or a state cache may be stored in.
SUPPORTED: tuple[torch.dtype, ...] = tuple(
    getattr(torch, name)
    for name in (
        "float64",
        "float32",
        "bfloat16",
        "float16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "int8",
        "uint8",
        "int16",
        "int32",
    )
    if hasattr(torch, name)
)


def dtype_name(dtype: torch.dtype) -> str:
    """The torch name of a dtype, as written to JSON: ``dtype_name(torch.bfloat16) == 'bfloat16'``."""
    return str(dtype).removeprefix("torch.")


def to_dtype(value: str | torch.dtype) -> torch.dtype:
    """Convert a dtype name (or a dtype) into a supported :class:`torch.dtype`.

    Raises:
        InvalidSpecError: the name is unknown or the dtype cannot hold a KV cache.
    """
    if isinstance(value, torch.dtype):
        dtype = value
    elif isinstance(value, str):
        name = value.strip().lower().removeprefix("torch.")
        name = ALIASES.get(name, name)
        candidate = getattr(torch, name, None)
        if not isinstance(candidate, torch.dtype):
            raise InvalidSpecError(
                f"'dtype' must be a torch dtype name such as 'bfloat16', 'float16', 'float32' or "
                f"'float8_e4m3fn' (got {value!r})"
            )
        dtype = candidate
    else:
        raise InvalidSpecError(
            f"'dtype' must be a torch.dtype or its name (got {value!r} that is a {type(value).__name__})"
        )
    if dtype not in SUPPORTED:
        names = ", ".join(dtype_name(d) for d in SUPPORTED)
        raise InvalidSpecError(f"'dtype' {dtype_name(dtype)!r} cannot hold a KV cache; use one of {names}")
    return dtype


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return int(dtype.itemsize)
