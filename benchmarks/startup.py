"""How long the command line takes to start, beside the cost of importing torch.

Planning is arithmetic on byte counts, so ``kvcore --help`` and the README's plan command
should not pay for torch (issue 11: at most 0.3 s wall on one core). Each command runs in a fresh
process several times; the table shows the median and best wall time, and whether torch was
imported (``-X importtime`` lists every module a process loads). Run it pinned to one core:

    taskset -c 0 python benchmarks/startup.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcore.cli.table import render_table

TARGET_S = 0.3
#: (label, argv after ``python``); the last one is the yardstick, not a kvcore command.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kvcore --help", ("-m", "kvcore", "--help")),
    (
        "kvcore plan (README)",
        (
            "-m",
            "kvcore",
            "plan",
            "--model",
            "google/gemma-3-27b-it",
            "--memory",
            "80GiB",
            "--max-model-len",
            "32768",
        ),
    ),
    ("kvcore models", ("-m", "kvcore", "models")),
    ('python -c "import torch"', ("-c", "import torch")),
)


#: The processes' environment: bytecode is cached as on an installed package (``pip install``
#: compiles it; a shell with PYTHONDONTWRITEBYTECODE would recompile every module every run).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall_seconds(argv: tuple[str, ...]) -> float:
    """Wall time of one fresh ``python argv...`` process (its output is discarded)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *argv], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
    )
    return time.perf_counter() - start


def imports_torch(argv: tuple[str, ...]) -> bool:
    """Whether the process loads torch (read from ``python -X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], check=True, capture_output=True, text=True, env=ENV
    )
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in done.stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per command (default 7)")
    args = parser.parse_args()
    rows = []
    slow = False
    for label, argv in COMMANDS:
        wall_seconds(argv)  # warm the file cache and the bytecode cache
        times = [wall_seconds(argv) for _ in range(args.runs)]
        median = statistics.median(times)
        is_kvcore = "kvcore" in argv
        verdict = ("ok" if median <= TARGET_S else "SLOW") if is_kvcore else "-"
        slow |= verdict == "SLOW"
        rows.append(
            [label, f"{median:.3f}", f"{min(times):.3f}", "yes" if imports_torch(argv) else "no", verdict]
        )
    print(f"wall seconds over {args.runs} fresh processes; target <= {TARGET_S} s for kvcore commands")
    print(render_table(["command", "median s", "best s", "torch", f"<= {TARGET_S} s"], rows, align="lrrll"))
    return 1 if slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
