"""The ``vllm`` scheduler profile: vLLM 0.33's v1 scheduler and KV-cache manager, step for step.

What it follows, with where vLLM does it (``vllm/v1/core/``; facts, not code):

- **A step** (``sched/scheduler.py``, ``Scheduler.schedule``): running requests first, in
  admission order, each asking for what it lacks (``num_tokens + num_output_placeholders -
  num_computed_tokens``), cut to ``long_prefill_token_threshold`` when more than one request is
  eligible, to the token budget left and to ``max_model_len``; then, unless a request was
  preempted in this step, the waiting queue first come first served while the budget lasts and
  fewer than ``max_num_seqs`` run.
- **Preemption** (``Scheduler._preempt_request``): when ``allocate_slots`` fails for a running
  request, the most recently admitted running request is preempted (blocks freed, computed
  tokens reset to 0, back to the head of the queue) until the allocation succeeds or the
  request preempted itself. The request later computes its prompt and the tokens it had
  generated again (full recompute).
- **Admission gate** (``kv_cache_manager.py``, ``KVCacheManager.allocate_slots`` with
  ``full_sequence_must_fit``; the scheduler passes ``scheduler_reserve_full_isl``, on by
  default): a waiting request is admitted only when the pool's free blocks hold its whole
  known sequence, each sliding or chunked group capped at its ``max_admission_blocks_per_request``
  (``single_type_kv_cache_manager.py``, ``get_num_blocks_to_allocate`` with
  ``apply_admission_cap``). Then the per-step check for the chunk itself.
- **Lazy freeing** (``allocate_slots`` → ``remove_skipped_blocks``): a sliding-window or chunk
  group frees the blocks before its window only when the request next allocates, counting the
  tokens processed (``num_computed_tokens - num_in_flight_tokens``), in running order.
- **Async scheduling** (``sched/async_scheduler.py``, ``engine/core.py``
  ``step_with_batch_queue``): the output of a step comes back after the next step was
  scheduled; a decoding request holds an output placeholder meanwhile, a preempted request's
  in-flight output is stale and keeps it waiting until it is back (``num_stale_output_tokens``).
- **Prefix cache** (``block_pool.py``): every full block of a request's known tokens (its
  prompt and what it generated) is hashed once computed, up to a multiple of the scheduler
  block (``cache_blocks``, ``get_num_cacheable_tokens``); a freed block that
  is cached goes to the back of the one free queue and one that is not to the front
  (``BlockPool.free_blocks``); allocation takes from the front, evicting a cached block's hash
  (``get_new_blocks``); an admitted request takes the longest run of cached blocks every group
  agrees on, up to ``num_tokens - 1`` (``kv_cache_coordinator.py``,
  ``HybridKVCacheCoordinator.find_longest_cache_hit``: full attention from the start, a sliding
  window from the end with ``cdiv(window - 1, block_size)`` contiguous blocks, chunked local
  attention from the start of the chunk the hit ends in, the blocks before it counted as hit),
  and so does a preempted request when it is admitted again.

Tokens stand for themselves: the ``j``-th block of a request has the content of its
``prefix_id``'s ``j``-th block while it lies inside ``prefix_tokens``, else its own.

Where it is an approximation: a Mamba-style state group holds one block per request from its
first token (vLLM's ``mamba_cache_mode='none'``); with prefix caching, state groups never hit,
nor do chunked local groups whose block is not the scheduler's (vLLM's lookup asserts that it
is; ``plan_for_vllm`` never makes such a plan), so a plan with them hits nothing; no speculative
decoding, no KV connector,
no encoder inputs, no priority policy, no watermark. ``tests/integrations/vllm`` checks the profile figure for
figure against vLLM 0.33's real ``Scheduler``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from itertools import repeat
from typing import TYPE_CHECKING, Any, cast

import attrs

from kvcore.errors import InvalidInputError
from kvcore.simulation.profile import BuiltInProfile
from kvcore.simulation.profiles.vllm_groups import (
    ManagerGroup as _Group,
    chunks_off_scheduler_block as chunks_off_scheduler_block,
    manager_group as _group,
    pages as _pages,
    scheduler_block as scheduler_block,
    usable_text as _usable,
    warn_unhit_chunks as _warn_unhit_chunks,
)
from kvcore.simulation.stepper import StepperState, check_lengths, step_budget
from kvcore.simulation.steps import StepRecord, StepTimeModel
from kvcore.spec import KVCacheSpec, SizingContext, cdiv
from kvcore.validators import int_at_least

if TYPE_CHECKING:
    from collections.abc import Hashable

    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler
    from kvcore.simulation.workload import Workload

#: vLLM 0.33's ``SchedulerConfig.max_num_seqs`` default (``DEFAULT_MAX_NUM_SEQS``).
VLLM_MAX_NUM_SEQS = 128

_WAITING, _RUNNING, _PREEMPTED, _FINISHED = range(4)

#: Token counts no request reaches.
_NEVER = 1 << 62

#: What a table holds for a page without prefix caching (no block id is needed).
_HELD = 0


@attrs.frozen(kw_only=True)
class VllmProfile(BuiltInProfile):
    """vLLM 0.33's v1 scheduler (see the module docstring), with its settings.

    Attributes:
        async_scheduling: vLLM's ``async_scheduling`` (on by default in 0.33): a step's output
            comes back one step later.
        max_num_seqs: vLLM's ``max_num_seqs``: the most requests running at once.
        reserve_full_isl: vLLM's ``scheduler_reserve_full_isl``: admit a request only when its
            whole known sequence fits (on by default).
        long_prefill_token_threshold: vLLM's ``long_prefill_token_threshold`` (0: off): the most
            tokens one request computes in a step while another request is eligible.
        reference: replay with the plain reference
            (:mod:`kvcore.simulation.profiles.vllm_reference`: vLLM's methods one by one, no
            speed path) instead of the fast :class:`VllmSimulator`; the figures are the same,
            only slower (registered as ``vllm-reference``).
    """

    name: str = "vllm"
    description: str = (
        "vLLM 0.33's v1 scheduler: whole-prompt admission, lazy window freeing, LRU prefix cache"
    )
    async_scheduling: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    max_num_seqs: int = attrs.field(default=VLLM_MAX_NUM_SEQS, validator=int_at_least(1))
    reserve_full_isl: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    long_prefill_token_threshold: int = attrs.field(default=0, validator=int_at_least(0))
    reference: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The settings as ``(vLLM's name, value)`` pairs, for reports."""
        return (
            ("async_scheduling", self.async_scheduling),
            ("max_num_seqs", self.max_num_seqs),
            ("scheduler_reserve_full_isl", self.reserve_full_isl),
            ("long_prefill_token_threshold", self.long_prefill_token_threshold),
        )

    def _stepper(
        self, plan: KVCachePlan, workload: Workload, options: dict[str, Any]
    ) -> VllmSimulator | VllmReferenceScheduler:
        """A :class:`VllmSimulator`, or with :attr:`reference` the plain
        :class:`~kvcore.simulation.profiles.vllm_reference.VllmReferenceScheduler`
        (:meth:`simulator` passes ``options``)."""
        if self.reference:
            from kvcore.simulation.profiles.vllm_reference import VllmReferenceScheduler

            return VllmReferenceScheduler(plan, workload, self, **options)
        return VllmSimulator(plan, workload, self, **options)


class _Pool:
    """One block pool as vLLM's ``BlockPool`` keeps it: uncached free blocks (interchangeable,
    counted) ahead of cached free blocks (least recently freed first), and the hash table."""

    def __init__(self, usable: int) -> None:
        self.usable = usable
        self.uncached = usable  # free block ids that hold no cached content
        # free cached page -> its span, oldest first (popping the oldest is O(1))
        self.cached_free: OrderedDict[int, int] = OrderedDict()
        self.cached_span = 0  # block ids in cached_free

    @property
    def free(self) -> int:
        return self.uncached + self.cached_span


