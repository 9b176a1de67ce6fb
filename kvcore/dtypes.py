"""Cache dtypes by name, with their byte sizes; no torch needed.

Planning is arithmetic on byte counts, so a spec holds a :class:`DType`: a name and the bytes
of one element. JSON holds the same names torch uses (``"bfloat16"``, ``"float8_e4m3fn"``).
:func:`to_dtype` accepts such a name, the short spellings engines use on the command line
(``"bf16"``, ``"fp8"``, ``"fp8_e5m2"``), a :class:`DType`, or a ``torch.dtype``, which it
recognises without importing torch. The runtime turns a :class:`DType` back into a
``torch.dtype`` where it makes tensors (:func:`kvcore.runtime.torch_dtypes.torch_dtype`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard, Union

import attrs

from kvcore.error_messages import did_you_mean
from kvcore.errors import InvalidInputError, InvalidSpecError
from kvcore.removed import removed_message

if TYPE_CHECKING:
    import torch


@attrs.frozen(repr=False, eq=False)
class DType:
    """An element type a cache may be stored in.

    Equal to another :class:`DType` of the same name and size. Comparing one with a
    ``torch.dtype`` (what kvcore 0.1's specs held: ``value in (torch.int8, torch.uint8)``) is
    refused with an error naming the :class:`DType` to compare with: kvcore 0.2 kept it equal by
    name with a warning, and 0.3 removed it, so it cannot silently be unequal.

    Attributes:
        name: torch's name for it, as written to JSON (``"bfloat16"``).
        itemsize: bytes per element.
    """

    name: str
    itemsize: int

    def __eq__(self, other: object) -> bool:
        equal = self._equals(other)
        return NotImplemented if equal is None else equal

    def __ne__(self, other: object) -> bool:
        equal = self._equals(other)
        return NotImplemented if equal is None else not equal

    def _equals(self, other: object) -> bool | None:
        """Equality with a :class:`DType`; ``None``: not comparable.

        Raises:
            InvalidInputError: ``other`` is a torch dtype (names the replacement).
        """
        if isinstance(other, DType):
            return self.name == other.name and self.itemsize == other.itemsize
        if is_torch_dtype(other):
            raise InvalidInputError(
                removed_message(
                    f"comparing kvcore dtype {self.name} with {other}",
                    f"kvcore.dtypes.{self.name} (or to_dtype({other})): specs hold kvcore.dtypes.DType "
                    "since kvcore 0.2",
                )
            )
        return None

    def __hash__(self) -> int:
        return hash((self.name, self.itemsize))

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


#: Dtypes a KV cache or a state cache may be stored in, by name.
SUPPORTED_BY_NAME: dict[str, DType] = {
    dtype.name: dtype
    for dtype in (
        DType("float64", 8),
        DType("float32", 4),
        DType("bfloat16", 2),
        DType("float16", 2),
        DType("float8_e4m3fn", 1),
        DType("float8_e5m2", 1),
        DType("float8_e4m3fnuz", 1),
        DType("float8_e5m2fnuz", 1),
        DType("int8", 1),
        DType("uint8", 1),
        DType("int16", 2),
        DType("int32", 4),
    )
}

#: Dtypes a KV cache or a state cache may be stored in.
SUPPORTED: tuple[DType, ...] = tuple(SUPPORTED_BY_NAME.values())

float64 = SUPPORTED_BY_NAME["float64"]
float32 = SUPPORTED_BY_NAME["float32"]
bfloat16 = SUPPORTED_BY_NAME["bfloat16"]
float16 = SUPPORTED_BY_NAME["float16"]
float8_e4m3fn = SUPPORTED_BY_NAME["float8_e4m3fn"]
float8_e5m2 = SUPPORTED_BY_NAME["float8_e5m2"]
float8_e4m3fnuz = SUPPORTED_BY_NAME["float8_e4m3fnuz"]
float8_e5m2fnuz = SUPPORTED_BY_NAME["float8_e5m2fnuz"]
int8 = SUPPORTED_BY_NAME["int8"]
uint8 = SUPPORTED_BY_NAME["uint8"]
int16 = SUPPORTED_BY_NAME["int16"]
int32 = SUPPORTED_BY_NAME["int32"]

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
    # torch's own second names of supported dtypes (``torch.int``, ``torch.short``)
    "int": "int32",
    "short": "int16",
}

#: torch dtypes (by every name torch gives them) that cannot hold a cache, with torch's main
#: name of each, so that naming one says "cannot hold a KV cache" rather than "unknown".
UNSUPPORTED_TORCH_NAMES: dict[str, str] = {
    **{
        name: name
        for name in (
            "bool",
            "int64",
            "uint16",
            "uint32",
            "uint64",
            "complex32",
            "complex64",
            "complex128",
            "float8_e8m0fnu",
            "float4_e2m1fn_x2",
            "qint8",
            "quint8",
            "qint32",
            "quint4x2",
            "quint2x4",
            "bits8",
            "bits16",
            "bits1x8",
            "bits2x4",
            "bits4x2",
            *(f"int{n}" for n in range(1, 8)),
            *(f"uint{n}" for n in range(1, 8)),
        )
    },
    "long": "int64",
    "chalf": "complex32",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "bit": "uint1",
}

#: What :func:`to_dtype` accepts: a name, a :class:`DType` or a ``torch.dtype``.
DTypeLike = Union[str, DType, "torch.dtype"]


def is_torch_dtype(value: object) -> TypeGuard[torch.dtype]:
    """Whether ``value`` is a ``torch.dtype``, found out without importing torch."""
    cls = type(value)
    return cls.__name__ == "dtype" and cls.__module__ == "torch"


def _unsupported(name: str) -> InvalidSpecError:
    names = ", ".join(SUPPORTED_BY_NAME)
    return InvalidSpecError(f"'dtype' {name!r} cannot hold a KV cache; use one of {names}")


def to_dtype(value: DTypeLike) -> DType:
    """Convert a dtype name, a :class:`DType` or a ``torch.dtype`` into a supported :class:`DType`.

    Args:
        value: ``"bfloat16"``, ``"torch.bfloat16"``, ``"bf16"``, ``"fp8"`` (any case), a
            :class:`DType`, or ``torch.bfloat16``.

    Returns:
        The supported dtype of that name.

    Raises:
        InvalidSpecError: the name is unknown or the dtype cannot hold a KV cache.
    """
    if isinstance(value, DType):
        if SUPPORTED_BY_NAME.get(value.name) != value:
            raise _unsupported(value.name)
        return value
    if is_torch_dtype(value):
        name = str(value).removeprefix("torch.")
        found = SUPPORTED_BY_NAME.get(name)
        if found is None:
            raise _unsupported(name)
        return found
    if not isinstance(value, str):
        raise InvalidSpecError(
            f"'dtype' must be a torch.dtype or its name (got {value!r} that is a {type(value).__name__})"
        )
    name = value.strip().lower().removeprefix("torch.")
    name = ALIASES.get(name, name)
    found = SUPPORTED_BY_NAME.get(name)
    if found is not None:
        return found
    if name in UNSUPPORTED_TORCH_NAMES:
        raise _unsupported(UNSUPPORTED_TORCH_NAMES[name])
    close = did_you_mean(name, [*SUPPORTED_BY_NAME, *ALIASES]).rstrip()
    raise InvalidSpecError(
        f"'dtype' must be a torch dtype name such as 'bfloat16', 'float16', 'float32' or "
        f"'float8_e4m3fn' (got {value!r}{': ' + close if close else ''})"
    )


def dtype_name(dtype: DType | torch.dtype) -> str:
    """The torch name of a dtype, as written to JSON: ``dtype_name(to_dtype("bf16")) == 'bfloat16'``.

    Args:
        dtype: a :class:`DType` or a ``torch.dtype`` (any, supported or not).

    Returns:
        The name without a ``torch.`` prefix.
    """
    if isinstance(dtype, DType):
        return dtype.name
    return str(dtype).removeprefix("torch.")


def dtype_size(dtype: DType | torch.dtype) -> int:
    """Bytes per element of ``dtype``.

    Args:
        dtype: a :class:`DType` or a ``torch.dtype``.

    Returns:
        Its ``itemsize``.
    """
    return int(dtype.itemsize)
