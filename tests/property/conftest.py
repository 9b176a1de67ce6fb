"""Property tests share one registry per module: a registry is read-only once built, and
hypothesis runs each test body many times with one set of fixtures."""

import pytest

from kvcore import Registry


@pytest.fixture(scope="module")
def registry():
    return Registry.default(autoload=False)
