"""The one plan check: structure, budget and live pages, exact against a page-by-page oracle."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import assume, given, strategies as st

from kvcore import KVCacheGroup, KVCachePlan, KVCacheTensor, PlanValidationError, SizingContext
from kvcore.planning.invariants import check_plan, overlap_problems, plan_problems
from tests.helpers import full

#: Requests of one token: the plans here have a few blocks, and the capacity rule (one request
#: must fit) is not what they test.
CTX = SizingContext(max_model_len=1)


def _spec(block_size):
    return full(block_size=block_size, heads=1, head_size=1, dtype="float32")  # page: 8 x block bytes


def _oracle(plan):
    """Whether two pages that may be live at once share a byte, page by page (small plans)."""
    group_of = {n: gi for gi, g in enumerate(plan.groups) for n in g.layer_names}
    pages = []
    for ti, tensor in enumerate(plan.tensors):
        for name in tensor.shared_by:
            gi = group_of[name]
            group = plan.groups[gi]
            size, span = group.spec.page_size_bytes, group.blocks_per_page
            memory = 0 if plan.single_buffer else ti
            for j in range(plan.num_blocks // span):
                start = tensor.offset + j * tensor.page_stride
                pages.append((memory, start, start + size, gi, j * span, (j + 1) * span))
    for i, (m1, s1, e1, g1, a1, b1) in enumerate(pages):
        for m2, s2, e2, g2, a2, b2 in pages[i + 1 :]:
            if m1 == m2 and s1 < e2 and s2 < e1 and (g1 == g2 or not (a1 < b2 and a2 < b1)):
                return True
    return False


@st.composite
def small_plans(draw):
    """Plans of 1-3 groups and a few tensors with random offsets, strides and sharers."""
    num_groups = draw(st.integers(1, 3))
    groups = []
    names = []
    for gi in range(num_groups):
        layers = tuple(f"g{gi}l{i}" for i in range(draw(st.integers(1, 3))))
        names += [(gi, name) for name in layers]
        groups.append(
            KVCacheGroup(
                layer_names=layers,
                spec=_spec(draw(st.sampled_from([1, 2, 3]))),
                blocks_per_page=draw(st.sampled_from([1, 1, 2, 3])),
            )
        )
    num_blocks = draw(st.integers(1, 7))
    single = draw(st.booleans())
    # each layer gets a tensor; layers of different groups may share one
    tensors = []
    pending = list(names)
    while pending:
        gi, name = pending.pop(0)
        sharers = [name]
        taken = {gi}
        for other in list(pending):
            if other[0] not in taken and draw(st.booleans()):
                sharers.append(other[1])
                taken.add(other[0])
                pending.remove(other)
        page = max(groups[g].spec.page_size_bytes for g in taken)
        pages = min(num_blocks // groups[g].blocks_per_page for g in taken)
        stride = page + draw(st.sampled_from([0, 0, 8, 16, page]))
        offset = draw(st.integers(0, 12)) * 8 if single else 0
        tensors.append(
            KVCacheTensor(
                size=(pages - 1) * stride + page if pages else 0,
                offset=offset,
                page_stride=stride,
                shared_by=tuple(sharers),
            )
        )
    if single:
        bytes_per_block = -(-max(t.offset + t.size for t in tensors) // num_blocks)
    else:
        bytes_per_block = -(-sum(t.size for t in tensors) // num_blocks)
    try:
        return KVCachePlan(
            policy="drawn",
            num_blocks=num_blocks,
            bytes_per_block=bytes_per_block,
            single_buffer=single,
            groups=tuple(groups),
            tensors=tuple(tensors),
            context=CTX,
            available_memory_bytes=num_blocks * bytes_per_block,
        )
    except PlanValidationError:
        assume(False)
        raise


@given(small_plans())
def test_the_check_agrees_with_a_page_by_page_oracle(plan):
    assert bool(overlap_problems(plan)) == _oracle(plan)


def _row_plan(offsets, groups=(0, 1), page=64, row=128, blocks=8, budget=None):
    """One buffer of ``blocks`` rows of ``row`` bytes; layer i of group g at ``offsets[i]``."""
    spec = _spec(page // 8)
    members: dict[int, list[str]] = {}
    tensors = []
    for i, (offset, group) in enumerate(zip(offsets, groups, strict=True)):
        name = f"l{i}"
        members.setdefault(group, []).append(name)
        tensors.append(
            KVCacheTensor(size=(blocks - 1) * row + page, offset=offset, page_stride=row, shared_by=(name,))
        )
    return KVCachePlan(
        policy="test",
        num_blocks=blocks,
        bytes_per_block=row,
        single_buffer=True,
        groups=tuple(
            KVCacheGroup(layer_names=tuple(names), spec=spec) for _, names in sorted(members.items())
        ),
        tensors=tuple(tensors),
        context=CTX,
        available_memory_bytes=budget if budget is not None else blocks * row,
    )


def test_layers_of_different_groups_may_share_bytes_in_one_row():
    assert plan_problems(_row_plan([0, 0])) == []


def test_two_layers_of_one_group_on_the_same_bytes_are_named():
    (problem,) = plan_problems(_row_plan([0, 32], groups=(0, 0)))
    assert "pages of one group" in problem and "'l0'" in problem and "'l1'" in problem


def test_the_named_layers_are_the_two_that_collide():
    # the old check named the first layer of each group ('l0' / 'l0'); the layers at fault are l1 and l2
    plan = _row_plan([0, 64, 64], groups=(0, 1, 1))
    (problem,) = plan_problems(plan)
    assert "'l1'" in problem and "'l2'" in problem and "'l0'" not in problem


def test_a_plan_over_its_budget_is_refused():
    plan = _row_plan([0, 64], budget=100)
    with pytest.raises(PlanValidationError) as info:
        check_plan(plan, source="here")
    assert info.value.policy == "test" and info.value.source == "here"
    assert "available_memory_bytes" in info.value.problems[0]
    assert "policy 'test' (here)" in str(info.value)


def test_layers_that_share_a_tensor_must_be_in_different_groups():
    spec = _spec(2)
    with pytest.raises(PlanValidationError, match="'a' and 'b' are both in group 0 and share tensor 0"):
        KVCachePlan(
            policy="test",
            num_blocks=4,
            bytes_per_block=16,
            single_buffer=True,
            groups=(KVCacheGroup(layer_names=("a", "b"), spec=spec),),
            tensors=(KVCacheTensor(size=64, page_stride=16, shared_by=("a", "b")),),
            context=CTX,
            available_memory_bytes=64,
        )


def test_groups_of_different_page_spans_in_one_tensor_are_checked_exactly():
    # a page of group 1 takes 2 block ids: page j covers ids 2j, 2j+1, group 0's page j only id j
    spec = _spec(2)
    plan = KVCachePlan(
        policy="test",
        num_blocks=4,
        bytes_per_block=16,
        single_buffer=True,
        groups=(
            KVCacheGroup(layer_names=("a",), spec=spec),
            KVCacheGroup(layer_names=("b",), spec=spec, blocks_per_page=2),
        ),
        tensors=(KVCacheTensor(size=64, page_stride=16, shared_by=("a", "b")),),
        context=CTX,
        available_memory_bytes=64,
    )
    problems = plan_problems(plan)
    assert problems and "different block ids" in problems[0]


def test_big_periodic_plans_are_checked_per_tensor_not_per_page():
    plan = _row_plan([64 * i for i in range(2)] * 1, groups=(0, 0), row=128, blocks=100_000)
    assert plan_problems(plan) == []
    broken = attrs.evolve(plan, tensors=[plan.tensors[0], attrs.evolve(plan.tensors[1], offset=32)])
    assert plan_problems(broken)


def test_rows_that_meet_do_not_hide_a_tensor_of_another_stride():
    """Found by the oracle: two tensors meeting in the row used to stop the row check before it
    saw the third tensor's other stride, so its overlap with a layer of its own group was missed."""
    spec = full(block_size=1, heads=1, head_size=1, dtype="float32")
    plan = KVCachePlan(
        policy="drawn",
        num_blocks=2,
        bytes_per_block=16,
        single_buffer=True,
        groups=[KVCacheGroup(layer_names=("g0l0", "g0l1", "g0l2"), spec=spec)],
        tensors=[
            KVCacheTensor(size=24, offset=8, page_stride=16, shared_by=("g0l0",)),
            KVCacheTensor(size=24, offset=0, page_stride=16, shared_by=("g0l1",)),
            KVCacheTensor(size=16, offset=16, page_stride=8, shared_by=("g0l2",)),
        ],
        context=SizingContext(max_model_len=64),
        available_memory_bytes=32,
    )
    problems = overlap_problems(plan)
    assert any("'g0l1'" in p and "'g0l2'" in p for p in problems), problems


