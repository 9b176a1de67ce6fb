"""Plain-text tables with aligned columns, for terminal output, and the same rows as CSV."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kvcore.errors import InvalidInputError


def collapse_alike(rows: Sequence[Sequence[object]]) -> tuple[list[list[object]], list[str]]:
    """Rows that differ in their first cell only (policies that plan a model alike: every
    policy gives a model of one spec kind the same single group), as one row each.

    The kept row is the first of its kind, its first cell followed by ``(+N)``; a row marked
    best (its first cell ending in ``*``) passes the mark to the row that stands for it.

    Returns:
        The rows, and a note per collapsed row naming the names it stands for
        (``"uniform (+2): shared_buffer and equal_groups give the same figures"``), each note
        once (the same policies alike at two block sizes make one note).
    """
    kept: dict[tuple[str, ...], list[object]] = {}
    alike: dict[tuple[str, ...], list[str]] = {}
    for row in rows:
        key = tuple(str(cell) for cell in row[1:])
        if key not in kept:
            kept[key] = list(row)
            alike[key] = []
            continue
        name = str(row[0])
        if name.endswith("*"):
            first = str(kept[key][0])
            kept[key][0] = first if first.endswith("*") else f"{first}*"
            name = name[:-1]
        alike[key].append(name)
    notes = []
    for key, row in kept.items():
        others = alike[key]
        if others:
            first = str(row[0]).removesuffix("*")
            row[0] = f"{row[0]} (+{len(others)})"
            listed = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} and {others[-1]}"
            notes.append(f"{first} (+{len(others)}): {listed} give the same figures")
    return list(kept.values()), list(dict.fromkeys(notes))  # alike at every block size: once


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    align: str | None = None,
    indent: str = "  ",
    wrap: Mapping[int, int] | None = None,
) -> str:
    """Render ``rows`` under ``headers`` with aligned columns.

    Args:
        headers: column titles.
        rows: cells; each is turned into text with ``str``.
        align: one letter per column, ``"l"`` or ``"r"``; default: numbers right, text left.
        indent: prefix of every line.
        wrap: column index -> the most characters a line of its cells may take; a longer cell
            goes on over the next lines at its spaces (``"0-3, 5, 7-9"`` breaks after a comma),
            the other columns blank there. The full text is in ``--json`` / ``--csv``.

    Returns:
        The table, lines joined with newlines, no trailing newline.
    """
    if align is None:
        align = "".join(
            "r" if rows and all(isinstance(row[i], (int, float)) for row in rows) else "l"
            for i in range(len(headers))
        )
    lines_of: list[list[list[str]]] = []  # per row, per column, its lines
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = str(cell)
            width = (wrap or {}).get(i)
            cells.append(textwrap.wrap(text, width, break_on_hyphens=False) or [""] if width else [text])
        lines_of.append(cells)
    widths = [
        max([len(h), *(len(part) for cells in lines_of for part in cells[i])]) for i, h in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align, strict=True)]
        return (indent + "  ".join(parts)).rstrip()

    body = []
    for cells in lines_of:
        for k in range(max(len(parts) for parts in cells)):
            body.append(line([parts[k] if k < len(parts) else "" for parts in cells]))
    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule, *body])


def add_output_options(
    parser: argparse.ArgumentParser, what: str, *, json_help: str = "print one JSON object"
) -> None:
    """``--json`` (with ``json_help``) and ``--csv`` (:func:`add_csv_option`, printing ``what``):
    the two formats a command prints its figures in besides its report."""
    parser.add_argument("--json", action="store_true", help=json_help)
    add_csv_option(parser, what)


def add_csv_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--csv``: print ``what`` (the command's table) as CSV, one row per line, for scripts."""
    parser.add_argument(
        "--csv",
        action="store_true",
        help=f"print {what} as CSV (a header row, then one row each, numbers unformatted), not the report",
    )


class OutputFormats(Protocol):
    """The options of a command that prints a table: ``--csv`` (:func:`add_csv_option`) and ``--json``."""

    @property
    def csv(self) -> bool: ...

    @property
    def json(self) -> bool: ...


def wants_csv(args: OutputFormats) -> bool:
    """Whether ``--csv`` was given (refused beside ``--json``: one format per run).

    Args:
        args: the command's options (a namespace of a command with both options, or its typed options).
    """
    if args.csv and args.json:
        raise InvalidInputError("--json and --csv print the same figures in two formats: give one of them")
    return bool(args.csv)


def write_csv(records: Sequence[Mapping[str, Any]]) -> None:
    """``records`` (the objects ``--json`` prints for the table's rows) as CSV on stdout: a
    header row of every key in first-seen order, then one row per record, numbers unformatted.
    A list cell is its items joined by spaces, an object cell its JSON, ``None`` empty."""
    columns = list(dict.fromkeys(key for record in records for key in record))
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(columns)
    for record in records:
        out.writerow([_cell(record.get(key)) for key in columns])


def _cell(value: Any) -> object:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(str(_cell(item)) for item in value)
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"))
    return value
