"""What prefix caching in the block pool keys its blocks by, and what it reports.

A request's leading tokens are named either by their token ids (a sequence of ints: an
engine's prompt) or by a :class:`PrefixKey` (an id shared by every request whose first
``num_tokens`` tokens are the same: what a simulator's trace knows). A group's block ``k``
holds tokens ``[k*B, (k+1)*B)``; only full blocks are keyed, and a key names everything before
the block too:

- token ids: ``key(k) = sha256(key(k - 1) + the block's token ids as 8-byte ints)`` (a chain,
  so two requests share block ``k`` only if they share every token up to its end);
- a :class:`PrefixKey`: ``(prefix_id, B, k)`` for the blocks that lie wholly inside its
  ``num_tokens`` (the rest of the request is its own and never cached).

The pool (:class:`~kvcore.runtime.block_pool.BlockPool` with ``prefix_caching=True``) keeps a
:class:`PrefixCache` per pool (one key-to-block table per group, reference counts, the
evictable blocks least recently used first) and counts lookups in :class:`PrefixCacheStats`.
An evicted page passes through :class:`PrefixCache`'s ``on_evict`` before its ids are handed out
again, and, with a plan's host tier, into the pool's
:class:`~kvcore.runtime.host_cache.HostCache` when its kind lets it go (a token block, or a state
checkpoint as a whole page); a lookup then counts what the host keeps as cached and brings back
what the hit needs.

A group of a state kind (SSM, linear attention: ``offload_unit == "checkpoint"``) holds no
tokens, so it caches *checkpoints*: the state after the first ``b`` tokens, ``b`` a multiple of
its ``block_size``, keyed like the block that ends at ``b`` (:func:`checkpoint_mode` says which
the kind keeps). A hit of ``h`` tokens then needs the checkpoint at exactly ``h`` besides every
other group's pages (vLLM's rule: ``HybridKVCacheCoordinator`` takes the longest hit every group
serves, and ``MambaManager.find_longest_cache_hit`` a state cached at that block boundary;
vllm/v1/core/kv_cache_coordinator.py, vllm/v1/core/single_type_kv_cache_manager.py).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from itertools import repeat

import attrs

from kvcore.errors import InvalidInputError
from kvcore.limits import MAX_TOKENS
from kvcore.plan import KVCacheGroup
from kvcore.runtime.free_blocks import FreeBlocks
from kvcore.runtime.host_cache import HostCache
from kvcore.runtime.request_tables import NULL_PAGE, PrefixKey, RequestRecord
from kvcore.spec import KVCacheSpec

__all__ = [
    "CHECKPOINT_MODES",
    "EvictionHook",
    "KindHits",
    "PrefixCache",
    "PrefixCacheStats",
    "PrefixKey",
    "block_key",
    "cacheable_blocks",
    "checkpoint_mode",
    "token_block_keys",
]

#: The state cache modes whose checkpoints a prefix cache keeps (``none`` keeps only the
#: running state, which no other request can start from).
CHECKPOINT_MODES = ("align", "all")


def checkpoint_mode(spec: KVCacheSpec) -> str:
    """Which state checkpoints a group of ``spec`` keeps for prefix caching: ``"align"`` (the
    state at each block boundary a request's step ends on, the plan's second state),
    ``"all"`` (the state at every block boundary, one page per block), or ``"none"`` (a kind
    that is not a per-request state, or keeps only its running state).

    A kind opts in by declaring ``offload_unit = "checkpoint"`` (a page is a whole state after
    a prefix ending at a block boundary) and a ``cache_mode`` field, as ``state`` does."""
    if spec.tokens_per_page is not None or spec.offload_unit != "checkpoint":
        return "none"
    mode = getattr(spec, "cache_mode", "none")
    return mode if mode in CHECKPOINT_MODES else "none"


@attrs.frozen
class KindHits:
    """What one group kind's cached pages served (counted with the lookups).

    Attributes:
        kind: the group kind (``full_attention``, ``sliding_window``, ``state``, ...).
        hits: lookups whose hit used at least one cached page of this kind.
        pages: cached pages of this kind the hits used (all groups of the kind together): a
            full-attention group's every block up to the hit, a sliding window's last
            window, a state group's one checkpoint.
    """

    kind: str
    hits: int
    pages: int


@attrs.frozen
class PrefixCacheStats:
    """What prefix caching found, counted when a looked-up request's first ``reserve`` succeeds.

    Attributes:
        enabled: whether the pool caches (``False`` when it was not asked to, or a group cannot
            cache; ``reason`` says which).
        reason: why caching is off, or ``""``.
        lookups: requests looked up (:meth:`~kvcore.runtime.block_pool.BlockPool.attach_prefix`).
        hits: lookups that found at least one cached token.
        queried_tokens: the tokens those requests had when looked up.
        hit_tokens: the tokens found cached (they need no computing).
        evictions: cached blocks evicted to hand their ids out again.
        by_kind: per group kind of the plan (in the plan's order), what its pages served.
    """

    enabled: bool
    reason: str
    lookups: int
    hits: int
    queried_tokens: int
    hit_tokens: int
    evictions: int
    by_kind: tuple[KindHits, ...] = ()

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / queried_tokens`` (0 before any lookup)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def token_block_keys(tokens: Sequence[int], block_size: int, keys: list[bytes], count: int) -> None:
    """Extend ``keys`` (the chained keys of ``tokens``' first blocks) to ``count`` blocks.

    Args:
        tokens: the token ids (at least ``count * block_size`` of them).
        block_size: tokens per block.
        keys: the keys so far, extended in place.
        count: blocks wanted.

    Raises:
        InvalidInputError: a token id is not an int that fits 8 bytes.
    """
    while len(keys) < count:
        k = len(keys)
        digest = hashlib.sha256(keys[-1] if keys else b"kvcore")
        try:
            digest.update(array("q", tokens[k * block_size : (k + 1) * block_size]).tobytes())
        except (TypeError, OverflowError) as exc:
            raise InvalidInputError(
                f"token ids must be ints that fit 8 bytes (block {k} of {block_size} tokens: {exc})"
            ) from None
        keys.append(digest.digest())


def block_key(record: RequestRecord, content: Sequence[int] | PrefixKey, per_page: int, k: int) -> Hashable:
    """The key of block ``k`` of ``per_page`` tokens of a request's ``content`` (token-id
    keys are chained once per request and kept in its record)."""
    if isinstance(content, PrefixKey):
        return (content.prefix_id, per_page, k)
    chains = record.chains
    keys = chains.get(per_page)
    if keys is None:
        keys = chains[per_page] = []
    if len(keys) <= k:
        token_block_keys(content, per_page, keys, k + 1)
    return keys[k]


def cacheable_blocks(content: Sequence[int] | PrefixKey, per_page: int, tokens: int) -> int:
    """Full blocks of ``per_page`` tokens among the first ``tokens`` that content names."""
    known = content.num_tokens if isinstance(content, PrefixKey) else len(content)
    return min(tokens, known) // per_page


#: Where an evicted cached block goes before its id is handed out again:
#: ``(pool index, block id, key)``. A second memory tier keeps the block's bytes there.
EvictionHook = Callable[[int, int, Hashable], None]


class PrefixCache:
    """The cached blocks of one pool: per group a key-to-page table, per block id its key and
    how many requests' tables hold it, and the evictable pages (cached, held by none) least
    recently used first.

    A cached page no request holds counts as free: :meth:`evict` hands its ids out again when
    the pool has no free id left, and tells ``on_evict`` first. A page of several ids (a state
    checkpoint in an aligned run) is counted by its first id (``ref``, ``key``), and evicting
    it frees the whole run.

    Args:
        pool: the plan's pool index (what ``on_evict`` is told).
        groups: every group of the plan (indices are the plan's).
        members: the indices of the groups drawing from this pool.
        paged: per group, tokens per page (0 for a state group that keeps checkpoints,
            :func:`checkpoint_mode`; every other member pages by the default rule).
        free: the pool's free ids, whose owners name each block's group.
        on_evict: called with ``(pool, block, key)`` for each evicted page (its first id), or ``None``.
        host: the pool's host tier (:class:`~kvcore.runtime.host_cache.HostCache`), or
            ``None``: an evicted block of an offloadable group goes there, and a lookup finds
            blocks there too and brings them back.
    """

    def __init__(
        self,
        pool: int,
        groups: Sequence[KVCacheGroup],
        members: Sequence[int],
        paged: Sequence[int],
        free: FreeBlocks,
        on_evict: EvictionHook | None = None,
        host: HostCache | None = None,
    ) -> None:
        self.pool = pool
        self.host = host
        self.groups = groups
        self.members = tuple(members)
        self.paged = paged
        self.free = free
        self.on_evict = on_evict
        #: state groups: (group, tokens per checkpoint, "align" or "all")
        self.checkpoints = tuple(
            (index, groups[index].spec.block_size, checkpoint_mode(groups[index].spec))
            for index in members
            if not paged[index]
        )
        #: the groups that cache token blocks
        self.token_groups = tuple(index for index in members if paged[index])
        self.keeps_all = tuple(
            index
            for index in self.token_groups
            if type(groups[index].spec).first_retained_token is KVCacheSpec.first_retained_token
        )
        self.freeing = tuple(index for index in self.token_groups if index not in self.keeps_all)
        self.spans = {index: groups[index].blocks_per_page for index in members}
        self.ref = [0] * free.num_blocks
        self.key: list[Hashable | None] = [None] * free.num_blocks
        self.cache: dict[int, dict[Hashable, int]] = {index: {} for index in members}
        self.lru: OrderedDict[int, None] = OrderedDict()  # evictable cached blocks, oldest first
        #: evictable cached pages of several ids (their first id), oldest first, and their ids
        self.run_lru: OrderedDict[int, None] = OrderedDict()
        self.run_ids = 0
        self.evictions = 0

    @property
    def num_evictable(self) -> int:
        """Block ids of cached pages no request holds."""
        return len(self.lru) + self.run_ids

    def _kept(self, index: int, with_host: bool) -> Callable[[Hashable], bool]:
        """Whether a key of group ``index`` is cached: on the device, or with ``with_host`` in
        the host tier too."""
        cache = self.cache[index]
        hosted = self.host.where.get(index) if with_host and self.host is not None else None
        if hosted is None:
            return cache.__contains__
        return lambda key: key in cache or key in hosted

    def find_hit(
        self,
        record: RequestRecord,
        content: Sequence[int] | PrefixKey,
        limit: int,
        step: int,
        with_host: bool = True,
        known: int = 0,
    ) -> int:
        """The most tokens (a multiple of ``step``, at most ``limit``) whose live blocks every
        group of the pool has cached, and every state group a checkpoint at exactly that
        length (on the device, or in the host tier unless ``with_host`` is false); ``known``
        tokens are known cached already (the device's hit, when the host tier is asked after
        it), so the walk of a group that keeps every block starts there."""
        upper = limit // step * step if limit > 0 else 0
        if not upper:
            return 0
        for index in self.keeps_all:
            kept, per_page = self._kept(index, with_host), self.paged[index]
            n = min(known, upper) // per_page
            while n < upper // per_page and kept(block_key(record, content, per_page, n)):
                n += 1
            upper = min(upper, n * per_page) // step * step
            if not upper:
                return 0
        runs: list[tuple[int, list[int]]] = []  # per freeing group: the cached run ending at k
        for index in self.freeing:
            kept, per_page, run, length = self._kept(index, with_host), self.paged[index], [], 0
            for k in range(upper // per_page):
                length = length + 1 if kept(block_key(record, content, per_page, k)) else 0
                run.append(length)
            runs.append((index, run))
        states = [(self._kept(index, with_host), unit) for index, unit, _ in self.checkpoints]
        for hit in range(upper, 0, -step):
            if runs and not self._windows_serve(runs, hit):
                continue
            if states and not all(kept(block_key(record, content, u, hit // u - 1)) for kept, u in states):
                continue  # a state resumes only from a checkpoint at exactly the hit (device or host)
            return hit
        return 0

    def _windows_serve(self, runs: list[tuple[int, list[int]]], hit: int) -> bool:
        """Whether every freeing group has cached the blocks live at a hit of ``hit`` tokens
        (``runs``: per group, the length of the cached run ending at each block)."""
        for index, run in runs:
            live = self.groups[index].spec.live_pages(hit, hit)
            if live.stop > live.start and run[live.stop - 1] < live.stop - live.start:
                return False
        return True

    def restores_fit(self, record: RequestRecord, content: Sequence[int] | PrefixKey, hit: int) -> bool:
        """Whether the device has room for the pages of a hit of ``hit`` tokens that only the
        host tier holds: single ids among the free ones and the evictable cached pages the hit
        itself does not use, and for a checkpoint of ``s > 1`` ids a whole aligned run (a
        free one, or an evictable cached page of ``s`` ids the hit does not use; runs that
        evicting single ids would piece together are not counted, so a hit may be cut short
        of what a perfect packing would bring back)."""
        if self.host is None:
            return True
        ref, spans = self.ref, self.spans
        missing: dict[int, int] = {}  # per span: pages only the host holds
        pinned: dict[int, int] = {}  # per span: evictable device pages the hit uses
        for index in self.token_groups:
            live = self.groups[index].spec.live_pages(hit, hit)
            cache, per_page = self.cache[index], self.paged[index]
            for k in live:
                block = cache.get(block_key(record, content, per_page, k))
                if block is None:
                    missing[1] = missing.get(1, 0) + 1
                elif not ref[block]:
                    pinned[1] = pinned.get(1, 0) + 1
        for index, unit, _ in self.checkpoints:
            span = spans[index]
            page = self.cache[index].get(block_key(record, content, unit, hit // unit - 1))
            if page is None:
                missing[span] = missing.get(span, 0) + 1
            elif not ref[page * span]:
                pinned[span] = pinned.get(span, 0) + 1
        if not missing:
            return True
        spare = self.free.num_free + self.num_evictable - sum(s * c for s, c in pinned.items())
        if sum(s * c for s, c in missing.items()) > spare:
            return False
        runs = [s for s in missing if s > 1]
        if not runs:
            return True
        owner = self.free.owner
        evictable: dict[int, int] = {}  # per span: evictable cached runs (the hit's own among them)
        for first in self.run_lru:
            span = spans[owner[first]]
            evictable[span] = evictable.get(span, 0) + 1
        free_runs = self.free.runs
        return all(free_runs[s].full + evictable.get(s, 0) - pinned.get(s, 0) >= missing[s] for s in runs)

    def attach(self, record: RequestRecord, content: Sequence[int] | PrefixKey, hit: int) -> int:
        """Fill the request's tables of this pool's groups with the cached blocks of a hit,
        bringing back from the host tier the blocks only it holds (the caller checked
        :meth:`restores_fit`). A state group's table gets the checkpoint at ``hit``: its
        first entry (``align``), or entry ``hit / block_size - 1`` after null ones (``all``).

        Returns:
            Block ids brought back from the host tier.
        """
        ref, lru, registered = self.ref, self.lru, record.registered
        assert registered is not None, "a cached request's record counts what it registered"
        missing: list[tuple[int, Hashable, list[int], int]] = []  # (group, key, table, entry)
        for index in self.token_groups:
            live = self.groups[index].spec.live_pages(hit, hit)
            cache, table, per_page = self.cache[index], record.tables[index], self.paged[index]
            table.extend(repeat(NULL_PAGE, live.start))
            for k in live:
                key = block_key(record, content, per_page, k)
                block = cache.get(key)
                if block is None:  # in the host tier: an id is found below
                    missing.append((index, key, table, len(table)))
                    table.append(NULL_PAGE)
                    continue
                if not ref[block]:
                    del lru[block]
                ref[block] += 1
                table.append(block)
            record.released[index] = live.start
            registered[index] = live.stop
        for index, unit, mode in self.checkpoints:
            k = hit // unit - 1
            key = block_key(record, content, unit, k)
            table = record.tables[index]
            if mode == "all":  # the states before the hit stay null: no later token reads them
                table.extend(repeat(NULL_PAGE, k))
                record.released[index] = k
            page = self.cache[index].get(key)
            if page is None:  # in the host tier: a whole page (an aligned run) is found below
                missing.append((index, key, table, len(table)))
                page = NULL_PAGE
            else:
                self._hold(index, page)
            table.append(page)
            registered[index] = k + 1
        if missing:
            self._bring_back(missing)
        return len(missing)

    def _hold(self, index: int, page: int) -> None:
        """One more request holds cached ``page`` of state group ``index`` (no longer evictable)."""
        span = self.spans[index]
        first = page * span
        if not self.ref[first]:
            if span == 1:
                del self.lru[first]
            else:
                del self.run_lru[first]
                self.run_ids -= span
        self.ref[first] += 1

    def _bring_back(self, missing: list[tuple[int, Hashable, list[int], int]]) -> None:
        """Give each host-held page of a hit a device page (a block id, or an aligned run for a
        checkpoint of several ids), cached under its key, held by the request (every device
        page the hit uses is held already, so none is evicted)."""
        host = self.host
        assert host is not None, "only a pool with a host tier finds blocks there"
        pages = [(index, key) for index, key, _, _ in missing]
        host.hold(pages)  # blocks the device evicts now must not push these out
        counts: dict[int, int] = {}
        for index, _, _, _ in missing:
            counts[index] = counts.get(index, 0) + 1
        taken = self.take(list(counts.items()))
        assert taken is not None, "restores_fit() checked the device has the ids"
        keys, spans = self.key, self.spans
        used = dict.fromkeys(taken, 0)
        for index, key, table, at in missing:
            page = taken[index][used[index]]
            used[index] += 1
            table[at] = page
            self.cache[index][key] = page
            keys[page * spans[index]] = key  # a page of an aligned run is keyed by its first id
        host.restore(pages)

    def register(
        self,
        record: RequestRecord,
        content: Sequence[int] | PrefixKey,
        computed: int,
        let_go: dict[int, list[int]] | None = None,
    ) -> float:
        """Cache the request's full blocks among its first ``computed`` tokens, and its state
        checkpoints (:meth:`_register_checkpoints`; the checkpoints an ``align`` table lets go
        of are added to ``let_go``, ``{group: pages}``).

        Returns:
            The computed tokens before which no further block of this pool fills.
        """
        registered, tables, keys = record.registered, record.tables, self.key
        assert registered is not None, "a cached request's record counts what it registered"
        for index in self.token_groups:
            start = registered[index]
            per_page = self.paged[index]
            end = cacheable_blocks(content, per_page, computed)
            if end <= start:
                continue
            cache, table = self.cache[index], tables[index]
            for k in range(start, min(end, len(table))):
                block = table[k]
                if block == NULL_PAGE or keys[block] is not None:
                    continue
                key = block_key(record, content, per_page, k)
                if key not in cache:  # else another request cached the same tokens first
                    cache[key] = block
                    keys[block] = key
            registered[index] = end
        due = math.inf
        fixed = isinstance(content, PrefixKey)  # knows no more tokens later
        for index in self.token_groups:
            per_page = self.paged[index]
            if not fixed or registered[index] < cacheable_blocks(content, per_page, MAX_TOKENS):
                due = min(due, (registered[index] + 1) * per_page)
        if self.checkpoints:
            due = min(due, self._register_checkpoints(record, content, computed, fixed, let_go))
        return due

    def _register_checkpoints(
        self,
        record: RequestRecord,
        content: Sequence[int] | PrefixKey,
        computed: int,
        fixed: bool,
        let_go: dict[int, list[int]] | None = None,
    ) -> float:
        """Cache the state checkpoints ``computed`` tokens complete: in ``all``, table entry
        ``k`` is the state after ``(k+1) * block_size`` tokens, cached once they are computed;
        in ``align``, a request reaching a block boundary at the end of a step (``computed`` a
        multiple of the block size) makes its running state (entry 1) the checkpoint (entry 0),
        lets go of the checkpoint before (cached, it stays evictable) and takes a new page for
        the running state at its next ``reserve`` (vLLM's ``mamba_cache_mode='align'``:
        ``MambaManager`` keeps the state of the last block boundary reached and frees the one
        before; vllm/v1/core/single_type_kv_cache_manager.py).

        Returns:
            The computed tokens before which no further checkpoint of this pool is due.
        """
        registered, tables, keys = record.registered, record.tables, self.key
        assert registered is not None, "a cached request's record counts what it registered"
        due = math.inf
        for index, unit, mode in self.checkpoints:
            cache, table, span = self.cache[index], tables[index], self.spans[index]
            end = cacheable_blocks(content, unit, computed)
            if mode == "all":
                for k in range(registered[index], min(end, len(table))):
                    page = table[k]
                    key = block_key(record, content, unit, k)
                    if page != NULL_PAGE and keys[page * span] is None and key not in cache:
                        cache[key] = page
                        keys[page * span] = key
                registered[index] = max(registered[index], end)
                upcoming = registered[index]
            else:
                boundary = computed // unit
                if computed % unit == 0 and registered[index] < boundary <= end and len(table) >= 2:
                    registered[index] = boundary
                    key = block_key(record, content, unit, boundary - 1)
                    running = table[1]
                    if running != NULL_PAGE and key not in cache:  # else cached first by another request
                        cache[key] = running
                        keys[running * span] = key
                        before = table[0]
                        table[0] = running
                        del table[1]  # the next reserve takes the new running state's page
                        if before != NULL_PAGE:
                            self.drop({index: [before]})
                        if let_go is not None:  # the table changed: its caller re-reads it
                            let_go.setdefault(index, []).extend([before] if before != NULL_PAGE else [])
                upcoming = computed // unit
            if not fixed or upcoming < cacheable_blocks(content, unit, MAX_TOKENS):
                due = min(due, (upcoming + 1) * unit)
        return due

    def shared_rewrite(self, block: int) -> int:
        """Other requests holding ``block`` if it is cached (a request writing into it would
        overwrite their tokens), else -1 when it is not cached."""
        return -1 if self.key[block] is None else self.ref[block] - 1

    def uncache(self, block: int) -> None:
        """Take a held block out of the cache (it will be written again)."""
        key = self.key[block]
        if key is not None:
            del self.cache[self.free.owner[block]][key]
            self.key[block] = None

    def take(self, grows: list[tuple[int, int]]) -> dict[int, list[int]] | None:
        """Take ``count`` pages for each ``(group, count)``: free ids first, then evicted cached
        blocks, all or none (``None``: too few)."""
        free = self.free
        if free.runs:
            return self._take_pages(grows)
        total = sum(count for _, count in grows)
        if total > free.num_free + len(self.lru):
            return None
        fresh = min(total, free.num_free)
        ids = free.take_ids(fresh)
        if total > fresh:
            ids.extend(self.evict(total - fresh))
        taken: dict[int, list[int]] = {}
        owner, ref, at = free.owner, self.ref, 0
        for index, count in grows:
            pages = taken[index] = ids[at : at + count]
            for block in pages:
                owner[block] = index
                ref[block] = 1
            at += count
        return taken

    def _take_pages(self, grows: list[tuple[int, int]]) -> dict[int, list[int]] | None:
        """:meth:`take` in a pool with aligned runs: evict least recently used pages (those of
        several ids first while an aligned run is short) until every page fits, then take them
        from the free ids. ``None`` when even evicting every evictable page leaves too few
        (the pages evicted stay evicted; nothing is taken)."""
        free, spans = self.free, self.spans
        singles = sum(count for index, count in grows if spans[index] == 1)
        runs: dict[int, int] = {}
        for index, count in grows:
            if spans[index] > 1:
                runs[spans[index]] = runs.get(spans[index], 0) + count
        while True:
            short = [span for span, count in runs.items() if free.runs[span].full < count]
            if not short and free.num_free - sum(s * c for s, c in runs.items()) >= singles:
                break
            if short and self.run_lru:  # a cached run frees a whole aligned run
                self._evict_run()
            elif self.lru:
                self.free.give_back(self.evict(1))
            elif self.run_lru:
                self._evict_run()
            else:
                return None
        taken: dict[int, list[int]] = {}
        ref = self.ref
        for index, count in sorted(grows, key=lambda grow: -spans[grow[0]]):  # runs before singles
            pages = taken[index] = free.take_pages(index, count)
            span = spans[index]
            for page in pages:
                ref[page * span] = 1
        return {index: taken[index] for index, _ in grows}

    def _evict_run(self) -> None:
        """Evict the least recently used evictable page of several ids (a state checkpoint),
        its run freed: out of the cache, into the host tier whole (an offloadable group's),
        through ``on_evict`` (its first id)."""
        first, _ = self.run_lru.popitem(last=False)
        index = self.free.owner[first]
        span = self.spans[index]
        self.run_ids -= span
        key = self.key[first]
        del self.cache[index][key]
        self.key[first] = None
        if self.host is not None:  # a checkpoint's whole run goes to the host, if its kind moves
            self.host.put(index, key)
        if self.on_evict is not None:
            self.on_evict(self.pool, first, key)
        self.free.give_back_pages({index: [first // span]})
        self.evictions += 1

    def evict(self, count: int) -> list[int]:
        """Evict the ``count`` least recently used evictable blocks (the caller checked they
        exist): out of the cache, into the host tier (an offloadable group's), through
        ``on_evict``; their ids are the caller's."""
        lru, keys, owner, on_evict, host = self.lru, self.key, self.free.owner, self.on_evict, self.host
        blocks: list[int] = []
        for _ in range(count):
            block, _ = lru.popitem(last=False)
            key = keys[block]
            del self.cache[owner[block]][key]
            keys[block] = None
            if host is not None:
                host.put(owner[block], key)
            if on_evict is not None:
                on_evict(self.pool, block, key)
            blocks.append(block)
        self.evictions += count
        return blocks

    def drop(self, pages: dict[int, list[int]]) -> None:
        """Drop one reference to each page: a page no request holds becomes evictable if it is
        cached (a request's last blocks first, so they are evicted first), else free."""
        ref, keys, lru = self.ref, self.key, self.lru
        freed: dict[int, list[int]] = {}  # pages per group, each aligned run freed whole
        spans = self.spans
        for index, held in pages.items():
            span = spans[index]
            out: list[int] = []
            if span > 1:  # pages of aligned runs, counted by their first id
                for page in reversed(held):
                    first = page * span
                    ref[first] -= 1
                    if ref[first]:
                        continue
                    if keys[first] is not None:
                        self.run_lru[first] = None
                        self.run_ids += span
                    else:
                        out.append(page)
            else:
                for block in reversed(held):
                    ref[block] -= 1
                    if ref[block]:
                        continue
                    if keys[block] is not None:
                        lru[block] = None
                    else:
                        out.append(block)
            if out:
                freed[index] = out
        if freed:
            self.free.give_back_pages(freed)
