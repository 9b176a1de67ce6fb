"""What kvcore needs beyond its light install, and the error that says how to get it.

``pip install kvcore`` brings the planner and every command that does not allocate (``plan``,
``compare``, ``simulate``, ``tune``, ``models``, ``check``, ``plugins``): pluggy, attrs and
cattrs, no torch. Two extras add the rest:

- ``kvcore[torch]``: torch (and numpy, which torch warns without) for allocation, binding and
  the runtime (``kvcore allocate``, :func:`kvcore.allocate_kv_cache`, the executors);
- ``kvcore[hub]``: huggingface_hub, to read a model's ``config.json`` and safetensors headers
  from the Hugging Face Hub by name (:mod:`kvcore.frontends.hf_hub`).

:func:`require` imports such a module or raises :class:`~kvcore.errors.MissingDependencyError`
naming the extra; this module itself imports neither.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from kvcore.errors import MissingDependencyError

#: The extra that installs each optional top-level module.
EXTRAS = {"torch": "torch", "numpy": "torch", "huggingface_hub": "hub"}


def install_hint(extra: str) -> str:
    """How to install ``extra``: ``pip install 'kvcore[torch]'`` (a checkout adds its
    constraints file, whose torch pin is the CPU build)."""
    return f"pip install 'kvcore[{extra}]' (from a checkout: pip install -c constraints.txt -e '.[{extra}]')"


def missing(module: str, purpose: str) -> MissingDependencyError:
    """The error for ``module`` missing where ``purpose`` (``'allocating a KV cache'``) needs it."""
    extra = EXTRAS.get(module.split(".", 1)[0], module)
    tail = "; planning, comparing, simulating and tuning run without it" if extra == "torch" else ""
    return MissingDependencyError(
        f"{purpose} needs {module}, which is not installed: {install_hint(extra)}{tail}", extra=extra
    )


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`~kvcore.errors.MissingDependencyError` naming its extra.

    Args:
        module: the module (``"torch"``, ``"huggingface_hub"``).
        purpose: what needs it, for the message (``"allocating a KV cache"``).

    Raises:
        MissingDependencyError: the module (or its top-level package) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".", 1)[0] == module.split(".", 1)[0]:
            raise missing(module, purpose) from None
        raise


def missing_from(exc: ModuleNotFoundError, purpose: str) -> MissingDependencyError | None:
    """The :class:`~kvcore.errors.MissingDependencyError` for an import that failed inside kvcore
    because an optional module (:data:`EXTRAS`) is missing; ``None`` for any other module."""
    top = (exc.name or "").split(".", 1)[0]
    return missing(top, purpose) if top in EXTRAS else None
