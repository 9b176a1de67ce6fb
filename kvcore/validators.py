"""Checks of integer and number arguments, worded one way across kvcore.

Python's ``bool`` is a subclass of ``int``, so ``isinstance(True, int)`` holds and ``True`` would
pass for a count of 1. Every count, size and index kvcore accepts goes through :func:`is_int`
(or :func:`check_int`), which refuse bools; fractions and durations go through
:func:`is_number`.

Two kinds of checks are offered:

- functions for values met in code: :func:`is_int` and :func:`is_number` answer yes or no (for
  callers that word their own error, or fail a test), :func:`check_int` raises the error class it
  is given, with the value, its type and the limit: ``'num_blocks' must be an int >= 1 (got 0)``;
- attrs validators for fields: :func:`positive_int` and :func:`non_negative_int` for spec
  kinds (they raise :class:`~kvcore.errors.InvalidSpecError` naming the kind, and are also
  importable from :mod:`kvcore.spec`), :func:`int_at_least` for any other class (options,
  requests; :class:`~kvcore.errors.InvalidInputError` unless told otherwise).

This module is part of the contract: of kvcore it imports :mod:`kvcore.errors` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import attrs

from kvcore.errors import InvalidInputError, InvalidSpecError, KVCoreError

#: An attrs validator: called with the instance, the field (an ``attrs.Attribute``) and the value.
Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` and not a ``bool``.

    Args:
        value: anything.

    Returns:
        ``True`` for ``0``, ``-3`` or an ``int`` subclass other than ``bool``; ``False`` for
        ``True``, ``1.0``, ``"1"`` and everything else.
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is an ``int`` or a ``float`` and not a ``bool``.

    Args:
        value: anything.

    Returns:
        ``True`` for ``2`` or ``0.5`` (``nan`` and infinities included: compare them yourself);
        ``False`` for ``True``, ``"0.5"`` and everything else.
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _limits(minimum: int | None, below: int | None) -> str:
    if minimum is not None and below is not None:
        return f" in [{minimum}, {below})"
    if minimum is not None:
        return f" >= {minimum}"
    if below is not None:
        return f" < {below}"
    return ""


def check_int(
    value: object,
    name: str,
    *,
    minimum: int | None = None,
    below: int | None = None,
    error: type[KVCoreError] = InvalidInputError,
    owner: str = "",
) -> int:
    """Check that ``value`` is an ``int`` (not a ``bool``) within limits; return it.

    Args:
        value: the value to check.
        name: what the message calls it, as it should read: ``"'num_blocks'"`` (a parameter,
            quoted) or ``"the world size"``.
        minimum: the smallest value allowed, if any.
        below: the first value too large (an exclusive bound, as for an index), if any.
        error: the :class:`~kvcore.errors.KVCoreError` subclass to raise.
        owner: prefix of the message naming whose value it is, e.g. ``"rank 3: "``.

    Returns:
        ``value``, typed as an ``int``.

    Raises:
        KVCoreError: an instance of ``error``: ``value`` is not an int, is a bool, or is out
            of range. The message reads ``<owner><name> must be an int >= 1 (got 1.5, a float)``.
    """
    if not is_int(value):
        limits = _limits(minimum, below)
        raise error(f"{owner}{name} must be an int{limits} (got {value!r}, a {type(value).__name__})")
    if (minimum is not None and value < minimum) or (below is not None and value >= below):
        raise error(f"{owner}{name} must be an int{_limits(minimum, below)} (got {value!r})")
    return value


def int_at_least(minimum: int, *, error: type[KVCoreError] = InvalidInputError, owner: str = "") -> Validator:
    """An attrs validator: the field is an ``int`` (not a ``bool``) of at least ``minimum``.

    For options and other inputs that are not specs (specs use :func:`positive_int` and
    :func:`non_negative_int`, which name the kind).

    Args:
        minimum: the smallest value allowed.
        error: the :class:`~kvcore.errors.KVCoreError` subclass to raise.
        owner: prefix of the message, e.g. ``"model option "``.

    Returns:
        The validator; it raises as :func:`check_int` does, naming the field:
        ``model option 'tp' must be an int >= 1 (got 0)``.
    """

    def validate(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        check_int(value, repr(attribute.name), minimum=minimum, error=error, owner=owner)

    validate.__doc__ = f"attrs validator: the field is an int (not a bool) >= {minimum}."
    return validate


def _spec_owner(instance: object) -> str:
    kind = getattr(type(instance), "kind", "")
    return f"{kind}: " if kind else f"{type(instance).__name__}: "


def _spec_int(
    instance: object, attribute: attrs.Attribute[Any], value: object, minimum: int, wanted: str
) -> None:
    # the wording spec kinds have used since 0.1, which spec-file users and third-party kinds see
    field = f"{_spec_owner(instance)}{attribute.name!r}"
    if not is_int(value):
        raise InvalidSpecError(f"{field} must be {wanted} (got {value!r} that is a {type(value).__name__})")
    if value < minimum:
        raise InvalidSpecError(f"{field} must be >= {minimum} (got {value})")


def positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator for spec fields: ``value`` is an ``int`` (not a ``bool``) and at least 1.

    Args:
        instance: the spec being built; the message names its ``kind`` (else its class).
        attribute: the field.
        value: the value given.

    Raises:
        InvalidSpecError: e.g. ``full_attention: 'head_size' must be >= 1 (got 0)``, or
            ``... must be a positive int (got '8' that is a str)``.
    """
    _spec_int(instance, attribute, value, 1, "a positive int")


def non_negative_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """:func:`positive_int` for a field that may be 0: ``value`` is an ``int`` (not a ``bool``)
    and at least 0, else ``InvalidSpecError`` (``KVCacheTensor: 'offset' must be >= 0 (got -1)``)."""
    _spec_int(instance, attribute, value, 0, "an int >= 0")


def boolean(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: ``value`` is ``True`` or ``False`` (not ``1``, ``"yes"`` or ``None``).

    Args:
        instance: the object being built.
        attribute: the field.
        value: the value given.

    Raises:
        InvalidInputError: e.g. ``'reserve_null_block' must be True or False (got 'yes')``.
    """
    if type(value) is not bool:
        raise InvalidInputError(f"'{attribute.name}' must be True or False (got {value!r})")
