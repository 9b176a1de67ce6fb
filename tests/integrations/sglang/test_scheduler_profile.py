"""The ``sglang`` scheduler profile's pieces against SGLang 0.5.23's own code, on CPU.

- the radix cache (:mod:`kvcore.simulation.profiles.radix`) beside SGLang's ``RadixCache``
  (``create_simulated``, a counting allocator): the same random inserts, matches, locks and
  evictions over token sequences that share prefixes give the same matched and inserted
  lengths, sizes, evictable sizes and evicted tokens, at pages of 1, 4 and 16;
- the admission arithmetic beside SGLang's ``PrefillBudget``, ``SWAPrefillBudget`` and
  ``estimate_swa_kv_tokens``;
- the new_token_ratio constants beside SGLang's environment defaults, the ratio a retraction
  sets beside ``NewTokenRatioTracker.estimate_new_token_ratio_after_retract``.

(``ScheduleBatch`` and ``PrefillAdder`` themselves do not import without SGLang's serving
dependencies, ``openai`` among them, so the retraction order and the adder's loop are checked by
hand in ``tests/simulation/test_sglang_profile.py``.)
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from sglang.srt.environ import envs
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.prefill_budget import PrefillBudget, SWAPrefillBudget, estimate_swa_kv_tokens
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from kvcore import SizingContext, Workload, plan_kv_cache
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.simulation.profiles import sglang as profile
from kvcore.simulation.profiles.radix import RadixTree
from kvcore.simulation.workload import Request
from tests.helpers import full, mix, sliding


class _Allocator:
    """What ``RadixCache`` asks of its allocator: a device, and freeing (counted)."""

    device = "cpu"
    page_size = 1

    def __init__(self) -> None:
        self.freed = 0

    def free_segment(self, value, start_pos=0):
        self.freed += len(value)


def _sequences(rng: random.Random, count: int):
    """Token sequences of ``count`` requests: some share a prefix (of whole or partial pages)."""
    prefixes = {p: rng.randint(1, 60) for p in range(3)}
    out = []
    for _ in range(count):
        length = rng.randint(1, 120)
        prefix = rng.choice([None, 0, 1, 2])
        shared = min(prefixes[prefix], length) if prefix is not None else 0
        out.append((prefix, shared, length))
    return out


@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("seed", range(10))
def test_the_radix_tree_matches_sglangs_radix_cache_operation_for_operation(page, seed):
    rng = random.Random(seed * 100 + page)
    requests = _sequences(rng, 12)
    shared = [s // page * page for _, s, _ in requests]

    def token(r: int, i: int) -> int:
        prefix = requests[r][0]
        if i < requests[r][1] and prefix is not None:  # the prefix's own tokens, every page
            return 1_000_000 * (prefix + 1) + i
        return 10_000_000 + 10_000 * r + i

    def identity(r, i):
        return ("p", requests[r][0], i) if i < shared[r] else (r, i)

    def common(a, b):
        if requests[a][0] is None or requests[a][0] != requests[b][0]:
            return 0
        return min(shared[a], shared[b])

    freed = [0]
    ours = RadixTree(identity, common, lambda n: freed.__setitem__(0, freed[0] + n))
    allocator = _Allocator()
    sglang = RadixCache.create_simulated(mock_allocator=allocator, page_size=page)

    def key(r, length):
        return RadixKey([token(r, i) for i in range(length)])

    held = []  # (our node, SGLang's node)
    for _ in range(400):
        op = rng.random()
        r = rng.randrange(len(requests))
        length = rng.randint(0, requests[r][2]) // page * page
        if op < 0.35:
            found = ours.insert(r, length)
            assert found == sglang.insert(InsertParams(key=key(r, length))).prefix_len
        elif op < 0.7:
            matched, node = ours.match(r, length)
            result = sglang.match_prefix(MatchPrefixParams(key=key(r, length)))
            assert matched == result.device_prefix_len
            if rng.random() < 0.5 and matched:
                ours.lock(node)
                sglang.inc_lock_ref(result.last_device_node)
                held.append((node, result.last_device_node))
        elif op < 0.85 and held:
            node, theirs = held.pop(rng.randrange(len(held)))
            ours.unlock(node)
            sglang.dec_lock_ref(theirs)
        else:
            tokens = rng.randint(1, 150)
            assert ours.evict(tokens) == sglang.evict(EvictParams(num_tokens=tokens)).num_tokens_evicted
        assert ours.size == sglang.total_size()
        assert ours.evictable == sglang.evictable_size()
        assert freed[0] == allocator.freed


class _Cache:
    """What ``PrefillBudget`` reads of the radix cache."""

    def __init__(self, evictable):
        self._evictable = evictable

    def supports_mamba(self):
        return False

    def evictable_size(self):
        return self._evictable


class _Pool:
    def __init__(self, page, available):
        self.page_size = page
        self._available = available

    def available_size(self):
        return self._available


REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))


def _simulator(page, tokens, requests, window=0):
    if window:
        specs = mix((1, full(block_size=page)), (1, sliding(window, block_size=page)))
        plan = plan_kv_cache(
            specs,
            tokens * 8192,
            SizingContext(max_model_len=2048, max_num_batched_tokens=512),
            registry=REGISTRY,
            policy="kind_pools",
        )
    else:
        plan = plan_kv_cache(
            {"model.layers.0": full(block_size=page)},
            2**34,
            SizingContext(max_model_len=2048, max_num_batched_tokens=512),
            registry=REGISTRY,
            num_blocks=tokens // page,
        )
    return profile.SglangProfile().simulator(
        plan, Workload(tuple(requests), name="x"), max_num_batched_tokens=None, prefix_caching=True
    )


@pytest.mark.parametrize("page", [1, 16])
def test_the_admission_budget_is_sglangs_prefill_budget(page):
    """Running requests, a free pool and a cached (evictable) share: the remaining tokens, and
    what admitting a request reserves, are SGLang's ``PrefillBudget`` figures."""
    sim = _simulator(page, 4096, [Request(i, 100 + 37 * i, 300 + 11 * i) for i in range(3)])
    sim.step()  # admits all three
    for _ in range(5):
        sim.step()
    ratio = sim.ratio
    ours = profile._Budget(sim, ratio)
    theirs = PrefillBudget(_Pool(page, sim.full_free * page), _Cache(sim.tree.evictable))
    theirs.total_offset += sum(
        min(sim._max_new[r] - sim._outputs[r], envs.SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.get()) * ratio
        for r in sim.running
    )
    assert ours.total() == pytest.approx(theirs.remaining_total)
    assert ours.current() == pytest.approx(theirs.remaining_current)
    ours.reserve(1000, 200, 512)
    theirs.reserve(1000, 200, extra_tokens=0)
    assert ours.total() == pytest.approx(theirs.remaining_total)
    assert ours.current() == pytest.approx(theirs.remaining_current)
    sim.window = 128  # the sliding estimate, as for a sliding pool of window 128
    for extend, max_new, chunk in [(10, 5, 512), (1000, 200, 256), (300, 0, None), (0, 90, None)]:
        assert sim._swa_tokens(extend, max_new, chunk) == estimate_swa_kv_tokens(
            extend, max_new, sliding_window_size=128, page_size=page, allocation_limit=chunk
        )


