"""Byte sizes: parse what people type (``24GiB``, ``500MB``, ``1e9``) and print them back."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from kvcore.errors import InvalidInputError
from kvcore.limits import MAX_BYTES, shown
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
        InvalidInputError: the text is not a non-negative number with a known unit, or the size
            is above :data:`~kvcore.limits.MAX_BYTES` (1 EiB).
    """
    if is_int(text):
        if text < 0:
            raise InvalidInputError(f"size must not be negative (got {shown(text)})")
        return _at_most_max(text, shown(text))
    match = _SIZE.match(str(text))  # a bool reads as 'True', which is no size
    if match is None:
        unsigned = str(text).strip().removeprefix("-")
        if unsigned != str(text).strip() and _SIZE.match(unsigned):
            raise InvalidInputError(
                f"a size must be positive, got {_quoted(text)}; write it without the minus sign, "
                f"e.g. {_quoted(unsigned)}"
            )
        raise InvalidInputError(
            f"cannot read size {_quoted(text)}; write bytes or a number with a unit, "
            "e.g. '24GiB', '500MB', '1.5G'"
        )
    number, unit = match.groups()
    factor = UNITS.get(unit.lower())
    if factor is None:
        known = ", ".join(u for u in ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
        raise InvalidInputError(f"unknown size unit {unit!r} in {_quoted(text)}; use one of {known}")
    try:
        value = Decimal(number.replace("_", ""))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise InvalidInputError(f"cannot read size {_quoted(text)}") from exc
    # compared before it becomes an int: 1e999999 would otherwise take a minute to expand
    if value > Decimal(MAX_BYTES) / factor:
        _at_most_max(MAX_BYTES + 1, _quoted(text))
    return int(value * factor)


def _quoted(text: object) -> str:
    shown_text = repr(text)
    return shown_text if len(shown_text) <= 40 else f"{shown_text[:37]}...'"


def _at_most_max(num_bytes: int, shown_text: str) -> int:
    if num_bytes > MAX_BYTES:
        raise InvalidInputError(
            f"size {shown_text} is above the largest kvcore accepts, 1 EiB ({MAX_BYTES:,} bytes, "
            "kvcore.limits.MAX_BYTES); give the KV cache's size in bytes or with a unit, e.g. '24GiB'"
        )
    return num_bytes


_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(num_bytes: int | float, *, precision: int = 2) -> str:
    """Format a byte count with binary units: ``format_bytes(3 * 2**30) == '3.00 GiB'``.

    Any int or float is formatted: up to 1024 EiB with a unit (``'5.00 PiB'``), beyond in
    powers of ten (``'1.00e+400 B'``), and ``'inf B'`` / ``'nan B'`` as such.
    """
    if isinstance(num_bytes, float) and not math.isfinite(num_bytes):
        return f"{num_bytes} B"
    sign = "-" if num_bytes < 0 else ""
    magnitude = abs(num_bytes)
    if magnitude < 1024:
        return f"{sign}{int(magnitude)} B"
    for power, unit in enumerate(_BINARY_UNITS, start=1):
        if magnitude < 1024 ** (power + 1) or (unit == "EiB" and magnitude < 1024**7):
            return f"{sign}{magnitude / 1024**power:.{precision}f} {unit}"
    exact = Decimal(int(magnitude))
    return f"{sign}{exact.scaleb(-exact.adjusted()):.{precision}f}e+{exact.adjusted()} B"
