"""A picture of a plan's memory: which bytes each tensor's pages take, coloured by group.

:func:`memory_map` computes the rectangles (no plotting library needed, so it is tested
directly); :func:`render_memory_map` draws them with matplotlib (the optional extra
``kvcore[plot]``) into a PNG or SVG file.

The picture has two panels:

- **buffer**: the first ``rows`` block ids of the buffer. :func:`memory_map` gives them along
  one axis, one track per tensor; a single buffer is drawn as it is laid out
  (:func:`fold_rows`): one track per block row, the x axis the bytes of a row, each tensor's
  page at its offset (its column named ``t0``, ``t1``, ... above). A tensor shared by layers of
  several groups is split into one band per layer, so bytes that groups share show as stacked
  colours at the same x.
- **one row per group**: how each group fills one block row: its layers' pages side by side,
  and the part of the row it leaves empty (padding, hatched) whenever it holds a block.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import attrs

from kvcore.cli.figures import pyplot, save_figure
from kvcore.errors import InvalidInputError
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.planning.capacity import Capacity, format_figure
from kvcore.units import format_bytes

#: Most tensor tracks drawn; larger plans show the first ones and say how many were left out.
MAX_TRACKS = 64


@attrs.frozen(kw_only=True)
class Box:
    """One rectangle: ``[x0, x1)`` bytes on a track band, filled for a group or as padding.

    Attributes:
        track: index of the track (tensor, or group in the row panel).
        band: index of the band within the track (one per sharing layer).
        bands: how many bands the track has.
        x0: first byte.
        x1: byte after the last.
        group: group index, or ``None`` for padding.
        label: the layer (or ``"padding"``).
    """

    track: int
    band: int
    bands: int
    x0: int
    x1: int
    group: int | None
    label: str


@attrs.frozen(kw_only=True)
class MemoryMap:
    """Everything the picture shows.

    Of a plan of several pools (one buffer), the buffer panel shows each pool's first block
    rows, one region after another (:attr:`regions`); the row panel shows each group's row of
    its own pool.
    """

    buffer_boxes: tuple[Box, ...]
    buffer_tracks: tuple[str, ...]
    buffer_bytes: int
    row_boxes: tuple[Box, ...]
    row_tracks: tuple[str, ...]
    row_bytes: int
    rows: int
    hidden_tracks: int
    title: str
    legend: tuple[str, ...]
    #: x of every block-row boundary in the buffer panel (a single buffer's; each pool's in turn)
    row_edges: tuple[int, ...] = ()
    #: ``(label, x0, x1)`` of each pool's region in the buffer panel (a plan of several pools)
    regions: tuple[tuple[str, int, int], ...] = ()


def memory_map(plan: KVCachePlan, *, rows: int = 4) -> MemoryMap:
    """Compute the boxes of the picture for the first ``rows`` block ids of ``plan``.

    A plan of several pools shows the first ``rows`` block ids of each pool, one region after
    another along the buffer axis (:attr:`MemoryMap.regions`); each group's row is a row of
    its own pool.
    """
    if rows < 1:
        raise InvalidInputError(f"'rows' must be >= 1 (got {rows})")
    shown_rows = min(rows, max(max((pool.num_blocks for pool in plan.pools), default=0), 1))
    window = _buffer_window(plan, shown_rows)
    buffer_boxes, buffer_tracks = _buffer_boxes(plan, window, shown_rows)
    row_boxes, row_tracks = _row_boxes(plan)
    row_width = max(
        (g.blocks_per_page * plan.pool_of(g).bytes_per_block for g in plan.groups),
        default=plan.pools[0].bytes_per_block,
    )
    return MemoryMap(
        buffer_boxes=buffer_boxes,
        buffer_tracks=buffer_tracks,
        buffer_bytes=window.width,
        row_boxes=row_boxes,
        row_tracks=row_tracks,
        row_bytes=row_width,
        rows=shown_rows,
        hidden_tracks=max(0, len(plan.tensors) - MAX_TRACKS),
        title=_title(plan),
        legend=_legend(plan),
        row_edges=window.edges,
        regions=window.regions,
    )


@attrs.frozen(kw_only=True)
class _BufferWindow:
    """Where each pool's window starts on the buffer axis, how wide it is, and the whole width."""

    starts: tuple[int, ...]
    widths: tuple[int, ...]
    width: int
    edges: tuple[int, ...]
    regions: tuple[tuple[str, int, int], ...]


