"""The one check every plan passes at every door: the planner's result, a plan read from JSON,
and a plan handed to allocation.

:func:`plan_problems` lists every broken rule; :func:`check_plan` raises them as one
:class:`PlanValidationError` naming the policy and where the plan came from. The rules:

- *structure* (:func:`kvcore.plan.structural_problems`, also checked when a plan is built):
  every layer in exactly one group and one tensor (a KV-sharing layer in neither, its target
  in both), layers that share a tensor in different groups, every page of a layer inside its
  tensor (sizes against block count and page stride), every tensor inside its memory;
- *alignment*: every page starts at a multiple of its layer's ``alignment_bytes`` (tensor
  offsets, page strides and so the starts of pools laid end to end);
- *budget*: ``kv_cache_bytes`` (every pool's ``num_blocks x bytes_per_block``) within
  ``available_memory_bytes``;
- *host tier*: an offload tier (:class:`~kvcore.plan.OffloadTier`) holds some bytes, and each
  pool's share is 0 or holds at least one of the pool's largest pages
  (:func:`offload_tier_problems`);
- *capacity*: one request of the plan's ``max_model_len`` fits (:meth:`KVCachePlan.fits`, in
  every pool): a plan of 0 blocks, of too few, or whose pages span more block ids than its pool
  has, serves no request and is refused wherever it is read or allocated (the planner refuses
  it with an :class:`~kvcore.errors.InsufficientMemoryError` and its largest fitting length);
- *live pages*, to the byte: two pages may share bytes only if they belong to layers of
  *different* groups and cover a common block id. A block id belongs to one group at a time,
  so such pages are never live together. Pages of one layer, of two layers of the same group,
  or pages whose block ids differ (both can be live at once) must never overlap. Pools are
  independent: block ``b`` of one pool and block ``b`` of another are live at once, so pages of
  different pools never share a byte (the structural rules keep every tensor in its pool's
  bytes and the pools apart), and each pool is checked on its own. A layer's page is its own
  spec's (``group.spec_of(layer)``), so a mixed-page group's layers are checked at their sizes.

Most one-buffer plans are checked by the *row rule* (:func:`_rows_problems`): where every
page of a group that spans ``s`` block ids lies in the ``s`` rows of ``W`` bytes that are its own
block ids, pages of different groups may share bytes and only the layers of one group need a
look, a sort per group (linear in the layers up to the sort, whatever the spans).

Other layouts are checked per tensor and per (tensor, group), not per page: every tensor's
pages repeat with its page stride, so within one period ``L`` (the least common multiple of
the strides) a tensor is a few byte intervals. Two tensors can only collide where those
intervals meet; for each such pair the pages that overlap form arithmetic runs, and since
whether two pages' block ids meet is linear in the page index, each run is judged exactly by
its two ends. The cost grows with the number of tensors, not pages. Layouts whose strides have
no small common period fall back to a sweep over pages (the first and last pages of each
layer above :data:`MAX_CHECKED_PAGES`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from kvcore.errors import PlanValidationError
from kvcore.limits import shown
from kvcore.plan import KVCachePlan, structural_problems

#: Above this many pages in all, the fallback sweep checks only the first and last few pages
#: of each layer; layouts are periodic, so an overlap shows in the first rows.
MAX_CHECKED_PAGES = 200_000
_EDGE_PAGES = 64
#: Most copies of one tensor's period the exact check lays out (``L / page_stride``) before it
#: falls back to the page sweep.
_MAX_PERIOD_COPIES = 4096
#: Problems listed before the check stops looking.
MAX_PROBLEMS = 20


def plan_problems(
    plan: KVCachePlan, *, limit: int = MAX_CHECKED_PAGES, structure: bool = True, capacity: bool = True
) -> list[str]:
    """Every broken rule of ``plan`` (empty when the plan is sound).

    Args:
        plan: the plan to check.
        limit: above this many pages, the fallback page sweep checks only the first and last
            pages of each layer.
        structure: also re-check :func:`~kvcore.plan.structural_problems` (a plan checks
            them when it is built; the planner, which has just built it, skips them).
        capacity: also check that one request of ``max_model_len`` fits
            (:func:`capacity_problems`); the planner, which then refuses such a plan with an
            :class:`~kvcore.errors.InsufficientMemoryError` (or was asked for plans past the
            fit), skips it.

    Returns:
        One sentence per problem: structure, then budget and capacity, then live-page overlaps
        (at most :data:`MAX_PROBLEMS` of those).
    """
    broken = list(structural_problems(plan)) if structure else []
    if not broken:  # alignment looks each tensor's layers up in their groups
        broken = alignment_problems(plan)
    problems = broken + budget_problems(plan)
    if not broken:
        problems += offload_tier_problems(plan)
    if capacity:
        problems += capacity_problems(plan)
    if not broken:  # the overlap check needs every layer in one group and one tensor
        problems += overlap_problems(plan, limit=limit)
    return problems


def check_plan(
    plan: KVCachePlan, *, source: str | None = None, structure: bool = True, capacity: bool = True
) -> None:
    """Raise unless ``plan`` passes :func:`plan_problems`.

    Args:
        plan: the plan to check.
        source: where it came from, for the message (``"policy.layout()"``, a file name).
        structure: re-check the structural rules too (see :func:`plan_problems`).
        capacity: check that one request fits (see :func:`plan_problems`).

    Raises:
        PlanValidationError: listing every problem, with the plan's policy and ``source``.
    """
    problems = plan_problems(plan, structure=structure, capacity=capacity)
    if problems:
        raise PlanValidationError(problems, policy=plan.policy, source=source)


def alignment_problems(plan: KVCachePlan) -> list[str]:
    """The alignment rule: every page of a layer starts at a multiple of its spec's
    ``alignment_bytes`` (its element size), i.e. the tensor's offset in its memory and its page
    stride are both multiples of it. A view of a page that breaks it cannot be made without a
    copy; pools laid end to end must keep each pool's start aligned for its layers too."""
    # (alignment, pool) per layer, built once: the plan's group_of builds its index per call
    aligns: dict[int, int] = {}  # id(spec) -> alignment (a state works its out on every read)
    need: dict[str, tuple[int, int]] = {}
    for g in plan.groups:
        for name in g.layer_names:
            spec = g.spec_of(name)
            align = aligns.get(id(spec))
            if align is None:
                align = aligns[id(spec)] = spec.alignment_bytes
            need[name] = (align, g.pool)
    problems: list[str] = []
    for index, tensor in enumerate(plan.tensors):
        for name in tensor.shared_by:
            align, pool = need[name]
            if tensor.offset % align == 0 and tensor.page_stride % align == 0:
                continue
            where = f" (pool {pool} starts at byte {plan.pools[pool].offset})" if plan.names_pools else ""
            problems.append(
                f"tensor {index} of layer {name!r} starts at byte {tensor.offset}{where} with a page stride "
                f"of {tensor.page_stride} bytes, but the layer's pages need {align}-byte alignment: "
                f"the policy must place pages, and lay pools end to end, at multiples of {align} bytes"
            )
            if len(problems) >= MAX_PROBLEMS:
                return problems
            break
    return problems


