"""Checks that every plan must pass, down to the byte: the layout never lets two live pages
overlap.

The rule: two pages may share bytes only if they belong to layers of *different* groups and
cover a common block id. A block id belongs to one group at a time, so such pages are never
live together. Pages of one layer, of two layers of the same group, or of pages whose block ids
differ (both can be live at once) must never overlap.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from kvcore.errors import PlanValidationError
from kvcore.plan import KVCachePlan

#: Above this many pages in all, only the first and last few pages of each layer are checked;
#: layouts are periodic, so an overlap shows in the first rows.
MAX_CHECKED_PAGES = 200_000
_EDGE_PAGES = 64


def _pages(plan: KVCachePlan, limit: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """``(allocation, start, end, group index, first block id, last block id + 1)`` per page."""
    total = sum(plan.num_pages(g) * len(g.layer_names) for g in plan.groups)
    tensor_index = {name: i for i, t in enumerate(plan.tensors) for name in t.shared_by}
    for gi, group in enumerate(plan.groups):
        pages = plan.num_pages(group)
        if total > limit and pages > 2 * _EDGE_PAGES:
            indices: list[int] = [*range(_EDGE_PAGES), *range(pages - _EDGE_PAGES, pages)]
        else:
            indices = list(range(pages))
        page = group.spec.page_size_bytes
        span = group.blocks_per_page
        for name in group.layer_names:
            ti = tensor_index[name]
            tensor = plan.tensors[ti]
            allocation = 0 if plan.single_buffer else ti
            for j in indices:
                start = tensor.offset + j * tensor.page_stride
                yield allocation, start, start + page, gi, j * span, (j + 1) * span


def plan_problems(plan: KVCachePlan, *, limit: int = MAX_CHECKED_PAGES) -> list[str]:
    """Every byte-overlap violation of ``plan`` (empty when the plan is sound).

    Args:
        plan: the plan to check (its structural invariants already hold: it was built).
        limit: above this many pages, check only the first and last pages of each layer.
    """
    problems: list[str] = []
    names = [g.layer_names for g in plan.groups]
    pages = sorted(_pages(plan, limit))
    active: list[tuple[int, int, int, int, int, int]] = []  # heap by end
    for entry in pages:
        alloc, start, _end, gi, b0, b1 = entry
        while active and (active[0][0] <= start or active[0][1] != alloc):
            heapq.heappop(active)
        for end2, alloc2, start2, gj, c0, c1 in active:
            if end2 <= start or alloc2 != alloc:
                continue
            same_group = gi == gj
            blocks_overlap = b0 < c1 and c0 < b1
            if same_group or not blocks_overlap:
                why = (
                    "pages of one group" if same_group else "pages of different groups on different block ids"
                )
                problems.append(
                    f"bytes {max(start, start2)}..{min(_end, end2)} are used by {why} "
                    f"(groups {gj} and {gi}, block ids {c0}..{c1 - 1} and {b0}..{b1 - 1}; "
                    f"e.g. layers {names[gj][0]!r} / {names[gi][0]!r})"
                )
                if len(problems) >= 20:
                    return problems
        heapq.heappush(active, (_end, alloc, start, gi, b0, b1))
    return problems


def check_plan(plan: KVCachePlan) -> None:
    """Raise :class:`PlanValidationError` listing every overlap :func:`plan_problems` finds."""
    problems = plan_problems(plan)
    if problems:
        raise PlanValidationError(problems)
