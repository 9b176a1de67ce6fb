"""A run timed by a measured profile says how far its steps went beyond the steps the profile
measured (:mod:`kvcore.simulation.profile_reach`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvcore import SizingContext, plan_kv_cache, simulate
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.simulation.profile_reach import MeasuredRange, ReachTally
from kvcore.simulation.steps import StepRecord
from kvcore.simulation.timing import StepProfile, fit_profile
from tests.helpers import full
from tests.simulation._workloads import random_workload

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
TERMS = ("prefill_tokens", "decode_requests", "context_tokens")


class Recorder:
    """Times every step at 10 ms and keeps the records."""

    description = "recorder"

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def __call__(self, record: StepRecord) -> float:
        self.records.append(record)
        return 0.01 if record.requests else 0.0


def _seconds(record: StepRecord) -> float:
    return 0.002 + 1e-6 * record.prefill_tokens + 1e-5 * record.decode_tokens + 1e-8 * record.context_tokens


def _samples(records):
    return [(r.prefill_tokens, r.decode_tokens, r.context_tokens, _seconds(r)) for r in records]


def _outside(record: StepRecord, kept) -> bool:
    """The plain check: some term of ``record`` outside what ``kept`` measured."""
    values = record.term_values()
    return any(
        not min(getattr(k, f) for k in kept) <= values[t] <= max(getattr(k, f) for k in kept)
        for t, f in zip(TERMS, ("prefill_tokens", "decode_tokens", "context_tokens"), strict=True)
    )


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), caching=st.booleans())
@pytest.mark.parametrize("scheduler", ["kvcore", "vllm", "sglang"])
def test_a_profile_of_a_runs_own_steps_finds_none_beyond_and_a_narrower_one_finds_each(
    seed, caching, scheduler
):
    workload = random_workload(
        seed, 40, "uniform:16:400", "uniform:2:60", prefix_share=0.5 if caching else 0.0
    )
    context = SizingContext(max_model_len=512, max_num_batched_tokens=256)
    plan = plan_kv_cache(
        {"model.layers.0": full(block_size=16)},
        2**34,
        context,
        registry=REGISTRY,
        policy="auto",
        num_blocks=40,
    )
    recorder = Recorder()
    simulate(plan, workload, step_time=recorder, prefix_caching=caching, scheduler=scheduler)
    records = [r for r in recorder.records if r.requests]
    # a profile of the very steps the run takes: every step inside, each predicted above 0
    own = simulate(
        plan, workload, step_time=fit_profile(_samples(records)), prefix_caching=caching, scheduler=scheduler
    )
    assert own.timeline is not None and own.timeline.reach is not None
    reach = own.timeline.reach
    assert (reach.steps, reach.outside, reach.at_zero, reach.summary) == (len(records), 0, 0, None)
    # without the steps of the longest context: exactly the steps outside the rest's ranges
    longest = max(r.context_tokens for r in records)
    kept = [r for r in records if r.context_tokens < longest]
    if len({(r.prefill_tokens, r.decode_tokens, r.context_tokens) for r in kept}) < 8:
        return  # too few shapes left to fit
    narrow = simulate(
        plan, workload, step_time=fit_profile(_samples(kept)), prefix_caching=caching, scheduler=scheduler
    )
    assert narrow.timeline is not None and narrow.timeline.reach is not None
    reach = narrow.timeline.reach
    assert reach.outside == sum(_outside(r, kept) for r in records) >= 1
    by_term = {t.term: t for t in reach.terms}
    assert by_term["context_tokens"].most == longest
    assert by_term["context_tokens"].high == max(r.context_tokens for r in kept)
    assert reach.summary is not None and "context tokens up to" in reach.summary


def test_steps_a_line_puts_at_zero_are_counted_and_named():
    # a noisy fit: decodes cost less than nothing, so a wide decode step falls to 0 s
    profile = StepProfile(
        source="noisy",
        intercept=0.001,
        per_prefill_token=1e-6,
        per_decode_request=-1e-4,
        per_context_token=1e-8,
        samples=6,
        max_error=0.01,
        measured=(
            MeasuredRange(term="prefill_tokens", low=0, high=512),
            MeasuredRange(term="decode_requests", low=1, high=8),
            MeasuredRange(term="context_tokens", low=10, high=4096),
        ),
    )
    tally = ReachTally(profile.measured)
    for record in (
        StepRecord(0, 4, 4, 400, 400),
        StepRecord(0, 32, 32, 3000, 3000),
        StepRecord(0, 0, 0, 0, 0),
    ):
        if record.requests:  # as the stepper does: an idle step is not timed
            tally.add(record.term_values(), profile(record))
    reach = tally.reach()
    assert (reach.steps, reach.outside, reach.at_zero) == (2, 1, 1)
    assert [t.term for t in reach.terms] == ["decode_requests"]
    assert reach.summary == (
        "1 of 2 steps (50.0 %) lie beyond the steps the profile measured, their seconds the fitted line "
        "extrapolated: decode requests up to 32 (measured 1 to 8); steps predicted at 0 s: 1 (the line "
        "falls below 0 there); measure the engine over the range the simulation runs (kvcore profile)"
    )


def test_a_profile_made_from_coefficients_measured_nothing_and_reports_no_reach():
    profile = StepProfile(
        source="given",
        intercept=0.001,
        per_prefill_token=1e-6,
        per_decode_request=1e-5,
        per_context_token=0.0,
        samples=0,
        max_error=0.0,
    )
    workload = random_workload(1, 10, "uniform:16:100", "uniform:2:10")
    plan = plan_kv_cache(
        {"model.layers.0": full(block_size=16)},
        2**30,
        SizingContext(max_model_len=256),
        registry=REGISTRY,
        policy="auto",
    )
    run = simulate(plan, workload, step_time=profile)
    assert run.timeline is not None and run.timeline.reach is None
