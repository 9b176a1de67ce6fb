"""kvcore's pytest plugin: registry fixtures for plugin tests (entry point ``pytest11``, name ``kvcore``).

pytest loads it whenever kvcore is installed, so a plugin author's tests get these fixtures and
the suites of :mod:`kvcore.testing.conformance` work without a ``conftest.py``. Disable it with
``-p no:kvcore``; load it by hand, when plugin autoloading is off, with
``-p kvcore.testing.pytest_plugin``.

Fixtures:

- ``kvcore_plugins``: the plugins under test, registered besides the built-ins (default: none).
  Override it in a test class or a ``conftest.py``.
- ``kvcore_autoload``: whether ``kvcore_registry`` also loads installed entry points (default:
  ``False``, so tests do not depend on what else is installed).
- ``kvcore_registry``: a fresh :class:`~kvcore.Registry` of the built-ins and ``kvcore_plugins``.
- ``make_kvcore_registry``: :func:`kvcore.testing.registries.build_registry`, to build others.

Loading it imports the ``kvcore`` package (not torch), nothing more: hypothesis and the
suites are imported only by the tests that use them, so the plugin also loads where hypothesis
is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry


@pytest.fixture
def kvcore_plugins() -> Sequence[object]:
    """Plugins (modules or objects) to register besides the built-ins; override it."""
    return ()


@pytest.fixture
def kvcore_autoload() -> bool:
    """Whether ``kvcore_registry`` also loads the installed ``kvcore`` entry points."""
    return False


@pytest.fixture(scope="session")
def make_kvcore_registry() -> Callable[..., Registry]:
    """``make(*plugins, autoload=False, block=())``: a fresh registry, see ``build_registry``."""
    from kvcore.testing.registries import build_registry

    return build_registry


@pytest.fixture
def kvcore_registry(
    make_kvcore_registry: Callable[..., Registry], kvcore_plugins: Sequence[object], kvcore_autoload: bool
) -> Registry:
    """A fresh registry of the built-ins and ``kvcore_plugins`` (and entry points if autoloading)."""
    return make_kvcore_registry(*kvcore_plugins, autoload=kvcore_autoload)
