"""The simulator's compiled build: which modules mypyc compiles, whether this process runs them
compiled, and the check that they were built from the sources beside them.

kvcore is pure Python. Built with ``KVCORE_MYPYC=1`` (``setup.py``), the ``vllm`` profile's fast
path and the stepper every profile shares (:data:`COMPILED_MODULES`) are also compiled by mypyc
into C extension modules beside their sources: the same code, type-checked by mypy, run 1.2 to
2.8 times as fast (``benchmarks/README.md``). Python imports an extension module before a
source of the same name, so the sources stay the plain version (and the ``vllm_reference``
profile, never compiled, the reference both are held to).

An extension module built from other sources than those beside it would run code nobody reads:
the build records each source's digest (:data:`DIGESTS_FILE`) and :func:`check_compiled_sources`
refuses to run modules whose sources changed since.

This module imports nothing of kvcore: ``setup.py`` reads it before kvcore is installed.
"""

from __future__ import annotations

import hashlib
import json
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

#: The modules mypyc compiles, as paths from the repository root (``setup.py``): the stepper
#: (whose class the others subclass) and the ``vllm`` profile's simulator. Its attrs classes
#: (``profile.py``, whose validators mypyc does not compile) and the package's ``__init__``
#: stay interpreted.
COMPILED_MODULES = (
    "kvcore/simulation/stepper.py",
    "kvcore/simulation/profiles/vllm_groups.py",
    "kvcore/simulation/profiles/vllm/free_queue.py",
    "kvcore/simulation/profiles/vllm/state.py",
    "kvcore/simulation/profiles/vllm/block_pool.py",
    "kvcore/simulation/profiles/vllm/prefix_cache.py",
    "kvcore/simulation/profiles/vllm/manager.py",
    "kvcore/simulation/profiles/vllm/shared.py",
    "kvcore/simulation/profiles/vllm/lean.py",
    "kvcore/simulation/profiles/vllm/steady.py",
    "kvcore/simulation/profiles/vllm/retention.py",
    "kvcore/simulation/profiles/vllm/state_groups.py",
    "kvcore/simulation/profiles/vllm/scheduler.py",
)

#: Beside the compiled modules: each source's SHA-256 when they were built (``setup.py``).
DIGESTS_FILE = "kvcore/simulation/mypyc_sources.json"

_ROOT = Path(__file__).resolve().parents[2]


def module_name(path: str) -> str:
    """The import name of one of :data:`COMPILED_MODULES`."""
    return path.removesuffix(".py").replace("/", ".")


def source_digest(path: Path) -> str:
    """The SHA-256 of a source file, as the build records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compiled_modules() -> list[str]:
    """The modules of :data:`COMPILED_MODULES` that this process imports as extension modules
    (empty for a pure-Python install)."""
    # looked up as files: finding a module's spec would import its package (the stepper's
    # import calls this, and the vllm profile's package imports the stepper)
    return [
        module_name(path)
        for path in COMPILED_MODULES
        if any((_ROOT / path).with_name(Path(path).stem + suffix).is_file() for suffix in EXTENSION_SUFFIXES)
    ]


def check_compiled_sources() -> None:
    """Refuse to run extension modules built from other sources than those beside them.

    Raises:
        StaleBuildError: a compiled module's source changed since the build (or the build's
            record is missing), with the fix.
    """
    from kvcore.errors import StaleBuildError  # (setup.py reads this module before kvcore is installed)

    compiled = compiled_modules()
    if not compiled:
        return
    record = _ROOT / DIGESTS_FILE
    built: dict[str, Any] = json.loads(record.read_text()) if record.is_file() else {}
    changed = [
        path
        for path in COMPILED_MODULES
        if module_name(path) in compiled
        and (not (_ROOT / path).is_file() or built.get(path) != source_digest(_ROOT / path))
    ]
    if changed:
        raise StaleBuildError(
            f"kvcore's compiled simulator modules were built from other sources than those beside "
            f"them ({', '.join(changed)} changed since the build, {len(compiled)} modules compiled): "
            "rebuild them in place (KVCORE_MYPYC=1 python setup.py build_ext -i) or delete them "
            f"(find {_ROOT / 'kvcore'} -name '*.so' -delete)"
        )


try:  # mypyc reads the decorator as it compiles; at run time it does nothing
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # mypy_extensions comes with mypy: a build requirement, not a run-time one

    def mypyc_attr(*_attrs: str, **_flags: bool) -> Callable[[type], type]:  # type: ignore[misc]
        """``mypy_extensions.mypyc_attr``'s run-time no-op."""
        return lambda cls: cls
