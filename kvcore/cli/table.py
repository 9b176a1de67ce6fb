"""Plain-text tables with aligned columns, for terminal output."""

from __future__ import annotations

from collections.abc import Sequence


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    align: str | None = None,
    indent: str = "  ",
) -> str:
    """Render ``rows`` under ``headers`` with aligned columns.

    Args:
        headers: column titles.
        rows: cells; each is turned into text with ``str``.
        align: one letter per column, ``"l"`` or ``"r"``; default: numbers right, text left.
        indent: prefix of every line.

    Returns:
        The table, lines joined with newlines, no trailing newline.
    """
    text = [[str(cell) for cell in row] for row in rows]
    if align is None:
        align = "".join(
            "r" if rows and all(isinstance(row[i], (int, float)) for row in rows) else "l"
            for i in range(len(headers))
        )
    widths = [max([len(h), *(len(row[i]) for row in text)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align, strict=True)]
        return (indent + "  ".join(parts)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule, *(line(row) for row in text)])
