"""The rows of ``kvcore compare --engine ...``: each policy's plan as the engine runs it, and the
engine's own sizing of the same budget, shared by the vLLM and SGLang comparisons."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class EngineRows:
    """What an engine comparison found, ready for its table, JSON or CSV.

    Attributes:
        rows: one per policy that planned, in the order listed.
        failures: each policy that did not plan, with the reason.
        best: the row the engine serves most with (one of ``rows``), if any.
        own: the engine's own sizing as a row, or ``None`` where it is missing.
        own_name: the name the engine's own row goes by.
        why: why ``own`` is missing (empty when it is not).
    """

    rows: list[dict[str, Any]]
    failures: dict[str, str]
    best: dict[str, Any] | None
    own: dict[str, Any] | None
    own_name: str
    why: str = ""

    @property
    def status(self) -> int:
        """The command's exit status: 0 when some policy planned, else 1."""
        return 0 if self.rows else 1

    @property
    def best_policy(self) -> str | None:
        return self.best["policy"] if self.best is not None else None

    def candidates_json(self) -> list[dict[str, Any]]:
        """Every policy's row (``best`` marked) and every failure, in order."""
        return [
            *({**r, "best": r is self.best} for r in self.rows),
            *({"policy": n, "error": e} for n, e in self.failures.items()),
        ]

    def own_json(self) -> dict[str, Any]:
        return self.own if self.own is not None else {"error": self.why}

    def table(self, cells: Callable[[dict[str, Any]], list[Any]]) -> list[list[Any]]:
        """The table's rows: each policy's, then the engine's own; the best one's name starred."""
        shown = [*self.rows, *([self.own] if self.own is not None else [])]
        return [[f"{r['policy']}*" if r is self.best else r["policy"], *cells(r)] for r in shown]

    def print_notes(self) -> None:
        """The lines under the table: each policy without a plan, and a missing own row."""
        for name, error in self.failures.items():
            print(f"  {name}: no plan: {error}")
        if self.own is None:
            print(f"  {self.own_name}: not shown: {self.why}")
