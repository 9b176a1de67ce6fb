"""Byte sizes: parse what people type (``24GiB``, ``500MB``, ``1e9``) and print them back."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from kvcore.errors import InvalidInputError
from kvcore.validators import is_int

#: Multipliers for the units :func:`parse_size` accepts (case-insensitive). Binary units are
#: powers of 1024, decimal units powers of 1000; a bare ``K``/``M``/``G``/``T`` is binary, as
#: GPU memory is usually quoted that way.
UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
}

_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``"24GiB"``, ``"500MB"``, ``"1.5G"`` or ``"1073741824"``.

    Args:
        text: the size; an ``int`` is returned unchanged (after a sign check).

    Returns:
        The size in bytes, rounded down to a whole byte.

    Raises:
        InvalidInputError: the text is not a non-negative number with a known unit.
    """
    if is_int(text):
        if text < 0:
            raise InvalidInputError(f"size must not be negative (got {text})")
        return text
    match = _SIZE.match(str(text))  # a bool reads as 'True', which is no size
    if match is None:
        raise InvalidInputError(
            f"cannot read size {text!r}; write bytes or a number with a unit, e.g. '24GiB', '500MB', '1.5G'"
        )
    number, unit = match.groups()
    factor = UNITS.get(unit.lower())
    if factor is None:
        known = ", ".join(u for u in ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
        raise InvalidInputError(f"unknown size unit {unit!r} in {text!r}; use one of {known}")
    try:
        value = Decimal(number.replace("_", "")) * factor
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise InvalidInputError(f"cannot read size {text!r}") from exc
    return int(value)


def format_bytes(num_bytes: int | float, *, precision: int = 2) -> str:
    """Format a byte count with binary units: ``format_bytes(3 * 2**30) == '3.00 GiB'``."""
    value = float(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