class _SwaAllocator:
    """What ``SWAPrefillBudget`` reads of SGLang's ``SWATokenToKVPoolAllocator``."""

    def __init__(self, sim):
        self.page_size = sim.page
        self.size_swa = sim.pools.swa_tokens
        self._full = sim.full_free * sim.page
        self._swa = sim.swa_free * sim.page

    def full_available_size(self):
        return self._full

    def swa_available_size(self):
        return self._swa


class _SwaCache:
    def __init__(self, sim):
        self.sliding_window_size = sim.window
        self._evictable = sim.tree.evictable

    def full_evictable_size(self):
        return self._evictable

    def swa_evictable_size(self):
        return 0  # the profile's tree keeps no sliding tokens


@pytest.mark.parametrize("page", [1, 16])
def test_the_sliding_admission_is_sglangs_swa_prefill_budget(page):
    """A sliding model mid-run: whether a request is admitted, and the chunk it may take, are
    what SGLang's ``SWAPrefillBudget.check_prefill`` says, a request that never fits the sliding
    pool whole included; so are the budgets left after admitting one."""
    sim = _simulator(page, 3000, [Request(i, 200 + 50 * i, 300) for i in range(4)], window=128)
    for _ in range(40):
        sim.step()
    ours = profile._Budget(sim, sim.ratio)
    theirs = SWAPrefillBudget(_SwaAllocator(sim), _SwaCache(sim))
    theirs.total_offset = ours.total_offset
    size = sim.pools.swa_tokens
    # fits; fits; chunk-limited; too much now (transient: waits); never fits whole (capped chunk)
    cases = [(10, 5, 512), (300, 200, 512), (900, 100, 256), (880, 100, 1000), (1000, 0, 1200)]
    cases += [(size, 50, 4096), (2000, 50, 4096), (4 * size, 0, 512)]
    outcomes = set()
    for extend, max_new, chunk in cases:
        total = extend + max_new + page
        expected = theirs.check_prefill(
            extend_input_len=extend,
            total_tokens=total,
            max_new_tokens=max_new,
            input_tokens=extend,
            swa_host_hit_length=0,
            chunk_limit=chunk,
        )
        fits, limit = ours.check_prefill(extend, max_new, total, chunk)
        assert (fits, limit if fits else None) == expected
        outcomes.add("capped" if fits and limit < chunk else str(fits))
    assert outcomes == {"True", "False", "capped"}  # every branch was compared
    ours.reserve(300, 200, 512)
    theirs.reserve(300, 200, chunk_limit=512)
    assert ours.total() == pytest.approx(theirs.remaining_total)
    assert ours.swa() == theirs.remaining_swa


def test_the_ratio_constants_and_the_retraction_are_sglangs():
    assert envs.SGLANG_INIT_NEW_TOKEN_RATIO.get() == profile.INIT_NEW_TOKEN_RATIO
    assert envs.SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR.get() == profile.MIN_NEW_TOKEN_RATIO_FACTOR
    assert envs.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS.get() == profile.NEW_TOKEN_RATIO_DECAY_STEPS
    assert envs.SGLANG_RETRACT_DECODE_STEPS.get() == profile.RETRACT_DECODE_STEPS
    assert envs.SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.get() == profile.CLIP_MAX_NEW_TOKENS
    assert envs.SGLANG_SWA_EVICTION_INTERVAL.get() == profile.SWA_EVICTION_INTERVAL
    # the ratio after a retraction, over the requests left
    reqs = [
        SimpleNamespace(output_ids=[0] * out, sampling_params=SimpleNamespace(max_new_tokens=new))
        for out, new in [(91, 100), (3, 50), (40, 41)]
    ]
    expected = NewTokenRatioTracker.estimate_new_token_ratio_after_retract(reqs)
    ours = min(1.0, (91 + 3 + 40 + profile.RETRACT_DECODE_STEPS * 3) / (100 + 50 + 41 + 1))
    assert ours == pytest.approx(expected)
