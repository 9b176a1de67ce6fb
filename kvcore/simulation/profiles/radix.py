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

    __slots__ = ("backed", "children", "end", "evicted", "lock_ref", "origin", "parent", "start", "used")

    def __init__(self, parent: Node | None, origin: int, start: int, end: int, used: int) -> None:
        self.parent = parent
        self.origin = origin
        self.start = start
        self.end = end
        self.children: dict[Hashable, Node] = {}
        self.lock_ref = 0
        self.used = used  # last access: a counter standing for SGLang's time.monotonic()
        self.evicted = False  # HiCache: off the device, its tokens on the host only
        self.backed = False  # HiCache: a copy on the host (``host_value``)

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
        upper.evicted, upper.backed = node.evicted, node.backed  # both halves keep where they are
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


#: ``HiRadixCache.load_back_threshold``: a host hit shorter than this is computed again.
LOAD_BACK_THRESHOLD = 10


class HiRadixTree(RadixTree):
    """SGLang's ``HiRadixCache`` (HiCache's host tier, ``mem_cache/hiradix_cache.py``; facts,
    not code), with the default ``--hicache-write-policy write_through``:

    - **Write-through**: a node is copied to host memory when it enters the tree, or when an
      insert walks it and it has no copy yet (``inc_hit_count`` with ``write_through_threshold``
      1, ``write_backup``), only under a parent that has one (or the root); when the host is
      full, ``evict_host`` makes room first, and a node that still finds none stays on the device
      only.
    - **Device eviction** (``evict``): the unheld nodes with no child on the device, least
      recently used first; a node with a host copy leaves the device and stays in the tree,
      evicted (``_evict_backuped``), one without is dropped (``_evict_regular``).
    - **Host eviction** (``evict_host``): evicted leaves, least recently used first, dropped
      with their host copy.
    - **Matching**: ``match_prefix`` walks evicted nodes too; the hit on the device ends at the
      last node still there, the rest is the host hit (``host_hit_length``), which the caller
      loads back (:meth:`load_back`, ``init_load_back``) when it is at least
      :data:`LOAD_BACK_THRESHOLD` tokens.
    - **Insertion over an evicted node** (a prefix computed again) puts the request's copy back
      in the node (``_insert_helper``): it is not a duplicate to free.

    Copies finish at once here (SGLang writes and loads asynchronously, holding the node meanwhile).

    Args:
        identity, common, free_tokens: as :class:`RadixTree`.
        host_tokens: tokens the host pool holds (``--hicache-size``, or ``--hicache-ratio`` x
            the device pool).
        page: tokens per page (a node's size is whole pages).
    """

    def __init__(
        self,
        identity: Callable[[int, int], Hashable],
        common: Callable[[int, int], int],
        free_tokens: Callable[[int], None],
        *,
        host_tokens: int,
        page: int,
    ) -> None:
        super().__init__(identity, common, free_tokens)
        self.root.backed = True  # the root's children may be written
        self.host_tokens = host_tokens
        #: tokens with a host copy
        self.host_used = 0
        #: tokens written to the host, and loaded back, and host copies dropped
        self.written = 0
        self.loaded = 0
        self.host_evictions = 0
        self._page = page

    def match_host(self, r: int, limit: int) -> tuple[int, Node, int]:
        """``match_prefix``: the device hit of ``r``'s first ``limit`` tokens, the last node on
        the device, and the host hit beyond it."""
        pos, node = self._walk(r, limit)
        host = 0
        while node.evicted:
            host += node.size
            assert node.parent is not None
            node = node.parent
        return pos - host, node, host

    def match(self, r: int, limit: int) -> tuple[int, Node]:
        """The device hit alone (see :meth:`match_host`)."""
        hit, node, _ = self.match_host(r, limit)
        return hit, node

    def load_back(self, r: int, limit: int, device: Node, free_pages: Callable[[], int]) -> tuple[int, Node]:
        """``init_load_back`` / ``load_back``: bring the evicted nodes of ``r``'s hit below
        ``device`` (held by the caller) back to the device, evicting the device for room
        (``free_pages`` says what the pool has free); returns the tokens loaded and the last
        node, or ``(0, device)`` when the host hit is under :data:`LOAD_BACK_THRESHOLD` or the
        device cannot make room."""
        chain: list[Node] = []
        _, node = self._walk(r, limit)
        while node.evicted:
            chain.append(node)
            assert node.parent is not None
            node = node.parent
        tokens = sum(n.size for n in chain)
        if node is not device or tokens < LOAD_BACK_THRESHOLD:
            return 0, device
        need = tokens // self._page
        if need > free_pages():
            self.evict((need - free_pages()) * self._page)
        if need > free_pages():
            return 0, device
        for n in reversed(chain):
            n.evicted = False
            self.size += n.size
            self.evictable += n.size  # nobody holds it yet
        self.loaded += tokens
        return tokens, chain[0]

    def insert(self, r: int, length: int) -> int:
        """``insert``: as :meth:`RadixTree.insert`, writing new and walked nodes through to the
        host, and giving an evicted node on the way the request's copy (not counted as found)."""
        now = self._tick()
        node = self.root
        pos = 0
        found = 0
        while pos < length:
            child = node.children.get(self._identity(r, pos))
            if child is None:
                break
            child.used = now
            matched = self._match_len(child, r, length)
            if matched <= 0:
                break
            partial = matched < child.size
            if partial:
                child = self._split(child, child.start + matched)
            if child.evicted:  # computed again: the request's copy goes back into the node
                child.evicted = False
                self.size += child.size
                self.evictable += child.size
            else:
                found = child.end
                self._backup(child)
            node = child
            pos = child.end
            if partial:
                break
        if pos < length:
            leaf = Node(node, r, pos, length, self._tick())
            node.children[self._identity(r, pos)] = leaf
            self._nodes.add(leaf)
            self.evictable += length - pos
            self.size += length - pos
            self._backup(leaf)
        return found

    def _backup(self, node: Node) -> None:
        """``write_backup``: a host copy of ``node`` under a parent that has one, room made by
        :meth:`evict_host` if need be."""
        parent = node.parent
        if node.backed or parent is None or not parent.backed:
            return
        if self.host_used + node.size > self.host_tokens:
            self.evict_host(self.host_used + node.size - self.host_tokens)
        if self.host_used + node.size > self.host_tokens:
            return
        node.backed = True
        self.host_used += node.size
        self.written += node.size

    def evict(self, tokens: int) -> int:
        """``evict``: device leaves (no child on the device), least recently used first; a
        backed one becomes evicted, the others are dropped; returns the device tokens freed."""
        if tokens <= 0:
            return 0
        heap = [(n.used, id(n), n) for n in self._nodes if self._device_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < tokens and heap:
            _, _, node = heapq.heappop(heap)
            if not self._device_leaf(node):  # pushed twice
                continue
            parent = node.parent
            assert parent is not None
            if node.backed:
                node.evicted = True
            else:
                del parent.children[self._identity(node.origin, node.start)]
                self._nodes.discard(node)
                self._drop_subtree(node)
            freed += node.size
            self.evictable -= node.size
            self.size -= node.size
            self._free_tokens(node.size)
            if parent is not self.root and self._device_leaf(parent):
                heapq.heappush(heap, (parent.used, id(parent), parent))
        return freed

    def _drop_subtree(self, node: Node) -> None:
        """A dropped device node's evicted descendants go with it (their host copies too)."""
        stack = list(node.children.values())
        while stack:
            child = stack.pop()
            stack.extend(child.children.values())
            self._nodes.discard(child)
            if child.backed:
                self.host_used -= child.size
                self.host_evictions += 1
        node.children.clear()
        if node.backed:
            self.host_used -= node.size

    def _device_leaf(self, node: Node) -> bool:
        return (
            not node.evicted and node.lock_ref == 0 and all(child.evicted for child in node.children.values())
        )

    def evict_host(self, tokens: int) -> int:
        """``evict_host``: evicted leaves, least recently used first, dropped with their host
        copies; returns the host tokens freed."""
        heap = [(n.used, id(n), n) for n in self._nodes if n.evicted and not n.children]
        heapq.heapify(heap)
        freed = 0
        while freed < tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[self._identity(node.origin, node.start)]
            self._nodes.discard(node)
            self.host_used -= node.size
            self.host_evictions += 1
            freed += node.size
            if parent is not self.root and parent.evicted and not parent.children:
                heapq.heappush(heap, (parent.used, id(parent), parent))
        return freed
