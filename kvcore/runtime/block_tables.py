"""Padded block tables an attention kernel reads, kept on the cache's device, and slot mappings.

Engines do not hand a kernel one Python list per request: they keep, per group, one
``int32`` tensor of shape ``[max_requests, max_pages]`` whose row ``i`` is the block table of
the request in row ``i``, padded, and update it in place as requests grow, slide and finish.
:class:`BlockTables` is that tensor for every group of a plan, fed from a
:class:`~kvcore.runtime.block_pool.BlockPool`: after each pool call, :meth:`BlockTables.update`
writes only what the call changed (the pages :meth:`~BlockPool.reserve` returned, the entries
:meth:`~BlockPool.release_stale` or :meth:`~BlockPool.truncate` freed), and
:meth:`BlockTables.remove` clears a finished request's row.

Padding. An entry that holds no page (past the request's end, or freed because no later token
reads it) is:

- the plan's null block (``PlanOptions(reserve_null_block=True)``, ``plan.null_block == 0``)
  when the plan has one: a page no request is ever given, so a kernel that reads it reads
  garbage that it masks anyway, and a write to it harms nobody (vLLM pads the same way);
- else ``plan.num_pages(group)``, one past the group's last page: it cannot alias a live page,
  a kernel that stops at the sequence's length never reads it, and torch indexing with it
  raises instead of quietly reading the last page (as ``-1`` would).

Slot mappings (:meth:`BlockTables.slot_mapping`) give each token a step computes its place in
a group's cache, ``page * block_size + position % block_size`` (``int64``), for the kernel
that writes K/V. A token whose page was freed, and a padding token (``pad_to``), gets the
null block's slot when the plan has one, else :data:`PAD_SLOT` (``-1``, vLLM's
``PAD_SLOT_ID``: its cache-write kernels skip negative slots; with plain torch indexing, mask
``slots >= 0`` first).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Final

import numpy as np
import torch

from kvcore.errors import InvalidInputError
from kvcore.runtime.block_pool import NULL_PAGE, BlockPool
from kvcore.runtime.one_pool import page_cap
from kvcore.runtime.prefix_cache import checkpoint_mode
from kvcore.validators import check_int

#: Slot of a token with no page, when the plan has no null block (vLLM's ``PAD_SLOT_ID``).
PAD_SLOT: Final = -1


class BlockTables:
    """Per group, a persistent padded ``int32`` block-table tensor ``[max_requests, max_pages]``.

    Rows are given to requests on their first :meth:`update` (lowest free row first) and back
    on :meth:`remove`. The tensors never move while the object lives (CUDA graphs may capture
    them). On a CUDA device the tables are written on the host first; :meth:`sync` copies the
    rows that changed (call it once per step, before the kernels run).

    Args:
        pool: the block pool whose request methods change the tables.
        max_requests: rows (requests at once), ``>= 1``.
        device: where the kernels read the tables (default: the CPU).
        max_num_tokens: the longest request (default: the plan's ``max_model_len``); a group's
            row has ``spec.live_pages(max_num_tokens).stop`` entries.

    Raises:
        InvalidInputError: ``max_requests`` or ``max_num_tokens`` is not an int ``>= 1``.
    """

    def __init__(
        self,
        pool: BlockPool,
        max_requests: int,
        *,
        device: torch.device | str | None = None,
        max_num_tokens: int | None = None,
    ) -> None:
        check_int(max_requests, "'max_requests'", minimum=1)
        plan = pool.plan
        length = plan.context.max_model_len if max_num_tokens is None else max_num_tokens
        check_int(length, "'max_num_tokens'", minimum=1)
        self.pool = pool
        self.plan = plan
        self.max_requests = max_requests
        self.device = torch.device("cpu" if device is None else device)
        #: entries per row, per group
        self.max_pages: tuple[int, ...] = tuple(
            min(g.spec.live_pages(length, 0).stop, cap)
            if (cap := page_cap(g.spec, plan.context)) is not None
            else g.spec.live_pages(length, 0).stop
            for g in plan.groups
        )
        #: the entry of a page-less position, per group (the null block's page, or one past the last page)
        self.pad_pages: tuple[int, ...] = tuple(
            plan.null_block // g.blocks_per_page if plan.null_block is not None else plan.num_pages(g)
            for g in plan.groups
        )
        #: tokens per page, per group (``None``: a per-request state, which has no slots)
        self.block_sizes: tuple[int | None, ...] = tuple(g.spec.tokens_per_page for g in plan.groups)
        pinned = self.device.type == "cuda"
        self._host = tuple(
            torch.full((max_requests, width), pad, dtype=torch.int32, pin_memory=pinned)
            for width, pad in zip(self.max_pages, self.pad_pages, strict=True)
        )
        self._arrays = tuple(t.numpy() for t in self._host)
        #: the tables the kernels read, one per group (the host tensors themselves on the CPU)
        self.tensors: tuple[torch.Tensor, ...] = (
            self._host if self.device.type == "cpu" else tuple(t.to(self.device) for t in self._host)
        )
        self._rows: dict[Hashable, int] = {}
        self._free_rows = list(range(max_requests - 1, -1, -1))  # a stack, lowest row on top
        groups = len(plan.groups)
        #: per group, whether a change rewrites its entries in place (a state group keeping
        #: ``align`` checkpoints moves its running page to entry 0 at a block boundary)
        self._rewrites = tuple(checkpoint_mode(g.spec) == "align" for g in plan.groups)
        self._length = [[0] * max_requests for _ in range(groups)]
        self._released = [[0] * max_requests for _ in range(groups)]
        self._dirty: set[int] = set()

    def __contains__(self, request_id: Hashable) -> bool:
        """Whether the request has a row."""
        return request_id in self._rows

    @property
    def requests(self) -> tuple[Hashable, ...]:
        """The requests with a row."""
        return tuple(self._rows)

    def row(self, request_id: Hashable) -> int:
        """The request's row.

        Raises:
            InvalidInputError: the request has no row.
        """
        row = self._rows.get(request_id)
        if row is None:
            raise InvalidInputError(
                f"request {request_id!r} has no block-table row; update() it after its first reserve()"
            )
        return row

    def update(self, request_id: Hashable, changes: Mapping[int, Sequence[int]] | None = None) -> int:
        """Write what the last pool call changed in the request's row.

        Call it after each :meth:`~BlockPool.reserve`, :meth:`~BlockPool.release_stale` or
        :meth:`~BlockPool.truncate` of the request, with what the call returned: only the
        groups it names are read back from the pool (each call names every group it changed).
        A request's first update (e.g. after :meth:`~BlockPool.attach_prefix` found cached
        blocks) copies its whole table, and so does ``changes=None``.

        Args:
            request_id: a request the pool knows.
            changes: ``{group: pages}`` as the pool call returned it.

        Returns:
            The request's row.

        Raises:
            InvalidInputError: the pool does not know the request, every row is taken, or its
                table is longer than ``max_pages``.
        """
        row = self._rows.get(request_id)
        full = changes is None or row is None
        if row is None:
            if not self._free_rows:
                raise InvalidInputError(
                    f"no block-table row is free for request {request_id!r}: all {self.max_requests} "
                    "are taken; remove() finished requests or make BlockTables with more max_requests"
                )
            row = self._free_rows[-1]
        pool = self.pool
        groups = range(len(self.max_pages)) if full else (changes or {}).keys()
        extents = [(group, pool.table_extent(request_id, group)) for group in groups]
        for group, extent in extents:
            if extent.stop > self.max_pages[group]:
                raise InvalidInputError(
                    f"request {request_id!r} has {extent.stop} entries in group {group} but a block-table "
                    f"row holds {self.max_pages[group]}; make BlockTables with a larger max_num_tokens"
                )
        if request_id not in self._rows:
            self._free_rows.pop()
            self._rows[request_id] = row
        for group, extent in extents:
            array, pad = self._arrays[group], self.pad_pages[group]
            lengths, released = self._length[group], self._released[group]
            old_length, old_released = lengths[row], released[row]
            length, start = extent.stop, extent.start
            if full or self._rewrites[group]:
                table = pool.block_table(request_id, group)
                array[row, :] = pad
                if table:
                    values = np.asarray(table, dtype=np.int32)
                    values[values == NULL_PAGE] = pad
                    array[row, : len(table)] = values
            else:
                if length > old_length:
                    pages = (changes or {}).get(group, ())
                    if pages:
                        array[row, length - len(pages) : length] = pages
                elif length < old_length:
                    array[row, length:old_length] = pad
                if start > old_released:
                    array[row, old_released : min(start, length)] = pad
            lengths[row], released[row] = length, start
        self._dirty.add(row)
        return row

    def remove(self, request_id: Hashable) -> None:
        """Pad the request's row and give it back (after :meth:`~BlockPool.free_request`).

        Raises:
            InvalidInputError: the request has no row.
        """
        row = self.row(request_id)
        for group, array in enumerate(self._arrays):
            array[row, : self._length[group][row]] = self.pad_pages[group]
            self._length[group][row] = self._released[group][row] = 0
        del self._rows[request_id]
        self._free_rows.append(row)
        self._free_rows.sort(reverse=True)
        self._dirty.add(row)

    def sync(self) -> None:
        """Copy the rows written since the last call to the device (nothing to do on the CPU)."""
        if self.device.type != "cpu" and self._dirty:
            rows = torch.tensor(sorted(self._dirty), dtype=torch.long)
            for host, device in zip(self._host, self.tensors, strict=True):
                device[rows.to(self.device)] = host[rows].to(self.device, non_blocking=True)
        self._dirty.clear()

    def rows(self, request_ids: Sequence[Hashable]) -> torch.Tensor:
        """The requests' rows as an ``int64`` tensor on the device (to gather a batch's tables)."""
        return torch.tensor([self.row(r) for r in request_ids], dtype=torch.long, device=self.device)

    def slot_mapping(
        self, batch: Sequence[tuple[Hashable, int, int]], *, pad_to: int | None = None
    ) -> tuple[torch.Tensor | None, ...]:
        """Per group, the cache slot of every token a step computes, in batch order.

        Args:
            batch: ``(request, first position, tokens)`` per scheduled request: the step
                computes positions ``first .. first + tokens - 1`` (their pages reserved).
            pad_to: pad the mapping to this many tokens (a CUDA graph's batch size).

        Returns:
            Per group an ``int64`` tensor on the device (``None`` for a per-request state
            group, which has no slots): ``page * block_size + position % block_size``, or the
            padding slot (the null block's, else :data:`PAD_SLOT`) where the page was freed and
            for the padding.

        Raises:
            InvalidInputError: a request has no row, a count is negative, a position lies past
                the row, or ``pad_to`` is less than the tokens.
        """
        rows_list: list[np.ndarray] = []
        positions_list: list[np.ndarray] = []
        for request_id, first, count in batch:
            check_int(first, "a batch's first position", minimum=0)
            check_int(count, "a batch's token count", minimum=0)
            row = self.row(request_id)
            rows_list.append(np.full(count, row, dtype=np.int64))
            positions_list.append(np.arange(first, first + count, dtype=np.int64))
        rows = np.concatenate(rows_list) if rows_list else np.zeros(0, dtype=np.int64)
        positions = np.concatenate(positions_list) if positions_list else np.zeros(0, dtype=np.int64)
        total = len(positions)
        size = total if pad_to is None else check_int(pad_to, "'pad_to'", minimum=total)
        out: list[torch.Tensor | None] = []
        for group, block_size in enumerate(self.block_sizes):
            if block_size is None:
                out.append(None)
                continue
            pad = self.pad_pages[group]
            entries = positions // block_size
            if total and int(entries.max()) >= self.max_pages[group]:
                raise InvalidInputError(
                    f"position {int(positions.max())} lies past group {group}'s block-table row "
                    f"({self.max_pages[group]} entries of {block_size} tokens)"
                )
            pages = self._arrays[group][rows, entries].astype(np.int64)
            slots = np.empty(size, dtype=np.int64)
            slots[:total] = pages * block_size + positions % block_size
            if self.plan.null_block is None:
                slots[:total][pages == pad] = PAD_SLOT
                slots[total:] = PAD_SLOT
            else:
                slots[total:] = pad * block_size
            out.append(torch.from_numpy(slots).to(self.device))
        return tuple(out)