def budget_problems(plan: KVCachePlan) -> list[str]:
    """The budget rule: the plan's bytes within its ``available_memory_bytes``."""
    if plan.kv_cache_bytes <= plan.available_memory_bytes:
        return []
    blocks = " + ".join(f"{p.num_blocks} blocks x {p.bytes_per_block} bytes" for p in plan.pools)
    return [
        f"the plan takes {plan.kv_cache_bytes} bytes ({blocks}) but its budget "
        f"(available_memory_bytes) is {plan.available_memory_bytes} bytes"
    ]


def host_page_bytes(plan: KVCachePlan, pool: int) -> int:
    """Host bytes one page of pool ``pool`` takes at most: its largest run of block ids
    (``blocks_per_page``, a state's page spans several) times its bytes per block id; what
    its host tier must hold at least to take any page of its groups."""
    spans = [g.blocks_per_page for g in plan.groups if g.pool == pool]
    return max(spans, default=1) * plan.pools[pool].bytes_per_block


def smallest_host_memory(plan: KVCachePlan) -> int:
    """The fewest host bytes that, shared among the pools as
    :func:`~kvcore.plan.split_host_memory` shares them, give every pool with pages room for one
    of its largest pages (:func:`host_page_bytes`)."""
    device = plan.kv_cache_bytes
    least = 0
    for p, pool in enumerate(plan.pools):
        if not pool.nbytes:
            continue
        page = host_page_bytes(plan, p)
        # pool p gets floor(n * nbytes / device) bytes (in whole blocks): solve for page
        need = -(-page * device // pool.nbytes)
        while need * pool.nbytes // device // pool.bytes_per_block * pool.bytes_per_block < page:
            need += 1  # rounding down to whole blocks can cost a byte or two more
        least = max(least, need)
    return least


def offload_tier_problems(plan: KVCachePlan) -> list[str]:
    """The host-tier rule: a plan's offload tier holds something, and each pool's share is
    nothing or at least one of that pool's largest pages (:func:`host_page_bytes`); a share
    below that takes host memory and could never hold a page."""
    tier = plan.offload_tier
    if tier is None:
        return []
    if not tier.nbytes:
        return ["the offload tier has 0 host bytes in every pool; give it host memory, or drop the tier"]
    problems = []
    for p, nbytes in enumerate(tier.pool_bytes):
        page = host_page_bytes(plan, p)
        if 0 < nbytes < page:
            where = f"pool {p}'s" if plan.names_pools else "the plan's"
            problems.append(
                f"the offload tier gives {where} host tier {nbytes:,} bytes, which cannot hold one of its "
                f"pages of {page:,} bytes; give it at least {page:,} bytes (host memory of at least "
                f"{smallest_host_memory(plan):,} bytes for the whole plan) or 0"
            )
    return problems


def capacity_problems(plan: KVCachePlan) -> list[str]:
    """The capacity rule: one request of the plan's ``max_model_len`` fits in every pool
    (:meth:`KVCachePlan.fits`). A plan that holds no request would be allocated and bound and
    then refuse every request, or (hand-edited) hand one request more pages than it has."""
    if plan.fits():
        return []
    length = plan.context.max_model_len
    needs = plan.blocks_per_request_by_pool()
    problems = []
    for p, need in enumerate(needs):
        usable = plan.usable_blocks_in(p)
        if need <= usable:
            continue
        where = f"pool {p}'s" if plan.names_pools else "the plan's"
        problems.append(
            f"one request of max_model_len {length:,} tokens needs {shown(need)} block ids but {where} "
            f"{plan.pools[p].num_blocks:,} blocks leave {usable:,} for requests, so the plan serves no "
            "request: plan it with more memory (or blocks), or a lower max_model_len"
        )
    return problems


class _Series(NamedTuple):
    """The pages of one group's layers in one tensor: page ``j`` at ``offset + j * stride``."""

    offset: int
    stride: int
    page: int  # bytes
    pages: int
    span: int  # block ids per page
    group: int
    layer: str
    tensor: int


class _Copy(NamedTuple):
    """One tensor's pages of one phase within the period ``L``: ``[start, start + width) mod L``."""

    start: int  # residue in [0, L)
    width: int
    tensor: int
    phase: int  # page index mod L // stride


def overlap_problems(plan: KVCachePlan, *, limit: int = MAX_CHECKED_PAGES) -> list[str]:
    """Every pair of pages that may be live at once and share a byte (see the module doc).

    Args:
        plan: a structurally sound plan.
        limit: above this many pages, the fallback sweep checks the first and last pages only.

    Returns:
        Up to :data:`MAX_PROBLEMS` sentences naming the bytes, groups, block ids and layers.
    """
    if len(plan.pools) > 1:
        return _pools_problems(plan, limit)
    if plan.single_buffer:
        verdict = _rows_problems(plan)
        if verdict is not None:
            return verdict
    elif len({g.blocks_per_page for g in plan.groups if g.layer_names and plan.num_pages(g)}) <= 1:
        # Layers that share a tensor are in different groups (a structural rule), and with one
        # page span their pages cover the same block ids: sharing a tensor is always sound.
        return []
    return _exact_problems(plan, limit)


def _pools_problems(plan: KVCachePlan, limit: int) -> list[str]:
    """The live-page check of a plan of several pools, pool by pool.

    Block ``b`` of one pool and block ``b`` of another may be live at once, so pages of
    different pools may never share a byte; the structural rules already keep every tensor
    inside its own pool's bytes and the pools apart (:func:`~kvcore.plan.structural_problems`),
    so what is left is each pool on its own, as a plan of one pool
    (:meth:`~kvcore.KVCachePlan.pool_plan`), its groups named by their index in ``plan``.
    """
    problems: list[str] = []
    for p in range(len(plan.pools)):
        members = plan.groups_in(p)
        if not members:
            continue
        offset = plan.pools[p].offset
        for problem in overlap_problems(plan.pool_plan(p), limit=limit):
            worded = _renumbered(problem, members, offset)
            problems.append(f"pool {p}: {worded}")
            if len(problems) >= MAX_PROBLEMS:
                return problems
    return problems


def _renumbered(problem: str, members: Sequence[int], offset: int = 0) -> str:
    """``problem`` of a pool's own plan, with its group indices those of the whole plan and its
    bytes those of the plan's buffer (the pool's own plan starts at byte 0)."""

    def one(match: re.Match[str]) -> str:
        return f"{match.group(1)}{members[int(match.group(2))]}"

    def shifted(match: re.Match[str]) -> str:
        return f"bytes {int(match.group(1)) + offset}..{int(match.group(2)) + offset}"

    worded = re.sub(r"\b(groups? )(\d+)", one, problem)
    worded = re.sub(r"\b(groups \d+ and )(\d+)", one, worded)
    return re.sub(r"\bbytes (\d+)\.\.(\d+)", shifted, worded) if offset else worded


def _rows_problems(plan: KVCachePlan) -> list[str] | None:
    """The one-buffer layout of rows, tensor by tensor: block id ``b`` is row ``b`` of ``W``
    bytes, and a group whose page spans ``s`` block ids lays page ``j`` of each layer inside
    rows ``j*s .. j*s + s - 1`` (its tensor's page stride is ``s*W`` and every page ends within
    its run of rows).

    A page then covers only rows that are its own block ids, so pages of different groups that
    share bytes share a row, hence a block id, and may overlap; pages of one group meet only in
    one run (the same page index), so only the layers of one group must not overlap within
    their run. That is a sort per group: linear in the layers up to the sort. (A plan of
    several pools is checked pool by pool, each as a plan of one pool: :func:`_pools_problems`.)
    Returns ``None`` where the layout is not of this form (the caller checks it exactly).
    """
    group_of: dict[str, int] = {}
    for gi, group in enumerate(plan.groups):
        if plan.num_pages(group):
            group_of.update(dict.fromkeys(group.layer_names, gi))
    row = 0  # W, the bytes of one block id, common to every tensor
    page_of: dict[int, int] = {}  # id(spec) -> page bytes (specs live as long as the plan)
    # per group: (offset in the run, page bytes, layer, tensor index) of each of its layers
    places: dict[int, list[tuple[int, int, str, int]]] = {}
    for ti, tensor in enumerate(plan.tensors):
        if not tensor.size:
            continue
        for name in tensor.shared_by:
            found = group_of.get(name)
            if found is None:
                continue
            group = plan.groups[found]
            span = group.blocks_per_page
            spec = group.spec_of(name)
            page = page_of.get(id(spec))
            if page is None:  # a state's page is worked out from its parts on every read
                page = page_of[id(spec)] = spec.page_size_bytes
            # page j must lie in rows j*span ..: a stride of span rows, the page inside the first run
            if tensor.page_stride % span or tensor.offset + page > tensor.page_stride:
                return None
            width = tensor.page_stride // span
            if row and width != row:
                return None  # tensors of different row widths: no common rows
            row = width
            if page > 0:
                places.setdefault(found, []).append((tensor.offset, page, name, ti))
    problems: list[str] = []
    for gi, members in places.items():
        group = plan.groups[gi]
        span, pages = group.blocks_per_page, plan.num_pages(group)
        members.sort()
        # (end, place) of the member that reaches furthest so far: a later member that starts
        # before it overlaps it (sorted by start, any overlap shows against that one)
        reach: tuple[int, tuple[int, int, str, int]] | None = None
        for place in members:
            offset, page, name, ti = place
            if reach is not None and offset < reach[0]:
                a, other, first, tj = reach[1]
                stride = plan.tensors[tj].page_stride
                x = _Series(a, stride, other, pages, span, gi, first, tj)
                y = _Series(offset, plan.tensors[ti].page_stride, page, pages, span, gi, name, ti)
                problems.append(_describe(x, 0, y, 0))
                if len(problems) >= MAX_PROBLEMS:
                    return problems
            if reach is None or offset + page > reach[0]:
                reach = (offset + page, place)
    return problems


def _exact_problems(plan: KVCachePlan, limit: int) -> list[str]:
    """Any layout: per (tensor, group) series, candidate tensor pairs from one common period,
    each pair judged exactly (or a page sweep where there is no small common period)."""
    series = _series_by_tensor(plan)
    problems: list[str] = []
    # pages of different groups in one tensor (equal offset and stride)
    for members in series:
        if len(members) > 1 and len({m.span for m in members}) > 1:
            for i, first in enumerate(members):
                for second in members[i + 1 :]:
                    problems += _pair_problems(first, second, plan.single_buffer)
    if not plan.single_buffer:  # each tensor is its own allocation
        return problems[:MAX_PROBLEMS]
    candidates = _colliding_tensors(plan, series)
    if candidates is None:
        return (problems + _swept_problems(plan, series, limit))[:MAX_PROBLEMS]
    for a, b in sorted(candidates):
        for first in series[a]:
            for second in series[b]:
                problems += _pair_problems(first, second, True)
                if len(problems) >= MAX_PROBLEMS:
                    return problems[:MAX_PROBLEMS]
    return problems[:MAX_PROBLEMS]


def _series_by_tensor(plan: KVCachePlan) -> list[list[_Series]]:
    """Per tensor, one :class:`_Series` per group among its layers (with pages)."""
    figures = []
    group_of: dict[str, int] = {}
    for index, group in enumerate(plan.groups):
        figures.append((group.spec.page_size_bytes, plan.num_pages(group), group.blocks_per_page))
        group_of.update(dict.fromkeys(group.layer_names, index))
    out: list[list[_Series]] = []
    for ti, tensor in enumerate(plan.tensors):
        members: list[_Series] = []
        for name in tensor.shared_by:
            gi = group_of.get(name)
            if gi is None:
                continue
            page, pages, span = figures[gi]
            if plan.groups[gi].layer_specs:
                page = plan.groups[gi].spec_of(name).page_size_bytes
            if pages and page > 0:
                members.append(_Series(tensor.offset, tensor.page_stride, page, pages, span, gi, name, ti))
        out.append(members)
    return out


def _colliding_tensors(plan: KVCachePlan, series: Sequence[Sequence[_Series]]) -> set[tuple[int, int]] | None:
    """Pairs of tensors whose pages may meet in the buffer; ``None`` where the strides have no
    small common period (the caller then sweeps pages)."""
    tensors = plan.tensors
    live = [ti for ti, members in enumerate(series) if members]
    if len(live) < 2:
        return set()
    # tensors one after another (the usual layout of separate regions): nothing meets
    ends = [(tensors[ti].offset, tensors[ti].size) for ti in live]
    if all(o1 + s1 <= o2 for (o1, s1), (o2, _) in itertools.pairwise(ends)):
        return set()
    period = 1
    for stride in {tensors[ti].page_stride for ti in live}:
        period = math.lcm(period, stride)
    copies: list[_Copy] = []
    for ti in live:
        tensor = tensors[ti]
        width = max(m.page for m in series[ti])
        count = period // tensor.page_stride
        if count > _MAX_PERIOD_COPIES or len(copies) + count > _MAX_PERIOD_COPIES * 4 + 4 * len(live):
            return None
        pages = max(m.pages for m in series[ti])
        for phase in range(min(count, pages)):
            start = (tensor.offset + phase * tensor.page_stride) % period
            copies.append(_Copy(start, width, ti, phase))
            if start + width > period:  # wraps into the next period
                copies.append(_Copy(start - period, width, ti, phase))
    copies.sort()
    pairs: set[tuple[int, int]] = set()
    active: list[tuple[int, int]] = []  # (end, tensor)
    most = 8 * len(live) + 1024  # beyond this, the layout is no periodic one: sweep pages
    for copy in copies:
        start = copy.start
        active = [(end, ti) for end, ti in active if end > start]
        for _, ti in active:
            if ti != copy.tensor:
                pairs.add((min(ti, copy.tensor), max(ti, copy.tensor)))
        if len(pairs) > most:
            return None
        active.append((start + copy.width, copy.tensor))
    return pairs


def _pair_problems(x: _Series, y: _Series, same_memory: bool) -> list[str]:
    """Pages of ``x`` and ``y`` that share bytes while they may both be live (exact)."""
    if not same_memory and x.tensor != y.tensor:
        return []
    period = math.lcm(x.stride, y.stride)
    mx, my = period // x.stride, period // y.stride
    problems: list[str] = []
    for cx in range(min(mx, x.pages)):
        qx, rx = divmod(x.offset + cx * x.stride, period)
        tx = (x.pages - 1 - cx) // mx  # last period index of this phase
        for cy in range(min(my, y.pages)):
            qy, ry = divmod(y.offset + cy * y.stride, period)
            ty = (y.pages - 1 - cy) // my
            d = ry - rx
            # page (cx + t mx) of x and page (cy + t' my) of y meet when u = qy + t' - qx - t
            # satisfies -y.page < u L + d < x.page
            for u in range((-y.page - d) // period + 1, -((d - x.page) // period)):
                w = u + qx - qy  # t' = t + w
                t0, t1 = max(0, -w), min(tx, ty - w)
                if t0 > t1:
                    continue
                for t in (t0, t1) if t0 != t1 else (t0,):
                    j, k = cx + t * mx, cy + (t + w) * my
                    if x.group == y.group or not (
                        j * x.span < (k + 1) * y.span and k * y.span < (j + 1) * x.span
                    ):
                        problems.append(_describe(x, j, y, k))
                        break
    return problems


def _describe(x: _Series, j: int, y: _Series, k: int) -> str:
    a, b = x.offset + j * x.stride, y.offset + k * y.stride
    start, end = max(a, b), min(a + x.page, b + y.page)
    if x.group == y.group:
        why = f"pages of one group (group {x.group})"
    else:
        why = f"pages of groups {x.group} and {y.group} on different block ids"
    return (
        f"bytes {start}..{end} are used by {why}: page {j} of layer {x.layer!r} (tensor {x.tensor}, "
        f"block ids {j * x.span}..{(j + 1) * x.span - 1}) and page {k} of layer {y.layer!r} "
        f"(tensor {y.tensor}, block ids {k * y.span}..{(k + 1) * y.span - 1})"
    )


def _pages(
    plan: KVCachePlan, series: Sequence[Sequence[_Series]], limit: int
) -> Iterator[tuple[int, int, int, int, int, int, int]]:
    """``(start, end, group, first block id, last block id + 1, series index, page)`` per page."""
    flat = [s for members in series for s in members]
    total = sum(s.pages for s in flat)
    for si, s in enumerate(flat):
        if total > limit and s.pages > 2 * _EDGE_PAGES:
            indices: list[int] = [*range(_EDGE_PAGES), *range(s.pages - _EDGE_PAGES, s.pages)]
        else:
            indices = list(range(s.pages))
        for j in indices:
            start = s.offset + j * s.stride
            yield start, start + s.page, s.group, j * s.span, (j + 1) * s.span, si, j


def _swept_problems(plan: KVCachePlan, series: Sequence[Sequence[_Series]], limit: int) -> list[str]:
    """The page sweep, for layouts without a small common period (one buffer)."""
    flat = [s for members in series for s in members]
    problems: list[str] = []
    active: list[tuple[int, int, int, int, int, int, int]] = []  # heap by end
    for start, end, gi, b0, b1, si, j in sorted(_pages(plan, series, limit)):
        while active and active[0][0] <= start:
            heapq.heappop(active)
        for end2, _start2, gj, c0, c1, sj, k in active:
            if end2 <= start:
                continue
            if gi == gj or not (b0 < c1 and c0 < b1):
                problems.append(_describe(flat[sj], k, flat[si], j))
                if len(problems) >= MAX_PROBLEMS:
                    return problems
        heapq.heappush(active, (end, start, gi, b0, b1, si, j))
    return problems
