"""Planning several ranks without torch.distributed: layout, stages, merging, per-rank plans."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kvcore import (
    InsufficientMemoryError,
    InvalidInputError,
    InvalidSpecError,
    SizingContext,
    SpecMismatchError,
    plan_kv_cache,
)
from kvcore.planning.invariants import check_plan
from kvcore.planning.ranks import (
    Parallelism,
    merge_rank_specs,
    partition_layers,
    plan_for_ranks,
    project_groups,
    simulate_rank_specs,
    tightest_rank,
)
from tests.helpers import full, mix, mla, sliding

CTX = SizingContext(max_model_len=4096)
GiB = 2**30


def test_rank_layout_is_megatron_style_tp_innermost():
    layout = Parallelism(tp_size=2, pp_size=3)
    assert layout.world_size == 6
    assert [(layout.pp_rank(r), layout.tp_rank(r)) for r in range(6)] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    assert list(layout.stage_ranks(1)) == [2, 3]
    assert layout.describe(3) == "rank 3 (pp stage 1, tp rank 1)"
    assert Parallelism(tp_size=4).describe(3) == "rank 3"
    assert Parallelism(pp_size=4).describe(3) == "rank 3 (pp stage 3)"
    assert Parallelism.for_world(8, tp_size=4) == Parallelism(tp_size=4, pp_size=2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Parallelism.for_world(6, tp_size=4), "6 ranks cannot form pipeline stages of tp_size=4"),
        (lambda: Parallelism(tp_size=0), "'tp_size' must be an int >= 1 (got 0)"),
        (lambda: Parallelism.for_world(0), "world size must be an int >= 1"),
        (lambda: partition_layers(["a", "b"], 3), "2 layer(s) cannot fill 3 pipeline stages"),
    ],
)
def test_bad_layouts_are_input_errors(call, message):
    with pytest.raises(InvalidInputError) as info:
        call()
    assert message in str(info.value)


def test_stages_are_contiguous_and_the_first_ones_take_the_remainder():
    names = [f"l{i}" for i in range(10)]
    stages = partition_layers(names, 4)
    assert [len(s) for s in stages] == [3, 3, 2, 2]
    assert [name for stage in stages for name in stage] == names


@given(st.integers(1, 200), st.integers(1, 16))
def test_partition_covers_every_layer_once_in_order_and_balances(n, pp):
    if pp > n:
        return
    stages = partition_layers([str(i) for i in range(n)], pp)
    assert [name for stage in stages for name in stage] == [str(i) for i in range(n)]
    sizes = [len(stage) for stage in stages]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_simulated_ranks_hold_their_stage_and_tp_ranks_repeat_it():
    specs = mix((2, full()), (4, sliding(128)))
    ranks = simulate_rank_specs(specs, Parallelism(tp_size=2, pp_size=2))
    names = list(specs)
    assert [list(r) for r in ranks] == [names[:3], names[:3], names[3:], names[3:]]
    assert merge_rank_specs(ranks, Parallelism(tp_size=2, pp_size=2)) == specs


def test_one_rank_is_plan_kv_cache(registry):
    specs = mix((3, full()), (9, sliding(512)))
    (plan,) = plan_for_ranks([specs], [GiB], CTX, registry=registry)
    assert plan == plan_kv_cache(specs, GiB, CTX, registry=registry)


def test_pipeline_stages_with_unequal_kinds_get_their_own_bytes_per_block(registry):
    # stage 0: two full-attention layers (64 KiB pages); stage 1: two sliding-window layers of
    # an MLA page's size (18 KiB) with a window longer than any request: as many pages as MLA,
    # but another kind, so that no group mixes them (full + MLA: the test below)
    small = sliding(8192, heads=1, head_size=288)
    assert small.page_size_bytes == mla().page_size_bytes
    ranks = [{"a": full(), "b": full()}, {"c": small, "d": small}]
    plans = plan_for_ranks(ranks, [GiB, GiB], CTX, registry=registry)
    whole = plan_kv_cache({**ranks[0], **ranks[1]}, GiB, CTX, registry=registry)
    assert [g.layer_names for g in plans[0].groups] == [("a",), ("b",), ()]
    assert [g.layer_names for g in plans[1].groups] == [(), (), ("c", "d")]
    # the policy's row is 2 small pages; a 64 KiB full-attention page spans two rows
    assert plans[1].bytes_per_block == 2 * small.page_size_bytes == whole.bytes_per_block
    assert plans[0].bytes_per_block == full().page_size_bytes // 2
    assert plans[0].num_blocks == plans[1].num_blocks == GiB // plans[1].bytes_per_block
    for plan in plans:
        check_plan(plan)
        assert plan.blocks_per_request() == whole.blocks_per_request()  # same groups everywhere
        assert plan.kv_cache_bytes <= plan.available_memory_bytes
    assert {t for plan in plans for t in plan.layer_names} == {"a", "b", "c", "d"}


def test_pipeline_stages_of_one_retention_share_a_mixed_page_group(registry):
    # full attention and MLA keep every token: one group of both pages, each stage's row its own
    ranks = [{"a": full(), "b": full()}, {"c": mla(), "d": mla()}]
    plans = plan_for_ranks(ranks, [GiB, GiB], CTX, registry=registry)
    assert [g.layer_names for g in plans[0].groups] == [("a", "b")]
    assert [g.layer_names for g in plans[1].groups] == [("c", "d")]
    assert plans[0].bytes_per_block == 2 * full().page_size_bytes
    assert plans[1].bytes_per_block == 2 * mla().page_size_bytes
    assert plans[0].num_blocks == plans[1].num_blocks == GiB // plans[0].bytes_per_block
    for plan in plans:
        check_plan(plan)
        assert plan.groups[0].spec_of(plan.layer_names[0]) == {**ranks[0], **ranks[1]}[plan.layer_names[0]]


def test_the_smallest_budget_over_bytes_per_block_sets_every_rank_s_block_count(registry):
    ranks = [{"a": full(), "b": full()}, {"c": full()}]  # stage 1 needs half the bytes per block
    plans = plan_for_ranks(ranks, [GiB, GiB // 4], CTX, registry=registry)
    per_block = [p.bytes_per_block for p in plans]
    assert per_block == [2 * full().page_size_bytes, full().page_size_bytes]
    assert plans[0].num_blocks == plans[1].num_blocks == min(GiB // per_block[0], GiB // 4 // per_block[1])
    assert tightest_rank(plans) == 1


def test_forced_blocks_over_one_rank_s_budget_name_that_rank(registry):
    ranks = [{"a": full()}, {"a": full()}, {"b": full()}, {"b": full()}]
    page = full().page_size_bytes
    memory = [GiB, GiB, 100 * page, GiB]
    with pytest.raises(InsufficientMemoryError) as info:
        plan_for_ranks(
            ranks, memory, SizingContext(max_model_len=1024), registry=registry, num_blocks=500, tp_size=2
        )
    assert str(info.value).startswith("rank 2 (pp stage 1, tp rank 0): num_blocks=500 needs")
    assert "at most 100 blocks fit" in str(info.value)
    plans = plan_for_ranks(
        ranks, memory, SizingContext(max_model_len=1024), registry=registry, num_blocks=100, tp_size=2
    )
    assert {p.num_blocks for p in plans} == {100}


def test_admission_names_the_rank_with_the_fewest_blocks(registry):
    ranks = [{"a": full()}, {"b": full()}]
    with pytest.raises(InsufficientMemoryError) as info:
        plan_for_ranks(ranks, [GiB, 10 * full().page_size_bytes], CTX, registry=registry)
    assert str(info.value).startswith("rank 1 (pp stage 1) has the fewest blocks: one request of 4096 tokens")
    assert info.value.largest_fitting_len == 160


def test_tensor_parallel_ranks_must_report_equal_specs_naming_layer_and_ranks(registry):
    ranks = [
        {"x": full(), "y": full(heads=8)},
        {"x": full(), "y": full(heads=8)},
        {"x": full(), "y": full(heads=4)},
    ]
    with pytest.raises(SpecMismatchError) as info:
        plan_for_ranks(ranks, [GiB] * 3, CTX, registry=registry, tp_size=3)
    assert str(info.value).startswith(
        "layer 'y' (reported by ranks 0, 1, 2): rank 2 reports full_attention(block_size=16, num_kv_heads=4"
    )
    assert "but rank 0 reports full_attention(block_size=16, num_kv_heads=8" in str(info.value)
    assert "differ in num_kv_heads (8 vs 4)" in str(info.value)


def test_tensor_parallel_ranks_must_hold_the_same_layers(registry):
    ranks = [{"x": full()}, {"x": full()}, {"y": full(), "z": full()}, {"y": full()}]
    with pytest.raises(
        SpecMismatchError, match=r"layer 'z' is held by rank 2 but not by rank 3 of pipeline stage 1"
    ):
        plan_for_ranks(ranks, [GiB] * 4, CTX, registry=registry, tp_size=2)


def test_stages_must_own_disjoint_layers(registry):
    ranks = [{"x": full(), "y": full()}, {"y": full()}]
    with pytest.raises(
        SpecMismatchError, match=r"'y' is held by pipeline stages 0 \(rank 0\) and 1 \(rank 1\)"
    ):
        plan_for_ranks(ranks, [GiB] * 2, CTX, registry=registry)


@pytest.mark.parametrize(
    ("ranks", "memory", "kwargs", "error", "message"),
    [
        ([], [], {}, InvalidInputError, "no ranks reported"),
        ([{"x": full()}] * 2, [GiB], {}, InvalidInputError, "specs from 2 worker(s) but memory from 1"),
        ([{"x": full()}] * 3, [GiB] * 3, {"tp_size": 2}, InvalidInputError, "3 ranks cannot form"),
        ([{"x": full()}, {}], [GiB] * 2, {}, InvalidSpecError, "rank 1 (pp stage 1): there are no layers"),
        (
            [{"x": full()}, {"y": full()}],
            [GiB, -1],
            {},
            InvalidInputError,
            "rank 1 (pp stage 1): available memory",
        ),
    ],
)
def test_bad_rank_inputs(registry, ranks, memory, kwargs, error, message):
    with pytest.raises(error) as info:
        plan_for_ranks(ranks, memory, CTX, registry=registry, **kwargs)
    assert message in str(info.value)


def test_projection_keeps_every_group_and_the_order(registry):
    plan = plan_kv_cache(mix((4, full()), (12, sliding(128))), GiB, CTX, registry=registry)
    own = [name for name in plan.layer_names if name.endswith(("1", "2", "3"))]
    projected = project_groups(plan.groups, own)
    assert len(projected) == len(plan.groups)
    for whole, part in zip(plan.groups, projected, strict=True):
        assert part.spec == whole.spec and part.blocks_per_page == whole.blocks_per_page
        assert list(part.layer_names) == [n for n in whole.layer_names if n in own]


def test_tensor_parallel_ranks_get_the_plan_of_the_smallest_budget(registry):
    rank0 = {"a": full(), "b": sliding(128)}
    plans = plan_for_ranks([rank0, dict(rank0)], [GiB, GiB // 2], CTX, registry=registry, tp_size=2)
    assert plans[tightest_rank(plans)] == plan_kv_cache(rank0, GiB // 2, CTX, registry=registry)
    assert plans[0].num_blocks == plans[1].num_blocks
    with pytest.raises(
        SpecMismatchError, match="the tensor-parallel ranks of a stage must hold the same layers"
    ):
        plan_for_ranks([{"a": full()}, {"b": full()}], [GiB] * 2, CTX, registry=registry, tp_size=2)