def _buffer_window(plan: KVCachePlan, shown_rows: int) -> _BufferWindow:
    multi = plan.names_pools
    starts: list[int] = []
    widths: list[int] = []
    edges: list[int] = []
    if plan.single_buffer:
        x = 0
        for pool in plan.pools:
            starts.append(x)
            pool_rows = min(shown_rows, pool.num_blocks) if multi else shown_rows
            widths.append(pool_rows * pool.bytes_per_block)
            edges.extend(x + row * pool.bytes_per_block for row in range(pool_rows + 1))
            x += widths[-1]
        width = x
    else:  # separate allocations: show the first pages of each, side by side on one scale
        width = shown_rows * max((t.page_stride for t in plan.tensors), default=0)
        starts = [0] * len(plan.pools)
        widths = [width] * len(plan.pools)
    regions = (
        tuple(
            (f"pool {index}", starts[index], starts[index] + widths[index])
            for index in range(len(plan.pools))
        )
        if multi and plan.single_buffer
        else ()
    )
    return _BufferWindow(
        starts=tuple(starts), widths=tuple(widths), width=width, edges=tuple(edges), regions=regions
    )


def _buffer_boxes(
    plan: KVCachePlan, window: _BufferWindow, shown_rows: int
) -> tuple[tuple[Box, ...], tuple[str, ...]]:
    """The buffer panel: one track per tensor, one band per layer sharing it, its first pages."""
    groups = {name: index for index, g in enumerate(plan.groups) for name in g.layer_names}
    multi = plan.names_pools
    boxes: list[Box] = []
    tracks: list[str] = []
    for ti, tensor in enumerate(plan.tensors[:MAX_TRACKS]):
        first = plan.groups[groups[tensor.shared_by[0]]] if tensor.shared_by else None
        pool_index = first.pool if first is not None else 0
        pool = plan.pools[pool_index]
        if plan.single_buffer:
            tracks.append((f"pool {pool_index} " if multi else "") + f"@{axis_bytes(tensor.offset)}")
            # buffer byte b of this pool is drawn at x = b - pool.offset + start of its region
            shift = window.starts[pool_index] - pool.offset
            end_of_window = pool.offset + window.widths[pool_index]
        else:
            tracks.append(tensor.shared_by[0])
            shift = -tensor.offset
            end_of_window = tensor.offset + shown_rows * tensor.page_stride
        for band, name in enumerate(tensor.shared_by):
            group = plan.groups[groups[name]]
            page = group.spec_of(name).page_size_bytes
            for j in range(plan.num_pages(group)):
                start = tensor.offset + j * tensor.page_stride
                if start >= end_of_window:
                    break
                boxes.append(
                    Box(
                        track=ti,
                        band=band,
                        bands=len(tensor.shared_by),
                        x0=start + shift,
                        x1=min(start + page, end_of_window) + shift,
                        group=groups[name],
                        label=name,
                    )
                )
    return tuple(boxes), tuple(tracks)


