"""kvcore.simulation.load: arrivals against what a plan serves, and Workload.admit."""

import pytest

from kvcore.errors import InvalidInputError
from kvcore.simulation.load import arrival_load
from kvcore.simulation.workload import Request, Workload


def test_a_queue_that_keeps_up_is_not_overloaded():
    arrivals = list(range(0, 100, 2))
    load = arrival_load(arrivals, arrivals, "step")  # each begins as it arrives
    assert load is not None and not load.overloaded and load.line() == ""
    assert load.arrival_rate == load.served_rate == 50 / 98
    assert load.waiting_at_last_arrival == load.waiting_half_way == 0


def test_arrivals_twice_as_fast_as_service_grow_the_queue():
    arrivals = list(range(100))  # one a step
    begins = [2 * i for i in range(100)]  # one every other step
    load = arrival_load(arrivals, begins, "step")
    assert load is not None and load.overloaded
    assert load.served_rate == pytest.approx(load.arrival_rate / 2, rel=0.05)
    assert load.waiting_half_way == 25 and load.waiting_at_last_arrival == 50
    assert load.line().startswith("overloaded: requests arrive at 1.01 per step, served at 0.51 per step")


def test_a_burst_has_no_rate_and_a_never_begun_request_still_waits():
    assert arrival_load([0, 0, 0], [0, 1, 2], "step") is None
    assert arrival_load([], [], "s") is None
    load = arrival_load([0.0, 1.0, 2.0, 3.0], [0.0, -1, -1, -1], "s")
    assert load is not None and load.waiting_at_last_arrival == 3 and load.overloaded


def test_admit_sets_the_longer_requests_aside():
    workload = Workload(
        [Request(0, 100, 10), Request(1, 5000, 10, line=2), Request(2, 4000, 96)], "trace.jsonl"
    )
    admitted = workload.admit(4096)
    assert [r.id for r in admitted.requests] == [0, 2] and [r.id for r in admitted.rejected] == [1]
    assert workload.admit(10_000) is workload
    with pytest.raises(
        InvalidInputError, match=r"every request of trace\.jsonl is longer than max_model_len"
    ):
        workload.admit(50)
