"""Whole aligned runs taken and given back at once leave :class:`FreeBlocks` exactly as id by id.

``FreeBlocks`` takes and frees a page of an aligned run a chunk at a time; a subclass that
replaces the :meth:`~FreeBlocks.take` / :meth:`~FreeBlocks.release` seam sees every id instead.
Random programs of ``take_pages`` / ``take_for`` / ``give_back_pages`` / ``give_back`` on random
pools (runs of one to three lengths, with and without single-id groups, with and without the
null block held) run on both, and after every call both hold the same state: the owner of every
id, the free count, the heap of free ids (as a multiset: the order ids come out of a min-heap
depends on nothing else) and, per run length, the free ids per chunk, the count of full chunks
and the heap of full chunks (a multiset too); the pages handed out are the same.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, strategies as st

from kvcore.runtime.free_blocks import FREE, FreeBlocks

pytestmark = pytest.mark.property


class IdById(FreeBlocks):
    """The seam replaced by itself: every id through ``take`` / ``release``, one at a time."""

    def take(self, block: int, group: int) -> None:
        super().take(block, group)

    def release(self, block: int) -> None:
        super().release(block)


def _state(free: FreeBlocks) -> tuple[object, ...]:
    runs = tuple((span, r.free_in, r.full, sorted(r.heap)) for span, r in sorted(free.runs.items()))
    return free.owner, free.num_free, sorted(free.singles), runs


@st.composite
def _pools(draw: st.DrawFn) -> tuple[int, dict[int, int], bool]:
    lengths = draw(st.lists(st.integers(2, 9), min_size=1, max_size=3, unique=True))
    spans = lengths + draw(st.lists(st.sampled_from([1, *lengths]), max_size=3))  # singles, twins
    num_blocks = draw(st.integers(1, 90))
    return num_blocks, dict(enumerate(draw(st.permutations(spans)))), draw(st.booleans())


@given(pool=_pools(), data=st.data())
def test_whole_runs_leave_the_state_id_by_id_leaves(
    pool: tuple[int, dict[int, int], bool], data: st.DataObject
) -> None:
    num_blocks, spans, null = pool
    bulk, ids = FreeBlocks(num_blocks, spans), IdById(num_blocks, spans)
    assert bulk.whole_runs and not ids.whole_runs
    if null:
        for free in (bulk, ids):
            free.hold_null(0)
    held: dict[int, list[int]] = {group: [] for group in spans}
    for _ in range(data.draw(st.integers(1, 60))):
        action = data.draw(st.sampled_from(["take", "take_for", "give_pages", "give_ids"]))
        if action == "take":
            group = data.draw(st.sampled_from(sorted(spans)))
            count = data.draw(st.integers(0, bulk.available(spans[group])))
            pages = bulk.take_pages(group, count)
            assert ids.take_pages(group, count) == pages
            held[group] += pages
        elif action == "take_for":
            groups = data.draw(st.lists(st.sampled_from(sorted(spans)), min_size=1, unique=True))
            grows = [(g, data.draw(st.integers(0, bulk.available(spans[g]) + 1))) for g in groups]
            taken = bulk.take_for(grows)
            assert ids.take_for(grows) == taken  # all or none, the same on both
            for group, pages in (taken or {}).items():
                held[group] += pages
        else:
            back: dict[int, list[int]] = {}
            for group in data.draw(st.permutations(sorted(spans))):
                chosen = data.draw(st.lists(st.sampled_from(held[group]), unique=True)) if held[group] else []
                if chosen:
                    back[group] = chosen
                    held[group] = [p for p in held[group] if p not in chosen]
            if action == "give_pages":
                for free in (bulk, ids):
                    free.give_back_pages(back)
            else:
                blocks = [b for group, pages in back.items() for b in bulk.blocks(group, pages)]
                for free in (bulk, ids):
                    free.give_back(blocks)
        assert _state(bulk) == _state(ids)
        # and the state is right, not just shared: owners and free counts follow the pages held
        expected = Counter({FREE: num_blocks - null})
        for group, pages in held.items():
            for block in bulk.blocks(group, pages):
                assert bulk.owner[block] == group
            expected[group] += len(bulk.blocks(group, pages))
            expected[FREE] -= len(bulk.blocks(group, pages))
        assert bulk.num_free == expected[FREE] == bulk.owner.count(FREE)
        for span, runs in bulk.runs.items():
            free_in = [bulk.owner[k * span : (k + 1) * span].count(FREE) for k in range(runs.chunks)]
            assert runs.free_in == free_in and runs.full == free_in.count(span)
