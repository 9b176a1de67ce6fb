"""Deprecated alias of :mod:`kvcore.plugins.models.kit`, the model-family kit (kvcore 0.1's name).

Model-family plugins written against kvcore 0.1 imported their helpers from here. Importing it
still works until kvcore 0.3, with a ``DeprecationWarning`` naming the new module; every name
is looked up in :mod:`~kvcore.plugins.models.kit`. Names that kit no longer has (0.1's
``claim``, replaced by registering model types) are an ``AttributeError`` naming the
replacement, and an ``ImportError`` with the same message where ``from ... import claim`` asks
for them (Python turns an ``AttributeError`` there into a bare "cannot import name").
"""

from __future__ import annotations

import dis
import sys
import warnings
from typing import Any

from kvcore.plugins.models import kit

warnings.warn(
    "kvcore.plugins.models.common is deprecated since kvcore 0.2 and goes away in 0.3; "
    "import the model-family kit from kvcore.plugins.models.kit instead",
    DeprecationWarning,
    stacklevel=2,
)

#: 0.1 names that have no one-to-one replacement, with what to do instead.
_REMOVED = {
    "claim": (
        "families no longer claim configs with a function: register "
        "kvcore.ModelFamily(name=..., model_types=(...), layer_specs=...) from "
        "kvcore_register_model_families (docs/how-to/add-a-model-family.md)"
    ),
}


_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


def _asked_by_import() -> bool:
    """Whether the code that asked for a name is a ``from ... import`` (its frame stands at an
    ``IMPORT_FROM`` instruction): there an ``AttributeError`` would reach the user as a bare
    "cannot import name", so the removed name's message goes out as an ``ImportError``."""
    try:
        frame = sys._getframe(2)  # __getattr__ <- the asking code
    except ValueError:  # pragma: no cover - no such frame
        return False
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _IMPORT_FROM


def __getattr__(name: str) -> Any:
    if name in _REMOVED:
        message = f"kvcore.plugins.models.common.{name} was removed in kvcore 0.2: {_REMOVED[name]}"
        if _asked_by_import():
            raise ImportError(message, name=__name__)
        raise AttributeError(message)
    return getattr(kit, name)


def __dir__() -> list[str]:
    return sorted(set(dir(kit)) - set(_REMOVED))
