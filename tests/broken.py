"""Deliberately broken kvcore pieces, shared by the tests that prove a check can fail.

A harness that passes on sound plans and pools proves something only if it fails on broken
ones: the aliasing property (tests/runtime/test_aliasing.py) and the decode comparison with
transformers (tests/engine/decode/test_the_check_can_fail.py) both run these.
"""

from __future__ import annotations

import attrs

from kvcore import BlockPool, KVCachePlan
from kvcore.runtime.free_blocks import FREE, FreeBlocks


class DoubleBookingBlocks(FreeBlocks):
    """Broken free ids: the block ids group 0 takes stay free, so they are handed out again."""

    def take(self, block, group):
        super().take(block, group)
        if group == 0:
            self.release(block)

    def release(self, block):
        if self.owner[block] != FREE:  # an id group 0 took was never held
            super().release(block)


def double_booking_pool(plan):
    """A broken pool that hands one block id to two owners (through the pool's free-ids seam)."""
    return BlockPool(plan, free_blocks=DoubleBookingBlocks)


def unchecked_plan(plan: KVCachePlan, **changes) -> KVCachePlan:
    """``plan`` with ``changes``, built without the plan's own checks (to test what catches them)."""
    broken = object.__new__(type(plan))
    for field in attrs.fields(type(plan)):
        object.__setattr__(broken, field.name, changes.get(field.name, getattr(plan, field.name)))
    return broken
