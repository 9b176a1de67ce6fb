"""Shared fixtures: fresh, isolated registries (no entry points, no global state)."""

from __future__ import annotations

import gc
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

# No test reaches the Hugging Face Hub: a model name that is neither bundled nor cached would be
# looked up there (kvcore.frontends.hf_hub), so the whole run is offline, and huggingface_hub
# (imported later by the tests that use it, which read these at import) sends no telemetry. The
# tests of the Hub path turn the offline mode off against a stand-in on a loopback port
# (tests/frontends/hub_stand_in.py).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


# -- the default run: a quick one ---------------------------------------------------------------
#
# ``python -m pytest`` with no paths, no ``-m`` and no ``-n`` is the command people run often: it
# skips the tests marked ``slow`` and, where pytest-xdist is installed (the ``test`` extra), runs
# on every CPU. ``--run-slow`` runs everything (CI does); naming paths, a ``-m`` expression or
# ``-n`` keeps the choice to the caller (a slow test named by its file runs).


def pytest_addoption(parser):
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the tests marked slow (the default run of the whole suite skips them)",
    )


def _default_run(config) -> bool:
    """Whether this is the suite's default run: no paths given (pytest took its testpaths)."""
    return config.args_source is pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    # before xdist reads -n: the default run spreads over the CPUs when xdist is there
    if (
        _default_run(config)
        and config.pluginmanager.hasplugin("xdist")
        and getattr(config.option, "numprocesses", 0) is None
        and not hasattr(config, "workerinput")
    ):
        config.option.numprocesses = "auto"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or not _default_run(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        kept = [item for item in items if not item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)
        items[:] = kept


@pytest.fixture
def kvcore_pm():
    """A fresh plugin manager with the built-ins only (entry points are not loaded)."""
    return get_plugin_manager(autoload=False)


@pytest.fixture
def registry(kvcore_pm):
    """A registry over :func:`kvcore_pm`."""
    return Registry.from_plugin_manager(kvcore_pm)


@pytest.fixture(scope="module")
def module_registry():
    """One registry of the built-ins (no entry points) per module, for hypothesis tests: they run
    their body many times with one set of fixtures (a function-scoped fixture fails the health
    check). Read it only: never register into it."""
    return Registry.default(autoload=False)


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


@pytest.fixture
def frozen_heap():
    """The objects alive when the test starts moved out of the collector's sight for its length
    (``gc.freeze``): transformers' continuous batching runs ``gc.collect()`` twice each time its
    manager stops, and a full collection walks every object a worker holds (torch, transformers,
    the modules and plans of the tests run before), about 0.25 s each; what the test itself
    makes is still collected."""
    gc.freeze()
    yield
    gc.unfreeze()
