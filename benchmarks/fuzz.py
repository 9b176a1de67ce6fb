"""The fuzz suite at full size: >= 10,000 generated inputs through kvcore's doors.

The doors and their inputs are ``tests/fuzz_doors.py`` (the quick run is
``tests/test_fuzz_doors.py``): spec files (mutated valid files, random JSON, broken text, JSON
nested past ``MAX_JSON_DEPTH`` or holding numbers of more than 4,300 digits), config.json files
(bundled configs with fields deleted, retyped or made huge), the command line's numbers
(``--memory``, ``--max-model-len``, ``--num-blocks``, ``--tp``, ``--pp``, ``--block-size``,
through ``kvcore.cli.main`` in-process), plan JSON and plan files (valid plans mutated, shrunk
to hold no request, made hostile), input sizes (every file reader on ``/dev/zero`` and on a
file past a lowered ``MAX_INPUT_BYTES``), traces (read and simulated, arrivals ten million
steps out included) and a block pool driven with random calls (unhashable ids, lengths past
``max_model_len``, prefix keys of 10**9 tokens, frees of pages a request holds).
For each door it prints how many inputs were tried, refused with a KVCoreError (exit 1 or 2 with
one error line on the command line), accepted, and failed: another exception (target 0), an
accepted plan over its budget (target 0), an accepted plan whose live pages share bytes or that
breaks another rule of ``kvcore.planning.invariants.plan_problems`` or holds no request, and
a block id with two holders in the pool (target 0). Exits 1 if any failure was seen, printing
the first few.

    python benchmarks/fuzz.py                 # 2,500 examples per door, 20,000 in all
    python benchmarks/fuzz.py --examples 500  # per door
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings

from kvcore.cli.table import render_table
from tests.fuzz_doors import DOORS, Outcome


def run_door(name: str, examples: int, seed: int) -> tuple[Counter[str], list[str], float]:
    """Feed ``examples`` generated inputs through one door; count the outcomes."""
    strategy, function = DOORS[name]
    counts: Counter[str] = Counter()
    failures: list[str] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(strategy)
    def knock(kwargs: dict[str, Any]) -> None:
        outcome: Outcome = function(**kwargs)
        counts["examples"] += 1
        counts[outcome.kind] += 1
        counts["over budget"] += outcome.over_budget
        counts["overlapping"] += outcome.overlapping
        if outcome.kind == "failure":
            if not outcome.over_budget and not outcome.overlapping:
                counts["other exceptions"] += 1
            if len(failures) < 5:
                failures.append(f"{name}: {outcome.detail} <- {kwargs!r:.300}")

    start = time.perf_counter()
    knock._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    knock()
    return counts, failures, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2500, help="examples per door (default 2,500)")
    parser.add_argument("--seed", type=int, default=12, help="hypothesis seed (default 12)")
    args = parser.parse_args()
    rows, all_failures, total = [], [], Counter[str]()
    for name in DOORS:
        counts, failures, seconds = run_door(name, args.examples, args.seed)
        total.update(counts)
        all_failures += failures
        rows.append(
            [name, f"{counts['examples']:,}", f"{counts['refused']:,}", f"{counts['accepted']:,}",
             f"{counts['other exceptions']:,}", f"{counts['over budget']:,}", f"{counts['overlapping']:,}",
             f"{seconds:.1f}"]
        )  # fmt: skip
    rows.append(
        ["all", f"{total['examples']:,}", f"{total['refused']:,}", f"{total['accepted']:,}",
         f"{total['other exceptions']:,}", f"{total['over budget']:,}", f"{total['overlapping']:,}", ""]
    )  # fmt: skip
    headers = [
        "door",
        "examples",
        "KVCoreErrors",
        "accepted",
        "other exceptions",
        "over budget",
        "overlapping",
        "s",
    ]
    print(render_table(headers, rows, align="lrrrrrrr"))
    for line in all_failures:
        print(f"  {line}")
    return 1 if total["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
