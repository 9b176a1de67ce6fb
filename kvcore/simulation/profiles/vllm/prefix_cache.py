"""The ``vllm`` profile's prefix cache: hashing a request's computed blocks (``cache_blocks``,
``single_type_kv_cache_manager.py``) and finding the longest hit every group agrees on
(``KVCacheManager.get_computed_blocks``, ``kv_cache_coordinator.py``
``HybridKVCacheCoordinator.find_longest_cache_hit``, each attention type's
``find_longest_cache_hit``).

A block's hash stands for its content: ``(group, True, prefix_id, j)`` for the ``j``-th block
of a shared prefix, ``(group, False, request, j)`` for a request's own block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.block_pool import BlockPools, is_partial
from kvcore.simulation.profiles.vllm.state import WAITING
from kvcore.spec import cdiv

if TYPE_CHECKING:
    from collections.abc import Hashable


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixCache(BlockPools):
    """Hashing and hits (see the module docstring)."""

    def _content(self, r: int, g: int, j: int) -> Hashable:
        """What block ``j`` of group ``g`` of request ``r`` holds (its chained hash's identity)."""
        request = self.requests[r]
        per_page = self.groups[g].tokens_per_page
        if request.prefix_tokens and (j + 1) * per_page <= request.prefix_tokens:
            return (g, True, request.prefix_id, j)
        return (g, False, r, j)

    def _cache_blocks(self, r: int, tokens: int) -> None:
        """``cache_blocks``: hash the full blocks of known tokens up to ``tokens``, rounded down
        to the scheduler's block (``HybridKVCacheCoordinator.get_num_cacheable_tokens``: only what
        a hit, a multiple of it, could match)."""
        if not self.caching:
            return
        tokens = min(tokens, self._tokens[r])
        tokens -= tokens % self._align
        tables, hashed = self._tables[r], self._hashed[r]
        if not tables:
            return
        request = self.requests[r]
        for c, (g, ids) in enumerate(self._classes):
            group = self.groups[g]
            if group.sliding < 0:
                continue
            full = tokens // group.tokens_per_page
            start, end = hashed[c], min(full, len(tables[g]))
            if self._lazy:  # the request's own blocks are hashed when freed (_release)
                end = min(end, request.prefix_tokens // group.tokens_per_page)
            if start < end:
                if self._compact[r]:  # a hashed block needs its own id
                    self._materialise(r)
                for i in ids:
                    self._hash_blocks(r, i, start, end)
            hashed[c] = max(start, full)
            if group.sliding == 0 and not group.chunk and group.tokens_per_page > self._hash_block:
                for i in ids:
                    self._cache_partial_tail(r, i, tokens)

    def _hash_blocks(self, r: int, g: int, start: int, end: int) -> None:
        """Hash the blocks of table positions ``start`` to ``end`` of request ``r``'s group ``g``
        (a full block's hash replaces a partial one; one hashed already keeps its hash)."""
        group, table = self.groups[g], self._tables[r][g]
        hash_of, hashes = self._hash_of, self._hashes[group.pool]
        request = self.requests[r]
        shared = request.prefix_tokens // group.tokens_per_page
        for j in range(start, end):
            block = table[j]
            if block is None:
                continue
            old = hash_of.get(block)
            if old is not None:
                if not is_partial(old):
                    continue
                self._unhash(group.pool, block)  # the full block's hash replaces the partial one
            self._exposed[r] = True
            # _hash of _content, inlined: the one loop over every block hashed
            key: Hashable = (g, True, request.prefix_id, j) if j < shared else (g, False, r, j)
            hash_of[block] = key
            holders = hashes.get(key)
            if holders is None:
                hashes[key] = {block: None}
                self._keyed(key)
            else:
                holders[block] = None

    def _cache_partial_tail(self, r: int, g: int, tokens: int) -> None:
        """``FullAttentionManager._cache_partial_tail_block``: a group whose block is larger than
        the hash block also registers the block where the prompt's last full hash block ends
        (a lookup key no full-block lookup matches, but the block counts as cached: freed, it
        goes to the back of the free queue)."""
        group = self.groups[g]
        step = self._hash_block
        prompt = self.requests[r].prompt_tokens
        boundary = min((prompt - 1) // step, self._tokens[r] // step) * step
        if boundary == 0 or boundary > tokens or boundary % group.tokens_per_page == 0:
            return
        table = self._tables[r][g]
        index = boundary // group.tokens_per_page
        block = table[index] if index < len(table) else None
        if block is None or block in self._hash_of:
            return
        self._exposed[r] = True
        self._hash(group.pool, block, (g, "partial", r, boundary))

    def _has(self, r: int, t: int, j: int) -> bool:
        """Whether block ``j`` of request ``r`` is cached in every group of hit type ``t``
        (``BlockPool.get_cached_block`` of each, answered once per class: see
        ``_held_by_class``)."""
        request, held = self.requests[r], self._held_by_class
        per_page = self.groups[self._hit_types[t][2][0]].tokens_per_page
        shared = request.prefix_tokens and (j + 1) * per_page <= request.prefix_tokens
        for c, size in self._hit_classes[t]:
            key = (c, True, request.prefix_id, j) if shared else (c, False, r, j)
            if held.get(key) != size:
                return False
        return True

    def _find_hit(self, r: int) -> tuple[int, list[list[int | None]] | None]:
        """``get_computed_blocks``: the longest hit every group agrees on, below ``num_tokens``
        and a multiple of the scheduler's block (the groups' least common multiple).

        The hit is found by type (a cached block per class, see :meth:`_has`), then each
        group's blocks are read for it: per type the hit blocks are one stretch of positions,
        those before it null (a window's blocks before the window, a chunk's before its chunk).
        """
        if not self._hit_types:
            return 0, None
        if self._status[r] == WAITING and not self.requests[r].prefix_tokens and not self._null_hits:
            # it never ran and shares no prefix: no block was ever hashed with its content
            return 0, None
        align = self._align
        hit = self._tokens[r] - 1
        # a request that never ran has no block of its own content cached: full attention and
        # windows need look no further than its shared prefix's blocks (what comes after fails)
        shared = self.requests[r].prefix_tokens if self._status[r] == WAITING else -1
        stretches: list[tuple[int, int]] = []  # per type: (first hit block, end), last pass
        while True:
            current = hit
            stretches.clear()
            for t, (window, chunk, ids) in enumerate(self._hit_types):
                per_page = self.groups[ids[0]].tokens_per_page
                most = current // per_page
                if shared >= 0 and most > shared // per_page:
                    most = shared // per_page
                if chunk:
                    low, high, length = self._hit_chunk(r, t, current, chunk)
                elif window == 0:
                    low, high, length = self._hit_full(r, t, most, align)
                else:
                    low, high, length = self._hit_window(r, t, most, cdiv(window - 1, per_page), align)
                current = min(current, length)
                stretches.append((low, high))
            if current >= hit:
                break
            hit = current
            if hit == 0:
                break
        if hit <= 0:
            return 0, None
        request = self.requests[r]
        memo: Hashable | None = None
        if hit <= request.prefix_tokens:
            # a hit inside the shared prefix: its blocks are the prefix's first cached holders,
            # the same for every request of the prefix until its version changes (_bump)
            memo = cast("Hashable", (request.prefix_id, hit, tuple(stretches)))  # (boxed once)
            version = self._prefix_versions.get(request.prefix_id, 0)
            known = self._hit_rows.get(memo)
            if known is not None and known[0] == version:
                return hit, known[1]
        out: list[list[int | None]] = [[] for _ in self.groups]
        for (low, high), (_, _, ids) in zip(stretches, self._hit_types, strict=True):
            for g in ids:
                group = self.groups[g]
                per_page, hashes = group.tokens_per_page, self._hashes[group.pool]
                end = min(high, cdiv(hit, per_page))
                shared = request.prefix_tokens // per_page  # blocks of the shared prefix
                blocks: list[int | None] = [None] * min(low, end)
                for j in range(low, end):
                    key = (g, True, request.prefix_id, j) if j < shared else (g, False, r, j)
                    blocks.append(next(iter(hashes[key])))
                out[g] = blocks
        if memo is not None:
            self._hit_rows[memo] = (version, out)
        return hit, out

    def _hit_full(self, r: int, t: int, most: int, align: int) -> tuple[int, int, int]:
        """``FullAttentionManager.find_longest_cache_hit``: cached blocks from the start (the
        stretch of hit blocks and the tokens)."""
        per_page = self.groups[self._hit_types[t][2][0]].tokens_per_page
        count = 0
        while count < most and self._has(r, t, count):
            count += 1
        length = count * per_page
        length -= length % align
        return 0, cdiv(length, per_page), length

    def _hit_chunk(self, r: int, t: int, most: int, chunk: int) -> tuple[int, int, int]:
        """``ChunkedLocalAttentionManager.find_longest_cache_hit`` for at most ``most`` tokens: the
        blocks before the chunk ``most`` lies in count as hit (null, outside the attention), then
        cached blocks from the chunk's start (its block is the scheduler's: see
        :func:`~kvcore.simulation.profiles.vllm_groups.manager_group`)."""
        per_page = self.groups[self._hit_types[t][2][0]].tokens_per_page
        start = most // chunk * chunk // per_page
        end = start
        while end < most // per_page and self._has(r, t, end):
            end += 1
        return start, end, end * per_page

    def _hit_window(self, r: int, t: int, most: int, need: int, align: int) -> tuple[int, int, int]:
        """``SlidingWindowManager.find_longest_cache_hit``: from the end, the first run of
        ``need`` cached blocks (the window) ending on an aligned boundary; else the run from
        the start."""
        per_page = self.groups[self._hit_types[t][2][0]].tokens_per_page
        run = 0
        for j in range(most - 1, -1, -1):
            if not self._has(r, t, j):
                run = 0
                continue
            if run == 0 and per_page != align and (j + 1) * per_page % align:
                continue  # a hit must end on the scheduler's block
            run += 1
            if run >= need:
                return j, j + run, (j + run) * per_page
        kept = run
        while per_page != align and kept * per_page % align:
            kept -= 1
        return 0, kept, kept * per_page
