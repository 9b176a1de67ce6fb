"""The fault matrix on real ranks: every fault ends on every live rank in a
``DistributedAgreementError`` within ``timeout_s + 2 s`` of the start, never a hang, never a plan
on some ranks and an error on others.

Four ranks (tp 2 x pp 2) run every case; sixteen (tp 4 x pp 4) run a few of them. Set
``KVCORE_FAULT_RANKS=4,16`` to run every case at both sizes (``_faults.py`` has the harness).
"""

from __future__ import annotations

import os

import pytest

from kvcore.planning.serialization import plan_to_dict
from tests.engine.distributed._faults import Case, StoreHost, check_no_split, run_case
from tests.engine.distributed._ranks import Scenario, expected_plans, preload_forkserver, toy_registry

#: about 70 s of real rank processes: CI and ``--run-slow`` run it, the default run skips it
pytestmark = pytest.mark.slow

MiB = 2**20
TIMEOUT_S = 2.0
#: The bound every live rank must end within (from the moment every rank starts).
BOUND_S = TIMEOUT_S + 2.0


@pytest.fixture(scope="module", autouse=True)
def _forkserver():
    preload_forkserver()


def _scenario(world: int, **kwargs) -> Scenario:
    tp, pp = {4: (2, 2), 16: (4, 4)}[world]
    return Scenario(tp=tp, pp=pp, timeout_s=TIMEOUT_S, **kwargs)


#: name: (faults, settings, resume, outcome, ranks at fault, error of the live ranks)
CASES = {
    "kill before the first round": ({2: "kill"}, {}, set(), "raised", [2], "DistributedAgreementError"),
    "kill during the plan round": ({1: "kill-mid"}, {}, set(), "raised", [1], "DistributedAgreementError"),
    "freeze before the first round": ({3: "freeze"}, {}, {3}, "raised", [3], "DistributedAgreementError"),
    "freeze the collector during a round": (
        {0: "freeze-mid"},
        {},
        {0},
        "raised",
        [0],
        "DistributedAgreementError",
    ),
    "freeze after the plan round": ({1: "freeze-after"}, {}, {1}, "raised", [1], "DistributedAgreementError"),
    "slow allocation": ({2: "slow"}, {}, set(), "raised", [2], "DistributedAgreementError"),
    "freeze after publishing the commit": ({1: "freeze-commit"}, {}, {1}, "ok", [], None),
    "frozen store host": ({1: "freeze-store"}, {}, set(), "raised", [], "StoreUnavailableError"),
    "store host killed": ({2: "kill-store"}, {}, set(), "raised", [], "StoreUnavailableError"),
    "a rank raises": ({1: "raise"}, {}, set(), "raised", [1], "DistributedAgreementError"),
    "different max_model_len": (
        {},
        {1: {"max_model_len": 262144}},
        set(),
        "raised",
        [1],
        "AgreementMismatchError",
    ),
    "different policy": ({}, {2: {"policy": "uniform"}}, set(), "raised", [2], "AgreementMismatchError"),
    "different forced num_blocks": (
        {},
        {3: {"num_blocks": 10}},
        set(),
        "raised",
        [3],
        "AgreementMismatchError",
    ),
    "different forced counts per pool": (
        {},
        {0: {"num_blocks": (10, 20)}, 1: {"num_blocks": (10, 20)}, 2: {"num_blocks": (10, 20)}},
        set(),
        "raised",
        [3],
        "AgreementMismatchError",
    ),
}
SIXTEEN = ("kill during the plan round", "freeze the collector during a round", "frozen store host")
SIZES = [int(n) for n in os.environ.get("KVCORE_FAULT_RANKS", "").split(",") if n.strip()]
PARAMS = [(4, name) for name in CASES] + [(16, name) for name in CASES if (16 in SIZES or name in SIXTEEN)]


@pytest.mark.parametrize(
    ("world", "name"), PARAMS, ids=[f"{w}-ranks-{n.replace(' ', '-')}" for w, n in PARAMS]
)
def test_fault_matrix(world, name):
    faults, settings, resume, outcome, at_fault, error = CASES[name]
    case = Case(
        scenario=_scenario(world),
        faults=faults,
        settings=settings,
        resume=frozenset(resume),
        run_id=f"matrix-{world}-{name.replace(' ', '-')}",
    )
    with StoreHost() as host:
        reports, _ = run_case(case, host=host, guard_s=60.0)
    assert check_no_split(reports) == outcome
    if outcome == "ok":
        return
    own_error = {1: "MemoryProfilingError"} if faults.get(1) == "raise" else {}
    for rank, report in reports.items():
        assert report["error"] == own_error.get(rank, error), (rank, report)
        if rank in own_error:
            continue
        assert report["agreement_error"], report
        if rank not in resume:  # a resumed rank was stopped for as long as the others ran
            assert report["seconds"] < BOUND_S + (TIMEOUT_S + 1 if faults.get(rank) == "slow" else 0), report
    live = [r for r in reports if r not in resume and r not in own_error and faults.get(r) != "slow"]
    for rank in live:
        report = reports[rank]
        assert report["ranks"] == at_fault, (rank, report)
        if error == "StoreUnavailableError":
            assert report["host"] == host.address and host.address in report["message"]
        if error == "AgreementMismatchError":
            assert report["field"] in {"max_model_len", "policy", "num_blocks"}
            assert f"ranks disagree on {report['field']}" in report["message"]
            assert "fewest blocks" not in report["message"]


