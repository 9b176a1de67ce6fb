"""The ``install`` fixture of ``tests/plugins`` (a real distribution with a ``kvcore`` entry point)."""

from tests.plugins.conftest import install  # noqa: F401 (fixture)
