"""``kvcore plugins``: every registered plugin, spec kind, policy and model family, and where each
came from."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

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
                    _distribution(row),
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


def _registered(key: str, entry: Any, *, described: bool = False) -> dict[str, Any]:
    """A registered kind, policy or scheduler profile as the listing shows it: its name (under
    ``key``), its class, its ``description`` attribute where ``described``, and the plugin and
    distribution it came from."""
    return {
        key: entry.name,
        "class": entry.qualname,
        **({"description": getattr(entry.obj, "description", "")} if described else {}),
        "plugin": entry.origin.name,
        "distribution": entry.origin.distribution,
    }


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
    kinds = [_registered("kind", e) for e in registry.kind_entries()]
    policies = [_registered("policy", e, described=True) for e in registry.policy_entries()]
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
    profiles = [_registered("scheduler", e, described=True) for e in registry.profile_entries()]
    return {
        "plugins": plugins,
        "spec_kinds": kinds,
        "policies": policies,
        "model_families": families,
        "scheduler_profiles": profiles,
    }


def _origin(entry: Mapping[str, Any]) -> str:
    """Where a registered thing came from: its distribution, else the plugin that registered it."""
    return str(entry["distribution"] or entry["plugin"])


def _family_cells(family: Mapping[str, Any]) -> list[Any]:
    model_types = ", ".join(family["model_types"]) or "-"
    return [family["family"], model_types, "yes" if family["fallback"] else "no", _origin(family)]


def _distribution(plugin: Mapping[str, Any]) -> str:
    """A plugin's distribution and its version (``-`` for a built-in)."""
    return f"{plugin['distribution']} {plugin['version']}" if plugin["distribution"] else "-"


def _plugin_cells(plugin: Mapping[str, Any]) -> list[Any]:
    hooks = ", ".join(hook.removeprefix("kvcore_") for hook in plugin["hooks"])
    return [plugin["name"], plugin["source"], _distribution(plugin), hooks]


@attrs.frozen
class ListingTable:
    """One table of the text listing.

    Attributes:
        title: the line above it.
        section: its entries' key in :func:`plugin_listing`.
        headers: the columns.
        cells: one entry's cells; ``None`` where each header is the entry's key (``from``: where
            it came from, :func:`_origin`).
        wrap: ``{column: width}`` of the columns wrapped (long descriptions, hook lists).
    """

    title: str
    section: str
    headers: tuple[str, ...]
    cells: Callable[[Mapping[str, Any]], list[Any]] | None = None
    wrap: Mapping[int, int] = attrs.field(factory=dict)

    def rows(self, entries: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
        """The table's rows of ``entries``."""
        if self.cells is not None:
            return [self.cells(entry) for entry in entries]
        keys = self.headers
        return [[_origin(entry) if key == "from" else entry[key] for key in keys] for entry in entries]


#: The tables ``kvcore plugins`` prints, in order.
LISTING_TABLES = (
    ListingTable("spec kinds", "spec_kinds", ("kind", "class", "from")),
    ListingTable("policies", "policies", ("policy", "class", "from", "description"), wrap={3: 60}),
    ListingTable(
        "scheduler profiles (kvcore simulate --scheduler)",
        "scheduler_profiles",
        ("scheduler", "class", "from", "description"),
    ),
    ListingTable(
        "model families", "model_families", ("family", "model types", "fallback", "from"), _family_cells
    ),
    ListingTable("plugins", "plugins", ("name", "source", "distribution", "hooks"), _plugin_cells, {3: 60}),
)


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
    for number, table in enumerate(LISTING_TABLES):
        if number:
            print()
        print(table.title)
        print(render_table(table.headers, table.rows(listing[table.section]), wrap=table.wrap))
    return 0