def _row_boxes(plan: KVCachePlan) -> tuple[tuple[Box, ...], tuple[str, ...]]:
    """The row panel: how each group fills one block row of its pool, and the padding it leaves."""
    multi = plan.names_pools
    boxes: list[Box] = []
    tracks: list[str] = []
    tensor_of = {name: tensor for name, _, tensor in plan.iter_layers()}
    for gi, group in enumerate(plan.groups):
        tracks.append(f"group {gi}" + (f" (pool {group.pool})" if multi else ""))
        pool = plan.pool_of(group)
        width = group.blocks_per_page * pool.bytes_per_block
        used = 0
        pages = sorted(
            (
                tensor_of[name].offset - pool.offset if plan.single_buffer else 0,
                name,
                group.spec_of(name).page_size_bytes,
            )
            for name in group.layer_names
        )
        if not plan.single_buffer:  # separate tensors: a block id spans every layer's page in turn
            laid: list[tuple[int, str, int]] = []
            at = 0
            for _, name, page in pages:
                laid.append((at, name, page))
                at += page
            pages = laid
        for run in _runs(pages):
            start, end = run[0][0], run[-1][0] + run[-1][2]
            label = run[0][1] if len(run) == 1 else f"{run[0][1]} .. {run[-1][1]} ({len(run)} layers)"
            boxes.append(Box(track=gi, band=0, bands=1, x0=start, x1=end, group=gi, label=label))
            used = max(used, end)
        if used < width:
            boxes.append(Box(track=gi, band=0, bands=1, x0=used, x1=width, group=None, label="padding"))
    return tuple(boxes), tuple(tracks)


def _legend(plan: KVCachePlan) -> tuple[str, ...]:
    multi = plan.names_pools
    return tuple(
        f"group {gi}: {g.spec.kind}, {len(g.layer_names)} layers"
        + (f", pool {g.pool}" if multi else "")
        + f", block {g.spec.block_size}, page {_pages_text(g)}"
        + (f", {g.blocks_per_page} blocks per page" if g.blocks_per_page > 1 else "")
        for gi, g in enumerate(plan.groups)
    )


def _title(plan: KVCachePlan) -> str:
    capacity = Capacity.of(plan)
    if plan.names_pools:
        blocks = ", ".join(f"{p.num_blocks:,} x {format_bytes(p.bytes_per_block)}" for p in plan.pools)
        blocks = f"{len(plan.pools)} pools ({blocks})"
    else:
        blocks = f"{plan.num_blocks:,} blocks x {format_bytes(plan.bytes_per_block)}"
    return (
        f"{plan.policy}: {blocks} = {format_bytes(plan.kv_cache_bytes)}; "
        f"{format_figure(capacity.max_concurrency, '.2f')} "
        f"requests of {capacity.max_model_len:,} tokens"
    )


def _pages_text(group: KVCacheGroup) -> str:
    """The group's page size, or its sizes joined by ``/`` for a mixed-page group."""
    sizes = sorted({spec.page_size_bytes for spec in group.specs})
    return "/".join(format_bytes(size) for size in sizes)


def _runs(pages: list[tuple[int, str, int]]) -> list[list[tuple[int, str, int]]]:
    """Sorted ``(offset, layer, page bytes)`` pages cut into runs of pages that follow one
    another: one box each, so that a group of thousands of layers draws as a few boxes, not
    thousands."""
    runs: list[list[tuple[int, str, int]]] = []
    for item in pages:
        if runs and runs[-1][-1][0] + runs[-1][-1][2] == item[0]:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def check_map_path(path: str | os.PathLike[str], *, what: str = "the memory map") -> Path:
    """Check, before anything is planned, that the memory map can be written to ``path``.

    Args:
        path: where ``--map`` asks the picture to go.
        what: the picture, as the messages name it (``kvcore simulate --plot`` checks its
            plot with this function too).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        InvalidInputError: the suffix is not ``.png``/``.svg``, the folder does not exist (or is
            not a folder), or matplotlib is missing.
    """
    out = Path(path)
    if out.suffix.lower() not in (".png", ".svg"):
        raise InvalidInputError(f"{what} is written as .png or .svg (got {out.name!r})")
    folder = out.parent
    if not folder.is_dir():
        raise InvalidInputError(
            f"cannot write {what} to {out}: the folder {folder} does not exist; create it first"
        )
    if out.is_dir():
        raise InvalidInputError(f"cannot write {what} to {out}: it is a folder; name a .png or .svg file")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidInputError(
            f"drawing {what} needs matplotlib; install it with: pip install 'kvcore[plot]'"
        ) from None
    return out


