"""Deliberately broken kvcore pieces, shared by the tests that prove a check can fail.

A harness that passes on sound plans and pools proves something only if it fails on broken
ones: the aliasing property (tests/runtime/test_aliasing.py) and the decode comparison with
transformers (tests/engine/decode/test_the_check_can_fail.py) both run these.
"""

from __future__ import annotations

import attrs

from kvcore import BlockPool, KVCachePlan


class DoubleBookingPool(BlockPool):
    """A broken pool: the block ids group 0 takes stay free, so they are handed out again."""

    def _take(self, block, group):
        super()._take(block, group)
        if group == 0:
            self._release(block)

    def free(self, group, pages):
        if group != 0:
            super().free(group, pages)


def unchecked_plan(plan: KVCachePlan, **changes) -> KVCachePlan:
    """``plan`` with ``changes``, built without the plan's own checks (to test what catches them)."""
    broken = object.__new__(type(plan))
    for field in attrs.fields(type(plan)):
        object.__setattr__(broken, field.name, changes.get(field.name, getattr(plan, field.name)))
    return broken
