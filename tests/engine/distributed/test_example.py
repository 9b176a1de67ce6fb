"""``examples/distributed_plan.py`` on four CPU ranks, as the how-to runs it with torchrun: the
outputs pasted in ``docs/how-to/run-distributed.md`` must be what it prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.engine.distributed._ranks import preload_forkserver, run_example

HOW_TO = Path(__file__).parents[3] / "docs" / "how-to" / "run-distributed.md"
RUNS = re.findall(r"```console\n\$ (torchrun .*?)\n(.*?)```", HOW_TO.read_text(encoding="utf-8"), re.S)


@pytest.fixture(scope="module", autouse=True)
def _forkserver():
    preload_forkserver()


def _launch(command):
    argv = shlex.split(command)
    script = argv.index("examples/distributed_plan.py")
    world = int(argv[argv.index("--nproc-per-node") + 1])
    return run_example(argv[script + 1 :], world)


def test_the_how_to_shows_a_run_and_a_failure():
    assert [("--fail-rank" in command) for command, _ in RUNS] == [False, True]


@pytest.mark.slow  # four real ranks through the documented torchrun-style run (~14 s)
def test_the_documented_run_is_what_rank_0_prints():
    command, output = RUNS[0]
    reports = _launch(command)
    assert [reports[r]["status"] for r in sorted(reports)] == [0, 0, 0, 0]
    assert reports[0]["stdout"] == output
    assert all(reports[r]["stdout"] == "" for r in (1, 2, 3))


@pytest.mark.slow  # four real ranks, as the documented run above (~20 s on two loaded cores)
def test_the_documented_failure_is_one_line_per_rank():
    command, output = RUNS[1]
    reports = _launch(command)
    assert [reports[r]["status"] for r in sorted(reports)] == [1, 1, 1, 1]
    printed = sorted(line for report in reports.values() for line in report["stderr"].splitlines())
    assert printed == sorted(output.splitlines())
