"""Aliasing safety: for random hybrid mixes, the shared-buffer plan allocated on the CPU and
driven through the block pool never lets two live pages share a byte.

The same harness must fail on a plan that aliases two layers of one group, and on a pool that
hands one block id to two owners; otherwise the property proves nothing.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given, strategies as st

from kvcore import (
    PlanValidationError,
    SizingContext,
    allocate,
    plan_kv_cache,
)
from kvcore.planning.invariants import plan_problems
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.testing import strategies as kst
from tests.broken import double_booking_pool, unchecked_plan
from tests.helpers import full, sliding
from tests.runtime._kinds import ToyStateSpec, toy_state_registry
from tests.runtime._workload import run_workload

DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])


def _attention(cls, **extra):
    return st.builds(
        cls,
        block_size=st.sampled_from([2, 4, 8, 16]),
        num_kv_heads=st.integers(1, 2),
        head_size=st.sampled_from([4, 8, 16]),
        dtype=DTYPES,
        **extra,
    )


SMALL_SPECS = st.one_of(
    _attention(FullAttentionSpec),
    _attention(SlidingWindowSpec, sliding_window=st.integers(1, 64)),
    _attention(ChunkedLocalAttentionSpec, attention_chunk_size=st.integers(1, 64)),
    st.builds(
        MLAAttentionSpec,
        block_size=st.sampled_from([2, 4, 8, 16]),
        kv_lora_rank=st.sampled_from([8, 16]),
        qk_rope_head_dim=st.sampled_from([4, 8]),
        dtype=DTYPES,
    ),
    st.builds(
        ToyStateSpec, block_size=st.just(1), conv=st.integers(1, 8), ssm=st.integers(1, 48), dtype=DTYPES
    ),
)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 64), st.just(0)),
        st.tuples(st.just("step"), st.integers(0, 7), st.integers(1, 64)),
        st.tuples(st.just("finish"), st.integers(0, 7), st.just(0)),
    ),
    min_size=8,
    max_size=24,
).map(lambda ops: [("arrive", 64, 0), *ops])


@pytest.fixture(scope="module")
def registry():
    return toy_state_registry()


def _plan(specs, context, registry, extra_requests, spare, policy="shared_buffer"):
    probe = plan_kv_cache(
        specs, 1 << 40, context, registry=registry, policy=policy, num_blocks=1, check_fit=False
    )
    need = probe.blocks_per_request()
    return plan_kv_cache(
        specs,
        1 << 40,
        context,
        registry=registry,
        policy=policy,
        num_blocks=need * (1 + extra_requests) + spare,
    )


@given(
    specs=kst.layer_specs(max_layers=8, max_distinct=3, spec_strategy=SMALL_SPECS),
    max_model_len=st.integers(8, 128),
    step=st.integers(1, 48),
    extra_requests=st.integers(0, 2),
    spare=st.integers(0, 7),
    ops=OPS,
)
def test_live_pages_never_share_bytes(registry, specs, max_model_len, step, extra_requests, spare, ops):
    context = SizingContext(max_model_len=max_model_len, max_num_batched_tokens=step)
    plan = _plan(specs, context, registry, extra_requests, spare)
    ops = [(kind, min(a, step) if kind == "arrive" else a, min(b, step)) for kind, a, b in ops]
    assert run_workload(plan, registry, ops) == []


@given(
    specs=kst.layer_specs(max_layers=8, max_distinct=3, spec_strategy=SMALL_SPECS),
    max_model_len=st.integers(8, 128),
    step=st.integers(1, 48),
    extra_requests=st.integers(0, 2),
    spare=st.integers(0, 7),
    ops=OPS,
)
def test_live_pages_never_share_bytes_in_a_unified_pool(
    registry, specs, max_model_len, step, extra_requests, spare, ops
):
    """unified_pool: each kind's page a run of rows of its own length, the shortest from the
    low end of the pool and the others from the high end."""
    context = SizingContext(max_model_len=max_model_len, max_num_batched_tokens=step)
    plan = _plan(specs, context, registry, extra_requests, spare, policy="unified_pool")
    ops = [(kind, min(a, step) if kind == "arrive" else a, min(b, step)) for kind, a, b in ops]
    assert run_workload(plan, registry, ops) == []


def _gemma_like(registry):
    specs = {
        "model.layers.0": sliding(16, block_size=4, heads=1, head_size=8, dtype="float32"),
        "model.layers.1": sliding(16, block_size=4, heads=1, head_size=8, dtype="float32"),
        "model.layers.2": full(block_size=4, heads=1, head_size=8, dtype="float32"),
        "model.layers.3": full(block_size=4, heads=1, head_size=8, dtype="float32"),
    }
    return _plan(specs, SizingContext(max_model_len=64, max_num_batched_tokens=16), registry, 1, 0)


BUSY = [("arrive", 16, 0), ("arrive", 16, 0), ("step", 0, 16), ("step", 1, 16), ("step", 0, 8)]


def test_the_workload_catches_a_plan_that_aliases_two_layers_of_one_group(registry):
    plan = _gemma_like(registry)
    assert run_workload(plan, registry, BUSY) == []
    group = next(g for g in plan.groups if len(g.layer_names) >= 2)
    first, second = group.layer_names[:2]
    tensors = []
    for tensor in plan.tensors:  # move `second` onto `first`'s bytes
        names = tuple(n for n in tensor.shared_by if n != second)
        if first in names:
            names += (second,)
        tensors.append(attrs.evolve(tensor, shared_by=names))
    kept = [t for t in tensors if t.shared_by]
    with pytest.raises(PlanValidationError, match="must be in different groups"):
        attrs.evolve(plan, tensors=kept)  # a plan refuses it when built ...
    broken = unchecked_plan(plan, tensors=tuple(kept))  # ... so build it behind the plan's back
    assert plan_problems(broken), "the invariant checker should flag it too"
    with pytest.raises(PlanValidationError):
        allocate(broken, "cpu", registry=registry)
    problems = run_workload(broken, registry, BUSY)
    assert problems and "was overwritten" in problems[0]


def test_the_workload_catches_a_pool_that_hands_a_block_to_two_owners(registry):
    plan = _gemma_like(registry)
    problems = run_workload(plan, registry, BUSY, pool_factory=double_booking_pool, check_accounting=False)
    assert problems and "was overwritten" in problems[0]


def test_a_shifted_tensor_overlapping_its_neighbour_is_caught(registry):
    plan = _gemma_like(registry)
    row = plan.bytes_per_block
    lane = next(t for t in plan.tensors if t.offset > 0)
    shifted = attrs.evolve(lane, offset=lane.offset - 4)  # 4 bytes into the previous layer's page
    broken = attrs.evolve(plan, tensors=[shifted if t is lane else t for t in plan.tensors])
    assert row % 4 == 0
    assert any("pages of one group" in p for p in plan_problems(broken))
    with pytest.raises(PlanValidationError, match="handed to allocate"):
        allocate(broken, "cpu", registry=registry)
    problems = run_workload(broken, registry, BUSY)  # allocates without the check
    assert problems and "was overwritten" in problems[0]


def test_two_run_lengths_growing_from_the_two_ends_never_share_bytes(registry):
    """unified_pool's Gemma-3 shape: 26 sliding and 5 full-attention layers of one page share a
    row of one page, so both kinds are runs (26 and 5 ids), the 5s from the low end."""
    tiny = {"block_size": 4, "heads": 1, "head_size": 8, "dtype": "float32"}
    specs = {f"model.layers.{i}": (full(**tiny) if i % 6 == 5 else sliding(16, **tiny)) for i in range(31)}
    plan = _plan(
        specs, SizingContext(max_model_len=64, max_num_batched_tokens=16), registry, 2, 3, "unified_pool"
    )
    assert sorted(g.blocks_per_page for g in plan.groups) == [5, 26]
    ops = [("arrive", 16, 0), ("arrive", 16, 0), ("arrive", 8, 0), ("step", 0, 16), ("step", 1, 16)]
    ops += [("step", 2, 8), ("finish", 1, 0), ("step", 0, 16), ("arrive", 16, 0), ("step", 2, 16)]
    assert run_workload(plan, registry, ops) == []
