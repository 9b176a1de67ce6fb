"""``kvcore plugins``: every registered plugin, spec kind, policy and model family, and where each
came from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcore.cli.command import Command
from kvcore.cli.table import add_csv_option, render_table, wants_csv, write_csv
from kvcore.planning.registry import Registry

COMMAND = Command(
    help="list plugins, spec kinds, policies and model families, and where each came from",
    description="""
        List every registered plugin, spec kind, policy and model family, and where each came from.
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--check",
        action="store_true",
        help=(
            "report every plugin's health: loaded, or skipped because it failed to import or "
            "register (why, and how to block it); exit 1 if any failed"
        ),
    )
    add_csv_option(parser, "every registered plugin, kind, policy and family (a 'section' column first)")


def plugin_health(registry: Registry) -> list[dict[str, Any]]:
    """Every plugin the registry loaded or skipped: name, source, distribution, status, and for
    a skipped one what failed and how to silence it (what ``kvcore plugins --check`` prints)."""
    pm = registry.pm
    rows: list[dict[str, Any]] = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked (a skipped plugin is blocked too; it is listed below)
            continue
        origin = pm.origin_of(plugin)
        rows.append(
            {
                "name": name,
                "source": origin.source,
                "distribution": origin.distribution,
                "version": origin.version,
                "status": "ok",
                "api": pm.api_version(name),
                "deprecated": list(pm.deprecations.get(name, ())),
                "stage": None,
                "error": None,
                "remedy": None,
            }
        )
    for failure in pm.failures:
        origin = failure.origin
        rows.append(
            {
                "name": origin.name,
                "source": origin.source,
                "distribution": origin.distribution,
                "version": origin.version,
                "status": "failed",
                "api": pm.api_version(origin.name),
                "deprecated": list(pm.deprecations.get(origin.name, ())),
                "stage": failure.stage,
                "error": failure.error,
                "remedy": failure.remedy,
            }
        )
    return rows


def _run_check(args: argparse.Namespace, registry: Registry) -> int:
    rows = plugin_health(registry)
    failed = [row for row in rows if row["status"] == "failed"]
    if args.json:
        print(json.dumps({"plugins": rows, "failed": len(failed)}, indent=2))
        return 1 if failed else 0
    print(
        render_table(
            ["plugin", "source", "distribution", "api", "status"],
            [
                [
                    row["name"],
                    row["source"],
                    f"{row['distribution']} {row['version']}" if row["distribution"] else "-",
                    row["api"],
                    row["status"] if row["status"] == "ok" else f"FAILED ({row['stage']})",
                ]
                for row in rows
            ],
        )
    )
    for row in failed:
        print(f"\n{row['name']}: {row['error']}\n  fix: {row['remedy']}")
    for row in rows:
        for note in row["deprecated"]:
            print(f"\n{row['name']} (written for plugin API {row['api']}): {note}")
    print(f"\n{len(rows) - len(failed)} plugins loaded, {len(failed)} failed")
    return 1 if failed else 0


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
    profiles = [
        {
            "scheduler": e.name,
            "class": e.qualname,
            "description": getattr(e.obj, "description", ""),
            "plugin": e.origin.name,
            "distribution": e.origin.distribution,
        }
        for e in registry.profile_entries()
    ]
    return {
        "plugins": plugins,
        "spec_kinds": kinds,
        "policies": policies,
        "model_families": families,
        "scheduler_profiles": profiles,
    }


def run(args: argparse.Namespace, registry: Registry) -> int:
    if args.check:
        return _run_check(args, registry)
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
    print("\nscheduler profiles (kvcore simulate --scheduler)")
    print(
        render_table(
            ["scheduler", "class", "from", "description"],
            [
                [p["scheduler"], p["class"], p["distribution"] or p["plugin"], p["description"]]
                for p in listing["scheduler_profiles"]
            ],
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
