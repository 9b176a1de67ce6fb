"""The ``vllm`` profile's count of a table's freed pages (``leading_nulls``), held to the plain
count it replaced: a table's ``None`` entries (pages freed before a window, or before a hit
from a window's end) all lead it, so halving finds where its first held page is."""

from __future__ import annotations

from hypothesis import given, strategies as st

from kvcore.simulation.profiles.vllm.state import leading_nulls

# block ids past CPython's small integers, as a long replay's are
_IDS = st.lists(st.integers(min_value=0, max_value=10**9), max_size=64)


@given(freed=st.integers(min_value=0, max_value=64), held=_IDS)
def test_leading_nulls_counts_the_freed_pages_that_lead_a_table(freed: int, held: list[int]) -> None:
    table: list[int | None] = [None] * freed
    table.extend(held)
    assert leading_nulls(table) == table.count(None) == freed