class _Run:
    """Blocks of one span that lie together in a pool's free queue as one entry (its key below 0).

    A run stands for blocks nothing can hit yet: a request's own blocks, unhashed (lazy hashing)
    and held by nobody. Evicting takes them from the front by count. A run ``owner`` (a live
    request's blocks freed before their window) keeps, in queue order, which blocks it holds,
    as ``[group, top position, count]`` segments (positions top, top - 1, ...): if the owner is
    preempted it may hit them when admitted again, so the run is then ``expanded`` into hashed
    blocks, each its own entry of ``members`` (in the same order), which a hit can take from
    the middle. A segment ``[groups, top, count]`` holds each group's positions in turn (vLLM
    frees group by group).
    """

    __slots__ = ("consumed", "members", "owner", "segments", "span")

    def __init__(self, span: int, owner: int) -> None:
        self.span = span  # block ids of one block of the run
        self.owner = owner  # the request that may hash them (-1: none; they are never hit)
        self.segments: list[list[Any]] = []
        self.consumed = 0  # blocks evicted from the front
        self.members: OrderedDict[int, None] | None = None  # once expanded: the blocks left


class VllmSimulator(StepperState):
    """vLLM's scheduler and KV-cache manager over a kvcore plan, one :meth:`step` at a time.

    Args:
        plan: the plan (one vLLM block pool per plan pool, of its usable block ids).
        workload: the requests.
        profile: the settings.
        max_num_batched_tokens: tokens per step (default: the plan's).
        prefix_caching: vLLM's ``enable_prefix_caching``.
        step_time: a step-time model: each step becomes a
            :class:`~kvcore.simulation.steps.StepRecord` timed by it, a clock runs (requests that
            arrive in seconds join at the first step starting at or after their arrival; with
            nothing to run the clock jumps to the next arrival), and the result carries a
            :class:`~kvcore.simulation.steps.Timeline`.

    Raises:
        InvalidInputError: a request is longer than the plan's ``max_model_len``, or
            ``max_num_batched_tokens`` is not an int from 1 to ``kvcore.limits.MAX_TOKENS``, or
            the requests arrive in seconds and no ``step_time`` is given.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        workload: Workload,
        profile: VllmProfile,
        *,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = False,
        step_time: StepTimeModel | None = None,
    ) -> None:
        budget = step_budget(plan, max_num_batched_tokens)
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
            _group(g.spec, g.pool, g.blocks_per_page, context, hits_chunk=index not in unhit)
            for index, g in enumerate(plan.groups)
        ]
        if prefix_caching and unhit:
            _warn_unhit_chunks(plan, unhit[0])
        self.pools = [_Pool(plan.usable_blocks_in(p)) for p in range(len(plan.pools))]
        self.caching = prefix_caching
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
        # cache hits: the attention types as (window, chunk, groups), full attention first
        # (vLLM's tighter first bound)
        self._hit_types: list[tuple[int, int, list[int]]] = []
        if prefix_caching and all(g.sliding >= 0 for g in self.groups):
            by_type: dict[tuple[int, int, int], list[int]] = {}
            for index, g in enumerate(self.groups):
                by_type.setdefault((g.sliding, g.chunk, g.tokens_per_page), []).append(index)
            self._hit_types = [(key[0], key[1], ids) for key, ids in sorted(by_type.items())]
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
        self._lazy = prefix_caching and not self._tails
        self._hashes: list[dict[Hashable, dict[int, None]]] = [{} for _ in self.pools]
        self._hash_of: dict[int, Hashable] = {}
        #: holders of a block that is cached or shared (0: in the free queue); a block with no
        #: entry has one holder
        self._ref: dict[int, int] = {}
        #: the free queue's runs of blocks (keys below 0; see _Run)
        self._runs: dict[int, _Run] = {}
        #: the run each block of an expanded run lies in
        self._run_of: dict[int, int] = {}
        self._next_run = 0
        self._next_id = 0
        count = len(self.requests)
        self._start(workload, step_time, profile.name)
        self._tokens = [r.prompt_tokens for r in self.requests]  # vLLM's num_tokens
        self._total = [r.total_tokens for r in self.requests]
        self._computed = [0] * count
        self._placeholders = [0] * count
        self._in_flight = [0] * count
        self._stale = [0] * count
        #: request -> (its computed tokens, requests finished) when it last failed to grow
        #: running alone (:meth:`_check_alone`)
        self._failed_alone: dict[int, tuple[int, int]] = {}
        self._status = [_WAITING] * count
        self._tables: list[list[list[int | None]]] = [[] for _ in range(count)]
        self._hashed: list[list[int]] = [[] for _ in range(count)]  # blocks cached per class
        #: with lazy hashing, the runs of each request's own blocks freed before their window
        #: and not hashed yet (hashed if the request is preempted)
        self._pending: list[list[int]] = [[] for _ in range(count)]
        #: whether a block in a request's tables may be hashed or held twice (hashed as a shared
        #: prefix or a partial tail, or a hit); until then each is its own, unhashed, one holder
        self._exposed = [False] * count
        #: whether a request's tables are compact: one list per class, which its members share,
        #: holding _HELD for each page (see _allocate)
        self._compact = [False] * count
        self._first = [-1] * count
        # when a request's tables next change (see _note_events); 0: not known, take the full path
        self._quiet = [0] * count
        self._free_at = [0] * count
        self._cache_at = [0] * count
        self._next = 0
        #: the admission gate's block ids per pool of a request that failed it before it ever
        #: ran and has no shared prefix: nothing can hit its blocks and its tables and counts
        #: stay as they are, so the same gate fails while a pool's free blocks fall short of it
        #: (the retry, a cache lookup of its whole prompt and the gate, is skipped)
        self._blocked: dict[int, list[int]] = {}
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

    # -- the stepper ---------------------------------------------------------------------------

    def step(self) -> None:
        """Schedule one step, then take back the output of the step ``lag`` steps ago (or skip
        an idle stretch up to the next arrival).

        Raises:
            InvalidInputError: the first waiting request can never be admitted: the pool is
                empty of requests and it still does not fit.
        """
        if self.done:
            return
        step = self.steps
        arrival, waiting = self._arrival, self._waiting
        upcoming = self._next
        timed = self._step_time is not None
        now = self.clock if self._in_seconds else step
        if not self._running and not waiting and arrival[upcoming] > now:
            # nothing runs or waits: what is still in flight is of finished requests; take it
            # back now, so the idle stretch is skipped in one go (and takes no time)
            while self._outputs:
                self._update_from_output(*self._outputs.popleft())
            if self._in_seconds:  # nothing to run: the clock jumps to the next arrival
                self.clock = arrival[upcoming]
                return
            gap = int(arrival[upcoming]) - step
            self._running_series.extend_repeat(0, gap)
            self._usage_series.extend_repeat(0.0, gap)
            if timed:  # an idle step runs nothing and takes no time
                self._step_end.extend([self.clock] * gap)
            self.steps += gap
            return
        while upcoming < len(arrival) and arrival[upcoming] <= now:
            if self._in_seconds:
                self._queued[upcoming] = step
            waiting.append(upcoming)
            upcoming += 1
        self._next = upcoming
        scheduled, sampled = self._schedule(step)
        tokens = sum(scheduled.values()) + self._steady  # the steady decoders each ran a token
        # nothing ran, runs or will come back (async keeps the last, empty, step in flight)
        if not tokens and not self._running and not any(out[0] for out in self._outputs) and waiting:
            stuck = self.requests[waiting[0]]
            raise InvalidInputError(
                f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                f"cannot be admitted even with the pool to itself ({_usable(self.plan)} block ids): "
                "plan more blocks, or give a smaller max_num_batched_tokens"
            )
        self.total_tokens += tokens
        self._running_series.append(len(self._running))
        self._usage_series.append(self._usage())
        if timed:
            self._time_step(step, scheduled)
            token_step = self._token_step
            for r in sampled:
                if token_step[r] < 0:
                    token_step[r] = step
        self._outputs.append((scheduled, sampled, step))
        while len(self._outputs) > self.lag:
            self._update_from_output(*self._outputs.popleft())
        self._join_steady(scheduled, sampled, step)
        self.steps = step + 1
        if self.finished == len(self.requests):
            self._outputs.clear()  # the last (empty) steps in flight

    def _schedule(self, step: int) -> tuple[dict[int, int], set[int]]:
        """``Scheduler.schedule``: tokens per request scheduled in this step, and the requests
        that sample a token in it.

        The fake model runner's part is done here as each request is scheduled, once nothing
        else in the step reads its counts: its tokens are computed and in flight, and it
        samples a token when its chunk reaches its end (then, async, it holds a placeholder).
        """
        profile = self.profile
        running, waiting = self._running, self._waiting
        computed, known, placeholders = self._computed, self._tokens, self._placeholders
        budget = self.budget
        limit = self.max_model_len
        threshold = profile.long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0
        scheduled: dict[int, int] = {}
        preempted = False
        total, in_flight = self._total, self._in_flight
        quiet, free_at, cache_at = self._quiet, self._free_at, self._cache_at
        compact = self._compact
        sampled: set[int] = set()
        add = sampled.add
        lag = self.lag
        until = self._until
        # why a for loop: a preemption pops only requests after this one (or this one, then breaks)
        for r in running:
            if budget <= 0:
                if self._steady:  # the steady decoders from here on did not run
                    for held in running[running.index(r) :]:
                        if until[held]:
                            self._settle(held, step)
                break
            if until[r]:
                if until[r] > step:  # a steady decoder: one token, counted (see _join_steady)
                    budget -= 1
                    continue
                self._settle(r, step)  # its next event: visited as any request
            done = computed[r]
            out = placeholders[r]
            tokens = known[r]
            if done + 1 == tokens + out:  # a decode (one new token)
                if out and tokens + 1 >= total[r]:
                    continue  # async: its last token is in flight
                # the usual step: a decode short of the next page, the next block to cache and
                # the window's next free (see _note_events), which the manager leaves alone;
                # below quiet it stays under max_model_len, and a decode's token samples
                if done < quiet[r] and tokens < cache_at[r]:
                    flying = in_flight[r]
                    if done - flying < free_at[r]:
                        scheduled[r] = 1
                        budget -= 1
                        computed[r] = done + 1
                        in_flight[r] = flying + 1
                        add(r)
                        placeholders[r] = out + lag
                        continue
            elif out and done + 2 - out >= total[r]:
                continue  # async: its last token is in flight
            new = known[r] + placeholders[r] - done
            if 0 < threshold < new:
                new = threshold
            if new > budget:  # min() of three, spelled out: this loop runs per request and step
                new = budget
            if new > limit - done - 1:
                new = limit - done - 1
            if new <= 0:
                continue
            # the usual step: a decode that crosses no page boundary, frees nothing and caches
            # nothing, which the manager leaves alone (see _note_events)
            if not (
                new == 1
                and done < quiet[r]
                and done - in_flight[r] < free_at[r]
                and (done + 1 if done < known[r] else known[r]) < cache_at[r]
            ):
                granted = False
                while True:
                    # a decode of a request whose tables are compact: the lean boundary call
                    lean = new == 1 and compact[r]
                    if self._allocate_decode(r) if lean else self._allocate(r, new, gate=False):
                        granted = True
                        break
                    victim = running.pop()
                    if victim == r and not running:  # it failed with the pool to itself
                        self._check_alone(r)
                    self._preempt(victim)
                    preempted = True
                    if victim == r:
                        break
                if not granted:
                    break
            scheduled[r] = new
            budget -= new
            computed[r] = done + new
            in_flight[r] += new
            if done + new >= known[r] + placeholders[r]:  # not a prefill chunk
                sampled.add(r)
                placeholders[r] += lag
        if not preempted:
            blocked, pools = self._blocked, self.pools
            skipped: list[int] = []
            while budget > 0 and waiting:
                if len(running) >= profile.max_num_seqs:
                    break
                r = waiting[0]
                if self._stale[r]:  # its in-flight output is not back yet
                    skipped.append(waiting.popleft())
                    continue
                gate = blocked.get(r)
                if gate is not None and any(n > pool.free for n, pool in zip(gate, pools, strict=True)):
                    break  # its admission gate fails as it did (see _blocked)
                hit, blocks = self._find_hit(r) if self.caching else (0, None)
                new = known[r] - hit
                if 0 < threshold < new:
                    new = threshold
                new = min(new, budget)
                if not self._allocate(r, new, gate=profile.reserve_full_isl, hit=hit, hit_blocks=blocks):
                    break
                waiting.popleft()
                running.append(r)
                blocked.pop(r, None)
                self.cached_tokens += hit
                self.looked_up_tokens += known[r]
                self._status[r] = _RUNNING
                if self._first[r] < 0:
                    self._first[r] = step
                scheduled[r] = new
                budget -= new
                computed[r] = hit + new
                in_flight[r] += new
                if hit + new >= known[r] + placeholders[r]:  # the whole prompt: it samples
                    sampled.add(r)
                    placeholders[r] += lag
            waiting.extendleft(reversed(skipped))
        return scheduled, sampled

    def _time_step(self, step: int, scheduled: dict[int, int]) -> None:
        """Describe the step as a :class:`~kvcore.simulation.steps.StepRecord` (its tokens are
        counted as computed already) and advance the clock by the step-time model's seconds."""
        model = self._step_time
        assert model is not None
        steady = self._steady
        if not scheduled and not steady:  # async: nothing to schedule while the last tokens are in flight
            self._step_end.append(self.clock)  # the engine runs no model: the step takes no time
            return
        computed = self._computed
        # the steady decoders: each had computed (its count when it became steady, less that
        # step) + this step tokens before the step, and attends to those and its new token
        decodes = steady
        context = pairs = self._steady_base + steady * (step + 1)
        prefills = prefill = 0
        for r, n in scheduled.items():
            c = computed[r] - n  # computed before the step
            context += c + n
            if n == 1:
                decodes += 1
                pairs += c + 1
            else:
                prefills += 1
                prefill += n
                pairs += n * c + n * (n + 1) // 2  # each new token attends to itself and all before
        record = StepRecord(prefill, decodes, decodes + prefills, context, pairs)
        self._advance_clock(step, record)

    def _update_from_output(self, scheduled: dict[int, int], sampled: set[int], step: int) -> None:
        """``Scheduler.update_from_output``: the tokens of step ``step`` come back."""
        finished: list[int] = []
        in_flight, stale_tokens, status = self._in_flight, self._stale, self._status
        known, placeholders, total = self._tokens, self._placeholders, self._total
        cache, tails, cache_at = self.caching, self._tails, self._cache_at
        computed = self._computed
        for r, n in scheduled.items():
            in_flight[r] -= n
            if stale_tokens[r] > 0:  # a preempted request's output (rare)
                stale_tokens[r] -= n
                stale = True
            else:
                stale = False
            if r not in sampled or status[r] == _FINISHED:
                continue
            out = placeholders[r]
            tokens_known = known[r] = known[r] + 1
            if out and not stale:
                placeholders[r] = out - 1
                if tokens_known < total[r]:  # the usual decode: not finished
                    # short of the next block to cache (_note_events' bound; min(tokens,
                    # tokens_known) below), it would hash nothing
                    if cache and (tails or tokens_known >= cache_at[r]) and status[r] == _RUNNING:
                        tokens = computed[r] - in_flight[r]
                        if tails or (tokens if tokens < tokens_known else tokens_known) >= cache_at[r]:
                            self._cache_blocks(r, tokens)
                    continue
                if cache and status[r] == _RUNNING:
                    # vLLM caches a finishing request's blocks too, then frees them: the blocks
                    # it completed go to the back of the free queue, not the front
                    self._cache_blocks(r, computed[r] - in_flight[r])
            if tokens_known >= total[r]:
                finished.append(r)
                if self._step_time is not None:
                    self._finish_step[r] = step
        if finished:
            for r in finished:
                if self._status[r] == _RUNNING:
                    self._free(r, live=False)
                else:
                    self._waiting.remove(r)
                self._status[r] = _FINISHED
            done = set(finished)
            self._running = [r for r in self._running if r not in done]
            self.finished += len(finished)

    def _check_alone(self, r: int) -> None:
        """Stop a run that would never end: request ``r``, running alone, failed to grow where it
        failed alone before, and no request finished in between. With the admission gate off
        (``reserve_full_isl=False``) a request is admitted when its first chunk fits, so one
        that cannot get past some point even with the pool to itself is preempted, admitted
        again and preempted at that same point without end (with prefix caching on it usually
        finds its own blocks and gets further each time, so this never fires).

        Raises:
            InvalidInputError: ``r`` failed alone at the same point twice.
        """
        point = (self._computed[r], self.finished)
        if self._failed_alone.get(r) == point:
            stuck = self.requests[r]
            raise InvalidInputError(
                f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                f"cannot grow past {point[0]:,} computed tokens even with the pool to itself "
                f"({_usable(self.plan)} block ids), so it would be admitted and preempted without end: "
                "plan more blocks, give a smaller max_num_batched_tokens, or keep reserve_full_isl on "
                "(vLLM's default: a request waits until its whole prompt fits)"
            )
        self._failed_alone[r] = point

    def _preempt(self, r: int) -> None:
        if self._until[r]:  # a steady decoder (it is after the request being scheduled)
            self._settle(r, self.steps)
        if self._pending[r]:  # its own blocks freed before their window, still in the queue
            for key in self._pending[r]:
                self._expand(key, r)
            self._pending[r] = []
        self._free(r, live=True)
        self.recomputed_tokens += self._computed[r]
        self._status[r] = _PREEMPTED
        self._computed[r] = 0
        self._stale[r] = self._in_flight[r]
        self._placeholders[r] = 0
        self._waiting.appendleft(r)
        self.preemptions += 1

    # -- steady decoders -----------------------------------------------------------------------

    def _join_steady(self, scheduled: dict[int, int], sampled: set[int], step: int) -> None:
        """Make steady the requests of step ``step`` whose next steps are the usual decode.

        A decode that crosses no page boundary, frees no page before a window and caches no
        block (``_note_events``' bounds), whose output neither finishes the request nor caches
        (``_update_from_output``), changes nothing but its own counts: computed and known
        tokens each grow by one a step while in-flight tokens and placeholders stay. Such a
        request is not visited step by step: it is *steady* from the next step until the first
        step one of those bounds is reached (``_until``), and its counts are brought up to date
        (:meth:`_settle`) when it is visited then, or earlier when it is preempted or the token
        budget runs out before it. Only requests visited in this step can become steady: the
        others' bounds did not change.

        With async scheduling the output of a steady decoder's last step is still in flight when
        it is settled: it joins that step's output and is taken back as any other.
        """
        until, status, stale = self._until, self._status, self._stale
        computed, known, in_flight = self._computed, self._tokens, self._in_flight
        placeholders = self._placeholders
        quiet, cache_at, free_at, total = self._quiet, self._cache_at, self._free_at, self._total
        lag, requests = self.lag, self.requests
        caching_output = self.caching and lag  # async: taking an output back may cache blocks
        for r, n in scheduled.items():
            if n != 1 or r not in sampled or status[r] != _RUNNING or stale[r] or until[r]:
                continue
            c, k, out = computed[r], known[r], placeholders[r]
            if c + 1 != k + out:  # not a decode in the next step
                continue
            # steps it stays steady: each bound the first step that reaches it, less one
            steps = min(
                quiet[r] - c,  # _schedule: computed below quiet (no page)
                cache_at[r] - k,  # known below the next block to cache
                free_at[r] + in_flight[r] - c,  # processed below the window's next free
                total[r] - k - 1 - lag,  # no output that finishes it (async: nor the last in flight)
            )
            if caching_output:
                # no output taken back while it is steady caches a block: the m-th after this
                # step's has min(processed, known) = first + m, and caches from cache_at on
                # (with partial tails too: _cache_blocks rounds down to the scheduler block, and
                # a tail is registered at the first multiple past the prompt's last hash block,
                # where _note_events puts cache_at)
                first = min(c + 1 - in_flight[r], k + 1)
                # the output of its last steady step is taken back after it is settled, in
                # another place of the step's order: it may cache only blocks no other request
                # can hold the content of (no shared prefix)
                last = 1 if requests[r].prefix_tokens else 0
                if cache_at[r] - first - last < steps:
                    steps = cache_at[r] - first - last
            if steps < 1:
                continue
            until[r] = step + 1 + steps
            self._since[r] = step + 1
            self._steady += 1
            self._steady_base += c - step - 1

    def _settle(self, r: int, step: int) -> None:
        """Bring steady request ``r``'s counts to where they stand when step ``step`` begins (the
        steps it ran since it became steady, see :meth:`_join_steady`) and make it unsteady.

        Async: the output of its last step is in flight; it joins that step's output, and its
        counts stand as before that output is taken back (the first output it had in flight when
        it became steady was taken back as any other).
        """
        since = self._since[r]
        base = self._computed[r]
        ran = step - since
        if ran > 0:
            lag = self.lag
            self._computed[r] = base + ran
            self._tokens[r] += ran - lag
            if lag:
                self._in_flight[r] += 1
                self._placeholders[r] += 1
                scheduled, sampled, _ = self._outputs[-1]
                scheduled[r] = 1
                sampled.add(r)
        self._until[r] = 0
        self._steady -= 1
        self._steady_base -= base - since

    # -- the KV-cache manager ------------------------------------------------------------------

    def _note_events(self, r: int, *, grew: bool = True, freed: bool = True, cached: bool = True) -> None:
        """When request ``r``'s tables next change: the slots that take a new page in some group
        (less one, and at most ``max_model_len - 1``: ``_quiet``), the processed tokens that
        free a page before a window (``_free_at``) and the tokens that complete a block to cache
        (``_cache_at``).

        Args:
            grew, freed, cached: which may have changed since they were last noted (a table's
                length, the pages freed before a window, the blocks counted as cached); the
                others are kept.
        """
        grow = free = cache = _NEVER
        table_of, hashed, align = self._tables[r], self._hashed[r], self._align
        freeing = self._freeing
        for c, (g, per_page, first_retained, _, hashes) in enumerate(self._decode_classes):
            table = table_of[g]  # one member answers for its class
            if not per_page:
                if not table:
                    grow = min(grow, 1)
                continue
            if grew:
                grow = min(grow, len(table) * per_page + 1)
            if freed and first_retained is not None:
                # the pages freed before the window: a table's None entries lead it (freed from
                # the start, hits from a window's end), so their count is the first block's index
                target = (table.count(None) + 1) * per_page
                known = freeing.get((g, target))
                free = min(free, self._first_freeing(g, target) if known is None else known)
            if cached and hashes:
                # tokens are cached in multiples of the scheduler block
                cache = min(cache, -(-(hashed[c] + 1) * per_page // align) * align)
        if grew:
            # a decode computing below quiet takes no page and stays within max_model_len
            self._quiet[r] = min(grow, self.max_model_len) - 1
        if freed:
            self._free_at[r] = free
        if cached:
            self._cache_at[r] = cache

    def _first_freeing(self, g: int, target: int) -> int:
        """The fewest processed tokens whose first retained token in group ``g`` is at least
        ``target`` (the count is non-decreasing in the tokens: a binary search, memoized), or
        never."""
        known = self._freeing.get((g, target))
        if known is None:
            known = self._freeing[g, target] = self._search_freeing(self.groups[g], target)
        return known

    def _search_freeing(self, group: _Group, target: int) -> int:
        first = group.spec.first_retained_token
        low, high = target, self.max_model_len + 1
        if first(high) < target:
            return _NEVER
        while low < high:
            middle = (low + high) // 2
            if first(middle) >= target:
                high = middle
            else:
                low = middle + 1
        return low

    def _allocate(
        self,
        r: int,
        new: int,
        *,
        gate: bool,
        hit: int = 0,
        hit_blocks: list[list[int | None]] | None = None,
    ) -> bool:
        """``KVCacheManager.allocate_slots`` for ``new`` tokens after ``hit`` cached ones; granted,
        when the tables next change is noted (:meth:`_note_events`: a decode short of it needs
        no call, see :meth:`_schedule`)."""
        groups, pools = self.groups, self.pools
        tables = self._tables[r]
        if hit and self._compact[r]:  # admitted with a hit after a try without: hit blocks have ids
            tables.clear()
        if not tables:
            if self._lazy and not hit:
                # compact tables: while every block is the request's own and unhashed, a block's
                # id means nothing (runs count them, a preemption hashes fresh ids): the members
                # of a class share one table, as without caching, until _materialise
                shared: list[list[int | None]] = [[] for _ in self._classes]
                tables.extend(shared[c] for c in self._class_of)
                self._compact[r] = True
            else:
                tables.extend([] for _ in groups)
                self._compact[r] = False
            self._hashed[r] = [0] * len(self._classes)
        computed = min(self._computed[r] + hit, self.max_model_len)
        if gate:
            whole = min(self._tokens[r], self.max_model_len)
            need = self._to_allocate(tables, whole, hit_blocks, computed, cap=True)
            if any(n > pool.free for n, pool in zip(need, pools, strict=True)):
                if self._status[r] == _WAITING and not self.requests[r].prefix_tokens:
                    self._blocked[r] = need  # (see _blocked)
                return False
        if self._windowed:
            self._remove_skipped(r, tables, max(0, computed - self._in_flight[r]))
        slots = min(computed + new, self.max_model_len)
        need = self._to_allocate(tables, slots, hit_blocks, computed, cap=False)
        if any(n > pool.free for n, pool in zip(need, pools, strict=True)):
            return False
        if hit_blocks is not None and hit:
            for g, group in enumerate(groups):
                self._touch(group.pool, hit_blocks[g])
                tables[g].extend(hit_blocks[g])
            self._exposed[r] = True
        pages = [_pages(groups[g], slots) - len(tables[g]) for g, _ in self._classes]
        if not self.caching:
            # no block is shared or cached, so an id means nothing: one table per class, and
            # the pools count every member's pages
            for c, (g, _) in enumerate(self._classes):
                if pages[c] > 0:
                    for p, span in self._class_spans[c]:
                        pools[p].uncached -= pages[c] * span
                    tables[g].extend(repeat(_HELD, pages[c]))
        elif any(n > 0 for n in pages):
            self._take(tables, pages, compact=self._compact[r])
        if self.caching:
            self._cache_blocks(r, min(computed + new, self._tokens[r]))
        self._note_events(r)
        return True

    def _allocate_decode(self, r: int) -> bool:
        """:meth:`_allocate` of one decode token of request ``r`` whose tables are compact (every
        block its own and unhashed, one table per class; no hit, no admission gate), with what
        depends on the class alone looked up once: the window's free, the fit check, the new
        pages, the blocks to cache and the next events, in :meth:`_allocate`'s order.

        It assumes what a decode's scheduling checked: ``computed + 1`` is within
        ``max_model_len``. A page before the window above the hashed count (then
        :meth:`_remove_skipped` materialises the tables) takes :meth:`_allocate` instead,
        before anything changed.
        """
        tables, hashed = self._tables[r], self._hashed[r]
        computed = self._computed[r]
        processed = computed - self._in_flight[r]
        if processed < 0:
            processed = 0
        freeing: dict[int, tuple[int, int]] = {}  # class -> (pages before the window, first held)
        # short of _note_events' next free no window frees a page: the loop is skipped
        classes = self._decode_classes
        windows = classes if processed >= self._free_at[r] else ()
        for c, (g, per_page, first_retained, _, _) in enumerate(windows):
            if first_retained is None:
                continue
            table = tables[g]
            skipped = first_retained(processed) // per_page
            if skipped > len(table):
                skipped = len(table)
            if not skipped or table[skipped - 1] is None:  # freed already
                continue
            if skipped > hashed[c]:  # released one by one: the full path materialises
                return self._allocate(r, 1, gate=False)
            low = skipped - 1  # freed pages lead a table: walk down to the first held
            while low > 0 and table[low - 1] is not None:
                low -= 1
            freeing[c] = (skipped, low)
        if freeing:  # _remove_skipped's compact case: each class's pages as runs, group by group
            for c, (skipped, low) in freeing.items():
                tables[self._classes[c][0]][low:skipped] = repeat(None, skipped - low)
            for c, members in self._window_segments:
                if c in freeing:
                    skipped, low = freeing[c]
                    self._queue_pending(r, members, skipped - 1, skipped - low)
        slots = computed + 1
        pools = self.pools
        need = [0] * len(pools)  # block ids to allocate (_to_allocate)
        take = [0] * len(pools)  # block ids taken (_take)
        grown: list[tuple[list[int | None], int]] = []  # (a class's table, its new pages)
        grows = False
        # below _note_events' quiet bound no table grows: the loop is skipped
        for g, per_page, first_retained, spans, _ in classes if computed >= self._quiet[r] else ():
            table = tables[g]
            held = len(table)
            required = (slots + per_page - 1) // per_page if per_page else 1  # _pages
            if required > held:
                grown.append((table, required - held))
                for p, span in spans:
                    take[p] += (required - held) * span
                if first_retained is not None:  # _to_allocate: pages before the window need none
                    skipped = first_retained(computed) // per_page
                    if skipped > held:
                        held = skipped
                if required > held:
                    grows = True
                    for p, span in spans:
                        need[p] += (required - held) * span
        if grows:
            for n, pool in zip(need, pools, strict=True):
                if n > pool.uncached + pool.cached_span:  # pool.free, inlined
                    return False
        for p, ids in enumerate(take):  # _take of the compact tables, inlined
            if ids:
                pool = pools[p]
                if pool.uncached < ids:
                    self._evict(p, ids)
                pool.uncached -= ids
        for table, count in grown:
            table.extend(repeat(_HELD, count))
        grew = bool(grown)
        known = self._tokens[r]
        tokens = slots if slots < known else known
        tokens -= tokens % self._align
        # below the next block to cache (_note_events' bound) _cache_blocks hashes nothing
        cached = tokens >= self._cache_at[r]
        if cached:
            if self.requests[r].prefix_tokens:
                self._cache_blocks(r, tokens)  # (materialising keeps the tables' shape)
            else:  # no shared prefix: lazy hashing only counts the full blocks (_cache_blocks)
                for c, (_, per_page, _, _, hashes) in enumerate(self._decode_classes):
                    if hashes and tokens // per_page > hashed[c]:
                        hashed[c] = tokens // per_page
        # what did not change keeps its bound (a cache bound may be stale-low after
        # _update_from_output's caching, so it is noted again whenever it was reached)
        if grew or freeing or cached:
            self._note_events(r, grew=grew, freed=bool(freeing), cached=cached)
        return True

    def _to_allocate(
        self,
        tables: list[list[int | None]],
        tokens: int,
        hit_blocks: list[list[int | None]] | None,
        computed: int,
        *,
        cap: bool,
    ) -> list[int]:
        """``get_num_blocks_to_allocate`` summed over the groups: block ids per pool."""
        groups, ref = self.groups, self._ref
        need = [0] * len(self.pools)
        for c, (g, ids) in enumerate(self._classes):
            group, table = groups[g], tables[g]
            required = _pages(group, tokens)
            if cap and group.cap is not None:
                required = min(required, group.cap)
            skipped = 0
            if group.windowed:
                skipped = group.spec.first_retained_token(computed) // group.tokens_per_page
            hits = len(hit_blocks[g]) if hit_blocks is not None else 0  # one length in a class
            pages = max(required - max(skipped, hits + len(table)), 0)
            if pages:
                for p, span in self._class_spans[c]:
                    need[p] += pages * span
            if hits:
                # a cached hit block nobody holds leaves the free queue when taken
                start = max(0, skipped - len(table))
                for i in ids:
                    assert hit_blocks is not None
                    evictable = sum(1 for b in hit_blocks[i][start:] if b is not None and ref.get(b) == 0)
                    need[groups[i].pool] += evictable * groups[i].span
        return need

    def _remove_skipped(self, r: int, tables: list[list[int | None]], processed: int) -> None:
        """``remove_skipped_blocks`` of every windowed group: free the pages before the window,
        last first."""
        groups = self.groups
        by_class: dict[int, tuple[int, int]] = {}  # class -> (pages before the window, first held)
        for c, (g, _) in enumerate(self._classes):
            group, table = groups[g], tables[g]
            if not group.windowed:
                continue
            skipped = min(group.spec.first_retained_token(processed) // group.tokens_per_page, len(table))
            if not skipped or table[skipped - 1] is None:  # every member has freed them
                continue
            if self.caching:
                low = skipped - 1  # the lowest page still held: the same in every member
                while low > 0 and table[low - 1] is not None:
                    low -= 1
                by_class[c] = (skipped, low)
                continue
            count = 0  # without caching: the class's one table (see _allocate)
            for i in range(skipped - 1, -1, -1):
                if table[i] is None:
                    break
                table[i] = None
                count += 1
            for p, span in self._class_spans[c]:
                self.pools[p].uncached += count * span
        if not by_class:
            return
        hashed = self._hashed[r]
        if self._compact[r]:
            if all(skipped <= hashed[c] for c, (skipped, _) in by_class.items()):
                # one table per class, every block its own and below the hashed count: each
                # class's pages to the back of the queue as runs, group by group
                for c, (skipped, low) in by_class.items():
                    tables[self._classes[c][0]][low:skipped] = repeat(None, skipped - low)
                for c, members in self._window_segments:
                    if c in by_class:
                        skipped, low = by_class[c]
                        self._queue_pending(r, members, skipped - 1, skipped - low)
                return
            self._materialise(r)  # some block goes back among the uncached one by one (_release)
        # in group order: the order vLLM frees them in
        freeing = sorted(
            (i, *by_class[c]) for c, (_, ids) in enumerate(self._classes) if c in by_class for i in ids
        )
        ref, hash_of, lazy = self._ref, self._hash_of, self._lazy
        own = lazy and not self._exposed[r]  # every block is the request's own, unhashed
        batch: list[int] = []  # groups in a row whose blocks go to the queue as one run
        batch_key: tuple[int, int, int, int] = (0, 0, 0, 0)  # its pool, span, pages before and after
        for g, skipped, low in freeing:
            table = tables[g]
            if (
                lazy
                and skipped <= hashed[self._class_of[g]]
                and (
                    own
                    or (
                        ref.keys().isdisjoint(table[low:skipped])
                        and hash_of.keys().isdisjoint(table[low:skipped])
                    )
                )
            ):
                # the usual case: the request's own blocks, unhashed and below its hashed count,
                # all to the back of the queue (what _release does block by block)
                if table[low] is not None:  # a compact table is its class's: freed once
                    table[low:skipped] = repeat(None, skipped - low)
                key = (groups[g].pool, groups[g].span, skipped, low)
                if batch and key != batch_key:
                    self._queue_pending(r, tuple(batch), batch_key[2] - 1, batch_key[2] - batch_key[3])
                    batch = []
                batch.append(g)
                batch_key = key
                continue
            if batch:
                self._queue_pending(r, tuple(batch), batch_key[2] - 1, batch_key[2] - batch_key[3])
                batch = []
            held = cast("list[int]", table[low:skipped])  # pages still held: no None among them
            held.reverse()  # last first
            table[low:skipped] = repeat(None, skipped - low)
            self._release(r, g, held, skipped - 1, live=True, window=True)
        if batch:
            self._queue_pending(r, tuple(batch), batch_key[2] - 1, batch_key[2] - batch_key[3])

    def _queue_pending(self, r: int, groups: tuple[int, ...], top: int, count: int) -> None:
        """Queue request ``r``'s own unhashed blocks at table positions ``top``, ``top - 1``, ...
        (``count`` of them) of each of ``groups`` in turn (one pool, one span), freed before
        their window, as a run it owns (hashed if ``r`` is preempted, see :meth:`_expand`)."""
        group = self.groups[groups[0]]
        segments = self._queue_run(group.pool, group.span, count * len(groups), r).segments
        last = segments[-1] if segments else None
        if last is not None and len(groups) == 1 and last[0] == groups and last[1] - last[2] == top:
            last[2] += count  # the next positions down of the same group
        else:
            segments.append([groups, top, count])

    def _free(self, r: int, *, live: bool) -> None:
        """``KVCacheManager.free``: every group's pages, group by group, tail first (``live``:
        the request may come back, preempted, and hit its own blocks)."""
        tables = self._tables[r]
        if not tables:
            pass
        elif self.caching and not live and self._compact[r]:
            self._finish_compact(r)  # the usual finish, counted per class
        elif self.caching:
            if live and self._compact[r]:  # released block by block: each needs its own id
                self._materialise(r)
            ref, hash_of, hashed, groups = self._ref, self._hash_of, self._hashed[r], self.groups
            own = self._lazy and not self._exposed[r]  # every block is the request's own, unhashed
            # runs of groups in a row of one pool and span: queued as one (the second would join
            # the first at the back of the queue): pool, span, blocks
            run_pool, run_span, run_count = -1, 0, 0
            for g, table in enumerate(tables):
                if (
                    not live
                    and self._lazy
                    and (own or (ref.keys().isdisjoint(table) and hash_of.keys().isdisjoint(table)))
                ):
                    # the usual finish: the request's own blocks only, those above its hashed
                    # count back among the uncached, those below as one run (as _release does)
                    group = groups[g]
                    first = table.count(None)  # freed pages lead a table
                    below = max(0, min(hashed[self._class_of[g]], len(table)) - first)
                    self.pools[group.pool].uncached += (len(table) - first - below) * group.span
                    if below:
                        if group.pool == run_pool and group.span == run_span:
                            run_count += below
                        else:
                            if run_count:
                                self._queue_run(run_pool, run_span, run_count, -1)
                            run_pool, run_span, run_count = group.pool, group.span, below
                    continue
                if run_count:  # queued before this group's blocks
                    self._queue_run(run_pool, run_span, run_count, -1)
                    run_pool, run_span, run_count = -1, 0, 0
                self._release(r, g, [b for b in reversed(table) if b is not None], len(table) - 1, live=live)
            if run_count:
                self._queue_run(run_pool, run_span, run_count, -1)
        else:  # the class's one table (see _allocate)
            for c, (g, _) in enumerate(self._classes):
                held = len(tables[g]) - tables[g].count(None)
                for p, span in self._class_spans[c]:
                    self.pools[p].uncached += held * span
        self._tables[r] = []
        self._hashed[r] = []
        self._exposed[r] = self._compact[r] = False
        if not live:  # finished: nothing will hash its runs
            for key in self._pending[r]:
                run = self._runs.get(key)
                if run is not None:
                    run.owner = -1
                    run.segments = []
            self._pending[r] = []
        self._quiet[r] = self._cache_at[r] = 0  # the next allocation takes the full path

    def _finish_compact(self, r: int) -> None:
        """The usual finish of :meth:`_free` for compact tables (every block the request's own and
        unhashed, one table per class): each class's pages above its hashed count back among
        the uncached, those below queued group by group, counted once per class and queued
        per run of groups in a row of one pool and span (:attr:`_free_segments`)."""
        tables, hashed, pools = self._tables[r], self._hashed[r], self.pools
        below: list[int] = []  # per class: pages below the hashed count, still held
        for c, (g, _) in enumerate(self._classes):
            table = tables[g]
            first = table.count(None)  # freed pages lead a table
            queued = max(0, min(hashed[c], len(table)) - first)
            below.append(queued)
            for p, span in self._class_spans[c]:
                pools[p].uncached += (len(table) - first - queued) * span
        # a group with nothing below keeps the batch open, as in _free
        run_pool, run_span, run_count = -1, 0, 0
        for p, span, members in self._free_segments:
            count = sum(n * below[c] for c, n in members)
            if not count:
                continue
            if p == run_pool and span == run_span:
                run_count += count
            else:
                if run_count:
                    self._queue_run(run_pool, run_span, run_count, -1)
                run_pool, run_span, run_count = p, span, count
        if run_count:
            self._queue_run(run_pool, run_span, run_count, -1)

    def _take(self, tables: list[list[int | None]], pages: list[int], *, compact: bool) -> None:
        """``BlockPool.get_new_blocks`` for ``pages[c]`` new pages of every group of class ``c``:
        uncached blocks first, then the oldest cached ones (their hashes evicted).

        vLLM takes group by group, each evicting from the front of the queue while the uncached
        blocks fall short of its pages; together that evicts the shortest front of the queue
        that covers every group's pages, so each pool evicts once for all of them.
        """
        pools = self.pools
        need = [0] * len(pools)  # block ids per pool, every class's together
        for c, spans in enumerate(self._class_spans):
            if pages[c] > 0:
                for p, span in spans:
                    need[p] += pages[c] * span
        for p, ids in enumerate(need):
            if ids:
                pool = pools[p]
                if pool.uncached < ids:  # why once: class by class evicts the same front
                    self._evict(p, ids)
                pool.uncached -= ids
        if compact:  # one shared table per class (see _allocate)
            for c, (g, _) in enumerate(self._classes):
                if pages[c] > 0:
                    tables[g].extend(repeat(_HELD, pages[c]))
            return
        of_class = self._class_of
        for g in range(len(self.groups)):  # fresh ids, one holder each (no _ref entry)
            count = pages[of_class[g]]
            if count > 0:
                first = self._next_id
                self._next_id = first + count
                tables[g].extend(range(first, first + count))

    def _evict(self, p: int, need: int) -> None:
        """Evict the oldest cached free blocks of pool ``p`` until ``need`` block ids are uncached."""
        pool = self.pools[p]
        ref, hash_of, hashes, cached_free = self._ref, self._hash_of, self._hashes[p], pool.cached_free
        runs = self._runs
        while pool.uncached < need:
            key = next(iter(cached_free))  # the front (a run partly used stays there)
            ids = cached_free[key]
            if key < 0:  # a run: as many of its blocks as the pages need, from its front
                run = runs[key]
                span = run.span
                used = -(-(need - pool.uncached) // span) * span  # whole blocks (ids is too)
                if used > ids:
                    used = ids
                pool.cached_span -= used
                pool.uncached += used
                if run.members is not None:  # expanded: hashed blocks, each evicted as one
                    for _ in range(used // span):
                        block, _ = run.members.popitem(last=False)
                        self._unhash(p, block)
                        del ref[block], self._run_of[block]
                run.consumed += used // span
                if used < ids:  # the rest stays at the front
                    cached_free[key] = ids - used
                else:
                    del cached_free[key], runs[key]
                continue
            del cached_free[key]
            pool.cached_span -= ids
            pool.uncached += ids
            # the block's hash goes (one freed by a finished request has none), and its count
            hashed = hash_of.pop(key, None)
            if hashed is not None:
                holders = hashes[hashed]
                del holders[key]
                if not holders:
                    del hashes[hashed]
            del ref[key]

    def _release(
        self, r: int, g: int, blocks: list[int], top: int, *, live: bool, window: bool = False
    ) -> None:
        """``BlockPool.free_blocks`` of request ``r``'s blocks of group ``g``, listed from table
        position ``top`` down: a cached block to the back of the free queue, another one back
        among the interchangeable uncached blocks at the front.

        With lazy hashing (see :meth:`_cache_blocks`) a block of the request's own below its
        hashed count is cached too: its hash is made now when the request is ``live`` (only it
        can hit its own blocks, and only once it is admitted again), else it is queued with no
        hash, and a run of such blocks as one entry of the queue (nothing can hit them; they
        keep their place). Blocks freed as they leave a ``window`` wait for the request's
        preemption to be hashed (a request that finishes unpreempted never hashes them).
        """
        group = self.groups[g]
        pool, span = self.pools[group.pool], group.span
        ref, hash_of, cached_free = self._ref, self._hash_of, pool.cached_free
        # blocks[lazy:] lie below the hashed count: cached, hashed or not
        lazy = max(0, top - self._hashed[r][self._class_of[g]] + 1) if self._lazy else len(blocks)
        if not live and lazy < len(blocks):
            # a finished request's own blocks (a request's own block has one holder and no hash:
            # no _ref entry, not in _hash_of) are queued as one run; a shared block still goes alone
            end = len(blocks)
            while end > lazy and blocks[end - 1] in hash_of:  # the shared prefix and hits: the lowest
                end -= 1
            run = blocks[lazy:end]
            if run and hash_of.keys().isdisjoint(run) and ref.keys().isdisjoint(run):
                self._release(r, g, blocks[:lazy], top, live=live)
                self._queue_run(group.pool, span, len(run), -1)
                self._release(r, g, blocks[end:], top - end, live=live)
                return
        for index, block in enumerate(blocks):
            left = ref.get(block, 1) - 1  # no entry: one holder
            if left:
                ref[block] = left
            elif index >= lazy or block in hash_of:
                if live and block not in hash_of:
                    if window:  # hashed if the request is preempted (_preempt), else never
                        ref.pop(block, None)
                        self._queue_pending(r, (g,), top - index, 1)
                        continue
                    self._hash(group.pool, block, (g, False, r, top - index))
                ref[block] = 0
                cached_free[block] = span
                pool.cached_span += span
            else:
                ref.pop(block, None)
                pool.uncached += span

    def _materialise(self, r: int) -> None:
        """Give request ``r``'s compact tables (see :meth:`_allocate`) one table per group
        and a fresh id per page, before a block of them is hashed or released one by one."""
        tables = self._tables[r]
        for g, shared in enumerate(tables):
            first = self._next_id
            self._next_id += len(shared)
            tables[g] = [None if block is None else first + j for j, block in enumerate(shared)]
        self._compact[r] = False

    def _queue_run(self, p: int, span: int, count: int, owner: int) -> _Run:
        """Queue ``count`` blocks of ``span`` ids at the back of pool ``p``'s free queue as a run
        (see :class:`_Run`), joining the run at the back when it is one of the same kind."""
        cached_free = self.pools[p].cached_free
        self.pools[p].cached_span += count * span
        if cached_free:
            last = next(reversed(cached_free))
            # why: blocks evicted by count from one entry or from two in a row are the same blocks
            run = self._runs.get(last) if last < 0 else None
            if run is not None and run.span == span and run.owner == owner and run.members is None:
                cached_free[last] += count * span
                return run
        key = self._next_run = self._next_run - 1
        run = self._runs[key] = _Run(span, owner)
        cached_free[key] = count * span
        if owner >= 0:
            self._pending[owner].append(key)
        return run

    def _expand(self, key: int, r: int) -> None:
        """Hash the blocks left in request ``r``'s run ``key`` (``r`` is preempted: it may hit them
        once admitted again), each its own member of the run, in the run's order."""
        run = self._runs.get(key)
        if run is None:  # evicted whole
            return
        members: OrderedDict[int, None] = OrderedDict()
        skip = run.consumed
        for groups, top, count in run.segments:
            for g in groups:
                if skip >= count:
                    skip -= count
                    continue
                p = self.groups[g].pool
                for j in range(top - skip, top - count, -1):
                    block = self._next_id  # a fresh id: the freed one is in no table any more
                    self._next_id += 1
                    members[block] = None
                    self._hash(p, block, (g, False, r, j))
                    self._ref[block] = 0
                    self._run_of[block] = key
                skip = 0
        run.members = members
        run.owner = -1
        run.segments = []

    def _touch(self, p: int, blocks: list[int | None]) -> None:
        """``BlockPool.touch``: a hit block leaves the free queue when nobody held it."""
        pool, ref = self.pools[p], self._ref
        for block in blocks:
            if block is None:
                continue
            held = ref.get(block, 1)  # no entry: one holder
            if held == 0:
                key = self._run_of.pop(block, None)
                if key is None:
                    pool.cached_span -= pool.cached_free.pop(block)
                else:  # a member of an expanded run: taken from its middle
                    run = self._runs[key]
                    assert run.members is not None
                    del run.members[block]
                    pool.cached_span -= run.span
                    pool.cached_free[key] -= run.span
                    if not run.members:
                        del pool.cached_free[key], self._runs[key]
            ref[block] = held + 1

    # -- the prefix cache ----------------------------------------------------------------------

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
                if not _is_partial(old):
                    continue
                self._unhash(group.pool, block)  # the full block's hash replaces the partial one
            self._exposed[r] = True
            # _hash of _content, inlined: the one loop over every block hashed
            key = (g, True, request.prefix_id, j) if j < shared else (g, False, r, j)
            hash_of[block] = key
            holders = hashes.get(key)
            if holders is None:
                hashes[key] = {block: None}
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

    def _hash(self, p: int, block: int, key: Hashable) -> None:
        self._hash_of[block] = key
        self._hashes[p].setdefault(key, {})[block] = None

    def _unhash(self, p: int, block: int) -> None:
        key = self._hash_of.pop(block)
        holders = self._hashes[p][key]
        del holders[block]
        if not holders:
            del self._hashes[p][key]

    def _cached(self, r: int, ids: list[int], j: int) -> list[int] | None:
        """``BlockPool.get_cached_block``: block ``j``'s cached block in every group of ``ids``."""
        out = []
        for g in ids:
            holders = self._hashes[self.groups[g].pool].get(self._content(r, g, j))
            if not holders:
                return None
            out.append(next(iter(holders)))
        return out

    def _find_hit(self, r: int) -> tuple[int, list[list[int | None]] | None]:
        """``get_computed_blocks``: the longest hit every group agrees on, below ``num_tokens``
        and a multiple of the scheduler's block (the groups' least common multiple)."""
        if not self._hit_types:
            return 0, None
        if self._status[r] == _WAITING and not self.requests[r].prefix_tokens and not self._null_hits:
            # it never ran and shares no prefix: no block was ever hashed with its content
            return 0, None
        align = self._align
        hit = self._tokens[r] - 1
        found: dict[int, list[int | None]] = {}
        while True:
            current = hit
            for window, chunk, ids in self._hit_types:
                per_page = self.groups[ids[0]].tokens_per_page
                most = current // per_page
                if chunk:
                    blocks, length = self._hit_chunk(r, ids, current, chunk)
                elif window == 0:
                    blocks, length = self._hit_full(r, ids, most, align)
                else:
                    blocks, length = self._hit_window(r, ids, most, cdiv(window - 1, per_page), align)
                current = min(current, length)
                for k, g in enumerate(ids):
                    found[g] = [row[k] if row is not None else None for row in blocks]
            if current >= hit:
                break
            hit = current
            if hit == 0:
                break
        if hit <= 0:
            return 0, None
        out: list[list[int | None]] = []
        for g, group in enumerate(self.groups):
            out.append(found[g][: cdiv(hit, group.tokens_per_page)])
        return hit, out

    def _hit_full(self, r: int, ids: list[int], most: int, align: int) -> tuple[list[list[int] | None], int]:
        """``FullAttentionManager.find_longest_cache_hit``: cached blocks from the start."""
        per_page = self.groups[ids[0]].tokens_per_page
        rows: list[list[int] | None] = []
        for j in range(most):
            row = self._cached(r, ids, j)
            if row is None:
                break
            rows.append(row)
        length = len(rows) * per_page
        length -= length % align
        return rows[: cdiv(length, per_page)], length

    def _hit_chunk(self, r: int, ids: list[int], most: int, chunk: int) -> tuple[list[list[int] | None], int]:
        """``ChunkedLocalAttentionManager.find_longest_cache_hit`` for at most ``most`` tokens: the
        blocks before the chunk ``most`` lies in count as hit (null, outside the attention), then
        cached blocks from the chunk's start (its block is the scheduler's: see :func:`_group`)."""
        per_page = self.groups[ids[0]].tokens_per_page
        start = most // chunk * chunk // per_page
        rows: list[list[int] | None] = [None] * start
        for j in range(start, most // per_page):
            row = self._cached(r, ids, j)
            if row is None:
                break
            rows.append(row)
        return rows, len(rows) * per_page

    def _hit_window(
        self, r: int, ids: list[int], most: int, need: int, align: int
    ) -> tuple[list[list[int] | None], int]:
        """``SlidingWindowManager.find_longest_cache_hit``: from the end, the first run of
        ``need`` cached blocks (the window) ending on an aligned boundary; else the run from
        the start."""
        per_page = self.groups[ids[0]].tokens_per_page
        rows: list[list[int] | None] = [None] * most
        run = 0
        for j in range(most - 1, -1, -1):
            row = self._cached(r, ids, j)
            if row is None:
                run = 0
                continue
            if run == 0 and per_page != align and (j + 1) * per_page % align:
                continue  # a hit must end on the scheduler's block
            rows[j] = row
            run += 1
            if run >= need:
                return rows[: j + run], (j + run) * per_page
        kept = run
        while per_page != align and kept * per_page % align:
            kept -= 1
        return rows[:kept], kept * per_page

    # -- figures -------------------------------------------------------------------------------

    def _usage(self) -> float:
        """``BlockPool.get_usage`` (``1 - free / usable``) of the fullest pool."""
        return max((1 - p.free / p.usable for p in self.pools if p.usable), default=0.0)

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The profile's settings (reported with the result)."""
        return self.profile.settings()


def _is_partial(key: Hashable) -> bool:
    return isinstance(key, tuple) and len(key) > 1 and key[1] == "partial"