def fold_regions(plan: KVCachePlan, data: MemoryMap) -> list[tuple[str, int, int]]:
    """``(label, x0, x1)`` of each pool's block row on the folded buffer axis
    (:func:`fold_rows`): one row of each pool, side by side; ``""`` labels for one pool."""
    spans: list[tuple[str, int, int]] = []
    x = 0
    for index, pool in enumerate(plan.pools):
        spans.append((f"pool {index}" if data.regions else "", x, x + pool.bytes_per_block))
        x += pool.bytes_per_block
    return spans


def fold_rows(plan: KVCachePlan, data: MemoryMap) -> tuple[tuple[Box, ...], tuple[str, ...], int]:
    """The buffer panel of a single buffer as the buffer is laid out: a track per block row
    (``block 0``, ``block 1``, ...), the x axis the bytes of one row (of each pool's row, side
    by side), so every tensor's page of a row sits at its offset in the row and the rows line up
    under one another, instead of one track per tensor stepping across the rows. Each row has a
    lane per group: the pages of the groups sharing a tensor's bytes lie one above the other.

    Returns:
        The boxes (a page spread over a run of block ids cut at each row's end), the track
        labels and the axis width.
    """
    regions = data.regions or (("", 0, data.buffer_bytes),)
    spans = fold_regions(plan, data)
    # one lane per group in every row: pages of different groups that share bytes lie one above
    # the other, and a group's page wider than a tensor's slice (a larger block) reads whole
    drawn = sorted({box.group for box in data.buffer_boxes if box.group is not None})
    lane = {group: index for index, group in enumerate(drawn)}
    lanes = max(len(drawn), 1)
    boxes: list[Box] = []
    for box in data.buffer_boxes:
        index = next(i for i, (_, lo, hi) in enumerate(regions) if lo <= box.x0 < hi)
        start, row_bytes = regions[index][1], plan.pools[index].bytes_per_block
        at = spans[index][1]
        x0 = box.x0
        while x0 < box.x1:
            row, offset = divmod(x0 - start, row_bytes)
            end = min(box.x1, start + (row + 1) * row_bytes)
            boxes.append(
                attrs.evolve(
                    box,
                    track=row,
                    band=lane.get(box.group, 0) if box.group is not None else 0,
                    bands=lanes,
                    x0=at + offset,
                    x1=at + offset + (end - x0),
                )
            )
            x0 = end
    tracks = tuple(f"block {row}" for row in range(data.rows))
    return tuple(boxes), tracks, spans[-1][2]


def label_tensors(ax: Any, plan: KVCachePlan, data: MemoryMap, width: int) -> None:
    """Name each tensor's column (``t0``, ``t1``, ...) along the folded buffer panel's top edge,
    where there is room (at most 24 tensors)."""
    tensors = plan.tensors[:MAX_TRACKS]
    if not tensors_named(plan):
        return
    spans = fold_regions(plan, data)
    top = ax.secondary_xaxis("top")
    ticks = []
    for index, tensor in enumerate(tensors):
        pool = tensor_pool(plan, index)
        ticks.append((spans[pool][1] + tensor.offset - plan.pools[pool].offset, f"t{index}"))
    top.set_xticks([x for x, _ in ticks], [label for _, label in ticks], fontsize=7)
    top.tick_params(axis="x", length=2, pad=1)
    ax.set_xlim(0, max(width, 1))


def tensors_named(plan: KVCachePlan) -> bool:
    """Whether :func:`label_tensors` names the tensors: 1 to 24 of them (more would overlap)."""
    return 0 < len(plan.tensors) <= 24


