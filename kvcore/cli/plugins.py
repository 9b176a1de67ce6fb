"""``kvcore plugins``: every registered plugin, spec kind, policy and model family, and where each
came from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcore.cli.table import add_csv_option, render_table, wants_csv, write_csv
from kvcore.planning.registry import Registry


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "plugins",
        help="list plugins, spec kinds, policies and model families, and where each came from",
        description=(
            "List every registered plugin, spec kind, policy and model family, and where each came from."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_csv_option(parser, "every registered plugin, kind, policy and family (a 'section' column first)")
    parser.set_defaults(run=run)


def plugin_listing(registry: Registry) -> dict[str, Any]:
    """What ``kvcore plugins --json`` prints."""
    pm = registry.pm
    plugins = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked
            continue
        origin = pm.origin_of(plugin)
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])
        plugins.append(
            {
                "name": name,
                "source": origin.source,
                "module": origin.module,
                "distribution": origin.distribution,
                "version": origin.version,
                "hooks": hooks,
            }
        )
    kinds = [
        {"kind": e.name, "class": e.qualname, "plugin": e.origin.name, "distribution": e.origin.distribution}
        for e in registry.kind_entries()
    ]
    policies = [
        {
            "policy": e.name,
            "class": e.qualname,
            "description": getattr(e.obj, "description", ""),
            "plugin": e.origin.name,
            "distribution": e.origin.distribution,
        }
        for e in registry.policy_entries()
    ]
    families = [
        {
            "family": e.obj.name,
            "model_types": list(e.obj.model_types),
            "fallback": e.obj.fallback is not None,
            "plugin": e.origin.name,
            "distribution": e.origin.distribution,
        }
        for e in registry.family_entries()
    ]
    return {"plugins": plugins, "spec_kinds": kinds, "policies": policies, "model_families": families}


def run(args: argparse.Namespace, registry: Registry) -> int:
    listing = plugin_listing(registry)
    if wants_csv(args):
        # one row per registered thing, its section first: the four tables in one
        write_csv(
            [
                {"section": section, **entry}
                for section in ("spec_kinds", "policies", "model_families", "plugins")
                for entry in listing[section]
            ]
        )
        return 0
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    print("spec kinds")
    print(
        render_table(
            ["kind", "class", "from"],
            [[k["kind"], k["class"], k["distribution"] or k["plugin"]] for k in listing["spec_kinds"]],
        )
    )
    print("\npolicies")
    print(
        render_table(
            ["policy", "class", "from", "description"],
            [
                [p["policy"], p["class"], p["distribution"] or p["plugin"], p["description"]]
                for p in listing["policies"]
            ],
            wrap={3: 60},
        )
    )
    print("\nmodel families")
    print(
        render_table(
            ["family", "model types", "fallback", "from"],
            [
                [
                    f["family"],
                    ", ".join(f["model_types"]) or "-",
                    "yes" if f["fallback"] else "no",
                    f["distribution"] or f["plugin"],
                ]
                for f in listing["model_families"]
            ],
        )
    )
    print("\nplugins")
    print(
        render_table(
            ["name", "source", "distribution", "hooks"],
            [
                [
                    p["name"],
                    p["source"],
                    f"{p['distribution']} {p['version']}" if p["distribution"] else "-",
                    ", ".join(h.removeprefix("kvcore_") for h in p["hooks"]),
                ]
                for p in listing["plugins"]
            ],
            wrap={3: 60},
        )
    )
    return 0
