"""Every plan (and every kept command output) equals its snapshot from before the reshape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.snapshots import snapshots

_EXPECTED: dict[str, Any] = json.loads(snapshots.FIXTURE.read_text())


@pytest.fixture(scope="module")
def current() -> dict[str, Any]:
    return dict(snapshots.cases())


def test_the_same_cases_are_planned(current: dict[str, Any]) -> None:
    assert sorted(current) == sorted(_EXPECTED)


@pytest.mark.parametrize("case", sorted(_EXPECTED))
def test_snapshot_unchanged(case: str, current: dict[str, Any]) -> None:
    assert current.get(case) == _EXPECTED[case]
