"""Joint peaks against a brute-force walk of every token position.

A request of ``L`` tokens runs in steps of at most ``T`` tokens; a step that starts with ``c``
tokens cached holds ``len(live_pages(min(c + T, L), c))`` pages of each kind. The walk here
visits every ``c`` in ``0 .. L - 1`` and adds the kinds up at each; :func:`kvcore.peaks.joint_peak`
must give its largest sum exactly (for kinds whose growth it knows) and never less (for a kind
it can only bound), and each kind's ``max_num_blocks`` must be the largest count alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import assume, given, strategies as st

from kvcore import BlockPool, Registry, peaks, plan_kv_cache
from kvcore.plugins.attention import AttentionSpec, attention_specs
from kvcore.plugins.chunked_local_attention import chunked_local_attention_specs
from kvcore.plugins.sliding_window import sliding_window_specs
from kvcore.runtime.block_pool import NULL_PAGE
from kvcore.spec import KVCacheSpec, SizingContext, cdiv
from kvcore.testing import strategies as kst
from tests.helpers import BUILTIN_KINDS

pytestmark = pytest.mark.property


@attrs.frozen(kw_only=True)
class StridedWindowSpec(AttentionSpec):
    """A third-party kind of the default ``live_pages`` that frees by a rule of its own: it
    keeps the last ``window`` tokens, freed ``stride`` tokens at a time."""

    kind = "test.strided_window"

    window: int = attrs.field(validator=attrs.validators.ge(1))
    stride: int = attrs.field(validator=attrs.validators.ge(1))

    def first_retained_token(self, num_tokens: int) -> int:
        return max(0, num_tokens - self.window + 1) // self.stride * self.stride


@attrs.frozen(kw_only=True)
class RingSpec(AttentionSpec):
    """A third-party kind that only overrides ``live_pages``: a ring of at most ``ring`` pages
    of the newest tokens (its growth is unknown to the planner)."""

    kind = "test.ring"

    ring: int = attrs.field(validator=attrs.validators.ge(1))

    def live_pages(self, num_tokens: int, num_computed_tokens: int = 0) -> range:
        stop = cdiv(num_tokens, self.block_size)
        return range(max(0, min(stop, cdiv(num_computed_tokens + 1, self.block_size)) - self.ring), stop)

    def max_num_blocks(self, context: SizingContext) -> int:
        return max(
            len(self.live_pages(min(c + context.max_tokens_per_step, context.max_model_len), c))
            for c in range(context.max_model_len)
        )


def _third_party(
    cls: type[AttentionSpec], **fields: st.SearchStrategy[int]
) -> st.SearchStrategy[KVCacheSpec]:
    return attention_specs(cls, block_sizes=kst.block_sizes(), dtypes=kst.dtypes(), **fields)


STRIDED = _third_party(StridedWindowSpec, window=st.integers(1, 300), stride=st.integers(1, 40))
RING = _third_party(RingSpec, ring=st.integers(1, 6))
#: windows and chunks about as long as the requests, so that they slide and end within them
BUILT_IN = kst.specs(
    list(BUILTIN_KINDS),
    strategies={
        "sliding_window": sliding_window_specs(
            block_sizes=kst.block_sizes(), dtypes=kst.dtypes(), max_window=300
        ),
        "chunked_local_attention": chunked_local_attention_specs(
            block_sizes=kst.block_sizes(), dtypes=kst.dtypes(), max_chunk=300
        ),
    },
)
CONTEXTS = kst.sizing_contexts(
    max_model_len=st.integers(1, 700), max_num_batched_tokens=st.integers(1, 400), serving=True
)


def walk(weighted: Sequence[tuple[KVCacheSpec, int]], context: SizingContext) -> int:
    """The brute force: every step start, every kind added up at it."""
    length, per_step = context.max_model_len, context.max_tokens_per_step
    served = [(spec.sized_for(context), weight) for spec, weight in weighted]
    return max(
        sum(w * len(spec.live_pages(min(c + per_step, length), c)) for spec, w in served)
        for c in range(length)
    )


@given(
    mix=st.lists(st.tuples(st.one_of(BUILT_IN, STRIDED), st.integers(1, 5)), min_size=1, max_size=4),
    context=CONTEXTS,
)
def test_the_joint_peak_is_the_walks_largest_sum(mix, context):
    assert peaks.joint_peak(mix, context) == walk(mix, context)
    step = peaks.worst_step(mix, context)
    length, per_step = context.max_model_len, context.max_tokens_per_step
    held = sum(
        w * len(spec.sized_for(context).live_pages(min(step + per_step, length), step)) for spec, w in mix
    )
    assert held == peaks.joint_peak(mix, context)  # the step it names holds the peak


@given(spec=BUILT_IN, context=CONTEXTS)
def test_max_num_blocks_is_the_largest_live_pages(spec, context):
    # the built-in kinds' closed forms; a third-party kind that frees by its own rule and keeps
    # the default max_num_blocks (every page of the request) only bounds it
    assert spec.max_num_blocks(context) == walk([(spec, 1)], context)


@given(
    mix=st.lists(st.tuples(st.one_of(BUILT_IN, RING), st.integers(1, 5)), min_size=1, max_size=4),
    context=CONTEXTS,
)
def test_a_kind_of_unknown_growth_is_bounded_never_under(mix, context):
    peak = peaks.joint_peak(mix, context)
    assert walk(mix, context) <= peak <= sum(w * s.max_num_blocks(context) for s, w in mix)


@given(
    mix=st.lists(st.tuples(st.one_of(BUILT_IN, STRIDED), st.integers(1, 5)), min_size=1, max_size=4),
    context=CONTEXTS,
    walk_limit=st.integers(0, 8),
)
def test_a_cut_short_walk_still_bounds_the_peak(mix, context, walk_limit, monkeypatch_module):
    monkeypatch_module.setattr(peaks, "MAX_WALK", walk_limit)
    peaks._peak.cache_clear()
    try:
        assert peaks.joint_peak(mix, context) >= walk(mix, context)
    finally:
        monkeypatch_module.undo()
        peaks._peak.cache_clear()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@given(
    distinct=st.lists(st.one_of(BUILT_IN, STRIDED), min_size=1, max_size=3),
    counts=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    context=kst.sizing_contexts(
        max_model_len=st.integers(1, 400), max_num_batched_tokens=st.integers(1, 200)
    ),
    chunks=st.lists(st.integers(1, 200), max_size=30),
)
def test_a_pool_never_holds_more_than_the_plan_counts(distinct, counts, context, chunks):
    registry = Registry.default(autoload=False)
    specs = {f"l{i}.{j}": spec for i, spec in enumerate(distinct) for j in range(counts[i])}
    probe = plan_kv_cache(specs, 2**34, context, registry=registry, policy="shared_buffer")
    peak = probe.blocks_per_request()
    # pages of one block id each: runs of several ids may not pack into exactly the peak (their
    # alignment is the pool's business, not what a request holds)
    assume(all(g.blocks_per_page == 1 for g in probe.groups))
    # a pool of one request's worth of blocks (the budget's count would be millions of ids)
    plan = plan_kv_cache(
        specs, 2**34, context, registry=registry, policy="shared_buffer", num_blocks=max(peak, 1)
    )
    length, per_step = context.max_model_len, context.max_tokens_per_step
    # the drawn chunking, then the worst one: steps that start where the groups hold the most
    worst = peaks.worst_step([(g.spec, g.blocks_per_page) for g in plan.groups], plan.context)
    drawn = [0]
    for chunk in [*chunks, *[per_step] * length]:
        if drawn[-1] >= length:
            break
        drawn.append(min(drawn[-1] + min(chunk, per_step), length))
    aligned = sorted({0, *range(worst % per_step or per_step, length, per_step), length})
    most = []
    for bounds in (drawn, aligned):
        pool = BlockPool(plan)
        pool.reserve("r", 0)
        held_most = 0
        for start, end in itertools.pairwise(bounds):
            pool.release_stale("r", start)
            pool.reserve("r", end)
            held = sum(
                g.blocks_per_page * sum(page != NULL_PAGE for page in pool.block_table("r", i))
                for i, g in enumerate(plan.groups)
            )
            held_most = max(held_most, held)
        assert held_most <= peak  # the reservation is never short
        most.append(held_most)
    assert most[1] == peak  # and the worst chunking reaches it
