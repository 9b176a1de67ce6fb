"""Shared fixtures: fresh, isolated registries (no entry points, no global state)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from kvcore import Registry, get_plugin_manager

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def kvcore_pm():
    """A fresh plugin manager with the built-ins only (entry points are not loaded)."""
    return get_plugin_manager(autoload=False)


@pytest.fixture
def registry(kvcore_pm):
    """A registry over :func:`kvcore_pm`."""
    return Registry.from_plugin_manager(kvcore_pm)


@pytest.fixture
def make_registry():
    """Build a registry with extra inline plugins: ``make_registry(plugin, ...)``."""

    def make(*plugins, block=()):
        return Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=plugins, block=block))

    return make
