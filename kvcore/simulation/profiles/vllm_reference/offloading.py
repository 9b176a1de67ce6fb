"""vLLM 0.33's native CPU offloading (``--kv-offloading-size GiB --kv-offloading-backend native``),
scheduler side, plainly: the CPU tier's manager and its LRU policy, and the connector's scheduler
half that decides what is looked up, loaded and stored.

Where vLLM does it (facts, not code):

- **Configuration** (``vllm/config/vllm.py``, ``VllmConfig._post_init_kv_transfer_config``): a
  ``kv_offloading_size`` of ``X`` GiB with the ``native`` backend selects the
  ``OffloadingConnector`` with ``cpu_bytes_to_use = X * 2**30`` (``kv_role`` ``kv_both``).
  ``CPUOffloadingSpec.__init__`` (``vllm/v1/kv_offload/cpu/spec.py``) makes one CPU *chunk* per
  ``blocks_per_chunk`` GPU blocks (1 by default), of ``worker_kv_bytes_per_block`` bytes rounded
  up to the 4 KiB page, and keeps ``cpu_bytes_to_use // chunk`` chunks
  (:func:`host_chunks`). The spec's defaults: the ``lru`` eviction policy,
  ``offload_prompt_only`` on (``vllm/v1/kv_offload/base.py``, ``OffloadingSpec.__init__``), no
  store threshold, no synchronous-load budget (every load is asynchronous).
- **The manager** (``vllm/v1/kv_offload/cpu/manager.py``, ``CPUOffloadingManager``) and its
  policy (``cpu/policies/lru.py``, ``LRUCachePolicy``): :class:`CpuOffloadingManager`.
- **The connector's scheduler side**
  (``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``,
  ``OffloadingConnectorScheduler``): :class:`OffloadingConnectorScheduler`, one method per
  method it mirrors.

What is modelled, and where it differs:

- **One full-attention group.** The tier is simulated for plans of one pool with one group
  that keeps every token (full attention, MLA) and pages of one block id: with a second group,
  vLLM's LRU heap orders two keys of one position by their hash bytes (``(rank, key)``
  entries), which no simulation knows; sliding, chunked and state groups bring vLLM's window
  lookups and Mamba copy-on-write tails, not modelled; a group mixing layers of different
  pages (``UniformTypeKVCacheSpecs``) stops vLLM 0.33's connector. :func:`check_offloadable`
  refuses the rest by name.
- **Keys** are the reference's block hashes (the block's content: shared prefix block ``j`` or
  the request's own block ``j``), as vLLM keys a chunk by the hash of its last block.
- **Transfers take one step.** The worker side is not simulated: every load and store job a
  step issues is reported finished in that step's output (``KVConnectorOutput``:
  ``finished_recving`` for loads, ``completed_jobs`` for both), which the scheduler reads in
  ``update_from_output``, at once or with async scheduling one step later. A loading request
  waits (``WAITING_FOR_REMOTE_KVS``) until then. With a step-time model on a GPU the bytes
  moved each way are priced at the host link's bandwidth and added to the next step that
  computes (see :mod:`~kvcore.simulation.profiles.vllm_reference.offloading_scheduler`).
- **Finish order.** vLLM walks a step's finished requests as a set of request ids (its order
  is the strings' hashing); here they go in the order they finished. It shows only when
  several requests finish in one step and their tails then compete for the last free chunks.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

import attrs

from kvcore.errors import InvalidInputError
from kvcore.simulation.profiles.vllm_reference.kv_cache_manager import block_hash
from kvcore.spec import cdiv

if TYPE_CHECKING:
    from kvcore.plan import KVCachePlan
    from kvcore.simulation.profiles.vllm_reference.request import RequestState

#: vLLM's CPU region rounds each chunk up to the OS page (``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``).
CHUNK_ALIGNMENT = 4096

#: ``LookupResult`` of a key: not on the CPU tier, stored and readable, or being stored.
MISS, HIT, HIT_PENDING = "miss", "hit", "hit_pending"


def chunk_bytes(plan: KVCachePlan) -> int:
    """Bytes of one CPU chunk: one block id of the plan's one pool, rounded up to
    :data:`CHUNK_ALIGNMENT` (``CPUOffloadingSpec.__init__``, one rank)."""
    per_block = plan.pools[0].bytes_per_block
    return cdiv(per_block, CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT


def host_chunks(plan: KVCachePlan) -> int:
    """Chunks vLLM keeps for the plan's host tier: its bytes (``cpu_bytes_to_use``) over
    :func:`chunk_bytes`, rounded down; 0 without a tier."""
    tier = plan.offload_tier
    if tier is None or not tier.pool_bytes:
        return 0
    return tier.pool_bytes[0] // chunk_bytes(plan)


def check_offloadable(plan: KVCachePlan) -> None:
    """Refuse a plan whose host tier the ``vllm`` profile does not simulate.

    Raises:
        InvalidInputError: the plan has several pools, or groups other than one full-attention
            (or MLA) group with pages of one block id (see the module docstring).
    """
    tier = plan.offload_tier
    if tier is None or not tier.nbytes:
        return
    if len(plan.pools) != 1:
        raise InvalidInputError(
            f"the plan has {len(plan.pools)} block pools; vLLM's native CPU offloading "
            "(kv_offloading_size) serves one KV cache: plan with one pool, or simulate the tier with "
            "scheduler='kvcore'"
        )
    kinds = [g.spec.kind for g in plan.groups]
    group = plan.groups[0]
    key = group.spec.retention_key
    keeps_all = isinstance(key, tuple) and key[:1] == ("keeps every token",)
    if len(plan.groups) != 1 or not keeps_all or group.blocks_per_page != 1:
        raise InvalidInputError(
            f"the vllm profile simulates vLLM's CPU offloading (kv_offloading_size) for plans of one "
            f"full-attention or MLA group with pages of one block id; this plan has groups of "
            f"{', '.join(kinds)} ({group.blocks_per_page} block id(s) a page): simulate its host tier with "
            "scheduler='kvcore' (or 'sglang'), or without the tier"
        )
    if (group.spec.tokens_per_page or 0) < 2:
        raise InvalidInputError(
            f"the plan's blocks hold {group.spec.tokens_per_page} token(s): with one-token blocks a "
            "one-token prompt found on vLLM's CPU tier is looked up again after its load (its last "
            "token is computed again, leaving none computed), which the vllm profile does not "
            "simulate; plan with blocks of 2 tokens or more"
        )
    if group.layer_specs:
        raise InvalidInputError(
            "the plan's group mixes layers of different pages (vLLM's UniformTypeKVCacheSpecs), on "
            "which vLLM 0.33's OffloadingConnector stops (its scheduler finds no manager for that "
            "spec): plan with one page for every layer, or simulate the tier with scheduler='kvcore'"
        )
    if host_chunks(plan) == 0:
        raise InvalidInputError(
            f"the host tier's {tier.nbytes:,} bytes hold no chunk of {chunk_bytes(plan):,} bytes "
            "(vLLM rounds a block up to 4 KiB): give more host memory"
        )


@attrs.define
class OffloadStats:
    """What the CPU tier did, counted as the tier's figures are reported
    (:class:`~kvcore.runtime.host_cache.HostTierStats`)."""

    loads: int = 0  # load jobs (requests that waited for the tier)
    loaded_chunks: int = 0
    stored_chunks: int = 0
    evicted_chunks: int = 0
    host_hit_tokens: int = 0  # tokens the tier gave that the admission counts as computed
    #: bytes moved each way not yet priced by the step-time model (chunks)
    unpriced_out: int = 0
    unpriced_back: int = 0


class CpuOffloadingManager:
    """``CPUOffloadingManager`` with ``LRUCachePolicy``: the CPU chunks, which key each holds,
    and which to evict.

    A chunk's ``ref_cnt`` is -1 while its store is in flight (``ChunkStatus``: not ready), 0
    when it may be evicted, and the number of loads reading it otherwise. Recency is a rank
    per key (``LRUCachePolicy._ranks``): a request gets a rank from one counter the first time
    it touches the tier (``_get_request_rank``), its keys rank ``(request rank, -position)`` (its
    tail older than its head), and when it finishes its keys get fresh ranks from the counter,
    tail first (``on_request_finished``, ``_update_recency``), so a finished request's head is
    the most recent. Eviction takes the lowest ranks among the chunks at 0 (``evict``).

    Args:
        num_chunks: chunks of the CPU region (:func:`host_chunks`).
        stats: where evictions are counted.
    """

    def __init__(self, num_chunks: int, stats: OffloadStats) -> None:
        self.num_chunks = num_chunks
        self.stats = stats
        self.ref_cnt: dict[Hashable, int] = {}
        self.rank: dict[Hashable, tuple[int, int]] = {}
        self.evictable: set[Hashable] = set()
        #: the evictable keys by rank, with stale entries left behind (``LRUCachePolicy._heap``)
        self._heap: list[tuple[tuple[int, int], int, Hashable]] = []
        self._tiebreak = 0
        self.next_rank = 0
        self.request_rank: dict[int, int] = {}
        #: per request, the keys it touched (``_RequestCacheAccess.seen_keys``) with their positions
        self.seen: dict[int, dict[Hashable, int]] = {}

    def lookup(self, key: Hashable) -> str:
        """``lookup``: :data:`MISS`, :data:`HIT` or :data:`HIT_PENDING` (stored, not ready)."""
        ref = self.ref_cnt.get(key)
        if ref is None:
            return MISS
        return HIT if ref >= 0 else HIT_PENDING

    def _get_request_rank(self, r: int) -> int:
        """``LRUCachePolicy._get_request_rank``: request ``r``'s rank, drawn on first use."""
        if r not in self.request_rank:
            self.next_rank += 1
            self.request_rank[r] = self.next_rank
        return self.request_rank[r]

    def _push(self, key: Hashable) -> None:
        self._tiebreak += 1
        heapq.heappush(self._heap, (self.rank[key], self._tiebreak, key))

    def _mark_evictable(self, key: Hashable) -> None:
        self.evictable.add(key)
        self._push(key)

    def _record_request_cache_access(self, r: int, keys: Sequence[tuple[Hashable, int]]) -> None:
        """``_record_request_cache_access`` with ``LRUCachePolicy.on_request_access``: the keys
        request ``r`` touches for the first time take its rank where theirs is older."""
        seen = self.seen.setdefault(r, {})
        new = [(key, position) for key, position in keys if key not in seen]
        if not new:
            return
        seen.update(new)
        rank = self._get_request_rank(r)
        for key, position in new:
            if key not in self.ref_cnt or self.rank[key] >= (rank, -position):
                continue
            self.rank[key] = (rank, -position)
            if key in self.evictable:
                self._push(key)

    def prepare_load(self, r: int, keys: Sequence[tuple[Hashable, int]]) -> None:
        """``prepare_load``: the chunks being read cannot be evicted until the load completes."""
        for key, _ in keys:
            if self.ref_cnt[key] == 0:
                self.evictable.discard(key)
            self.ref_cnt[key] += 1
        self._record_request_cache_access(r, keys)

    def complete_load(self, keys: Iterable[Hashable]) -> None:
        """``complete_load``: a chunk no load reads any more may be evicted again."""
        for key in keys:
            self.ref_cnt[key] -= 1
            if self.ref_cnt[key] == 0:
                self._mark_evictable(key)

    def prepare_store(self, r: int, keys: Sequence[tuple[Hashable, int]]) -> list[Hashable] | None:
        """``prepare_store``: of the offered keys, those not on the tier get a chunk (evicting
        the least recent chunks at 0, never an offered one); ``None`` when too few can be
        evicted (nothing changes, and the request offers them again next step). The offered
        keys already stored and readable count as touched by ``r``."""
        to_store = [(key, position) for key, position in keys if key not in self.ref_cnt]
        touched = [
            (key, position) for key, position in keys if key not in self.ref_cnt or self.ref_cnt[key] >= 0
        ]
        self._record_request_cache_access(r, touched)
        if not to_store:
            return []
        short = len(to_store) - (self.num_chunks - len(self.ref_cnt))
        if short > 0:
            if short > len(self.evictable):
                return None
            victims = self._evict(short, {key for key, _ in keys})
            if victims is None:
                return None
            for key in victims:
                del self.ref_cnt[key]
                del self.rank[key]
                self.evictable.discard(key)
            self.stats.evicted_chunks += len(victims)
        rank = self._get_request_rank(r)
        for key, position in to_store:
            self.ref_cnt[key] = -1
            self.rank[key] = (rank, -position)
        return [key for key, _ in to_store]

    def _evict(self, n: int, protected: set[Hashable]) -> list[Hashable] | None:
        """``LRUCachePolicy.evict``: the ``n`` evictable keys of lowest rank outside
        ``protected``, or ``None`` (nothing evicted) when there are fewer."""
        chosen: list[Hashable] = []
        kept: list[tuple[tuple[int, int], int, Hashable]] = []
        while self._heap and len(chosen) < n:
            entry = heapq.heappop(self._heap)
            rank, _, key = entry
            if key not in self.evictable or self.rank.get(key) != rank or key in chosen:
                continue  # a stale entry
            if key in protected:
                kept.append(entry)
                continue
            chosen.append(key)
            kept.append(entry)
        if len(chosen) < n:
            for entry in kept:
                heapq.heappush(self._heap, entry)
            return None
        for entry in kept:
            if entry[2] not in chosen:
                heapq.heappush(self._heap, entry)
        return chosen

    def complete_store(self, keys: Iterable[Hashable]) -> None:
        """``complete_store``: the stored chunks become readable and evictable."""
        for key in keys:
            if self.ref_cnt.get(key) == -1:
                self.ref_cnt[key] = 0
                self._mark_evictable(key)

    def on_request_finished(self, r: int) -> None:
        """``on_request_finished`` with ``LRUCachePolicy.on_request_finished``: the keys request
        ``r`` touched, head to tail (``order_request_keys``), take fresh ranks tail first."""
        seen = self.seen.pop(r, {})
        for key in sorted(seen, key=seen.__getitem__, reverse=True):
            if key not in self.ref_cnt:
                continue
            self.next_rank += 1
            self.rank[key] = (self.next_rank, 0)
            if key in self.evictable:
                self._push(key)


