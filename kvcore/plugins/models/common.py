"""Deprecated alias of :mod:`kvcore.plugins.models.kit`, the model-family kit (kvcore 0.1's name).

Model-family plugins written against kvcore 0.1 imported their helpers from here. Importing it
still works until kvcore 0.3, with a ``DeprecationWarning`` naming the new module; every name
is looked up in :mod:`~kvcore.plugins.models.kit`. Names that kit no longer has (0.1's
``claim``, replaced by registering model types) are an ``AttributeError`` naming the
replacement.
"""

from __future__ import annotations

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


def __getattr__(name: str) -> Any:
    if name in _REMOVED:
        raise AttributeError(
            f"kvcore.plugins.models.common.{name} was removed in kvcore 0.2: {_REMOVED[name]}"
        )
    return getattr(kit, name)


def __dir__() -> list[str]:
    return sorted(set(dir(kit)) - set(_REMOVED))