def tensor_pool(plan: KVCachePlan, index: int) -> int:
    """The pool whose rows tensor ``index`` lies in (its first sharing layer's group's)."""
    tensor = plan.tensors[index]
    if not tensor.shared_by:
        return 0
    name = tensor.shared_by[0]
    return next(g.pool for g in plan.groups if name in g.layer_names)


def axis_bytes(value: float) -> str:
    """A byte offset as an axis label: as many decimals as it needs, up to three, so that ticks
    1.125 MiB and 1.5 MiB apart read so (``'1.125 MiB'``, ``'1.5 MiB'``, ``'2 MiB'``; ``'0'``)
    instead of rounding to the same whole unit."""
    if not value:
        return "0"
    number, unit = format_bytes(int(value), precision=3).split(" ")
    if "." in number:  # '1.500' -> '1.5', '2.000' -> '2'
        number = number.rstrip("0").rstrip(".")
    return f"{number} {unit}"


def byte_tick_step(width: float, *, most: int = 8) -> float:
    """The spacing of byte ticks across ``width`` bytes: a power of two times a binary unit
    (0.125, 0.25, ... 512 x B, KiB, MiB, ...), the smallest that gives at most ``most`` ticks, so
    that ticks fall on offsets :func:`axis_bytes` writes exactly (matplotlib's own would fall
    at decimal steps: 976.562 KiB, 1.907 MiB)."""
    unit = 1.0
    while unit * 1024 <= width:
        unit *= 1024
    step = unit / 8 if unit > 1 else 1.0
    while width / step > most:
        step *= 2
    return step


def say_written(path: Path, what: str) -> None:
    """Say on stderr that ``what`` was written to ``path`` (stdout may be ``--json``):
    ``kvcore: wrote map.svg (the memory map, 23.40 KiB)``; every file the command line writes is
    said this way."""
    print(f"kvcore: wrote {path} ({what}, {format_bytes(path.stat().st_size)})", file=sys.stderr)


def render_memory_map(plan: KVCachePlan, path: str | os.PathLike[str], *, rows: int = 4) -> Path:
    """Draw the memory map of ``plan`` into ``path`` (``.png`` or ``.svg``).

    Large plans stay quick: the first :data:`MAX_TRACKS` tensors are drawn, a group's pages
    that follow one another in a block row are one box, and the boxes are drawn as one
    collection per panel (100,000 layers draw in seconds).

    Raises:
        InvalidInputError: as :func:`check_map_path` (the suffix, the folder, matplotlib), or
            the file cannot be written.
    """
    out = check_map_path(path)
    try:
        plt = pyplot()
        from matplotlib.patches import Patch
    except ImportError:
        raise InvalidInputError(
            "drawing the memory map needs matplotlib; install it with: pip install 'kvcore[plot]'"
        ) from None

    data = memory_map(plan, rows=rows)
    colors = plt.get_cmap("tab20")
    legend_rows = (len(data.legend) + 2) // 2
    folded = fold_rows(plan, data) if plan.single_buffer else None
    top_boxes, top_tracks, top_width = (
        folded if folded is not None else (data.buffer_boxes, data.buffer_tracks, data.buffer_bytes)
    )
    # a folded buffer has a track per block row, each drawn taller: its bands are the sharing layers
    heights = [max(len(top_tracks), 1) * (2 if folded is not None else 1), max(len(data.row_tracks), 1)]
    legend_in = 0.16 * legend_rows + 0.15
    fig_h = 1.6 + 0.28 * sum(heights) + legend_in
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, fig_h), gridspec_kw={"height_ratios": heights})
    _draw_panel(
        top, top_boxes, top_tracks, top_width, _buffer_xlabel(plan, data, folded=folded is not None), colors
    )
    if folded is not None:
        _annotate_folded(top, plan, data, top_width)
    smallest = min((g.spec.page_size_bytes for g in plan.groups), default=0)
    if smallest and data.row_bytes // smallest <= 16:
        bottom.set_xticks(range(0, data.row_bytes + 1, smallest))
    top.set_title(data.title, fontsize=9, pad=16 if folded is not None else 6)
    _draw_panel(
        bottom,
        data.row_boxes,
        data.row_tracks,
        data.row_bytes,
        "one block row, as each group fills it",
        colors,
    )
    handles = [
        Patch(facecolor=colors(i % 20), edgecolor="black", label=text) for i, text in enumerate(data.legend)
    ]
    handles.append(
        Patch(
            facecolor="white",
            edgecolor="grey",
            hatch="///",
            label="padding: unused while the group holds the block",
        )
    )
    fig.legend(handles=handles, loc="lower center", fontsize=7, ncol=2, frameon=False)
    fig.tight_layout(rect=(0, legend_in / fig_h, 1, 1))
    return save_figure(fig, out, what="the memory map", dpi=120)


