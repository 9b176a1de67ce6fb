"""What a ``vllm`` profile replay keeps (:class:`VllmState`), and which speed paths are on.

The per-request counts are vLLM's (``num_tokens``, ``num_computed_tokens``, output
placeholders, in-flight tokens), kept in lists indexed by request; the tables hold block ids
per group. Groups of one spec have tables of one shape in every request, so what depends on
the shape alone is worked out once per *class* of groups (Gemma-3-27B's ``equal_groups`` plan:
31 groups, 2 classes).

The speed paths (:data:`SPEED_PATHS`) each skip work whose outcome is known, and each can be
turned off on its own (``speed_paths``); with none on, every request is visited every step,
every allocation takes :meth:`~kvcore.simulation.profiles.vllm.manager.KVCacheManager._allocate`
and every computed block is hashed as vLLM hashes it:

- ``event_bounds``: a request's next page, next block to cache and next page freed before a
  window are noted when its tables change; a decode short of them skips the manager;
- ``steady_decoders``: a decode short of those bounds for many steps is counted, not visited
  (:mod:`~kvcore.simulation.profiles.vllm.steady`; needs ``event_bounds``);
- ``lazy_hashing``: a request's own blocks are hashed when freed, not when computed (only it
  could hit them, and it holds them), and freed as runs in the free queue
  (:class:`~kvcore.simulation.profiles.vllm.free_queue.Run`);
- ``compact_tables``: while every block of a request is its own and unhashed, the groups of a
  class share one table of placeholders (needs ``lazy_hashing``);
- ``lean_decode``: a decode's boundary call worked out per class
  (:mod:`~kvcore.simulation.profiles.vllm.lean`; needs ``lazy_hashing``), for compact tables
  and for tables of a request with a hit or a shared prefix;
- ``lean_finish``: a finish over compact tables, per class (needs ``compact_tables``);
- ``gate_memo``: a request refused by the admission gate before it ever ran is not tried again
  while the pools fall short of the same need and no block of its shared prefix was cached
  anew or left the cache;
- ``shared_runs``: a request with shared blocks (a hit, a shared prefix) frees its own pages
  (from ``_exposed_to`` on) before its windows, at its finish and at its preemption as a
  request with no shared block does (as runs, hashed in one loop), and only its shared pages one
  by one (:mod:`~kvcore.simulation.profiles.vllm.shared`; needs ``lazy_hashing``);
- ``preempted_runs``: a preempted request's own blocks (and those it freed before its windows)
  are queued as runs it owns and hashed only when it is next looked up, not when it is
  preempted: only it can hit them, and most are evicted, by count, before that (needs
  ``shared_runs``);
- ``hit_memo``: a request that never ran and is longer than its shared prefix takes the hit
  the last such request of its prefix found, while no block of the prefix was cached anew or
  left the cache (its hit lies in the prefix; not with chunked local attention).
- ``unread_runs``: a preempted request's runs are not hashed at its lookup when some group of
  a hit type has none of its blocks left in them (evicted, as the runs queued first are when
  the preemption makes room): that type can hit nothing of its own content, so neither can the
  lookup, and the hit is the one the hash table gives without them. They are hashed, in the
  same order, before any other block of its own content is (needs ``preempted_runs``).

Always on (they are how the state is kept, not a path beside another): a hit is looked up once
per class (``_held_by_class``), the blocks of a hit inside a shared prefix are read once per
version of the prefix's cached blocks (``_hit_rows``), and the search of a request that never
ran stops at its shared prefix's last block (nothing of its own is cached).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from kvcore.errors import InvalidInputError
from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.free_queue import BlockKey, Pool, Run
from kvcore.simulation.profiles.vllm_groups import (
    chunks_off_scheduler_block,
    manager_group,
    scheduler_block,
    warn_unhit_chunks,
)
from kvcore.simulation.stepper import StepperState, check_lengths, step_budget
from kvcore.spec import KVCacheSpec, SizingContext

if TYPE_CHECKING:
    from collections.abc import Hashable

    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm_reference.scheduler import VllmSettings
    from kvcore.simulation.steps import StepTimeModel
    from kvcore.simulation.workload import Workload

#: A request's status.
WAITING, RUNNING, PREEMPTED, FINISHED = range(4)

#: Token counts no request reaches.
NEVER = 1 << 62

#: What a table holds for a page without prefix caching (no block id is needed).
HELD = 0

#: The speed paths, each of which ``speed_paths`` may leave out (see the module docstring).
SPEED_PATHS = (
    "event_bounds",
    "steady_decoders",
    "lazy_hashing",
    "compact_tables",
    "lean_decode",
    "lean_finish",
    "gate_memo",
    "shared_runs",
    "preempted_runs",
    "hit_memo",
    "unread_runs",
)


def leading_nulls(table: list[int | None]) -> int:
    """How many ``None`` lead ``table``: its pages freed before a window (a hit from a window's
    end leaves ``None`` before it too). Every ``None`` of a table leads it, so the count is
    where its first page held is, found by halving (``table.count(None)`` reads every page).
    """
    low, high = 0, len(table)
    while low < high:
        mid = (low + high) // 2
        if table[mid] is None:
            low = mid + 1
        else:
            high = mid
    return low


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class VllmState(StepperState):
    """The state of one replay (see the module docstring); the layers above it step it.

    Args:
        plan: the plan (one vLLM block pool per plan pool, of its usable block ids).
        workload: the requests.
        profile: the settings (a :class:`~kvcore.simulation.profiles.vllm.VllmProfile`).
        max_num_batched_tokens: tokens per step (default: the plan's).
        prefix_caching: vLLM's ``enable_prefix_caching``.
        step_time: a step-time model: each step becomes a
            :class:`~kvcore.simulation.steps.StepRecord` timed by it, a clock runs (requests that
            arrive in seconds join at the first step starting at or after their arrival; with
            nothing to run the clock jumps to the next arrival), and the result carries a
            :class:`~kvcore.simulation.steps.Timeline`.
        speed_paths: the speed paths on (default: every one of :data:`SPEED_PATHS`); the
            figures are the same with any of them.

    Raises:
        InvalidInputError: a request is longer than the plan's ``max_model_len``, or
            ``max_num_batched_tokens`` is not an int from 1 to ``kvcore.limits.MAX_TOKENS``, or
            the requests arrive in seconds and no ``step_time`` is given, or ``speed_paths``
            names one that is not in :data:`SPEED_PATHS`.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        workload: Workload,
        profile: VllmSettings,
        *,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = False,
        step_time: StepTimeModel | None = None,
        speed_paths: Collection[str] = SPEED_PATHS,
    ) -> None:
        budget = step_budget(plan, max_num_batched_tokens)
        unknown = sorted(set(speed_paths) - set(SPEED_PATHS))
        if unknown:
            raise InvalidInputError(
                f"unknown speed path {unknown[0]!r}: the vllm profile's are {', '.join(SPEED_PATHS)}"
            )
        self.speed_paths = frozenset(speed_paths)
        self._event_bounds = "event_bounds" in self.speed_paths
        self._steady_decoders = "steady_decoders" in self.speed_paths
        self._compact_tables = "compact_tables" in self.speed_paths
        self._lean_decode = "lean_decode" in self.speed_paths
        self._lean_finish = "lean_finish" in self.speed_paths
        self._gate_memo = "gate_memo" in self.speed_paths
        self.plan = plan
        self.profile = profile
        self.requests = workload.requests
        self.budget = budget
        self.max_model_len = plan.context.max_model_len
        check_lengths(plan, self.requests)
        self.lag = 1 if profile.async_scheduling else 0  # steps before a step's output returns
        # vLLM's VllmConfig.max_in_flight_tokens: what a window may hold beyond itself
        in_flight = (self.lag + 1) * budget
        context = SizingContext(max_model_len=self.max_model_len, max_num_batched_tokens=in_flight)
        #: the scheduler's block: hits are multiples of it (``_cache_hit_alignment_tokens``)
        self._align = scheduler_block(plan)
        unhit = chunks_off_scheduler_block(plan)
        self.groups = [
            manager_group(g.spec, g.pool, g.blocks_per_page, context, hits_chunk=index not in unhit)
            for index, g in enumerate(plan.groups)
        ]
        if prefix_caching and unhit:
            warn_unhit_chunks(plan, unhit[0])
        self.pools = [Pool(plan.usable_blocks_in(p)) for p in range(len(plan.pools))]
        self.caching = prefix_caching
        self._init_classes(prefix_caching)
        self._init_hits(prefix_caching)
        count = len(self.requests)
        self._start(workload, step_time, profile.name)
        self._init_requests(count)

    def _init_classes(self, prefix_caching: bool) -> None:
        """The groups' classes (groups of one spec) and what is worked out once per class."""
        # groups of one spec have tables of one shape in every request (lengths, null blocks,
        # blocks hashed): what depends on the shape alone is worked out once per class
        # (equal_groups on Gemma-3-27B: 31 groups, 2 classes)
        members: dict[KVCacheSpec, list[int]] = {}
        for index, g in enumerate(self.groups):
            members.setdefault(g.spec, []).append(index)
        self._classes: list[tuple[int, list[int]]] = [(ids[0], ids) for ids in members.values()]
        #: per class, the block ids one page of every member takes, by pool
        self._class_spans: list[list[tuple[int, int]]] = []
        for _, ids in self._classes:
            spans: dict[int, int] = {}
            for index in ids:
                member = self.groups[index]
                spans[member.pool] = spans.get(member.pool, 0) + member.span
            self._class_spans.append(sorted(spans.items()))
        self._class_of = [0] * len(self.groups)
        for c, (_, ids) in enumerate(self._classes):
            for index in ids:
                self._class_of[index] = c
        self._windowed = any(g.windowed for g in self.groups)
        #: the windowed groups in group order (vLLM's order of freeing), cut where the class,
        #: pool or span changes: (class, groups)
        self._window_segments: list[tuple[int, tuple[int, ...]]] = []
        segment_key = (-1, -1, -1)
        for index, g in enumerate(self.groups):
            if not g.windowed:
                continue
            key = (self._class_of[index], g.pool, g.span)
            if key == segment_key:
                c, segment = self._window_segments[-1]
                self._window_segments[-1] = (c, (*segment, index))
                continue
            segment_key = key
            self._window_segments.append((self._class_of[index], (index,)))
        self._freeing: dict[tuple[int, int], int] = {}  # memo of _first_freeing
        #: the groups in group order, cut where the pool or span changes: (pool, span, how many
        #: groups of each class) (see _finish_compact)
        self._free_segments: list[tuple[int, int, list[tuple[int, int]]]] = []
        for index, g in enumerate(self.groups):
            c = self._class_of[index]
            if self._free_segments and self._free_segments[-1][:2] == (g.pool, g.span):
                counts = self._free_segments[-1][2]
                if counts[-1][0] == c:
                    counts[-1] = (c, counts[-1][1] + 1)
                else:
                    counts.append((c, 1))
            else:
                self._free_segments.append((g.pool, g.span, [(c, 1)]))
        #: per class, what a boundary call reads (_allocate_decode, _note_events): its first
        #: member, tokens per page (0: a state), first_retained_token (None: not windowed),
        #: block ids per page by pool, and whether its blocks are cached (prefix caching on and
        #: the group hits)
        self._decode_classes: list[tuple[int, int, Any, list[tuple[int, int]], bool]] = [
            (
                g,
                self.groups[g].tokens_per_page,
                self.groups[g].spec.first_retained_token if self.groups[g].windowed else None,
                self._class_spans[c],
                prefix_caching and self.groups[g].sliding >= 0,
            )
            for c, (g, _) in enumerate(self._classes)
        ]

    def _init_hits(self, prefix_caching: bool) -> None:
        """What a cache lookup reads (the attention types, hash block, lazy hashing) and the
        block pool's hash and run tables."""
        # cache hits: the attention types as (window, chunk, groups), full attention first
        # (vLLM's tighter first bound)
        self._hit_types: list[tuple[int, int, list[int]]] = []
        if prefix_caching and all(g.sliding >= 0 for g in self.groups):
            by_type: dict[tuple[int, int, int], list[int]] = {}
            for index, g in enumerate(self.groups):
                by_type.setdefault((g.sliding, g.chunk, g.tokens_per_page), []).append(index)
            self._hit_types = [(key[0], key[1], ids) for key, ids in sorted(by_type.items())]
        #: per hit type, its classes and their sizes: a block is cached in every group of a
        #: class when the class's count of its content (_held_by_class) is the class's size
        self._hit_classes: list[list[tuple[int, int]]] = [
            sorted({(self._class_of[g], len(self._classes[self._class_of[g]][1])) for g in ids})
            for _, _, ids in self._hit_types
        ]
        #: every group is chunked local attention: a lookup counts the blocks before the chunk
        #: it ends in as hit (null blocks, outside the attention) even when nothing is cached,
        #: so a request that never ran hits them too
        self._null_hits = bool(self._hit_types) and all(chunk for _, chunk, _ in self._hit_types)
        #: the hash block: the groups' greatest common divisor (one group: its block)
        self._hash_block = math.gcd(*(g.tokens_per_page for g in self.groups if g.tokens_per_page)) or 1
        #: some group registers a partial tail block (see _cache_partial_tail): caching cannot be
        #: skipped on the token count alone
        self._tails = any(
            g.sliding == 0 and not g.chunk and g.tokens_per_page > self._hash_block for g in self.groups
        )
        #: hash a request's own blocks when they are freed, not when computed: until then only
        #: the request could hit them, and it holds them (not with partial tails, which a full
        #: hash replaces as it is computed)
        self._lazy = prefix_caching and not self._tails and "lazy_hashing" in self.speed_paths
        #: per class of sliding windows whose blocks are not all hashed (vLLM's sparse retention,
        #: :mod:`~kvcore.simulation.profiles.vllm.retention`): (need, per_segment)
        self._thinned_classes: dict[int, tuple[int, int]] = {}
        self._shared_runs = self._lazy and "shared_runs" in self.speed_paths
        self._preempted_runs = self._shared_runs and "preempted_runs" in self.speed_paths
        self._unread_runs = self._preempted_runs and "unread_runs" in self.speed_paths
        #: requests some of whose own content was hashed (a run expanded, a block hashed as
        #: freed): a lookup of theirs is answered from the hash table alone
        self._own_hashed: set[int] = set()
        #: per request, its runs when a lookup last left them unread (unread_runs): while they are
        #: the same, some group still has none of its blocks left in them
        self._unread: dict[int, tuple[int, ...]] = {}
        #: chunked local attention's hit starts at the chunk the prompt ends in: not memoized
        self._hit_memo = "hit_memo" in self.speed_paths and not any(chunk for _, chunk, _ in self._hit_types)
        #: per shared prefix and length shared: its version, and the hit a request that never
        #: ran, longer than the prefix, found then (hit_memo)
        self._prefix_hits: dict[Hashable, tuple[int, int, list[list[int | None]] | None]] = {}
        #: the hit blocks, computed tokens and evictable block ids per pool that the last
        #: _to_allocate of the allocation in progress counted (see _to_allocate)
        self._evictable: tuple[list[list[int | None]], int, list[int]] | None = None
        self._hashes: list[dict[Hashable, dict[BlockKey, None]]] = [{} for _ in self.pools]
        self._hash_of: dict[BlockKey, Hashable] = {}
        #: per content of a class ``(class, kind, owner, j)``: the class's groups that have a
        #: cached block of it (a hit is looked up once per class, not once per group)
        self._held_by_class: dict[Hashable, int] = {}
        #: per shared prefix: bumped when a block of its content is cached for the first time or
        #: a cached one leaves the cache (a refused admission's memo is then stale: _blocked)
        self._prefix_versions: dict[Hashable, int] = {}
        #: per (shared prefix, hit, stretches): its version and the hit blocks found then (read,
        #: never changed, by the caller)
        self._hit_rows: dict[Hashable, tuple[int, list[list[int | None]]]] = {}
        #: holders of a block that is cached or shared (0: in the free queue); a block with no
        #: entry has one holder
        self._ref: dict[BlockKey, int] = {}
        #: the free queue's runs of blocks (keys below 0; see free_queue.Run)
        self._runs: dict[int, Run] = {}
        #: the expanded runs' first member ids (ascending) and, at the same index, their keys:
        #: the run a member lies in is the last that starts at or below it
        self._member_firsts: list[int] = []
        self._member_runs: list[int] = []
        self._next_run = 0
        self._next_id = 0

    def _init_requests(self, count: int) -> None:
        """Each request's counts, tables and scheduling state, all at their start."""
        self._tokens = [r.prompt_tokens for r in self.requests]  # vLLM's num_tokens
        self._total = [r.total_tokens for r in self.requests]
        self._computed = [0] * count
        self._placeholders = [0] * count
        self._in_flight = [0] * count
        self._stale = [0] * count
        #: request -> (its computed tokens, requests finished) when it last failed to grow
        #: running alone (:meth:`_check_alone`)
        self._failed_alone: dict[int, tuple[int, int]] = {}
        self._status = [WAITING] * count
        self._tables: list[list[list[int | None]]] = [[] for _ in range(count)]
        self._hashed: list[list[int]] = [[] for _ in range(count)]  # blocks cached per class
        #: with lazy hashing, the runs of each request's own blocks freed before their window
        #: and not hashed yet (hashed if the request is preempted)
        self._pending: list[list[int]] = [[] for _ in range(count)]
        #: whether a block in a request's tables may be hashed or held twice (hashed as a shared
        #: prefix or a partial tail, or a hit); until then each is its own, unhashed, one holder
        self._exposed = [False] * count
        #: whether a request's tables are compact: one list per class, which its members share,
        #: holding HELD for each page (see _allocate)
        self._compact = [False] * count
        #: the tokens before which a request's blocks may be hashed or held by another request
        #: (its shared prefix, its hit); its blocks from there on are its own and unhashed
        self._exposed_to = [0] * count
        self._first = [-1] * count
        # when a request's tables next change (see _note_events); 0: not known, take the full path
        self._quiet = [0] * count
        self._free_at = [0] * count
        self._cache_at = [0] * count
        self._next = 0
        #: the admission gate's block ids per pool of a request that failed it before it ever
        #: ran, and its shared prefix's version then: only its prefix's blocks can be hit, and
        #: its tables and counts stay as they are, so while no block of its prefix is cached
        #: anew or leaves the cache, the same gate fails while a pool's free blocks fall short
        #: of it (a hit block taken or freed by another request changes the need and the free
        #: blocks alike; the retry, a cache lookup of its whole prompt and the gate, is skipped)
        self._blocked: dict[int, tuple[list[int], int]] = {}
        self._waiting: deque[int] = deque()
        self._running: list[int] = []
        self._outputs: deque[tuple[dict[int, int], set[int], int]] = deque()
        #: steady decoders (see _join_steady): request -> the first step it is visited again
        #: (0: not steady), the step it became steady, how many are steady and the sum of their
        #: computed tokens less that step (what _time_step reads of them)
        self._until = [0] * count
        self._since = [0] * count
        self._steady = 0
        self._steady_base = 0
