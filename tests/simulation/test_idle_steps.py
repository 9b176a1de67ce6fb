"""Idle stretches cost nothing: requests arriving ten million steps apart are simulated by
jumping to the next arrival, and the per-step series store the stretch as one run, with the
same figures as a step-by-step record."""

from __future__ import annotations

import attrs
from hypothesis import given, strategies as st

from kvcore import SizingContext, plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.simulation.series import StepSeries
from kvcore.simulation.simulator import simulate
from kvcore.simulation.workload import MAX_ARRIVAL_STEP, Request, Workload
from tests.helpers import full, mix, sliding

REGISTRY = Registry.default(autoload=False)


def test_a_request_arriving_at_the_last_allowed_step_is_simulated_without_walking_the_gap() -> None:
    plan = plan_kv_cache(
        mix((1, full(block_size=4)), (2, sliding(16, block_size=4))),
        2**24,
        SizingContext(max_model_len=64, max_num_batched_tokens=16),
        registry=REGISTRY,
    )
    early = Workload((Request(0, 20, 5, 0), Request(1, 30, 3, 1)), name="early")
    late = Workload(
        tuple(attrs.evolve(r, arrival_step=r.arrival_step + MAX_ARRIVAL_STEP - 1) for r in early.requests),
        name="late",
    )
    near, far = simulate(plan, early), simulate(plan, late)
    gap = MAX_ARRIVAL_STEP - 1
    assert far.steps == near.steps + gap
    assert far.running.num_runs <= near.running.num_runs + 1  # the stretch is one run
    assert len(far.running) == len(far.pool_usage) == far.steps
    assert far.running[0] == far.running[gap - 1] == 0
    assert tuple(far.running[gap:]) == tuple(near.running)
    assert far.pool_usage[gap:] == tuple(near.pool_usage)
    assert (far.total_tokens, far.peak_running, far.peak_pool_usage, far.mean_queue_delay) == (
        near.total_tokens,
        near.peak_running,
        near.peak_pool_usage,
        near.mean_queue_delay,
    )
    assert far.running.total() == near.running.total()  # (so the mean is over the longer run)
    assert far.mean_running == near.running.total() / far.steps


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=30), st.data())
def test_a_step_series_reads_as_the_tuple_of_its_steps(
    appends: list[tuple[int, int]], data: st.DataObject
) -> None:
    series: StepSeries[int] = StepSeries()
    plain: list[int] = []
    for value, count in appends:
        if count == 1:
            series.append(value)
        else:
            series.extend_repeat(value, count)
        plain.extend([value] * count)
    assert series == tuple(plain) and series == plain and list(series) == plain
    assert len(series) == len(plain) and hash(series) == hash(tuple(plain))
    assert series.total() == sum(plain) and series.peak(-1) == max(plain, default=-1)
    assert series.num_runs == sum(1 for i, v in enumerate(plain) if i == 0 or plain[i - 1] != v)
    if plain:
        index = data.draw(st.integers(-len(plain), len(plain) - 1))
        assert series[index] == plain[index]
        start, stop = data.draw(st.integers(-40, 40)), data.draw(st.integers(-40, 40))
        assert series[start:stop] == tuple(plain[start:stop])
    copy = series.copy()
    series.append(9)
    assert copy == tuple(plain) and series != copy