def _buffer_xlabel(plan: KVCachePlan, data: MemoryMap, *, folded: bool) -> str:
    each = ", each pool's row beside the other's" if data.regions else ""
    hidden = f"; {data.hidden_tracks} more tensors not drawn" if data.hidden_tracks else ""
    if not folded:
        return f"buffer bytes (the first {data.rows} block ids{each}{hidden})"
    named = "; t0, t1, ... above: where each tensor's page starts" if tensors_named(plan) else ""
    return (
        f"bytes of a block row{each}: the buffer's first {data.rows} block ids, one row each, a lane per "
        f"group (a block id is one group's at a time){named}{hidden}"
    )


def _draw_panel(
    ax: Any, boxes: tuple[Box, ...], tracks: tuple[str, ...], width: int, xlabel: str, colors: Any
) -> None:
    """Draw one panel's boxes: filled ones as one collection, padding hatched one by one."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FixedLocator, FuncFormatter, MultipleLocator

    filled: list[Rectangle] = []
    for box in boxes:
        band_h = 0.8 / box.bands
        y = box.track - 0.4 + box.band * band_h
        if box.group is None:  # padding: few boxes, hatched one by one
            ax.add_patch(
                Rectangle(
                    (box.x0, y),
                    box.x1 - box.x0,
                    band_h,
                    facecolor="white",
                    edgecolor="grey",
                    hatch="///",
                    linewidth=0.5,
                )
            )
        else:
            filled.append(Rectangle((box.x0, y), box.x1 - box.x0, band_h))
    ax.add_collection(
        PatchCollection(
            filled,
            facecolors=[colors((box.group or 0) % 20) for box in boxes if box.group is not None],
            edgecolors="black",
            linewidths=0.3,
        )
    )
    ax.set_xlim(0, max(width, 1))
    ax.set_ylim(max(len(tracks), 1) - 0.5, -0.5)  # an empty plan still gets one track's height
    ax.set_yticks(range(len(tracks)), tracks, fontsize=7)
    ax.set_xlabel(xlabel, fontsize=8)
    if not isinstance(ax.xaxis.get_major_locator(), FixedLocator):  # page ticks set before stay
        ax.xaxis.set_major_locator(MultipleLocator(byte_tick_step(max(width, 1))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: axis_bytes(value)))
    ax.tick_params(axis="x", labelsize=7)


def _annotate_folded(top: Any, plan: KVCachePlan, data: MemoryMap, width: int) -> None:
    """A folded buffer's labels: tensor columns above, row offsets on the right, pool regions."""
    label_tensors(top, plan, data, width)
    if not data.regions:  # one pool: the buffer offset where each row starts, on the right
        offsets = top.secondary_yaxis("right")
        edges = data.row_edges[: data.rows + 1]
        offsets.set_yticks(
            [row - 0.5 for row in range(len(edges))], [axis_bytes(e) for e in edges], fontsize=7
        )
        offsets.set_ylabel("buffer offset", fontsize=7)
    for label, x0, x1 in fold_regions(plan, data):
        top.axvline(x0, color="black", linewidth=1.2)
        top.text((x0 + x1) / 2, -0.5, label, ha="center", va="bottom", fontsize=7)
