"""``kvcore check PLAN.json``: a saved plan is an input; check it as allocation would."""

from __future__ import annotations

import argparse
import sys

from kvcore.cli.command import Command
from kvcore.errors import InvalidInputError, PlanValidationError
from kvcore.json_input import read_bounded
from kvcore.plan import KVCachePlan
from kvcore.planning.invariants import MAX_PROBLEMS
from kvcore.planning.registry import Registry
from kvcore.planning.serialization import plan_from_json
from kvcore.units import format_bytes

COMMAND = Command(
    help="check a saved plan (kvcore plan --json output) as allocation would",
    description="""
        Read a plan from a JSON file (what `kvcore plan --json` prints, or a plan dict) and run the check
        every plan passes before allocation: structure, budget, and no two pages that may be live at once
        sharing a byte. Exit 0 with a one-line summary when it is valid; else list every problem and exit 1.
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN.json", help="the saved plan")


def read_plan_file(path: str, registry: Registry) -> KVCachePlan:
    """Read and check the plan saved in ``path``.

    Args:
        path: a JSON file holding a plan (extra keys, such as report figures, are ignored).
        registry: the spec kinds its groups may name.

    Returns:
        The plan, checked (:func:`kvcore.planning.invariants.check_plan`).

    Raises:
        InvalidInputError: the file is missing, unreadable, not UTF-8 JSON, or not a plan.
        PlanValidationError: the plan breaks an invariant (every problem listed).
    """
    try:
        text = read_bounded(path).decode("utf-8")
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return plan_from_json(text, registry, source=path)


def summary(plan: KVCachePlan) -> str:
    """One line: the plan's policy, blocks (each pool's), bytes against its budget, groups, layers
    and tensors."""
    if not plan.groups:
        return (
            f"policy {plan.policy}: nothing to cache (no cache-holding layer); "
            f"budget {format_bytes(plan.available_memory_bytes)}"
        )
    layers = sum(len(group.layer_names) for group in plan.groups)
    sharing = f" (+{len(plan.kv_sharing)} sharing)" if plan.kv_sharing else ""
    if plan.names_pools:
        blocks = " + ".join(f"{p.num_blocks:,} x {format_bytes(p.bytes_per_block)}" for p in plan.pools)
        blocks = f"{len(plan.pools)} pools of {blocks} blocks"
    else:
        blocks = f"{plan.num_blocks:,} blocks x {format_bytes(plan.bytes_per_block)}"
    return (
        f"policy {plan.policy}: {blocks} = "
        f"{format_bytes(plan.kv_cache_bytes)} of {format_bytes(plan.available_memory_bytes)}; "
        f"{len(plan.groups)} group{'s' if len(plan.groups) != 1 else ''}, {layers} layers{sharing}, "
        f"{len(plan.tensors)} tensor{'s' if len(plan.tensors) != 1 else ''}; "
        f"max_model_len {plan.context.max_model_len:,}"
    )


def run(args: argparse.Namespace, registry: Registry) -> int:
    try:
        plan = read_plan_file(args.plan, registry)
    except PlanValidationError as exc:
        whose = f" of policy {exc.policy!r}" if exc.policy is not None else ""
        count = len(exc.problems)
        many = (
            f"the first {count} problems"
            if count >= MAX_PROBLEMS
            else f"{count} problem{'s' if count != 1 else ''}"
        )
        print(f"kvcore: error: {args.plan}: the plan{whose} is invalid ({many}):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(f"{args.plan}: valid; {summary(plan)}")
    return 0
