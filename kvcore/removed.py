"""The forms kvcore 0.3 removed, each refused with an error that names its replacement.

kvcore 0.2 kept the 0.1 forms working for one minor version, with a ``DeprecationWarning``
(docs/reference/plugin-api.md); 0.3 removes them. Code written against 0.1 then fails where it
uses one, and the error says what to write instead, rather than a bare "has no attribute": a
removed module attribute is an ``AttributeError`` (an ``ImportError`` where ``from ... import``
asks for it, since Python turns an ``AttributeError`` there into a bare "cannot import name").
"""

from __future__ import annotations

import dis
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import NoReturn

#: The version that removed the forms deprecated in 0.2.
REMOVED_IN = "0.3"

_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


def removed_message(old: str, replacement: str) -> str:
    """``"kvcore.Layout was removed in kvcore 0.3: use kvcore.BlockPlacement"``."""
    return f"{old} was removed in kvcore {REMOVED_IN}: use {replacement}"


def refuse_removed(module: str, name: str, replacement: str) -> NoReturn:
    """Raise the error of asking module ``module`` for its removed name ``name``.

    Raises:
        ImportError: a ``from module import name`` asked (naming the replacement).
        AttributeError: any other lookup (naming the replacement); ``hasattr`` is ``False``.
    """
    message = removed_message(f"{module}.{name}", replacement)
    if _asked_by_import():
        raise ImportError(message, name=module)
    raise AttributeError(message, name=name)


def names_removed_from(module: str, replacements: Mapping[str, str]) -> Callable[[str], NoReturn]:
    """A module ``__getattr__`` that refuses each removed name of ``replacements`` (``{name:
    what to use instead}``) with :func:`refuse_removed`, and any other missing name as Python
    does. A module assigns it under ``if not TYPE_CHECKING:``, so that type checkers keep
    refusing names the module does not define."""

    def __getattr__(name: str) -> NoReturn:
        if name in replacements:
            refuse_removed(module, name, replacements[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}", name=name)

    return __getattr__


def _asked_by_import() -> bool:
    """Whether the code that asked for the name is a ``from ... import`` (its frame stands at an
    ``IMPORT_FROM`` instruction); the frames of this module and of ``__getattr__`` hooks are
    the lookup's own, not the asker's."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_name == "__getattr__"
    ):
        frame = frame.f_back
    if frame is None:  # pragma: no cover - asked from nowhere
        return False
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _IMPORT_FROM
