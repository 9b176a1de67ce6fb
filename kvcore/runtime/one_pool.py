"""One of a plan's pools at run time: its groups' share of each request's tables.

:class:`~kvcore.runtime.block_pool.BlockPool` keeps one :class:`OnePool` per pool of the plan
(a one-pool plan: a tuple of one) and one :class:`~kvcore.runtime.request_tables.RequestRecord`
per request. An ``OnePool`` grows, releases, truncates and frees the tables of the groups that
draw from its pool, with its free ids (:mod:`kvcore.runtime.free_blocks`) and, with prefix
caching, its cache (:class:`~kvcore.runtime.prefix_cache.PrefixCache`). Group indices are the
plan's; block ids are the pool's own.

What a request holds comes from its group's spec, :meth:`~kvcore.KVCacheSpec.live_pages`, the
method the planner's worst case (:meth:`~kvcore.KVCacheSpec.max_num_blocks`) reads. A kind that
keeps the default rule pages by ``tokens_per_page``, so a table's length is inline arithmetic;
groups of equal specs grow and free alike, which a stacked pool uses to serve them together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import chain, repeat

from kvcore.errors import BlockPoolExhaustedError, InvalidInputError
from kvcore.plan import KVCachePlan
from kvcore.runtime.free_blocks import FreeBlocks
from kvcore.runtime.host_cache import HostCache
from kvcore.runtime.prefix_cache import EvictionHook, PrefixCache, checkpoint_mode
from kvcore.runtime.request_tables import NULL_PAGE, RequestRecord
from kvcore.spec import KVCacheSpec, SizingContext

_NOT_NULL = NULL_PAGE.__ne__

#: The :attr:`~kvcore.spec.KVCacheSpec.offload_unit` values whose cached pages a prefix cache
#: moves to its host tier and back: ``block`` (a token block, alone) and ``checkpoint`` (a
#: state after a block boundary, the whole page, an aligned run of its ids). ``request`` pages
#: are a request's own and never cached; ``none`` stays on the device.
TIERED_UNITS = ("block", "checkpoint")


def default_paging(spec: KVCacheSpec) -> int:
    """Tokens per page when ``spec`` keeps the default :meth:`~kvcore.KVCacheSpec.live_pages`
    (entries ``first_retained_token(computed) // T`` to ``ceil(tokens / T)``), else 0."""
    per_page = spec.tokens_per_page
    return per_page if per_page and type(spec).live_pages is KVCacheSpec.live_pages else 0


def page_cap(spec: KVCacheSpec, context: SizingContext) -> int | None:
    """The most entries a table of ``spec`` holds when the kind caps its pages through
    :meth:`~kvcore.KVCacheSpec.max_num_blocks` only; ``None`` for every other kind.

    A kind that keeps the default :meth:`~kvcore.KVCacheSpec.live_pages` and frees nothing
    (default :meth:`~kvcore.KVCacheSpec.first_retained_token`), but whose ``max_num_blocks`` is
    below the pages its tokens fill (a fixed-size cross-attention kind of a third party: its
    encoder output's pages, whatever the decoder's length) is planned at that cap; a block pool
    holds it to the cap too, or a long decoder would take pages the plan never counted.
    """
    kind = type(spec)
    per_page = spec.tokens_per_page
    if (
        not per_page
        or kind.max_num_blocks is KVCacheSpec.max_num_blocks
        or kind.live_pages is not KVCacheSpec.live_pages
        or kind.first_retained_token is not KVCacheSpec.first_retained_token
    ):
        return None
    cap = spec.max_num_blocks(context)
    return cap if cap < -(-context.max_model_len // per_page) else None


def hit_unit(spec: KVCacheSpec) -> int:
    """Tokens a prefix hit of a group of ``spec`` comes in multiples of: its tokens per page
    (default paging), its block size (a state keeping checkpoints,
    :func:`~kvcore.runtime.prefix_cache.checkpoint_mode`), else 0 (it cannot cache)."""
    per_page = default_paging(spec)
    if per_page:
        return per_page
    return spec.block_size if checkpoint_mode(spec) != "none" else 0


def hit_step_of(plan: KVCachePlan) -> int:
    """Tokens every prefix hit on ``plan`` is a multiple of: the least common multiple of each
    group's :func:`hit_unit` (a hit must end on a page boundary of every group, and on a
    state group's checkpoint); 0 when some group cannot cache (:func:`uncacheable`)."""
    units = [hit_unit(group.spec) for group in plan.groups]
    return 0 if not units or not all(units) else math.lcm(*units)


def uncacheable(plan: KVCachePlan, pool: int, label: str) -> str:
    """Why pool ``pool``'s groups cannot cache prefixes (a group keeps a per-request state
    without checkpoints, or pages of its own rule), or ``""`` when they can."""
    for index in plan.groups_in(pool):
        group = plan.groups[index]
        spec = group.spec
        cap = page_cap(spec, plan.context)
        if cap is not None:
            return (
                f"{label}group {index} ({spec.kind}) holds at most {cap} pages (its max_num_blocks) "
                "whatever the request's length, so its pages do not hold a prefix's tokens, which is "
                "not cached, so no token can hit in every group"
            )
        # unified_pool spreads a page over a run of ids; the cache keeps pages of one block id
        if default_paging(spec) and group.blocks_per_page > 1:
            return (
                f"{label}group {index} ({spec.kind}) spreads a page over a run of {group.blocks_per_page} "
                "block ids, which is not cached (the prefix cache keeps pages of one block id), so no token "
                "can hit in every group"
            )
        if hit_unit(spec):
            continue
        if spec.tokens_per_page is None:
            mode = getattr(spec, "cache_mode", None)
            keeps = f" (cache_mode {mode!r})" if mode is not None else ""
            return (
                f"{label}group {index} ({spec.kind}) keeps a per-request state without checkpoints{keeps}, "
                "which is not cached, so no token can hit in every group: plan with state_cache_mode "
                "'align' or 'all' to cache states at block boundaries"
            )
        return (
            f"{label}group {index} ({spec.kind}) keeps pages of its own rule, which is not cached, so no "
            "token can hit in every group"
        )
    return ""


def host_cache_for(plan: KVCachePlan, pool: int) -> HostCache | None:
    """Pool ``pool``'s host tier for its prefix cache: the plan's host rows of the pool, for the
    groups whose kind says its cached pages may go (:data:`TIERED_UNITS`); ``None`` when the
    plan gives the pool no rows or no group may go."""
    rows = plan.host_blocks_in(pool)
    spans = {
        index: plan.groups[index].blocks_per_page
        for index in plan.groups_in(pool)
        if plan.groups[index].spec.offload_unit in TIERED_UNITS
    }
    if not rows or not spans:
        return None
    return HostCache(rows, spans, plan.pools[pool].bytes_per_block)


class OnePool:
    """The groups of pool ``pool`` of ``plan`` and the pool's block ids.

    Args:
        plan: the whole plan.
        pool: the pool's index.
        free: the pool's free ids (their ``spans`` are the pool's groups').
        prefix_caching: cache full blocks (every group of the plan can: :func:`uncacheable`).
        on_evict: where an evicted cached block goes (see :class:`PrefixCache`).
        host_tier: with prefix caching, keep evicted blocks in the plan's host tier
            (:func:`host_cache_for`) when it gives this pool rows.
        label: ``"pool p: "`` before this pool's messages in a plan of several pools, else ``""``.

    Attributes:
        members: the plan's indices of the groups drawing from this pool.
        num_blocks: the pool's ids.
        num_usable_blocks: ids its groups may hold (all but the null block).
        cache: the pool's prefix cache, or ``None``.
        grow: ``grow(record, num_tokens)`` grows the request's tables of this pool's groups to
            cover ``num_tokens`` tokens, all or none: ``{group: pages taken}``, or ``None`` when
            too few ids are free (nothing changed).
        release: ``release(record)`` frees the entries before ``live_pages(tokens,
            computed).start`` of each table: ``{group: pages freed}`` for the groups that shrank.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        pool: int,
        free: FreeBlocks,
        *,
        prefix_caching: bool,
        on_evict: EvictionHook | None,
        label: str,
        host_tier: bool = False,
    ) -> None:
        groups = plan.groups
        self.index = pool
        self.label = label
        self.groups = groups
        self.members = plan.groups_in(pool)
        self.num_blocks = plan.pools[pool].num_blocks
        self.free = free
        self.spans = [g.blocks_per_page for g in groups]
        #: per group, the cap of a kind that caps its pages through max_num_blocks only
        #: (:func:`page_cap`); ``None`` for the others
        self.caps = [page_cap(g.spec, plan.context) for g in groups]
        # per group: tokens per page when the spec keeps the default live_pages rule (uncapped),
        # else 0: a capped group's tables grow through live(), which holds them to the cap
        self.paged = [
            default_paging(g.spec) if cap is None else 0 for g, cap in zip(groups, self.caps, strict=True)
        ]
        keeps_all = [
            bool(self.paged[i])
            and type(groups[i].spec).first_retained_token is KVCacheSpec.first_retained_token
            for i in range(len(groups))
        ]
        classes: dict[tuple[KVCacheSpec, int], list[int]] = {}  # groups of equal specs free alike
        for index in self.members:
            classes.setdefault((groups[index].spec, groups[index].blocks_per_page), []).append(index)
        #: (tokens per page, the first group, all groups) of each spec
        self.classes = [(self.paged[m[0]], m[0], tuple(m)) for m in classes.values()]
        #: the same and the spec's first_retained_token, of each spec that frees pages
        self.freeing = [
            (self.paged[m[0]], m[0], tuple(m), groups[m[0]].spec.first_retained_token)
            for m in classes.values()
            if not keeps_all[m[0]]
        ]
        lead = {index: m[0] for m in classes.values() for index in m}
        #: groups that may free pages, in order: (group, tokens per page, its class's first group)
        self.releasing = [(i, self.paged[i], lead[i]) for i in self.members if not keeps_all[i]]
        self.num_usable_blocks = self.num_blocks
        if plan.null_block is not None and self.num_blocks:
            free.hold_null(plan.null_block)
            self.num_usable_blocks -= 1
        self.loose: dict[int, set[int]] = {index: set() for index in self.members}  # allocate()'s pages
        host = host_cache_for(plan, pool) if prefix_caching and host_tier else None
        self.cache = (
            PrefixCache(pool, groups, self.members, self.paged, free, on_evict, host)
            if prefix_caching
            else None
        )
        # a stack of default-rule kinds serves a request's groups of one spec together
        self.by_class = free.any_order and self.cache is None and all(self.paged[i] for i in self.members)
        # bound once: the simulator calls them millions of times
        self.grow: Callable[[RequestRecord, int], dict[int, list[int]] | None] = (
            self._grow_by_class if self.by_class else self._grow_each
        )
        self.release: Callable[[RequestRecord], dict[int, list[int]]] = (
            self._release_by_class if self.by_class else self._release_each
        )

    # -- figures -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Ids a request could take now: free ones and evictable cached ones."""
        return self.free.num_free + (self.cache.num_evictable if self.cache is not None else 0)

    def live(self, group: int, num_tokens: int, computed: int) -> range:
        """``live_pages`` of ``group``'s spec (computed tokens capped at ``num_tokens``), held to
        the group's :func:`page_cap` where it has one."""
        live = self.groups[group].spec.live_pages(num_tokens, min(computed, num_tokens))
        cap = self.caps[group]
        return live if cap is None or live.stop <= cap else range(min(live.start, cap), cap)

    def new_blocks_needed(self, record: RequestRecord | None, num_tokens: int) -> int:
        """Block ids growing the request's tables to ``num_tokens`` tokens would take."""
        computed = record.computed if record is not None else 0
        total = 0
        for index in self.members:
            start = max(len(record.tables[index]), record.released[index]) if record is not None else 0
            want = self.live(index, num_tokens, computed).stop
            total += max(0, want - start) * self.spans[index]
        return total

    def covers(self, record: RequestRecord, num_tokens: int) -> bool:
        """Whether the request's tables hold every page ``num_tokens`` tokens need."""
        tables = record.tables
        if self.by_class:  # one group of each spec says for all
            return all(-(-num_tokens // per_page) <= len(tables[lead]) for per_page, lead, _ in self.classes)
        paged, computed = self.paged, record.computed
        for index in self.members:
            per_page = paged[index]
            stop = -(-num_tokens // per_page) if per_page else self.live(index, num_tokens, computed).stop
            if stop > len(tables[index]):
                return False
        return True

    # -- a request's tables --------------------------------------------------------------------

    def _grow_each(self, record: RequestRecord, num_tokens: int) -> dict[int, list[int]] | None:
        """:attr:`grow` group by group."""
        tables, released = record.tables, record.released
        computed = min(record.computed, num_tokens)
        grows: list[tuple[int, int]] = []
        padding: list[tuple[int, int]] = []
        paged = self.paged
        for index in self.members:
            per_page = paged[index]
            want = -(-num_tokens // per_page) if per_page else self.live(index, num_tokens, computed).stop
            length = len(tables[index])
            if want <= length:
                continue
            nulls = min(released[index], want) - length
            if nulls > 0:  # entries released before the table reached them stay NULL_PAGE
                padding.append((index, nulls))
                length += nulls
            if want > length:
                grows.append((index, want - length))
        taken: dict[int, list[int]] = {}
        if grows:
            got = self.free.take_for(grows) if self.cache is None else self.cache.take(grows)
            if got is None:
                return None
            taken = got
        for index, nulls in padding:
            tables[index].extend(repeat(NULL_PAGE, nulls))
        for index, pages in taken.items():
            tables[index].extend(pages)
        return taken

    def _grow_by_class(self, record: RequestRecord, num_tokens: int) -> dict[int, list[int]] | None:
        """:attr:`grow` of a stacked pool of default-rule kinds, one spec at a time."""
        tables, released = record.tables, record.released
        needs: list[tuple[tuple[int, ...], int, int]] = []
        total = 0
        for per_page, lead, members in self.classes:
            want = -(-num_tokens // per_page)
            length = len(tables[lead])
            if want <= length:
                continue
            nulls = released[lead]
            if nulls > want:
                nulls = want
            nulls -= length
            if nulls < 0:
                nulls = 0
            count = want - length - nulls
            needs.append((members, count, nulls))
            total += count * len(members)
        taken: dict[int, list[int]] = {}
        if not needs:
            return taken
        free = self.free
        if total > free.num_free:
            return None
        ids = free.take_ids(total)
        owner, at = free.owner, 0
        for members, count, nulls in needs:
            for index in members:
                table = tables[index]
                if nulls:
                    table.extend(repeat(NULL_PAGE, nulls))
                if count == 1:
                    block = ids[at]
                    owner[block] = index
                    table.append(block)
                    taken[index] = [block]
                elif count:
                    pages = taken[index] = ids[at : at + count]
                    list(map(owner.__setitem__, pages, repeat(index, count)))
                    table.extend(pages)
                at += count
        return taken

    def _release_by_class(self, record: RequestRecord) -> dict[int, list[int]]:
        """:attr:`release` of a stacked pool of default-rule kinds, one spec at a time."""
        tables, released, computed = record.tables, record.released, record.computed
        freed: dict[int, list[int]] = {}
        for per_page, lead, members, first_retained_token in self.freeing:
            first = first_retained_token(computed) // per_page
            done = released[lead]
            if first <= done:
                continue
            one = first == done + 1 and done < len(tables[lead])  # one page, the usual step
            for index in members:
                table = tables[index]
                released[index] = first
                if one:
                    page = table[done]
                    if page != NULL_PAGE:
                        table[done] = NULL_PAGE
                        freed[index] = [page]
                    continue
                end = min(first, len(table))
                pages = [page for page in table[done:end] if page != NULL_PAGE]
                table[done:end] = repeat(NULL_PAGE, max(0, end - done))
                if pages:
                    freed[index] = pages
        if freed:
            self.free_pages(freed)
        return freed

    def _release_each(self, record: RequestRecord) -> dict[int, list[int]]:
        """:attr:`release` group by group."""
        tables, released, computed = record.tables, record.released, record.computed
        freed: dict[int, list[int]] = {}
        firsts: dict[int, int] = {}  # per class of equal specs, which free alike
        for index, per_page, lead in self.releasing:
            if per_page:
                first = firsts.get(lead, -1)
                if first < 0:
                    first = firsts[lead] = self.groups[index].spec.first_retained_token(computed) // per_page
            else:
                first = self.live(index, record.tokens, computed).start
            done = released[index]
            if first <= done:
                continue
            table = tables[index]
            end = min(first, len(table))
            pages = [page for page in table[done:end] if page != NULL_PAGE]
            table[done:end] = repeat(NULL_PAGE, max(0, end - done))
            released[index] = first
            if pages:
                freed[index] = pages
        if freed:
            self.free_pages(freed)
        return freed

    def check_truncate(
        self, request_id: object, record: RequestRecord, num_tokens: int
    ) -> tuple[list[int], list[int]]:
        """What truncating to ``num_tokens`` tokens does here: ``(table stop per member,
        cached pages to uncache)``; raises, changing nothing, where it cannot.

        Raises:
            InvalidInputError: a page the shorter request reads was freed, or ``num_tokens``
                ends inside a cached block another request shares.
        """
        tables, released = record.tables, record.released
        computed = min(record.computed, num_tokens)
        stops: list[int] = []
        for index in self.members:
            live = self.live(index, num_tokens, computed)
            if released[index] > live.start:
                raise InvalidInputError(
                    f"{self.label}cannot truncate request {request_id!r} to {num_tokens} tokens: group "
                    f"{index} ({self.groups[index].spec.kind}) already freed its entries before "
                    f"{released[index]}, and {computed} computed tokens still read entry {live.start}; "
                    "truncate before release_stale() counts the rejected tokens"
                )
            stops.append(live.stop)
        rewritten: list[int] = []  # cached pages (first ids) this request alone holds and will write into
        if self.cache is not None:
            for index, stop in zip(self.members, stops, strict=True):
                per_page, entry, span = self.paged[index], stop - 1, self.spans[index]
                if not per_page:  # a state: in all, the entry of the block num_tokens ends in is rewritten
                    spec = self.groups[index].spec
                    if checkpoint_mode(spec) != "all":
                        continue
                    per_page = spec.block_size
                    entry = -(-num_tokens // per_page) - 1
                if num_tokens % per_page and 0 <= entry < len(tables[index]):
                    page = tables[index][entry]
                    others = -1 if page == NULL_PAGE else self.cache.shared_rewrite(page * span)
                    if others > 0:
                        raise InvalidInputError(
                            f"{self.label}cannot truncate request {request_id!r} to {num_tokens} tokens: "
                            f"that ends inside block {page} of group {index}, a cached block {others} "
                            f"other request(s) share; truncate to a multiple of {per_page} tokens or more"
                        )
                    if others == 0:
                        rewritten.append(page * span)
        return stops, rewritten

    def truncate(self, record: RequestRecord, stops: list[int], rewritten: list[int]) -> dict[int, list[int]]:
        """Cut the tables to ``stops`` (from :meth:`check_truncate`), freeing the pages past them."""
        tables, released = record.tables, record.released
        freed: dict[int, list[int]] = {}
        for index, stop in zip(self.members, stops, strict=True):
            table = tables[index]
            cut = [page for page in table[stop:] if page != NULL_PAGE]
            del table[stop:]
            if released[index] > stop:
                released[index] = stop
            if cut:
                freed[index] = cut
        if self.cache is not None:
            for page in rewritten:
                self.cache.uncache(page)
        if freed:
            self.free_pages(freed)
        return freed

    def free_tables(self, record: RequestRecord) -> None:
        """Free every page the request's tables of this pool's groups hold."""
        held: dict[int, list[int]] = {}
        tables = record.tables
        for index in self.members:
            pages = list(filter(_NOT_NULL, tables[index]))
            if pages:
                held[index] = pages
        if held:
            self.free_pages(held)

    def free_pages(self, pages: dict[int, list[int]]) -> None:
        """Free pages the request tables say each group holds (no checks needed)."""
        if self.cache is not None:
            self.cache.drop(pages)
            return
        free = self.free
        if free.runs:  # a page of an aligned run is several ids, freed whole
            free.give_back_pages(pages)
        else:
            free.give_back(list(chain.from_iterable(pages.values())))

    # -- pages taken outside requests ------------------------------------------------------------

    def allocate(self, group: int, num_pages: int) -> list[int]:
        """Take ``num_pages`` pages for ``group`` outside any request, all or none."""
        if num_pages > self.free.available(self.spans[group]):
            raise self.exhausted(group, num_pages)
        pages = self.free.take_pages(group, num_pages)
        self.loose[group].update(pages)
        return pages

    def exhausted(self, group: int, num_pages: int) -> BlockPoolExhaustedError:
        """The error of an :meth:`allocate` that found too few ids (or aligned runs)."""
        g = self.groups[group]
        span, num_free = g.blocks_per_page, self.free.num_free
        if span == 1:
            short = f"{num_free} of {self.num_blocks} block ids are free"
        else:
            short = (
                f"only {self.free.runs[span].full} such runs are free ({num_free} of {self.num_blocks} "
                "block ids, the rest scattered)"
            )
        need = f"{num_pages} page(s)" if span == 1 else f"{num_pages} aligned run(s) of {span} block ids"
        return BlockPoolExhaustedError(
            f"{self.label}group {group} ({g.spec.kind}) needs {need} but {short}: free or preempt a "
            "request, or plan more blocks",
            requested_blocks=num_pages * span,
            free_blocks=num_free,
        )
