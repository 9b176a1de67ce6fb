"""``kvcore plan``: plan a KV cache for a memory budget and show what fits."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcore.cli import inputs
from kvcore.memory_map import render_memory_map
from kvcore.planner import plan_kv_cache
from kvcore.registry import Registry
from kvcore.report import format_plan, plan_report, policy_reason


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "plan",
        help="plan a KV cache for a memory budget and show capacity",
        description=(
            "Plan the KV cache for a set of layer specs and a byte budget: groups, block count, "
            "tensors, and how many requests of max-model-len tokens fit. No GPU needed."
        ),
    )
    inputs.add_spec_source(parser)
    inputs.add_planning_options(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the plan and its figures as one JSON object"
    )
    parser.add_argument(
        "--map",
        metavar="FILE",
        help="also draw the plan's memory map into FILE (.png or .svg; needs the 'plot' extra)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, registry: Registry) -> int:
    specs = inputs.load_layer_specs(args, registry)
    plan = plan_kv_cache(
        specs,
        args.memory,
        inputs.sizing_context(args),
        registry=registry,
        policy=args.policy,
        options=inputs.plan_options(args),
        num_blocks=args.num_blocks,
    )
    if args.map:
        render_memory_map(plan, args.map)
    if args.json:
        print(json.dumps(plan_report(plan, specs, registry), indent=2))
    else:
        print(format_plan(plan, specs, reason=policy_reason(specs, args.policy)))
    return 0
