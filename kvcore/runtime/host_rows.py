"""The rows of a host tier: which are free, handed out as aligned runs. Torch-free, so the
simulator can count a host tier with the same rules the real one (:mod:`kvcore.runtime.host_tier`)
keeps.

A pool's host tier has ``plan.host_blocks_in(pool)`` rows, one block id's bytes each; a page of
a group whose page spans ``s`` block ids takes an aligned run of ``s`` rows, as it takes an
aligned run of block ids on the device.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvcore.errors import InvalidInputError


class HostRows:
    """The free rows of one pool's host tier, handed out as aligned runs.

    Runs of each span the pool's groups use are kept in a stack of candidates, checked when
    popped (a row taken by a run of another span leaves stale candidates behind, skipped then):
    taking and giving back are amortized ``O(span x spans)``.

    Args:
        rows: rows in the tier (``>= 0``).
        spans: the run lengths pages will take (each group's ``blocks_per_page``).
    """

    def __init__(self, rows: int, spans: Iterable[int]) -> None:
        chosen = set(spans)
        if rows < 0 or any(s < 1 for s in chosen):
            raise InvalidInputError(f"host rows need rows >= 0 and spans >= 1 (got {rows}, {sorted(chosen)})")
        self.rows = rows
        self._free = bytearray(b"\x01") * rows
        #: rows holding no page
        self.num_free = rows
        # lowest runs on top, so pages fill the tier from its start
        self._candidates = {s: list(range((rows // s - 1) * s, -1, -s)) for s in chosen}

    def is_free(self, start: int, span: int) -> bool:
        """Whether rows ``start .. start + span - 1`` all hold no page."""
        return all(self._free[start : start + span])

    def free_runs(self, span: int) -> int:
        """Aligned runs of ``span`` rows that are wholly free (what pages of that span could
        still take, if no other span takes rows first)."""
        return sum(1 for run in range(0, self.rows - span + 1, span) if self.is_free(run, span))

    def take(self, span: int) -> int | None:
        """Take a free aligned run of ``span`` rows; its first row, or ``None`` when none is
        free."""
        stack = self._candidates[span]
        while stack:
            start = stack.pop()
            if self.is_free(start, span):
                self._free[start : start + span] = bytes(span)
                self.num_free -= span
                return start
        return None

    def give_back(self, start: int, span: int) -> None:
        """Free the run of ``span`` rows at ``start`` (taken with :meth:`take`)."""
        self._free[start : start + span] = b"\x01" * span
        self.num_free += span
        for s, stack in self._candidates.items():
            # every run of span s that holds a row given back may now be whole
            for run in range(start // s * s, start + span, s):
                if run + s <= self.rows and self.is_free(run, s):
                    stack.append(run)
