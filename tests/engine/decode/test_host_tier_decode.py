"""Pages that went to the host tier and came back decode exactly like pages that never left.

Tiny Llama and Gemma-3 decode their four concurrent requests through the reference runner while,
every few steps, every page the requests hold goes out to a :class:`~kvcore.runtime.host_tier.HostTier`
in one batch per group, is overwritten on the device with NaNs, and comes back: the tokens
must still be transformers' own, the logits within the usual tolerance. Its broken twin (pages
overwritten and not brought back) must get them wrong, so the check can fail. The state model
is in test_host_tier_state.py (the reference runner attends only).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest
import torch

from kvcore.plan import split_host_memory
from kvcore.runtime.block_pool import NULL_PAGE
from kvcore.runtime.host_tier import HostTier
from kvcore.testing.reference import PagedAttentionRunner, ScheduledRequest, decode_greedy
from tests.engine.decode._tiny import kvcore_runner, mismatches

pytest.importorskip("transformers")

#: Every third step sends every held page out and back.
EVERY = 3


class OffloadingRunner(PagedAttentionRunner):
    """A runner that, before every :data:`EVERY`-th step, offloads every page its requests
    hold, poisons the device pages, and (unless ``bring_back`` is off) restores them."""

    host_tier: HostTier
    bring_back = True
    round_trips = 0
    pages_moved = 0

    def step(self, batch: Sequence[ScheduledRequest]) -> dict[Hashable, torch.Tensor]:
        if self.num_steps % EVERY == EVERY - 1 and self.pool.requests:
            self._round_trip()
        return super().step(batch)

    def _round_trip(self) -> None:
        tier, plan = self.host_tier, self.plan
        for index, group in enumerate(plan.groups):
            pages = [
                page
                for request in self.pool.requests
                for page in self.pool.block_table(request, index)
                if page != NULL_PAGE
            ]
            if not pages:
                continue
            slots = tier.offload(index, pages)
            for name in group.layer_names:
                for view, part in _parts(self, index, name):
                    view.index_fill_(part.block_dim, torch.tensor(pages), float("nan"))
            if self.bring_back:
                tier.restore(index, slots, pages)
            tier.release(index, slots)
            self.pages_moved += len(pages)
        self.round_trips += 1


def _parts(runner: PagedAttentionRunner, group: int, name: str):
    spec = runner.plan.groups[group].spec_of(name)
    view = runner.host_tier_views[name]
    tensors = (view,) if isinstance(view, torch.Tensor) else tuple(view)
    return zip(tensors, runner.host_tier_registry.cache_layout(spec).parts, strict=True)


def _offloading_runner(subject, registry, *, bring_back: bool) -> OffloadingRunner:
    runner = kvcore_runner(subject.model, registry, runner_class=OffloadingRunner)
    assert isinstance(runner, OffloadingRunner)
    modules = dict(runner.model.named_modules())
    views = {name: modules[name].kv_cache for group in runner.plan.groups for name in group.layer_names}
    # room for every page of the plan, so a round trip never runs out of rows
    tier = split_host_memory(runner.plan.pools, runner.plan.kv_cache_bytes)
    runner.host_tier = HostTier(runner.plan, views, registry=registry, tier=tier)
    runner.host_tier_views = views  # type: ignore[attr-defined]
    runner.host_tier_registry = registry  # type: ignore[attr-defined]
    runner.bring_back = bring_back
    return runner


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_pages_that_went_out_and_came_back_decode_like_transformers(subjects, registry, name):
    subject = subjects(name)
    runner = _offloading_runner(subject, registry, bring_back=True)
    generations = decode_greedy(runner, subject.requests)
    assert runner.round_trips >= 10 and runner.pages_moved > 100
    assert mismatches(generations, subject.reference) == []
    assert [runner.host_tier.num_free_rows(p) for p in range(len(runner.plan.pools))] == [
        runner.host_tier.plan.host_blocks_in(p) for p in range(len(runner.plan.pools))
    ]


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_the_check_fails_when_pages_do_not_come_back(subjects, registry, name):
    subject = subjects(name)
    runner = _offloading_runner(subject, registry, bring_back=False)
    generations = decode_greedy(runner, subject.requests)
    assert mismatches(generations, subject.reference) != []