def test_a_page_off_its_element_alignment_is_refused():
    # float32 pages (4-byte elements) at byte 2: no view of them can be made without a copy
    plan = _row_plan([0, 66], row=136)
    (problem,) = plan_problems(plan)
    assert "tensor 1 of layer 'l1' starts at byte 66" in problem and "4-byte alignment" in problem
    stride = _row_plan([0, 64], row=130)
    assert any("page stride of 130 bytes" in p for p in plan_problems(stride))


def test_a_misaligned_plan_read_from_json_is_refused(registry):
    from kvcore.planning.serialization import plan_from_json, plan_to_json

    text = plan_to_json(_row_plan([0, 64], row=136), registry)
    assert '"offset": 64' in text
    text = text.replace('"offset": 64', '"offset": 66')
    with pytest.raises(PlanValidationError, match="4-byte alignment"):
        plan_from_json(text, registry, source="plan.json")


def _run_plan(state_offsets, attention_offsets, span=4, row=64, blocks=16):
    """One buffer of ``blocks`` rows of ``row`` bytes: a group of 32-byte pages spanning
    ``span`` rows (a state's aligned run) with layers at ``state_offsets`` in its run, beside a
    group of one-row pages with layers at ``attention_offsets`` in the row."""
    spec = _spec(4)  # 32-byte pages
    groups = (
        KVCacheGroup(
            layer_names=tuple(f"s{i}" for i in range(len(state_offsets))), spec=spec, blocks_per_page=span
        ),
        KVCacheGroup(layer_names=tuple(f"a{i}" for i in range(len(attention_offsets))), spec=spec),
    )
    tensors = [
        KVCacheTensor(
            size=(blocks // span - 1) * span * row + 32,
            offset=o,
            page_stride=span * row,
            shared_by=(f"s{i}",),
        )
        for i, o in enumerate(state_offsets)
    ] + [
        KVCacheTensor(size=(blocks - 1) * row + 32, offset=o, page_stride=row, shared_by=(f"a{i}",))
        for i, o in enumerate(attention_offsets)
    ]
    return KVCachePlan(
        policy="test",
        num_blocks=blocks,
        bytes_per_block=row,
        single_buffer=True,
        groups=groups,
        tensors=tuple(tensors),
        context=CTX,
        available_memory_bytes=blocks * row,
    )


def test_pages_spanning_a_run_of_rows_share_bytes_with_the_rows_they_cover():
    # state pages side by side in their run of 4 rows cross the attention pages of those rows
    # (the same block ids), for any number of layers: the row rule, not a pair per tensor
    plan = _run_plan([32 * i for i in range(8)], [0, 32])
    assert plan_problems(plan) == []
    assert not _oracle(plan)


def test_two_layers_of_one_spanning_group_on_the_same_bytes_are_named():
    plan = _run_plan([0, 40, 48], [0, 32])
    problems = plan_problems(plan)
    assert _oracle(plan)
    assert (
        problems
        and "pages of one group (group 0)" in problems[0]
        and "'s1'" in problems[0]
        and "'s2'" in problems[0]
    )


def test_a_page_that_leaves_its_run_is_checked_exactly():
    # the last state page reaches into the next run, whose block ids the attention pages there
    # (of group 1) may hold while the state page is live: the check must not take the row rule
    plan = _run_plan([0, 240], [0, 32], blocks=18)
    assert _oracle(plan)
    assert bool(plan_problems(plan)) == _oracle(plan)
