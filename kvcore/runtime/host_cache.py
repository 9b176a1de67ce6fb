"""The host tier of one pool's prefix cache: cached blocks evicted from the device, kept by key.

A plan with an :class:`~kvcore.plan.OffloadTier` gives pool ``p`` ``plan.host_blocks_in(p)``
host rows of one block id's bytes each. With prefix caching the block pool
(:class:`~kvcore.runtime.block_pool.BlockPool`) keeps a :class:`HostCache` per pool that has
rows: a cached page the device evicts (to hand its ids out again) goes here instead of being
dropped, when its group's kind says it may (:attr:`~kvcore.spec.KVCacheSpec.offload_unit`
``"block"``: a token block, alone; ``"checkpoint"``: a state checkpoint, the whole page); a
prefix lookup that finds a page here brings it back into device ids. Rows are counted by
:class:`~kvcore.runtime.host_rows.HostRows` (a page of ``s`` block ids, such as a large state
checkpoint, takes an aligned run of ``s`` rows and comes back into an aligned run of ``s`` ids),
the pages least recently used first; a full tier drops its oldest pages until a new one fits.

A cached page's bytes never change (a block is cached once its tokens are computed, a
checkpoint once its state is, and either leaves the cache before it is written again), so a page
brought back keeps its host copy: evicting it again moves no bytes, only refreshes it. This
module counts; the bytes move in :mod:`kvcore.runtime.host_tier` (real tensors) or are priced
by the simulator.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping

import attrs

from kvcore.runtime.host_rows import HostRows

__all__ = ["HostCache", "HostTierStats"]


@attrs.frozen
class HostTierStats:
    """What the host tier of a block pool's prefix cache kept and gave back, all pools together.

    Attributes:
        enabled: whether the pool has a host tier (prefix caching on, the plan has an offload
            tier, and some group's kind lets its cached pages go: ``offload_unit`` ``block``
            or ``checkpoint``).
        host_blocks: host rows of every pool (block ids' worth of host memory).
        held_blocks: rows holding a block now.
        device_hit_tokens: hit tokens the device alone had cached.
        host_hits: lookups whose hit needed a page (a block or a checkpoint) from the host tier.
        host_hit_tokens: hit tokens beyond what the device alone had (those the host tier gave).
        offloaded_blocks: block ids' worth of pages copied to the host (a page already there
            is not copied again).
        offloaded_bytes: their bytes.
        restored_blocks: block ids' worth of pages copied back to the device on a hit.
        restored_bytes: their bytes.
        host_evictions: pages the host tier dropped to make room (oldest first).
    """

    enabled: bool
    host_blocks: int
    held_blocks: int
    device_hit_tokens: int
    host_hits: int
    host_hit_tokens: int
    offloaded_blocks: int
    offloaded_bytes: int
    restored_blocks: int
    restored_bytes: int
    host_evictions: int


class HostCache:
    """The host rows of one pool, holding evicted cached pages by ``(group, key)``.

    Args:
        rows: host rows of the pool (``plan.host_blocks_in(pool)``).
        spans: per offloadable group of the pool, block ids per page (the rows a page takes);
            groups not named here never go to the host.
        bytes_per_block: the pool's bytes per block id (what a row holds).
    """

    def __init__(self, rows: int, spans: Mapping[int, int], bytes_per_block: int) -> None:
        self.rows = HostRows(rows, spans.values())
        self.spans = dict(spans)
        self.bytes_per_block = bytes_per_block
        #: per offloadable group: key -> first host row of the page
        self.where: dict[int, dict[Hashable, int]] = {group: {} for group in spans}
        #: pages that may be dropped, oldest first (pages being brought back are held out)
        self.lru: OrderedDict[tuple[int, Hashable], None] = OrderedDict()
        self.offloaded_blocks = 0
        self.restored_blocks = 0
        self.host_evictions = 0

    @property
    def held_blocks(self) -> int:
        """Rows holding a page."""
        return self.rows.rows - self.rows.num_free

    def holds(self, group: int, key: Hashable) -> bool:
        """Whether the tier keeps ``group``'s page of ``key``."""
        kept = self.where.get(group)
        return kept is not None and key in kept

    def put(self, group: int, key: Hashable) -> bool:
        """Keep an evicted device page (a block, or a checkpoint's run of ``span`` ids):
        ``True`` when its bytes are copied to the host (a page the tier keeps already is only
        refreshed; a group that stays on the device, or a tier with no free aligned run left
        once every other page is dropped, keeps nothing)."""
        kept = self.where.get(group)
        if kept is None:
            return False
        if key in kept:
            if (group, key) in self.lru:
                self.lru.move_to_end((group, key))
            return False
        span = self.spans[group]
        rows = self.rows
        if span > rows.rows:  # no run of the tier could ever hold it: drop nothing for it
            return False
        row = rows.take(span)
        while row is None and self.lru:  # full: drop the oldest page until a run frees up
            (old_group, old_key), _ = self.lru.popitem(last=False)
            rows.give_back(self.where[old_group].pop(old_key), self.spans[old_group])
            self.host_evictions += 1
            row = rows.take(span)
        if row is None:
            return False
        kept[key] = row
        self.lru[(group, key)] = None
        self.offloaded_blocks += span
        return True

    def hold(self, pages: Iterable[tuple[int, Hashable]]) -> None:
        """Keep ``pages`` (each held by the tier) from being dropped while they are brought
        back (the device may evict blocks to make room for them, and those come here)."""
        for page in pages:
            self.lru.pop(page, None)

    def restore(self, pages: Iterable[tuple[int, Hashable]]) -> None:
        """Count ``pages`` (held with :meth:`hold`) copied back to the device; the tier keeps
        them, most recently used."""
        for group, key in pages:
            self.lru[(group, key)] = None
            self.restored_blocks += self.spans[group]
