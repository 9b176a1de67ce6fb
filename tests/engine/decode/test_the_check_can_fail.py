"""The comparison with transformers catches broken memory: it fails when a live page is
corrupted, when the pool hands one block id to two owners, when a plan puts two layers on the
same bytes, and the run stops when a pool frees a page still in the window or never frees any.
Otherwise the passing tests would prove nothing."""

from __future__ import annotations

import attrs
import pytest

from kvcore import NULL_PAGE, BlockPool, BlockPoolExhaustedError, InvalidInputError, PlanValidationError
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.testing.reference import PagedAttentionRunner, decode_greedy
from tests.broken import double_booking_pool, unchecked_plan
from tests.engine.decode._tiny import kvcore_runner, mismatches, tight_num_blocks

pytest.importorskip("transformers")


class CorruptingRunner(PagedAttentionRunner):
    """Adds noise to one live page of request r2's first full-attention layer before step 20
    (``kind``: the layer's spec class; ``half``: its K or V pages)."""

    kind: type = FullAttentionSpec
    half = "keys"
    corrupted: tuple[str, int] | None = None

    def step(self, batch):
        if self.num_steps == 20:
            group = next(i for i, g in enumerate(self.plan.groups) if isinstance(g.spec, self.kind))
            page = self.pool.live_pages("r2", group)[0]
            name = self.plan.groups[group].layer_names[0]
            getattr(self.layer_of(dict(self.model.named_modules())[name]).pages, self.half)[page] += 1.0
            self.corrupted = (name, page)
        return super().step(batch)


class CrossCorruptingRunner(CorruptingRunner):
    """Adds noise to request r2's cached encoder output (a cross-attention page) before step 20:
    written at r2's first step, it is only read from then on."""

    kind = CrossAttentionSpec
    half = "values"


@pytest.mark.parametrize(
    ("name", "runner_class"),
    [
        ("llama", CorruptingRunner),
        ("gemma3", CorruptingRunner),
        ("whisper", CorruptingRunner),
        pytest.param("whisper", CrossCorruptingRunner, id="whisper-encoder-page"),
    ],
)
def test_a_corrupted_live_page_breaks_the_match(subjects, registry, name, runner_class):
    subject = subjects(name)
    runner = kvcore_runner(subject.model, registry, runner_class=runner_class)
    generations = decode_greedy(runner, subject.requests)
    assert runner.corrupted is not None
    problems = mismatches(generations, subject.reference)
    assert problems and all(p.startswith("r2:") for p in problems), problems


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_a_pool_that_gives_one_block_to_two_owners_breaks_the_match(subjects, registry, name):
    subject = subjects(name)
    runner = kvcore_runner(subject.model, registry, pool_factory=double_booking_pool)
    generations = decode_greedy(runner, subject.requests)
    assert _double_bookings(runner), "two owners (requests, or groups) held one block id at once"
    assert mismatches(generations, subject.reference) != []


def _double_bookings(runner):
    """``[(holder, new holder)]`` for every take of a block id that nobody had given back."""
    live, found = {}, []
    for event in runner.events:
        for block in runner.pool.blocks_of(event.group, event.page):
            if event.action != "take":
                live.pop(block, None)
                continue
            if block in live:
                found.append((live[block], (event.request_id, event.group)))
            live[block] = (event.request_id, event.group)
    return found


def test_a_sound_pool_never_double_books(subjects, registry):
    subject = subjects("gemma2")
    runner = kvcore_runner(subject.model, registry)
    decode_greedy(runner, subject.requests)
    assert _double_bookings(runner) == []


def test_a_plan_that_puts_two_layers_of_one_group_on_the_same_bytes_breaks_the_match(
    subjects, registry, monkeypatch
):
    subject = subjects("gemma2")
    plan = kvcore_runner(subject.model, registry).plan
    group = next(g for g in plan.groups if len(g.layer_names) >= 2)
    first, second = group.layer_names[:2]
    tensors = []
    for tensor in plan.tensors:  # move `second` onto `first`'s bytes
        names = tuple(n for n in tensor.shared_by if n != second)
        tensors.append(attrs.evolve(tensor, shared_by=(*names, second) if first in names else names))
    kept = tuple(t for t in tensors if t.shared_by)
    with pytest.raises(PlanValidationError):  # kvcore refuses such a plan when it is built ...
        attrs.evolve(plan, tensors=kept)
    # ... and before allocating it; build and allocate it behind those checks' backs, to show
    # that the comparison with transformers catches it on its own
    broken = unchecked_plan(plan, tensors=kept)
    monkeypatch.setattr("kvcore.runtime.allocation.check_plan", lambda plan, **kwargs: None)
    generations = decode_greedy(kvcore_runner(subject.model, registry, plan=broken), subject.requests)
    assert mismatches(generations, subject.reference) != []


class EagerPool(BlockPool):
    """A broken pool: frees one block more than the window allows (the first page a sliding
    window still reads; the pool's own check refuses a count past the reserved tokens, so the
    break is made in its tables)."""

    def release_stale(self, request_id, num_computed_tokens):
        freed = super().release_stale(request_id, num_computed_tokens)
        record = self._records[request_id]
        for group, table in enumerate(record.tables):
            live = [k for k, page in enumerate(table) if page != NULL_PAGE]
            if self.groups[group].spec.kind == "sliding_window" and len(live) > 1:
                page, table[live[0]] = table[live[0]], NULL_PAGE
                record.released[group] = live[0] + 1
                self.pools[self.groups[group].pool].free_pages({group: [page]})
                freed.setdefault(group, []).append(page)
        return freed


def test_a_pool_that_frees_a_page_still_in_the_window_is_caught(subjects, registry):
    subject = subjects("gemma3")
    runner = kvcore_runner(subject.model, registry, pool_factory=EagerPool)
    with pytest.raises(InvalidInputError, match=r"is still read but its page .* was freed"):
        decode_greedy(runner, subject.requests)


class HoardingPool(BlockPool):
    """A pool that never frees what falls out of a window (only finished requests give back)."""

    def release_stale(self, request_id, num_computed_tokens):
        return {}


def test_the_tight_budget_only_fits_because_windows_free_their_pages(subjects, registry):
    subject = subjects("gemma3")
    num_blocks = tight_num_blocks(kvcore_runner(subject.model, registry), subject.requests)
    runner = kvcore_runner(subject.model, registry, num_blocks=num_blocks, pool_factory=HoardingPool)
    with pytest.raises(BlockPoolExhaustedError):
        decode_greedy(runner, subject.requests)
