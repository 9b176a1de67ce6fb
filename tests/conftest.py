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


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread():
    """One torch thread for the whole run: the tensors in tests are small, and on a busy 2-core
    CI box two spinning intra-op threads per process make the suite many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