def _expected_plans(scenario: Scenario):
    registry = toy_registry()
    return [plan_to_dict(plan, registry) for plan in expected_plans(scenario, registry)]


@pytest.mark.parametrize("torchrun", [False, True], ids=["fresh-attempt", "torchrun-restart"])
def test_a_rerun_on_a_store_left_by_a_failed_attempt_agrees_on_its_own_inputs(torchrun):
    old = _scenario(4)
    new = _scenario(4, memory=3 * MiB)  # other memory: other plans, so old data would show
    run_id = "stale" if torchrun else None
    with StoreHost() as host:
        failed, _ = run_case(Case(scenario=old, faults={2: "kill-mid"}, run_id=run_id, restart=0), host=host)
        assert check_no_split(failed) == "raised"
        healthy, _ = run_case(Case(scenario=old, run_id=run_id, restart=1), host=host)
        assert check_no_split(healthy) == "ok"
        rerun, _ = run_case(Case(scenario=new, run_id=run_id, restart=2), host=host)
    assert check_no_split(rerun) == "ok"
    expected = _expected_plans(new)
    assert [rerun[r]["plan"] for r in range(4)] == expected
    assert expected != _expected_plans(old)


def test_a_rank_frozen_before_a_fresh_attempt_raises_too_when_it_resumes():
    # no run id: rank 0 draws the attempt; rank 3 joins it only after the others gave up
    case = Case(scenario=_scenario(4), faults={3: "freeze"}, resume=frozenset({3}))
    reports, _ = run_case(case)
    assert check_no_split(reports) == "raised"
    assert all(report["agreement_error"] for report in reports.values())
    assert all(reports[r]["ranks"] == [3] and reports[r]["seconds"] < BOUND_S for r in (0, 1, 2))
    # the late rank names itself, not rank 0 (which gave up waiting for it)
    assert reports[3]["ranks"] == [3] and "rank 3" in reports[3]["message"].split(":")[0], reports[3]


@pytest.mark.parametrize("fault", ["freeze-mid", "freeze-commit"])
def test_with_rank_0_hosting_the_store_a_frozen_rank_0_ends_like_the_others(fault):
    # env:// with ranks started by hand: rank 0's process serves the store, so freezing it
    # freezes the store; the others give up on it, and rank 0, resumed, must not take the plan
    case = Case(
        scenario=_scenario(4),
        faults={0: fault},
        resume=frozenset({0}),
        run_id=f"rank0-store-{fault}",
        store_on_rank0=True,
    )
    reports, _ = run_case(case)
    assert check_no_split(reports) == "raised"
    for rank in (1, 2, 3):
        # which they see first, the frozen store or the round's deadline, depends on the load
        assert reports[rank]["error"] in ("StoreUnavailableError", "DistributedAgreementError"), reports[rank]
        assert reports[rank]["seconds"] < BOUND_S, reports[rank]
    assert reports[0]["agreement_error"], reports[0]
    if fault == "freeze-commit":
        # rank 0 froze right after its ready key, and the store froze with it: the others' keys
        # are all there only if they published first (then only the clock says no); otherwise
        # rank 0, resumed, names a rank whose key never came. Either way it takes no plan.
        message = reports[0]["message"]
        if reports[0]["ranks"] == [0]:
            assert "after the deadline of rank" in message, reports[0]
        else:
            assert set(reports[0]["ranks"]) <= {1, 2, 3} and "did not answer" in message, reports[0]


def test_a_run_id_reused_on_a_surviving_store_is_refused_on_every_rank():
    # a second run with the same run id (and restart count) must not read the first run's
    # decisions: ranks started with different policies would both "agree"
    scenario = _scenario(4)
    with StoreHost() as host:
        first, _ = run_case(Case(scenario=scenario, run_id="reused"), host=host)
        assert check_no_split(first) == "ok"
        again, _ = run_case(
            Case(scenario=scenario, run_id="reused", settings={2: {"policy": "uniform"}}), host=host
        )
    assert check_no_split(again) == "raised"
    for report in again.values():
        assert report["error"] == "AttemptReusedError" and report["agreement_error"], report
        assert "was used on this store by an earlier run" in report["message"]
        assert report["seconds"] < BOUND_S, report
