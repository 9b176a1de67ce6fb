"""SGLang's radix cache, over the token identities a simulated workload has (the ``sglang``
scheduler profile's prefix cache; :mod:`kvcore.simulation.profiles.sglang`).

SGLang 0.5.23 (``python/sglang/srt/mem_cache/radix_cache.py``; facts, not code) keeps every
cached token sequence in a radix tree whose nodes are runs of tokens, page-granular:

- ``match_prefix``: walk from the root while a child starts with the next page; a match that
  ends inside a node splits it there (``_split_node``); every node walked has its access time
  refreshed to the walk's start (``_match_prefix_helper``), and a node made by the walk has the
  later time it was made at (``TreeNode.__init__``), which decides LRU ties.
- ``insert``: the same walk; what is left becomes a new leaf, counted as evictable
  (``_insert_helper``); the length already in the tree is returned, so that the caller frees
  its duplicate copy of it.
- ``inc_lock_ref`` / ``dec_lock_ref``: a request holding a node holds every node up to the
  root; a node nobody holds is evictable.
- ``evict``: the evictable leaves, least recently used first (``LRUStrategy``, the default
  ``--radix-eviction-policy``), whole nodes, a parent joining the heap once it is a free leaf,
  until the tokens asked for are freed.

Tokens stand for themselves as in the other profiles: token ``i`` of request ``r`` is its
``prefix_id``'s ``i``-th while ``i`` lies inside the prefix's whole pages, else ``r``'s own. A
node stores a run ``[start, end)`` of one request's tokens (its ``origin``), so a run of a
thousand tokens is one node, as in SGLang.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable


class Node:
    """One run of cached tokens: ``[start, end)`` of request ``origin``'s sequence."""

    __slots__ = ("children", "end", "lock_ref", "origin", "parent", "start", "used")

    def __init__(self, parent: Node | None, origin: int, start: int, end: int, used: int) -> None:
        self.parent = parent
        self.origin = origin
        self.start = start
        self.end = end
        self.children: dict[Hashable, Node] = {}
        self.lock_ref = 0
        self.used = used  # last access: a counter standing for SGLang's time.monotonic()

    @property
    def size(self) -> int:
        return self.end - self.start


class RadixTree:
    """SGLang's ``RadixCache`` over request token identities (see the module docstring).

    Args:
        identity: ``identity(r, i)``, what token ``i`` of request ``r`` is (a node's key in its
            parent is the identity of its first token).
        common: ``common(a, b)``, how many leading tokens requests ``a`` and ``b`` (``a != b``)
            have in common, a whole number of pages.
        free_tokens: called with the tokens an eviction frees (the pool takes them back).
    """

    def __init__(
        self,
        identity: Callable[[int, int], Hashable],
        common: Callable[[int, int], int],
        free_tokens: Callable[[int], None],
    ) -> None:
        self.root = Node(None, -1, 0, 0, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self._identity = identity
        self._common = common
        self._free_tokens = free_tokens
        self._clock = 0
        #: tokens in nodes nobody holds (SGLang's ``evictable_size_``)
        self.evictable = 0
        #: tokens in the tree
        self.size = 0
        self._nodes: set[Node] = set()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _match_len(self, node: Node, r: int, limit: int) -> int:
        """How many of ``node``'s tokens request ``r`` has at the same positions (up to
        ``limit``)."""
        end = min(node.end, limit)
        if node.origin != r:
            end = min(end, self._common(node.origin, r))
        return max(0, end - node.start)

    def _split(self, node: Node, at: int) -> Node:
        """``_split_node``: ``node`` becomes ``[at, end)`` under a new node ``[start, at)``."""
        parent = node.parent
        assert parent is not None
        upper = Node(parent, node.origin, node.start, at, self._tick())  # a new node: its creation time
        upper.lock_ref = node.lock_ref
        parent.children[self._identity(node.origin, node.start)] = upper
        node.start = at
        node.parent = upper
        upper.children[self._identity(node.origin, at)] = node
        self._nodes.add(upper)
        return upper

    def _walk(self, r: int, limit: int) -> tuple[int, Node]:
        """The longest cached run of ``r``'s first ``limit`` tokens, splitting where it ends
        inside a node, with the access time of every node on it refreshed."""
        now = self._tick()
        node = self.root
        node.used = now
        pos = 0
        while pos < limit:
            child = node.children.get(self._identity(r, pos))
            if child is None:
                break
            child.used = now
            matched = self._match_len(child, r, limit)
            if matched < child.size:
                if matched > 0:
                    node = self._split(child, child.start + matched)
                    pos += matched
                break
            node = child
            pos = child.end
        return pos, node

    def match(self, r: int, limit: int) -> tuple[int, Node]:
        """``match_prefix``: the cached length of ``r``'s first ``limit`` tokens and its node."""
        return self._walk(r, limit)

    def insert(self, r: int, length: int) -> int:
        """``insert``: cache ``r``'s first ``length`` tokens; returns the length that was
        already cached (the caller's copy of it is a duplicate)."""
        found, node = self._walk(r, length)
        if found < length:
            leaf = Node(node, r, found, length, self._tick())  # created after the walk's access time
            node.children[self._identity(r, found)] = leaf
            self._nodes.add(leaf)
            self.evictable += length - found
            self.size += length - found
        return found

    def lock(self, node: Node) -> None:
        """``inc_lock_ref``: hold ``node`` and its ancestors."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable -= node.size
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: Node) -> None:
        """``dec_lock_ref``."""
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable += node.size
            assert node.parent is not None
            node = node.parent

    def evict(self, tokens: int) -> int:
        """``evict``: free whole free leaves, least recently used first, until ``tokens`` are
        freed or none is left; returns the tokens freed."""
        if tokens <= 0:
            return 0
        heap = [(n.used, id(n), n) for n in self._nodes if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[self._identity(node.origin, node.start)]
            self._nodes.discard(node)
            freed += node.size
            self.evictable -= node.size
            self.size -= node.size
            self._free_tokens(node.size)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.used, id(parent), parent))
        return freed
