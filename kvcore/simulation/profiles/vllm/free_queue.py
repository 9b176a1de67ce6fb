"""The entries of the ``vllm`` profile's block pools: a :class:`Pool`'s counts and free queue,
and a :class:`Run` of blocks that lie in the queue as one entry (lazy hashing)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Hashable

#: A block id as the key of a map. Tables hold ids as ``int`` objects; compiled (mypyc), code
#: that narrowed one to ``int`` would unbox it and box it afresh, an allocation and a slower
#: key comparison, for every lookup. Maps keyed by block id take this type, so that code which
#: reads an id from a table as an ``object`` passes it on as it is.
BlockKey = Any


class Pool:
    """One block pool as vLLM's ``BlockPool`` keeps it: uncached free blocks (interchangeable,
    counted) ahead of cached free blocks (least recently freed first), and the hash table."""

    def __init__(self, usable: int) -> None:
        self.usable = usable
        self.uncached = usable  # free block ids that hold no cached content
        # free cached page -> its span, oldest first (popping the oldest is O(1))
        self.cached_free: OrderedDict[BlockKey, int] = OrderedDict()
        self.cached_span = 0  # block ids in cached_free

    @property
    def free(self) -> int:
        return self.uncached + self.cached_span


class Run:
    """Blocks of one span that lie together in a pool's free queue as one entry (its key below 0).

    A run stands for blocks nothing can hit yet: a request's own blocks, unhashed (lazy hashing)
    and held by nobody. Evicting takes them from the front by count. A run ``owner`` (a live
    request's blocks freed before their window) keeps, in queue order, which blocks it holds,
    as ``[group, top position, count]`` segments (positions top, top - 1, ...): if the owner is
    preempted it may hit them when admitted again, so the run is then ``expanded`` into hashed
    blocks, its members: fresh ids ``first``, ``first + 1``, ... in the same order, each of
    the content at the same index of ``contents``. Eviction takes them from ``front`` on; a
    hit takes one from the middle (``taken``). A segment ``[groups, top, count]`` holds each
    group's positions in turn (vLLM frees group by group). A run ``deferred`` (speed path
    ``unread_runs``) is one a lookup of its owner answered from its segments instead of
    expanding it: it stands for hashed blocks, so no later run joins it.
    """

    __slots__ = (
        "consumed",
        "contents",
        "deferred",
        "first",
        "front",
        "left",
        "owner",
        "segments",
        "span",
        "taken",
    )

    def __init__(self, span: int, owner: int) -> None:
        self.span = span  # block ids of one block of the run
        self.owner = owner  # the request that may hash them (-1: none; they are never hit)
        self.segments: list[list[Any]] = []
        self.consumed = 0  # blocks evicted from the front
        self.deferred = False  # its owner's lookup read it unexpanded (unread_runs)
        # once expanded (first >= 0): member first + i holds contents[i]; why ids and a list
        # rather than a map of members: a member is made and evicted with no map of its own
        self.first = -1
        self.front = -1  # the next member eviction takes (those before it are evicted or taken)
        self.left = 0  # members neither evicted nor taken
        self.contents: list[Hashable] = []  # (each a (group, False, owner, position) tuple)
        self.taken: set[int] = set()  # members a hit took from the middle

    @property
    def expanded(self) -> bool:
        """Whether the run's blocks are hashed, as members."""
        return self.first >= 0
