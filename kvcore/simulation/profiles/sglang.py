"""The ``sglang`` scheduler profile: SGLang 0.5.23's scheduler, radix cache and token pools.

What it follows, with where SGLang does it (``python/sglang/srt/`` of sglang 0.5.23; facts, not
code; line numbers of that release):

- **A step** is one forward batch (``Scheduler.get_next_batch_to_run``,
  ``managers/scheduler.py:3894``): a prefill batch when
  the waiting queue admits someone (or a chunked prompt continues), else one decode token for
  every running request. Prefill and decode never share a step (``--enable-mixed-chunk`` is off
  by default).
- **Admission** (``PrefillAdder``, ``managers/schedule_policy.py:607``, and ``PrefillBudget``,
  ``mem_cache/prefill_budget.py:62``): first come first served (``--schedule-policy fcfs``, the
  default). Each running request reserves ``min(max_new_tokens - output, 4096) x
  new_token_ratio`` tokens (``_get_running_request_total_token_offset``); a waiting request is
  admitted while ``extend + min(max_new_tokens - output, 4096) + page_size`` is below the free
  plus evictable tokens less the reservations (``add_one_req``, ``check_prefill``); each admitted
  one reserves its page-rounded extend plus a page plus its ``min(max_new_tokens, 4096)``
  (``_update_prefill_budget``, ``PrefillBudget.reserve``). A prompt longer than what is left of
  ``chunked_prefill_size`` is cut there (page-aligned) and becomes the one chunked request, which
  continues first in the next prefill (``add_chunked_req``). ``max_prefill_tokens`` (16384) and
  the chunk budget end the batch once spent (``budget_state``). At most
  ``max_running_requests`` requests hold a request slot (``get_num_allocatable_reqs``). Once
  admission stops for want of memory, the running batch is *full* and admission is not tried
  again until a request leaves it (``batch_is_full``).
- **new_token_ratio** (``managers/scheduler_components/new_token_ratio_tracker.py``): starts at
  ``SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness`` = 0.7, decays by ``(0.7 - 0.098) /
  600`` every decode step that retracts nothing, to ``0.7 x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``
  = 0.098 (``environ.py:646-648``); a retraction sets it to ``(output tokens + 20 x running) /
  (max_new_tokens + 1)`` over the requests left, at most 1
  (``estimate_new_token_ratio_after_retract``; ``SGLANG_RETRACT_DECODE_STEPS`` = 20,
  ``environ.py:649``).
- **Retraction** (``Scheduler.update_running_batch``, ``scheduler.py:4459``;
  ``ScheduleBatch.check_decode_mem`` and ``retract_decode``, ``managers/schedule_batch.py:3432``
  and ``:3451``): before a decode step, a request whose cached tokens fill its last page needs
  a new one; the radix cache is evicted for the shortfall; if the pages are still missing, the
  running requests are retracted, fewest output tokens first, longest prompt first among equals
  (``--retraction-policy length``), at least one and until the step fits, never the last one. A
  retracted request frees what it holds outside the radix cache (its prompt, already in the
  tree, stays there, evictable), goes to the back of the queue, and computes its prompt and
  output again when admitted (``release_req``, ``reset_for_retract``).
- **Radix cache** (:mod:`kvcore.simulation.profiles.radix`; ``mem_cache/radix_cache.py``): a
  request admitted looks up its known tokens less one, whole pages (``_compute_max_prefix_len``),
  and holds the run it found. After each prefill, and when it finishes, its computed tokens
  (whole pages) are inserted and its copy of what was already there is freed
  (``RadixCache.checkpoint``, ``_insert_cache``); a finished request's run is split where its
  prompt ends, so its output is evicted first. Allocation evicts unheld leaves, least recently
  used first, only when the free pages run short (``evict_to_free_tokens``).
- **Pools** (as ``kvcore.integrations.sglang`` converts a plan): one full token pool of the
  full-attention (or MLA) group's tokens, and, for a sliding-window model, a separate sliding
  pool of the sliding group's tokens (SGLang's ``SWAKVPool``: its size is the plan's, or
  SGLang's own ``swa_full_tokens_ratio`` split given as ``SglangProfile(pools=...)``). Every
  token takes a slot in both; the sliding pool has its own admission estimate
  (``SWAPrefillBudget``, ``estimate_swa_kv_tokens``)
  and a running request frees its sliding tokens that fell out of the window every
  ``SGLANG_SWA_EVICTION_INTERVAL`` = 128 tokens (``ScheduleBatch.maybe_evict_swa``,
  ``free_swa_out_of_window_slots`` in ``mem_cache/common.py``). Pages are the plan's block size
  (SGLang's ``--page-size``).

- **Mamba pool** (a Mamba/linear hybrid; ``HybridReqToTokenPool`` and ``MambaPool`` in
  ``mem_cache/memory_pool.py``): the state layers live in a pool of state slots
  (``max_mamba_cache_size``), each slot one request's state of every state layer, apart from
  the full pool that holds the attention layers (``HybridLinearKVPool``). Its slots are the
  plan's state pages (as ``kvcore.integrations.sglang``'s ``pool_sizes`` reads them), or
  ``SglangPools(mamba_slots=...)``. A request takes a slot when admitted (``alloc_req_slots``)
  and gives it back when released (finished or retracted); a new request is admitted only while
  a slot is free (``HybridReqToTokenPool.available_size``, the admission gate, one slot a
  request without the radix cache: ``MAMBA_STATE_PER_REQ_NO_CACHE``), and running requests are
  capped at the slots (``resolve_max_num_reqs``, ``mem_cache/kv_cache_configurator.py``), so the
  slots bound concurrency. With the radix cache SGLang runs ``MambaRadixCache``
  (``mem_cache/mamba_radix_cache.py``: states kept in the tree, three slots a running request),
  which the profile does not model: prefix caching on a Mamba hybrid is refused.

- **HiCache** (a plan with a host tier, ``kvcore simulate --host-memory``; SGLang's
  ``--enable-hierarchical-cache``, ``HiRadixCache`` in ``mem_cache/hiradix_cache.py``): the radix
  cache is :class:`~kvcore.simulation.profiles.radix.HiRadixTree` over the full pool's host
  pages (write-through copies, evicted nodes kept on the host, host eviction least recently used
  first), and an admitted request's host hit of at least ``load_back_threshold`` tokens is
  loaded back after the admission check (``PrefillAdder.add_one_req``: ``init_load_back``).

Requests generate exactly their ``output_tokens``; ``max_new_tokens`` is taken to be that too
(the request is not ``ignore_eos``, so the ratio applies).

- **Overlap scheduling** (on by default; ``Scheduler.event_loop_overlap``,
  ``scheduler.py:2061``): a step's results are processed after the next step was scheduled, so
  a finished request's pages, and the tokens a prefill puts in the tree, come back a step
  later; the next decode skips the requests whose last token is in flight, and waits for them
  rather than retract (``_reqs_finishing_inflight``).

Where it is an approximation (``docs/explanation/simulating-sglang.md`` lists them): with
overlap, SGLang's admission reserves for output counts a step old (the last step's tokens not yet
processed), the profile for the current ones; in a
sliding-window model the radix cache keeps full-attention tokens only: a finished request's
sliding tokens, and a running one's that the tree holds and that left the window, are freed at
once (SGLang keeps them in the tree, evictable, until sliding-pool pressure tombstones them),
and a request that hits a cached prefix takes the sliding tokens of its last window again; no
MambaRadixCache (prefix caching on a Mamba hybrid), no Mamba hybrid with sliding layers, no
HiCache beside a sliding or Mamba pool nor its storage tier (copies finish at once), no
all-sliding model, no priorities, no speculative decoding.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from kvcore.errors import InvalidInputError
from kvcore.runtime.host_cache import HostTierStats
from kvcore.simulation.profile import BuiltInProfile
from kvcore.simulation.profiles.radix import LOAD_BACK_THRESHOLD, HiRadixTree, Node, RadixTree
from kvcore.simulation.stepper import StepperState, check_lengths, step_budget
from kvcore.simulation.steps import StepRecord, StepTimeModel
from kvcore.spec import KVCacheSpec, cdiv
from kvcore.validators import int_at_least

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.result import SimulationResult
    from kvcore.simulation.workload import Workload

#: ``SGLANG_INIT_NEW_TOKEN_RATIO`` (``sglang/srt/environ.py:646``).
INIT_NEW_TOKEN_RATIO: Final = 0.7
#: ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` (``sglang/srt/environ.py:647``).
MIN_NEW_TOKEN_RATIO_FACTOR: Final = 0.14
#: ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` (``sglang/srt/environ.py:648``).
NEW_TOKEN_RATIO_DECAY_STEPS: Final = 600
#: ``SGLANG_RETRACT_DECODE_STEPS`` (``sglang/srt/environ.py:649``).
RETRACT_DECODE_STEPS: Final = 20
#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (``sglang/srt/environ.py:650``,
#: ``managers/schedule_policy.py:89``).
CLIP_MAX_NEW_TOKENS: Final = 4096
#: ``SGLANG_SWA_EVICTION_INTERVAL`` (``sglang/srt/environ.py:730``).
SWA_EVICTION_INTERVAL: Final = 128
#: ``--max-prefill-tokens``'s default (``sglang/srt/arg_groups/fields/schedule.py:71``).
MAX_PREFILL_TOKENS: Final = 16384

_NO_TOKEN, _OTHER, _CONTINUE = range(3)  # SGLang's AddReqResult


def default_max_running_requests(pool_tokens: int, context_len: int) -> int:
    """SGLang's ``max_running_requests`` when not given: ``int(tokens / context_len x 512)``
    clamped to 2048..4096, at most half the pool's tokens
    (``KVCacheConfigurator.resolve_max_num_reqs``, ``mem_cache/kv_cache_configurator.py:3119``)."""
    estimated = max(min(int(pool_tokens / context_len * 512), 4096), 2048)
    return max(1, min(estimated, pool_tokens // 2))


def _sliding(instance: SglangPools, attribute: attrs.Attribute[int], value: int) -> None:
    if (instance.swa_tokens > 0) != (instance.window > 0):
        raise InvalidInputError(
            f"a sliding pool has both tokens and a window (got swa_tokens={instance.swa_tokens}, "
            f"window={instance.window}); give both, or neither for a model without sliding layers"
        )


@attrs.frozen(kw_only=True)
class SglangPools:
    """SGLang's token pools: what the profile reads from a plan (:func:`sglang_pools`), or
    SGLang's own sizing given instead (``SglangProfile(pools=...)``; e.g. from
    ``kvcore.integrations.sglang.rules.own_pool_sizes``: ``full_tokens``, ``swa_tokens``,
    ``sliding_window`` as ``window``, ``page_size``).

    Attributes:
        page_size: SGLang's ``--page-size``.
        full_tokens: tokens of the full pool.
        swa_tokens: tokens of the sliding pool (0: none).
        window: the sliding layers' window (0: none).
        mamba_slots: state slots of the Mamba pool (``max_mamba_cache_size``; 0: a model
            without state layers).
    """

    page_size: int = attrs.field(validator=int_at_least(1))
    full_tokens: int = attrs.field(validator=int_at_least(1))
    swa_tokens: int = attrs.field(default=0, validator=int_at_least(0))
    window: int = attrs.field(default=0, validator=[int_at_least(0), _sliding])
    mamba_slots: int = attrs.field(default=0, validator=int_at_least(0))


@attrs.frozen(kw_only=True)
class SglangProfile(BuiltInProfile):
    """SGLang 0.5.23's scheduler (see the module docstring), with its settings.

    Attributes:
        max_running_requests: ``--max-running-requests`` (``None``: SGLang's default from the
            pool, :func:`default_max_running_requests`).
        chunked_prefill_size: ``--chunked-prefill-size`` (``None``: the simulation's
            ``max_num_batched_tokens``, the plan's unless given).
        max_prefill_tokens: ``--max-prefill-tokens``: a prefill batch ends once it has spent
            them.
        schedule_conservativeness: ``--schedule-conservativeness``: scales the initial
            ``new_token_ratio``.
        overlap_schedule: SGLang's overlap scheduler (on unless ``--disable-overlap-schedule``):
            a step's results are processed after the next step was scheduled.
        pools: SGLang's pools, instead of the plan's (``None``: :func:`sglang_pools` of the
            plan): to replay SGLang's own sizing (its ``swa_full_tokens_ratio`` split) on the
            plan's context.
    """

    name: str = "sglang"
    description: str = (
        "SGLang 0.5.23's scheduler: admission by new_token_ratio, decode retraction, radix cache"
    )
    #: a plan's host tier is simulated (HiCache: ``HiRadixCache``)
    simulates_host_tier: ClassVar[bool] = True
    max_running_requests: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(int_at_least(1))
    )
    chunked_prefill_size: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(int_at_least(1))
    )
    max_prefill_tokens: int = attrs.field(default=MAX_PREFILL_TOKENS, validator=int_at_least(1))
    schedule_conservativeness: float = attrs.field(default=1.0)
    overlap_schedule: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    pools: SglangPools | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(SglangPools))
    )

    @schedule_conservativeness.validator
    def _check_conservativeness(self, attribute: attrs.Attribute[float], value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise InvalidInputError(f"schedule_conservativeness must be a positive number (got {value!r})")

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The settings as ``(SGLang's name, value)`` pairs, for reports (``None``: SGLang's
        default for the plan)."""
        return (
            ("max_running_requests", self.max_running_requests),
            ("chunked_prefill_size", self.chunked_prefill_size),
            ("max_prefill_tokens", self.max_prefill_tokens),
            ("schedule_conservativeness", self.schedule_conservativeness),
            ("overlap_schedule", self.overlap_schedule),
        )

    def _stepper(self, plan: KVCachePlan, workload: Workload, options: dict[str, Any]) -> SglangSimulator:
        """A :class:`SglangSimulator` (:meth:`simulator` passes ``options``)."""
        return SglangSimulator(plan, workload, self, **options)


def sglang_pools(plan: KVCachePlan) -> SglangPools:
    """The pools SGLang runs ``plan`` with: the full-attention groups' tokens and the sliding
    groups' (the least each holds: SGLang keeps one token index per pool), one page size, and
    the state groups' pages as the Mamba pool's slots (the least of them).

    Raises:
        InvalidInputError: a plan SGLang's pools cannot hold: groups of different block sizes,
            two groups drawing from one block pool, a chunked-local group, sliding windows of
            different sizes, state and sliding groups together, or no full-attention group.
    """
    fix = "plan for SGLang with kind_pools and one block size (kvcore.integrations.sglang.plan_for_sglang)"
    sizes = sorted({g.spec.block_size for g in plan.groups})
    if len(sizes) > 1:
        raise InvalidInputError(
            f"the plan has block sizes {sizes}, but SGLang has one page size for every pool; {fix}"
        )
    owners = [g.pool for g in plan.groups]
    if len(set(owners)) < len(owners):
        raise InvalidInputError(
            f"policy {plan.policy!r} made groups share a block pool, but SGLang's full and sliding pools "
            f"never share memory and every layer of a pool shares one token index; {fix}"
        )
    full: list[int] = []
    swa: list[int] = []
    states: list[int] = []
    windows: set[int] = set()
    for group in plan.groups:
        spec = group.spec
        held = plan.tokens_held(group)
        if held is None:
            # a state group: its pages are the Mamba pool's slots (kvcore.integrations.sglang's
            # pool_sizes reads them the same way)
            states.append(plan.usable_blocks_in(group.pool) // group.blocks_per_page)
            continue
        if type(spec).first_retained_token is KVCacheSpec.first_retained_token:
            full.append(held)
            continue
        window = getattr(spec, "sliding_window", None)
        if not isinstance(window, int):
            raise InvalidInputError(
                f"the plan has a {spec.kind} group: SGLang runs only sliding windows in its sliding pool"
            )
        windows.add(window)
        swa.append(held)
    if len(windows) > 1:
        raise InvalidInputError(
            f"the plan has sliding windows {sorted(windows)}, but SGLang's sliding pool has one window"
        )
    if not full:
        raise InvalidInputError(
            "the plan has no full-attention group: the sglang profile does not model an all-sliding model"
        )
    if states and swa:
        raise InvalidInputError(
            "the plan has state and sliding-window groups: SGLang runs a Mamba hybrid's attention in one "
            "full pool (HybridLinearKVPool), and the sglang profile models no other"
        )
    return SglangPools(
        page_size=sizes[0],
        full_tokens=min(full),
        swa_tokens=min(swa) if swa else 0,
        window=windows.pop() if windows else 0,
        mamba_slots=min(states) if states else 0,
    )


_WAITING, _RUNNING, _FINISHED = range(3)


class SglangSimulator(StepperState):
    """SGLang's scheduler over a kvcore plan, one :meth:`step` (one forward batch) at a time.

    Args:
        plan: the plan (:func:`sglang_pools` reads SGLang's pools from it, unless the profile
            gives them) and its context.
        workload: the requests.
        profile: the settings.
        max_num_batched_tokens: the chunked prefill size unless the profile gives one
            (default: the plan's).
        prefix_caching: SGLang's radix cache (off: ``--disable-radix-cache``).
        step_time: a step-time model: each step becomes a
            :class:`~kvcore.simulation.steps.StepRecord` timed by it, a clock runs, requests may
            arrive in seconds, and the result carries a
            :class:`~kvcore.simulation.steps.Timeline`.

    Raises:
        InvalidInputError: a plan SGLang cannot run (:func:`sglang_pools`), prefix caching on a
            Mamba hybrid (MambaRadixCache is not modelled), a request longer
            than the plan's ``max_model_len``, a chunk size that is not an int from 1 to
            ``kvcore.limits.MAX_TOKENS``, or requests in seconds without ``step_time``.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        workload: Workload,
        profile: SglangProfile,
        *,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = True,
        step_time: StepTimeModel | None = None,
    ) -> None:
        size = profile.chunked_prefill_size
        chunk = step_budget(plan, max_num_batched_tokens if size is None else size)
        self.plan = plan
        self.profile = profile
        self.requests = workload.requests
        self.max_model_len = plan.context.max_model_len
        check_lengths(plan, self.requests)
        pools = profile.pools or sglang_pools(plan)
        self.pools = pools
        self.page = page = pools.page_size
        self.chunk = chunk
        self.max_running = profile.max_running_requests or default_max_running_requests(
            pools.full_tokens, self.max_model_len
        )
        #: the Mamba pool's slots and those free: a running request holds one
        self.mamba_slots = self.mamba_free = pools.mamba_slots
        if pools.mamba_slots:
            self._check_mamba_pool(prefix_caching)
        init = min(INIT_NEW_TOKEN_RATIO * profile.schedule_conservativeness, 1.0)
        self.ratio_min = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (init - self.ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        #: SGLang's current new_token_ratio
        self.ratio = init
        self.full_pages = pools.full_tokens // page
        self.full_free = self.full_pages
        self.swa_pages = pools.swa_tokens // page
        self.swa_free = self.swa_pages
        self.window = pools.window
        self.caching = prefix_caching
        requests = self.requests
        count = len(requests)
        self.tree = self._radix_tree(plan, pools)
        #: HiCache: lookups that loaded a host hit back, and the tokens they loaded
        self.host_hits = self.host_hit_tokens = 0
        self._prompt = [r.prompt_tokens for r in requests]
        self._max_new = [r.output_tokens for r in requests]
        self._outputs = [0] * count
        self._committed = [0] * count  # tokens with KV (SGLang's kv_committed_len)
        self._protected = [0] * count  # of them, the radix cache's (cache_protected_len)
        self._node: list[Node | None] = [None] * count  # the node a request holds
        self._swa_lo = [0] * count  # its first token with a sliding slot
        self._slot = [False] * count  # it holds a Mamba slot
        self._status = [_WAITING] * count
        self._first = [-1] * count
        self._waiting: list[int] = []
        self._running: list[int] = []  # the running (decoding) batch, in SGLang's order
        self._chunked: int | None = None  # the one request whose prompt is being chunked
        # overlap: the tree insertions and releases of the step before, processed after this
        # step was scheduled (request, release it too)
        self._pending: list[tuple[int, bool]] = []
        self._new_pending: list[tuple[int, bool]] = []
        self._batch_full = False
        self._start(workload, step_time, profile.name)
        self._next = 0

    def _check_mamba_pool(self, prefix_caching: bool) -> None:
        """A Mamba hybrid's pool: refused with prefix caching; running requests capped at its slots.

        Raises:
            InvalidInputError: prefix caching on (SGLang's MambaRadixCache is not modelled).
        """
        if prefix_caching:
            raise InvalidInputError(
                "prefix caching on a Mamba hybrid: the sglang profile does not model SGLang's "
                "MambaRadixCache (states cached in the tree, three slots a running request); replay "
                "without prefix caching (prefix_caching=False, as SGLang's disable_radix_cache), or with "
                "the 'kvcore' profile (scheduler='kvcore')"
            )
        # resolve_max_num_reqs: running requests capped at the slots over the slots each
        # holds (MAMBA_STATE_PER_REQ_NO_CACHE = 1 without the radix cache)
        self.max_running = min(self.max_running, self.pools.mamba_slots)

    def _radix_tree(self, plan: KVCachePlan, pools: SglangPools) -> RadixTree:
        """The radix cache (HiCache's, with a host tier): a request's tokens named by its shared
        prefix's whole pages, else by the request."""
        page, requests = self.page, self.requests
        # tokens every request with the same prefix_id shares: the prefix's whole pages
        self._shared = [r.prefix_tokens // page * page if r.prefix_id is not None else 0 for r in requests]
        prefix_ids = [r.prefix_id for r in requests]
        shared = self._shared

        def identity(r: int, i: int) -> Hashable:
            return ("p", prefix_ids[r], i) if i < shared[r] else (r, i)

        def common(a: int, b: int) -> int:
            if prefix_ids[a] is None or prefix_ids[a] != prefix_ids[b]:
                return 0
            return min(shared[a], shared[b])

        self.host_tokens = self._host_tokens(plan, pools)
        if self.host_tokens:
            return HiRadixTree(identity, common, self._tree_freed, host_tokens=self.host_tokens, page=page)
        return RadixTree(identity, common, self._tree_freed)

    def _host_tokens(self, plan: KVCachePlan, pools: SglangPools) -> int:
        """HiCache's host pool, in tokens: the plan's host tier of the full pool
        (``kvcore simulate --host-memory``, SGLang's ``--hicache-size``), whole pages.

        Raises:
            InvalidInputError: a host tier beside a sliding or Mamba pool (SGLang's hybrid host
                pools are not modelled).
        """
        tier = plan.offload_tier
        if tier is None or not tier.nbytes:
            return 0
        if pools.swa_tokens or pools.mamba_slots:
            kind = "sliding" if pools.swa_tokens else "Mamba"
            raise InvalidInputError(
                f"a host tier beside a {kind} pool: the sglang profile models HiCache (HiRadixCache) for "
                "full-attention and MLA pools only; simulate without the tier, or with the 'kvcore' profile "
                "(scheduler='kvcore')"
            )
        full = [g for g in plan.groups if g.spec.tokens_per_page]
        tokens = min(plan.host_blocks_in(g.pool) // g.blocks_per_page * self.page for g in full)
        self._host_group = full[0]
        return max(tokens, 0)

    # -- the stepper ---------------------------------------------------------------------------

    def step(self) -> None:
        """Run one forward batch (a prefill, else a decode), or skip an idle stretch up to the
        next arrival.

        Raises:
            InvalidInputError: the first waiting request can never be admitted (nothing runs and
                it still does not fit), or a lone running request cannot get its next page.
        """
        if self.done:
            return
        step = self.steps
        arrival, waiting = self._arrival, self._waiting
        upcoming = self._next
        now = self.clock if self._in_seconds else step
        if not self._running and not waiting and self._chunked is None and arrival[upcoming] > now:
            self._process_results()  # what is in flight comes back before the idle stretch
            if self._in_seconds:  # nothing to run: the clock jumps to the next arrival
                self.clock = arrival[upcoming]
                return
            gap = int(arrival[upcoming]) - step
            self._running_series.extend_repeat(0, gap)
            self._usage_series.extend_repeat(self._usage(), gap)
            if self._step_time is not None:  # an idle step runs nothing and takes no time
                self._step_end.extend([self.clock] * gap)
            self.steps += gap
            return
        while upcoming < len(arrival) and arrival[upcoming] <= now:
            if self._in_seconds:
                self._queued[upcoming] = step
            waiting.append(upcoming)
            upcoming += 1
        self._next = upcoming
        if not self._running:
            self._batch_full = False  # an empty batch has no request left to leave
        if self.pools.swa_tokens:
            self._batch_full = False  # SGLang retries every step with a sliding pool
        batch = self._prefill(step)
        if batch is None:
            if self._running:
                batch = self._decode()
            elif self._pending:
                batch = []  # overlap: nothing to schedule until the last step's results are back
            else:  # nothing runs and nobody can be admitted: it never will
                stuck = self.requests[waiting[0] if waiting else self._chunked or 0]
                raise InvalidInputError(
                    f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                    f"cannot be admitted even with the pool to itself ({self.pools.full_tokens} tokens"
                    + (f", {self.pools.swa_tokens} sliding" if self.pools.swa_tokens else "")
                    + "): SGLang admits a request when its prompt, its output and a page fit; "
                    "plan more memory"
                )
        decoding = set(self._running)
        self._running_series.append(len(decoding) + sum(1 for r, _, _ in batch if r not in decoding))
        self._usage_series.append(self._usage())
        if self._step_time is not None:
            self._time_step(step, batch)
        self.total_tokens += sum(n for _, n, _ in batch)
        self.steps = step + 1
        self._process_results()

    def _process_results(self) -> None:
        """Overlap: the step before's results are processed once this step was scheduled:
        its requests' tokens go into the tree and the finished ones free their pages
        (``event_loop_overlap``, ``pop_and_process``)."""
        pending, self._pending, self._new_pending = self._pending, self._new_pending, []
        for r, release in pending:
            if release:
                self._checkpoint(r)
                self._release(r)
            elif self._status[r] == _RUNNING:  # not retracted meanwhile
                self._checkpoint(r)

    # -- admission (PrefillAdder) --------------------------------------------------------------

    def _ceil(self, tokens: int) -> int:
        return cdiv(tokens, self.page) * self.page

    def _swa_tokens(self, extend: int, max_new: int, chunk_limit: int | None) -> int:
        """``estimate_swa_kv_tokens``: a request's peak sliding reservation."""
        allocated = extend if chunk_limit is None else min(extend, chunk_limit)
        return max(allocated - self.window, 0) + min(extend + max_new, self.window) + self.page

    def _allocatable(self, running: int, admitted: list[int]) -> int:
        """``get_num_allocatable_reqs``: request slots left (the chunked request holds one)."""
        held = 1 if self._chunked is not None else 0
        in_batch = 1 if self._chunked is not None and self._chunked in admitted else 0
        allocatable = min(self.max_running - running, self.max_running - running - held + in_batch)
        if self.mamba_slots:
            # HybridReqToTokenPool.available_size: a new request needs a free Mamba slot (the
            # chunked request holds its own)
            allocatable = min(allocatable, self.mamba_free + in_batch)
        return allocatable

    def _prefill(self, step: int) -> list[tuple[int, int, int]] | None:
        """``get_new_batch_prefill``: the prefill batch as ``(request, tokens, cached before)``,
        or ``None``."""
        waiting, running = self._waiting, self._running
        chunked = self._chunked
        if (self._batch_full or not waiting) and chunked is None:
            return None
        if chunked is None and self._allocatable(len(running), []) <= 0:
            self._batch_full = True
            return None
        page = self.page
        ratio = self.ratio
        budget = _Budget(self, ratio)
        rem_chunk = self.chunk
        admitted: list[tuple[int, int, Node | None]] = []  # request, extend, node it holds
        new_chunked: int | None = None
        if chunked is not None:
            rem_chunk, new_chunked = self._add_chunked(chunked, budget, rem_chunk, admitted)
        for r in list(waiting):
            if budget.state(rem_chunk) == _OTHER:
                break
            if len(admitted) >= self._allocatable(len(running), [a for a, _, _ in admitted]):
                self._batch_full = True
                break
            fill = self._fill(r)
            limit = (fill - 1) // page * page
            hit, node, host = self._match_prefix(r, limit)
            if node is not None:
                self.tree.lock(node)  # the prefix is not evictable while the request is judged
            max_new = min(max(self._max_new[r] - self._outputs[r], 0), CLIP_MAX_NEW_TOKENS)
            extend = fill - hit
            fits, limit_tokens = budget.check_prefill(
                extend, max_new, extend + max_new + page, rem_chunk, hit_window=self._hit_window(hit)
            )
            result = _NO_TOKEN
            if fits and host >= LOAD_BACK_THRESHOLD and node is not None:
                # init_load_back: the host hit comes back to the device (after the budget check,
                # which counted it as tokens to compute)
                hit, node = self._load_back(r, limit, hit, node)
                extend = fill - hit
            if fits:
                result = _CONTINUE
                full_new = min(self._max_new[r], CLIP_MAX_NEW_TOKENS)
                if self._ceil(extend) > limit_tokens:
                    end = (hit + limit_tokens // page * page) // page * page
                    extend, full_new = end - hit, 0
                    if extend <= 0 or new_chunked is not None:  # one chunked request at a time
                        result = _OTHER
                    else:
                        new_chunked = r
            if result != _CONTINUE:
                if node is not None:
                    self.tree.unlock(node)
                if result == _NO_TOKEN:
                    self._batch_full = bool(admitted) or bool(running)
                break
            admitted.append((r, extend, node))
            budget.reserve(extend, full_new, rem_chunk, swa_extra=self._hit_window(hit))
            rem_chunk -= self._ceil(extend)
            self.cached_tokens += hit
            self.looked_up_tokens += fill
            if budget.state(rem_chunk) != _CONTINUE:
                if budget.state(rem_chunk) == _NO_TOKEN:
                    self._batch_full = bool(admitted) or bool(running)
                break
        if not admitted:
            return None
        return self._run_prefill(step, admitted, chunked, new_chunked)

    def _add_chunked(
        self, chunked: int, budget: _Budget, rem_chunk: int, admitted: list[tuple[int, int, Node | None]]
    ) -> tuple[int, int | None]:
        """``add_chunked_req``: the chunked request's next chunk, within what is left of the chunk
        budget and of the memory; returns the chunk budget left and the request still chunked."""
        page = self.page
        rem = min(rem_chunk, int(budget.total()))
        if self.pools.swa_tokens > 0:
            rem = min(rem, int(budget.swa()) - page)  # <= 0: the chunk waits
        elif rem <= 0:
            rem = rem_chunk  # a lone chunk must progress to free its pages
        # (and what the pool can give now: SGLang would run out of memory beyond it)
        rem = min(rem, (budget.free() // page) * page)
        if rem <= 0:
            return rem_chunk, chunked
        cand = self._fill(chunked) - self._committed[chunked]
        truncated = cand > rem
        extend = min(cand, rem)
        budget.reserve(
            extend, 0 if truncated else min(self._max_new[chunked], CLIP_MAX_NEW_TOKENS), rem_chunk
        )
        admitted.append((chunked, extend, None))
        return rem_chunk - self._ceil(extend), chunked if truncated else None

    def _match_prefix(self, r: int, limit: int) -> tuple[int, Node | None, int]:
        """``match_prefix``: the tokens of ``r``'s prompt cached (up to ``limit``), the node that
        holds them, and of them the tokens only on the host (HiCache)."""
        if not self.caching or limit <= 0:
            return 0, None, 0
        if isinstance(self.tree, HiRadixTree):
            return self.tree.match_host(r, limit)
        hit, node = self.tree.match(r, limit)
        return hit, node, 0

    def _run_prefill(
        self,
        step: int,
        admitted: list[tuple[int, int, Node | None]],
        chunked: int | None,
        new_chunked: int | None,
    ) -> list[tuple[int, int, int]]:
        """The admitted requests leave the queue, take their pages and run their chunk."""
        waiting, swa = self._waiting, self.pools.swa_tokens > 0
        taken = {r for r, _, _ in admitted}
        self._waiting = [r for r in waiting if r not in taken]
        batch: list[tuple[int, int, int]] = []
        for r, extend, node in admitted:
            if r != chunked:
                self._admit(r, step, node)
            before = self._committed[r]
            if swa:  # what fell out of the window before this chunk (see the docstring)
                self._free_window(r, before, interval=1)
            self._allocate(r, before + extend)
            batch.append((r, extend, before))
        self._chunked = new_chunked
        for r, _, _ in batch:
            self._finish_prefill(r, step)
        if new_chunked is not None and new_chunked in taken:
            self._batch_full = False  # a chunk of this batch stays out of the merged batch
        return batch

    def _load_back(self, r: int, limit: int, hit: int, node: Node) -> tuple[int, Node]:
        """HiCache's ``init_load_back``: the evicted nodes of ``r``'s hit below ``node`` (held)
        loaded back into free pages; the hit and the node held after it."""
        tree = self.tree
        assert isinstance(tree, HiRadixTree)
        loaded, deeper = tree.load_back(r, limit, node, lambda: self.full_free)
        if not loaded:
            return hit, node
        self.full_free -= loaded // self.page
        tree.lock(deeper)
        tree.unlock(node)
        self.host_hits += 1
        self.host_hit_tokens += loaded
        return hit + loaded, deeper

    def _fill(self, r: int) -> int:
        """The tokens a request's next prefill covers: its prompt and what it generated."""
        return self._prompt[r] + self._outputs[r]

    def _hit_window(self, hit: int) -> int:
        """Sliding slots a request that found ``hit`` tokens cached takes for them: the last
        window's whole pages (the radix cache here keeps no sliding tokens)."""
        if not self.swa_pages or not hit:
            return 0
        return hit - self._window_start(hit)

    def _window_start(self, tokens: int) -> int:
        return max(0, tokens - self._ceil(max(self.window, self.page))) // self.page * self.page

    def _admit(self, r: int, step: int, node: Node | None) -> None:
        hit = node.end if node is not None else 0
        self._status[r] = _RUNNING
        self._committed[r] = self._protected[r] = hit
        self._node[r] = node
        if self._first[r] < 0:
            self._first[r] = step
        if self.mamba_slots:  # alloc_req_slots: its state slot, held until it is released
            if not self.mamba_free:
                raise AssertionError("the Mamba pool ran out although SGLang's checks admitted the request")
            self.mamba_free -= 1
            self._slot[r] = True
        if self.pools.swa_tokens:
            # the cached prefix's last window takes sliding slots again (see the docstring)
            lo = self._window_start(hit)
            self._swa_lo[r] = lo
            pages = hit // self.page - lo // self.page
            self._take_swa(pages)

    def _finish_prefill(self, r: int, step: int) -> None:
        """``process_batch_result_prefill``: a finished prompt samples its first token."""
        if self._committed[r] < self._fill(r):  # a chunk: the tree takes what it computed
            self._checkpoint(r)
            return
        self._outputs[r] += 1
        if self._step_time is not None and self._token_step[r] < 0:
            self._token_step[r] = step
        if self._outputs[r] >= self._max_new[r]:
            self._finish(r, step)
            self._batch_full = False  # it leaves the batch it was merged into
            return
        self._after_step(r, release=False)
        self._running.append(r)

    # -- decode (update_running_batch) ---------------------------------------------------------

    def _decode_pages(self, requests: list[int]) -> int:
        """``new_tokens_required_next_decode``: requests whose cached tokens fill their last page."""
        page, committed = self.page, self._committed
        return sum(1 for r in requests if committed[r] % page == 0)

    def _decode_fits(self, requests: list[int]) -> bool:
        """``check_decode_mem``: evict the radix cache for the shortfall, then whether every
        request's next token has a slot."""
        need = self._decode_pages(requests)
        if need > self.full_free:
            self.tree.evict((need - self.full_free) * self.page)
        return need <= self.full_free and (not self.swa_pages or need <= self.swa_free)

    def _decode(self) -> list[tuple[int, int, int]]:
        """One decode token for every running request, after retracting some if the pages
        run short."""
        running = self._running
        if not self._decode_fits(running) and any(release for _, release in self._pending):
            # the finishing requests in flight free their pages after this step: decode the
            # rest next step rather than retract (update_running_batch)
            self._batch_full = False
            return []
        if not self._decode_fits(running):
            order = self._retraction_order(running)
            first = True
            while first or not self._decode_fits([running[i] for i in order]):
                if len(order) == 1:
                    break
                first = False
                self._retract(running[order.pop()], len(order))
            kept = [running[i] for i in order]
            if not self._decode_fits(kept):
                lone = self.requests[kept[0]]
                raise InvalidInputError(
                    f"{lone.label} cannot get a page for its next token even alone in the pool "
                    f"({self.pools.full_tokens} tokens): SGLang aborts it; plan more memory"
                )
            left = set(kept)
            self._running = running = [r for r in running if r in left]
            outputs = sum(self._outputs[r] for r in running)
            budget = sum(self._max_new[r] for r in running)
            self.ratio = min(1.0, (outputs + RETRACT_DECODE_STEPS * len(running)) / (budget + 1))
            self._batch_full = False
        else:
            self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
        batch: list[tuple[int, int, int]] = []
        step = self.steps
        for r in running:
            before = self._committed[r]
            if self.swa_pages:
                self._free_window(r, before, interval=SWA_EVICTION_INTERVAL)
            self._allocate(r, before + 1)
            batch.append((r, 1, before))
        done: list[int] = []
        for r in running:
            self._outputs[r] += 1
            if self._outputs[r] >= self._max_new[r]:
                done.append(r)
        for r in done:
            self._finish(r, step)
        if done:
            gone = set(done)
            self._running = [r for r in running if r not in gone]
            self._batch_full = False
        return batch

    def _retraction_order(self, running: list[int]) -> list[int]:
        """``_get_decode_retraction_order`` (``--retraction-policy length``): positions in
        ``running``, the one to keep most first; retraction pops from the end (fewest outputs,
        then longest prompt; among equals the later in the batch)."""
        outputs, prompt = self._outputs, self._prompt
        return sorted(
            range(len(running)), key=lambda i: (outputs[running[i]], -prompt[running[i]]), reverse=True
        )

    def _retract(self, r: int, left: int) -> None:
        """``release_req`` without a checkpoint: free what the request holds outside the tree,
        then evict the tree for ``left x 20`` tokens' shortfall; back to the queue's end."""
        self.recomputed_tokens += self._committed[r]
        self._release(r)
        shortfall = left * RETRACT_DECODE_STEPS - self.full_free * self.page
        if shortfall > 0:
            self.tree.evict(shortfall)
        self._status[r] = _WAITING
        self._waiting.append(r)
        self.preemptions += 1

    # -- memory --------------------------------------------------------------------------------

    def _tree_freed(self, tokens: int) -> None:
        self.full_free += tokens // self.page

    def _take_swa(self, pages: int) -> None:
        if pages > self.swa_free:
            raise AssertionError("the sliding pool ran out although SGLang's checks admitted the step")
        self.swa_free -= pages

    def _allocate(self, r: int, tokens: int) -> None:
        """``alloc_for_extend`` / ``alloc_for_decode``: pages up to ``tokens``, the radix cache
        evicted for the shortfall."""
        page = self.page
        pages = cdiv(tokens, page) - cdiv(self._committed[r], page)
        if pages > self.full_free:
            self.tree.evict((pages - self.full_free) * page)
        if pages > self.full_free:
            raise AssertionError("the full pool ran out although SGLang's checks admitted the step")
        self.full_free -= pages
        if self.swa_pages:
            self._take_swa(pages)
        self._committed[r] = tokens

    def _free_window(self, r: int, pre_len: int, *, interval: int) -> None:
        """``free_swa_out_of_window_slots``: once ``interval`` tokens slid out of the window,
        free the sliding slots before it (a page kept whole). With the radix cache, the sliding
        slots of tokens the tree holds are freed as soon as they leave the window: SGLang's
        sliding radix cache counts them evictable and tombstones them when it needs the room."""
        lo = self._swa_lo[r]
        keep = self._ceil(max(self.window, self.page)) if self.caching else self.window
        frontier = (pre_len - keep) // self.page * self.page
        new = min(self._protected[r], frontier) if self.caching else lo
        if pre_len - self.window >= lo + interval:
            new = frontier
        if new > lo:
            self.swa_free += new // self.page - lo // self.page
            self._swa_lo[r] = new

    def _checkpoint(self, r: int) -> None:
        """``RadixCache.checkpoint``: insert the computed whole pages (split where the prompt
        ends), free the request's duplicate copy, hold the new node."""
        if not self.caching:
            return
        page, tree = self.page, self.tree
        length = self._committed[r] // page * page
        protected = self._protected[r]
        if length <= protected:
            return
        found = tree.insert(r, length)
        prompt = self._prompt[r] // page * page
        if 0 < prompt < length:
            tree.insert(r, prompt)
        if found > protected:
            self.full_free += (found - protected) // page  # the copy the tree already had
        _, node = tree.match(r, length)
        tree.lock(node)
        old = self._node[r]
        if old is not None:
            tree.unlock(old)
        self._node[r] = node
        self._protected[r] = length

    def _release(self, r: int) -> None:
        """``release_kv_cache``: free what the request holds outside the tree; let go of its node."""
        page = self.page
        committed = self._committed[r]
        self.full_free += cdiv(committed, page) - self._protected[r] // page
        if self.swa_pages:
            self.swa_free += cdiv(committed, page) - self._swa_lo[r] // page
        if self._slot[r]:
            self.mamba_free += 1
            self._slot[r] = False
        node = self._node[r]
        if node is not None:
            self.tree.unlock(node)
        self._node[r] = None
        self._committed[r] = self._protected[r] = self._swa_lo[r] = 0

    def _after_step(self, r: int, *, release: bool) -> None:
        """Insert ``r``'s computed tokens into the tree (and release it): now, or with the
        overlap scheduler once the next step was scheduled."""
        if self.profile.overlap_schedule:
            self._new_pending.append((r, release))
            return
        self._checkpoint(r)
        if release:
            self._release(r)

    def _finish(self, r: int, step: int) -> None:
        """A request sampled its last token: it leaves the batch (with the overlap scheduler
        the next decode skips it: ``_reqs_finishing_inflight``) and frees its pages."""
        self._after_step(r, release=True)
        self._status[r] = _FINISHED
        self.finished += 1
        if self._step_time is not None:
            self._finish_step[r] = step

    # -- figures -------------------------------------------------------------------------------

    def _usage(self) -> float:
        """Held share of the fuller pool (free and evictable tokens count as free)."""
        held = 1 - (self.full_free + self.tree.evictable // self.page) / self.full_pages
        if self.swa_pages:
            held = max(held, 1 - self.swa_free / self.swa_pages)
        if self.mamba_slots:
            held = max(held, 1 - self.mamba_free / self.mamba_slots)
        return held

    def result(self) -> SimulationResult:
        """The figures so far; with a host tier, what HiCache kept and gave back."""
        result = super().result()
        tree = self.tree
        if not isinstance(tree, HiRadixTree):
            return result
        group = self._host_group
        per_page = group.blocks_per_page
        per_block = self.plan.pool_of(group).bytes_per_block
        written = tree.written // self.page * per_page
        loaded = tree.loaded // self.page * per_page
        stats = HostTierStats(
            enabled=True,
            host_blocks=self.host_tokens // self.page * per_page,
            held_blocks=tree.host_used // self.page * per_page,
            device_hit_tokens=self.cached_tokens - self.host_hit_tokens,
            host_hits=self.host_hits,
            host_hit_tokens=self.host_hit_tokens,
            offloaded_blocks=written,
            offloaded_bytes=written * per_block,
            restored_blocks=loaded,
            restored_bytes=loaded * per_block,
            host_evictions=tree.host_evictions,
        )
        return attrs.evolve(result, host_tier=stats)

    def _time_step(self, step: int, batch: list[tuple[int, int, int]]) -> None:
        """Describe the step as a :class:`~kvcore.simulation.steps.StepRecord` and advance the
        clock by the step-time model's seconds."""
        model = self._step_time
        assert model is not None
        if not batch:  # overlap: a step that waited for results runs no model, takes no time
            self._step_end.append(self.clock)
            return
        decodes = prefill = context = pairs = 0
        for _, n, c in batch:
            context += c + n
            if n == 1:
                decodes += 1
                pairs += c + 1
            else:
                prefill += n
                pairs += n * c + n * (n + 1) // 2  # each new token attends to itself and all before
        record = StepRecord(prefill, decodes, len(batch), context, pairs)
        self._advance_clock(step, record)

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The settings this run used, SGLang's defaults resolved for the plan."""
        return (
            ("max_running_requests", self.max_running),
            ("chunked_prefill_size", self.chunk),
            ("max_prefill_tokens", self.profile.max_prefill_tokens),
            ("schedule_conservativeness", self.profile.schedule_conservativeness),
            ("overlap_schedule", self.profile.overlap_schedule),
            ("page_size", self.page),
            ("full_tokens", self.pools.full_tokens),
            ("swa_tokens", self.pools.swa_tokens),
            *((("mamba_slots", self.mamba_slots),) if self.mamba_slots else ()),
        )


class _Budget:
    """One prefill pass's ``PrefillBudget`` (``SWAPrefillBudget`` with a sliding pool): the
    free and evictable tokens less what running and admitted requests reserve."""

    def __init__(self, sim: SglangSimulator, ratio: float) -> None:
        self.sim = sim
        # each running request's expected remaining output (_get_running_request_total_token_offset)
        self.total_offset = sum(
            min(sim._max_new[r] - sim._outputs[r], CLIP_MAX_NEW_TOKENS) * ratio for r in sim._running
        )
        self.current_offset = 0.0
        self.swa_offset = 0
        self.rem_input = sim.profile.max_prefill_tokens

    def free(self) -> int:
        """Free and evictable tokens of the full pool."""
        sim = self.sim
        return sim.full_free * sim.page + sim.tree.evictable

    def total(self) -> float:
        """``remaining_total``."""
        return self.free() - self.total_offset

    def current(self) -> float:
        """``remaining_current``."""
        return self.free() - self.current_offset

    def swa(self) -> int:
        """``remaining_swa`` (the tree keeps no sliding tokens here: none is evictable)."""
        return self.sim.swa_free * self.sim.page - self.swa_offset

    def check_prefill(
        self, extend: int, max_new: int, total: int, chunk_limit: int, *, hit_window: int = 0
    ) -> tuple[bool, int]:
        """``check_prefill``: whether a request asking for ``total`` tokens (its extend, its
        output and a page) is admitted, and the chunk it may take. With a sliding pool
        (``SWAPrefillBudget``), its sliding estimate (plus ``hit_window``, the slots a cached
        prefix's window takes again here) must fit too; one that never fits the sliding pool
        may take a smaller chunk."""
        sim = self.sim
        if total >= self.total():
            return False, chunk_limit
        if not sim.swa_pages:
            return True, chunk_limit
        page = sim.page
        needed = sim._swa_tokens(sim._ceil(extend), max_new, chunk_limit)
        if needed + hit_window < self.swa():
            return True, chunk_limit
        if needed >= sim.pools.swa_tokens:  # never fits whole (swa_never_fits): cap the chunk
            cap = (int(self.swa()) - sim._swa_tokens(0, max_new, None) - hit_window) // page * page
            if cap > 0:
                return True, min(chunk_limit, cap)
        return False, chunk_limit

    def state(self, rem_chunk: int) -> int:
        """``budget_state``."""
        if self.total() <= 0 or self.current() <= 0 or (self.sim.swa_pages and self.swa() <= 0):
            return _NO_TOKEN
        if self.rem_input <= 0 or rem_chunk <= 0:
            return _OTHER
        return _CONTINUE

    def reserve(self, extend: int, max_new: int, chunk_limit: int, *, swa_extra: int = 0) -> None:
        """``_update_prefill_budget``: the page-rounded extend, a page, and the output (and
        ``swa_extra`` sliding tokens)."""
        sim = self.sim
        paged = sim._ceil(extend)
        self.total_offset += paged + sim.page + max_new
        self.current_offset += paged + sim.page
        if sim.swa_pages:
            self.swa_offset += sim._swa_tokens(paged, max_new, chunk_limit) + swa_extra
        self.rem_input -= paged