@attrs.define
class _RequestOffloadState:
    """``RequestOffloadState`` of one request: its block table's length as the connector last
    saw it, the next chunk to store, the hit it had locally, its transfers in flight."""

    num_blocks: int = 0
    next_stored_chunk_idx: int = 0
    num_locally_computed_tokens: int = 0
    transfer_jobs: set[int] = attrs.Factory(set)
    finished_signaled: bool = False


@attrs.define
class _Job:
    request: int
    keys: list[Hashable]
    is_store: bool


class OffloadingConnectorScheduler:
    """``OffloadingConnectorScheduler`` for one full-attention group, ``blocks_per_chunk`` 1.

    Args:
        plan: the plan (its one group's block size is the chunk's tokens).
        stats: where the tier's figures are counted.
    """

    def __init__(self, plan: KVCachePlan, stats: OffloadStats) -> None:
        self.tokens_per_chunk = plan.groups[0].spec.tokens_per_page or 1
        self.stats = stats
        self.manager = CpuOffloadingManager(host_chunks(plan), stats)
        self.requests: dict[int, _RequestOffloadState] = {}
        self.jobs: dict[int, _Job] = {}
        self.next_job = 0
        #: keys being loaded (``_chunks_being_loaded``: prefix caching is on)
        self.chunks_being_loaded: set[Hashable] = set()
        #: the loads of the step being scheduled (``_current_batch_load_jobs``)
        self.current_load_jobs: list[int] = []

    def _key(self, req: RequestState, j: int) -> tuple[Hashable, int]:
        """Chunk ``j``'s key and position (tokens up to its end: ``set_offload_key_position``)."""
        return block_hash(0, req, self.tokens_per_chunk, j), (j + 1) * self.tokens_per_chunk

    def _num_keys(self, req: RequestState) -> int:
        """``update_offload_keys``: a key per chunk whose tokens are all known (hashed)."""
        return req.num_tokens // self.tokens_per_chunk

    def on_new_request(self, r: int) -> None:
        """``on_new_request``: the request's state."""
        self.requests[r] = _RequestOffloadState()

    def get_num_new_matched_tokens(self, req: RequestState, num_computed_tokens: int) -> int | None:
        """``get_num_new_matched_tokens`` (``_lookup_complete_chunks``, one full-attention
        group): the tokens past the local hit ``num_computed_tokens`` the tier holds, whole
        chunks from the hit on, up to every known token; 0 under one chunk; ``None`` (the
        request waits a step) while it has transfers in flight, while a chunk of the hit is
        still being stored (``HIT_PENDING``) or being loaded for another request."""
        state = self.requests[req.index]
        state.num_blocks = 0
        state.next_stored_chunk_idx = 0
        if state.transfer_jobs:
            return None
        state.num_locally_computed_tokens = num_computed_tokens
        per_chunk = self.tokens_per_chunk
        num_keys = self._num_keys(req)
        max_hit = min(req.num_tokens, num_keys * per_chunk)
        if max_hit - num_computed_tokens < per_chunk:
            return 0
        start = num_computed_tokens // per_chunk
        hits, pending = 0, False
        for j in range(start, min(cdiv(max_hit, per_chunk), num_keys)):
            found = self.manager.lookup(self._key(req, j)[0])
            if found == MISS:
                break
            hits += 1
            pending |= found == HIT_PENDING
        if hits == 0:
            return 0
        if pending:
            return None
        hit = min(max_hit, per_chunk * (start + hits)) - num_computed_tokens
        if hit < per_chunk:
            return 0
        end = cdiv(num_computed_tokens + hit, per_chunk)
        if any(self._key(req, j)[0] in self.chunks_being_loaded for j in range(start, end)):
            return None
        return hit

    def update_state_after_alloc(self, req: RequestState, num_external_tokens: int) -> None:
        """``update_state_after_alloc``: the chunks of the external tokens are pinned and a load
        job is issued; the chunks before the hit's end are not offered for storing again
        (``OffloadPolicy.CHUNK_LEVEL``)."""
        if num_external_tokens == 0:
            return
        state = self.requests[req.index]
        local = state.num_locally_computed_tokens
        per_chunk = self.tokens_per_chunk
        end = cdiv(local + num_external_tokens, per_chunk)
        keys = [self._key(req, j) for j in range(local // per_chunk, end)]
        self.manager.prepare_load(req.index, keys)
        job = self.next_job
        self.next_job += 1
        self.jobs[job] = _Job(req.index, [key for key, _ in keys], is_store=False)
        state.transfer_jobs.add(job)
        self.current_load_jobs.append(job)
        self.chunks_being_loaded.update(key for key, _ in keys)
        state.next_stored_chunk_idx = end
        self.stats.loads += 1
        self.stats.loaded_chunks += len(keys)
        self.stats.unpriced_back += len(keys)

    def build_connector_meta(
        self,
        scheduled: dict[int, int],
        finished: Sequence[int],
        reqs: Sequence[RequestState],
        table_length: dict[int, int],
    ) -> list[int]:
        """``build_connector_meta``: the step's jobs (its loads, then a store job per request
        with chunks to store), which the (unsimulated) worker runs in this step.

        Args:
            scheduled: the requests scheduled this step (``num_scheduled_tokens``), each with its
                computed tokens once the step's are computed (``num_tokens_after_batch``).
            finished: the requests finished since the last step (``finished_req_ids``).
            reqs: every request's state.
            table_length: each scheduled request's block table length after this step's
                allocation (``_update_req_states``: the block ids the connector sees).
        """
        for r in scheduled:
            self.requests[r].num_blocks = table_length[r]
        jobs = self.current_load_jobs
        self.current_load_jobs = []
        jobs.extend(self._build_store_jobs(scheduled, finished, reqs))
        for r in finished:
            state = self.requests.get(r)
            if state is None:
                continue
            state.finished_signaled = True
            self.manager.on_request_finished(r)
            if not state.transfer_jobs:
                del self.requests[r]
        return jobs

    def _build_store_jobs(
        self, scheduled: dict[int, int], finished: Sequence[int], reqs: Sequence[RequestState]
    ) -> list[int]:
        """``_build_store_jobs``: per request, the chunks its computed prompt tokens fill that it
        has not offered yet (a finished request: up to its prompt) go to ``prepare_store``;
        the chunks stored become a job."""
        jobs: list[int] = []
        per_chunk = self.tokens_per_chunk
        for r in [*scheduled, *finished]:
            state = self.requests.get(r)
            if state is None:
                continue
            req = reqs[r]
            # a finished request: up to its last token's, never past its prompt
            after = scheduled[r] if r in scheduled else max(req.request.prompt_tokens, req.num_tokens - 1)
            # offload_prompt_only: the prompt's chunks alone
            offloadable = min(after, req.num_tokens, req.request.prompt_tokens)
            num_chunks = min(offloadable // per_chunk, state.num_blocks, self._num_keys(req))
            start = state.next_stored_chunk_idx
            if num_chunks <= start:
                state.next_stored_chunk_idx = max(start, num_chunks)
                continue
            stored = self.manager.prepare_store(r, [self._key(req, j) for j in range(start, num_chunks)])
            if stored is None:
                continue  # the tier cannot make room: offered again next step
            state.next_stored_chunk_idx = max(start, num_chunks)
            if not stored:
                continue
            job = self.next_job
            self.next_job += 1
            self.jobs[job] = _Job(r, stored, is_store=True)
            state.transfer_jobs.add(job)
            jobs.append(job)
            self.stats.stored_chunks += len(stored)
            self.stats.unpriced_out += len(stored)
        return jobs

    def update_connector_output(self, completed: Iterable[int]) -> list[int]:
        """``update_connector_output``: the jobs the worker reports finished; returns the
        requests whose load finished (``finished_recving``)."""
        received: list[int] = []
        for job_id in completed:
            job = self.jobs.pop(job_id)
            if job.is_store:
                self.manager.complete_store(job.keys)
            else:
                self.manager.complete_load(job.keys)
                self.chunks_being_loaded.difference_update(job.keys)
                received.append(job.request)
            state = self.requests[job.request]
            state.transfer_jobs.discard(job_id)
            if state.finished_signaled and not state.transfer_jobs:
                del self.requests[job.request]
        return received

    def held_chunks(self) -> int:
        """Chunks holding a key now (stored or being stored)."""
        return len(self.manager.ref_cnt)


__all__ = [
    "CHUNK_ALIGNMENT",
    "CpuOffloadingManager",
    "OffloadStats",
    "OffloadingConnectorScheduler",
    "check_offloadable",
    "chunk_bytes",
    "host_chunks",
]
