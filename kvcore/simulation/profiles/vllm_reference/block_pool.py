"""vLLM 0.33's ``BlockPool`` (``vllm/v1/core/block_pool.py``), plainly: the free block queue,
reference counts, and the prefix cache's hash table of one pool.

The reference (:mod:`kvcore.simulation.profiles.vllm_reference`) keeps one :class:`BlockPool`
per pool of the plan. What it keeps as vLLM does:

- **The free queue** (``FreeKVCacheBlockQueue``): blocks that hold nothing cached are reused
  first, cached blocks last, least recently freed first. ``free_blocks`` puts a freed block
  whose hash is set at the back of the queue and one without a hash at the front;
  ``get_new_blocks`` takes from the front, and a cached block taken there loses its hash
  (``_maybe_evict_cached_block``).
- **Reference counts**: a block held by ``n`` requests has ``ref_cnt == n``; at 0 it is in the
  free queue. A prefix hit on a block nobody holds takes it out of the queue (``touch``).
- **The hash table** (``cached_block_hash_to_block``): a hash may name several blocks (two
  requests that computed the same content at once); a lookup takes the first one cached
  (``get_cached_block``).

Where it differs from vLLM, and why:

- **Block ids.** A kvcore plan's page may take several block ids (``blocks_per_page``), and
  groups of different page sizes may share one pool, where each vLLM block is one id. Here a
  block is one page of ``span`` ids, and the free ids that hold nothing cached are counted,
  not listed: vLLM keeps them at the front of its queue, most recently freed first, and which
  of them a request gets changes no figure. ``get_num_free_blocks`` counts ids.
- **Hashes.** A block's hash is the identity of its content (see
  :mod:`~kvcore.simulation.profiles.vllm_reference.kv_cache_manager`), not a chained hash of
  token ids: a trace knows which requests share a prefix, not their tokens.

Why not :class:`kvcore.runtime.block_pool.BlockPool`: its prefix cache keys only shared
prefixes (``PrefixKey``), hands out aligned runs of ids lowest first and frees a window's pages
at the end of every step; vLLM hashes every full block, reuses uncached ids most recently freed
first and frees a window's blocks only when the request next allocates. The two agree on what
"free" means (a cached block nobody holds counts as free and is evicted only when an
allocation needs its ids), and so does this pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable


class KVCacheBlock:
    """One page of a pool (vLLM's ``KVCacheBlock``): its id, the block ids it takes, how many
    requests hold it and, once cached, its hash."""

    __slots__ = ("block_hash", "block_id", "ref_cnt", "span")

    def __init__(self, block_id: int, span: int) -> None:
        self.block_id = block_id
        self.span = span
        self.ref_cnt = 1
        self.block_hash: Hashable | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, span={self.span}, ref_cnt={self.ref_cnt}, {self.block_hash!r})"


class BlockPool:
    """The blocks of one pool of ``num_ids`` usable block ids (vLLM's ``BlockPool``).

    Attributes:
        num_ids: the pool's usable block ids.
        enable_caching: whether freed blocks keep their hashes (prefix caching).
    """

    def __init__(self, num_ids: int, *, enable_caching: bool) -> None:
        self.num_ids = num_ids
        self.enable_caching = enable_caching
        #: free ids that hold nothing cached (the front of vLLM's free queue)
        self.num_uncached_free = num_ids
        #: free cached blocks, the next to evict first (the back of vLLM's free queue)
        self.free_block_queue: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self.num_cached_free = 0  # block ids in free_block_queue
        self.cached_block_hash_to_block: dict[Hashable, dict[int, KVCacheBlock]] = {}
        self._next_block_id = 0

    def get_num_free_blocks(self) -> int:
        """``BlockPool.get_num_free_blocks``: free block ids, cached ones included."""
        return self.num_uncached_free + self.num_cached_free

    def get_usage(self) -> float:
        """``BlockPool.get_usage``: the share of the pool's ids held by requests."""
        return 1.0 - self.get_num_free_blocks() / self.num_ids

    def get_new_blocks(self, num_blocks: int, span: int) -> list[KVCacheBlock]:
        """``BlockPool.get_new_blocks``: ``num_blocks`` fresh blocks of ``span`` ids each, from the
        front of the free queue: uncached ids first, then the least recently freed cached
        blocks, whose hashes are evicted. The caller checked that the ids are free."""
        need = num_blocks * span
        assert need <= self.get_num_free_blocks(), (need, self.get_num_free_blocks())
        while self.num_uncached_free < need:
            _, block = self.free_block_queue.popitem(last=False)
            self.num_cached_free -= block.span
            self.num_uncached_free += block.span
            self._maybe_evict_cached_block(block)
        self.num_uncached_free -= need
        blocks = [KVCacheBlock(self._next_block_id + i, span) for i in range(num_blocks)]
        self._next_block_id += num_blocks
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> None:
        """``BlockPool._maybe_evict_cached_block``: drop the block's hash from the table."""
        key = block.block_hash
        if key is None:
            return
        holders = self.cached_block_hash_to_block[key]
        del holders[block.block_id]
        if not holders:
            del self.cached_block_hash_to_block[key]
        block.block_hash = None

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock | None]) -> None:
        """``BlockPool.free_blocks``: each block loses a holder; one nobody holds any more goes to
        the back of the free queue when it is cached, else among the uncached ids at the front.
        ``None`` stands for vLLM's null block (a page freed before its window), never pooled."""
        for block in ordered_blocks:
            if block is None:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt:
                continue
            if block.block_hash is not None and self.enable_caching:
                self.free_block_queue[block.block_id] = block
                self.num_cached_free += block.span
            else:
                self.num_uncached_free += block.span

    def touch(self, blocks: Iterable[KVCacheBlock | None]) -> None:
        """``BlockPool.touch``: a prefix hit holds the blocks; one nobody held leaves the queue."""
        for block in blocks:
            if block is None:
                continue
            if block.ref_cnt == 0:
                del self.free_block_queue[block.block_id]
                self.num_cached_free -= block.span
            block.ref_cnt += 1

    def get_cached_block(self, block_hash: Hashable) -> KVCacheBlock | None:
        """``BlockPool.get_cached_block``: the first block cached under ``block_hash``."""
        holders = self.cached_block_hash_to_block.get(block_hash)
        if not holders:
            return None
        return next(iter(holders.values()))

    def cache_block(self, block: KVCacheBlock, block_hash: Hashable) -> None:
        """One block of ``BlockPool.cache_full_blocks``: set its hash and enter it in the table
        (a partial block's hash, see ``cache_partial_block``, is replaced)."""
        if block.block_hash is not None:
            self._maybe_evict_cached_block(block)
        block.block_hash = block_hash
        self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block
