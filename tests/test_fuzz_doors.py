"""Fuzz every door (spec files, config.json, command-line numbers, plan JSON): kvcore either
refuses with a KVCoreError (one line, exit 1 or 2 on the command line) or accepts and every plan
it made is within budget with no two live pages sharing bytes. ``benchmarks/fuzz.py`` runs
the same doors for >= 10,000 examples and prints the counts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz_doors import DOORS

pytestmark = pytest.mark.fuzz

#: The default run stays quick: a few examples per door beyond the ``ci`` profile's choice.
QUICK = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_door_refuses_with_a_kvcore_error_or_accepts_a_sound_plan(door: str) -> None:
    strategy, function = DOORS[door]

    @QUICK
    @given(strategy)
    def knock(kwargs: dict[str, Any]) -> None:
        outcome = function(**kwargs)
        assert outcome.kind != "failure", f"{door}: {outcome.detail} ({kwargs!r:.800})"

    knock()
