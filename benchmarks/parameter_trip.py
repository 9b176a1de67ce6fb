"""How far the parsed options travel: a command's ``run`` to the planner, file by file.

A reader following a command's options to the planner reads each file the call path passes
through. This traces one command on the bundled Gemma-3 config with ``sys.setprofile`` from the
command's ``run`` until the planner is entered (``kvcore plan``: ``kvcore.planning.planner.plan``;
``kvcore compare``: ``kvcore.planning.compare.compare_policies``), and counts, over the kvcore
files that execute on the way:

- files: distinct files crossed;
- stays: maximal runs of events in one file (a call into another file and back is two stays
  more);
- climbs: stays that move up the layers (contract < planning < runtime < simulation <
  integrations < cli), i.e. a lower layer handing control back to a higher one;
- returns: stays in a file the path had already left.

Fewer of each is a shorter trip. Run: ``python benchmarks/parameter_trip.py`` (add ``--files``
to print the path, ``--command compare`` for the other command).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import kvcore
from kvcore.cli import main as cli_main

ROOT = Path(kvcore.__file__).parent
#: The layers, lowest first (:doc:`DESIGN.md`'s contract <- planning <- runtime <- engine <- CLI).
LAYERS = ("", "planning", "frontends", "models", "runtime", "simulation", "tuning", "integrations", "cli")
MODEL = ["--model", "google/gemma-3-27b-it", "--memory", "80GiB", "--max-model-len", "32768"]
#: command -> (its arguments, the file of its ``run``, where the planner is entered: file, function)
COMMANDS = {
    "plan": (["plan", *MODEL], "cli/plan.py", ("planning/planner.py", "plan")),
    "compare": (
        ["compare", *MODEL, "--policies", "shared_buffer"],
        "cli/compare.py",
        ("planning/compare.py", "compare_policies"),
    ),
}


def layer(path: str) -> int:
    """The layer of a kvcore file: its top package's place in :data:`LAYERS` (0: the contract)."""
    parts = Path(path).relative_to(ROOT).parts
    top = parts[0] if len(parts) > 1 else ""
    return LAYERS.index(top) if top in LAYERS else 0


def trace(command: str) -> list[str]:
    """The kvcore files executing, event by event, from ``command``'s ``run`` to the planner."""
    argv, start, (end, entry) = COMMANDS[command]
    path: list[str] = []
    state = {"on": False, "done": False}

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if state["done"] or event not in ("call", "return"):
            return
        name = frame.f_code.co_filename
        if not state["on"]:
            if event == "call" and name.endswith(start) and frame.f_code.co_name == "run":
                state["on"] = True
            else:
                return
        if event == "call" and name.endswith(end) and frame.f_code.co_name == entry:
            state["done"] = True
            path.append(name)
            return
        if name.startswith(str(ROOT)):
            path.append(name)

    sys.setprofile(profile)
    try:
        cli_main(argv)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return path


def stays(path: list[str]) -> list[str]:
    """The path with consecutive events in one file merged: one entry per stay."""
    merged: list[str] = []
    for name in path:
        if not merged or merged[-1] != name:
            merged.append(name)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="print the stays, one per line")
    parser.add_argument("--command", choices=sorted(COMMANDS), default="plan", help="the command traced")
    args = parser.parse_args()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # the plan itself is not the point
        path = trace(args.command)
    visits = stays(path)
    seen: set[str] = set()
    returns = climbs = 0
    for index, name in enumerate(visits):
        if name in seen:
            returns += 1
        seen.add(name)
        if index and layer(name) > layer(visits[index - 1]):
            climbs += 1
    if args.files:
        for name in visits:
            print(Path(name).relative_to(ROOT))
    argv, _, (_, entry) = COMMANDS[args.command]
    print(f"kvcore {' '.join(argv)}: run -> {entry}")
    print(f"{'files':>8} {'stays':>8} {'climbs':>8} {'returns':>8}")
    print(f"{len(seen):>8} {len(visits):>8} {climbs:>8} {returns:>8}")


if __name__ == "__main__":
    main()
