"""The store protocol and the executor, in one process: ranks are threads over one store."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from kvcore import (
    InvalidInputError,
    KVCacheAllocationError,
    ModelOptions,
    SizingContext,
    initialize_kv_caches,
)
from kvcore.engine.agreement import StoreAgreement, elastic_run_id, majority_mismatch, store_from_env
from kvcore.engine.distributed import DistributedExecutor
from kvcore.errors import AgreementMismatchError, DistributedAgreementError, StoreUnavailableError
from kvcore.planning.request import PlanRequest
from tests.engine.distributed._ranks import RankExecutor, Scenario, toy_registry


def _on_threads(world, work):
    """Run ``work(rank)`` on one thread per rank; return ``{rank: result or exception}``."""
    out = {}

    def run(rank):
        try:
            out[rank] = work(rank)
        except Exception as exc:
            out[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a rank thread hangs"
    return out


def test_every_rank_gets_every_payload_in_rank_order_and_rounds_never_mix():
    store = dist.HashStore()
    agreements = [StoreAgreement(store, rank, 3, timeout_s=10) for rank in range(3)]
    first = _on_threads(3, lambda r: agreements[r].exchange("x", {"rank": r}))
    second = _on_threads(3, lambda r: agreements[r].exchange("x", [r, "again"]))
    assert all(first[r] == [{"rank": 0}, {"rank": 1}, {"rank": 2}] for r in range(3))
    assert all(second[r] == [[0, "again"], [1, "again"], [2, "again"]] for r in range(3))
    # new agreement objects on the same store (a second executor) start a new round too
    fresh = _on_threads(3, lambda r: StoreAgreement(store, r, 3, timeout_s=10).exchange("x", r * 10))
    assert fresh[1] == [0, 10, 20]


def test_ranks_that_do_not_answer_are_named_when_the_timeout_expires():
    store = dist.HashStore()
    out = _on_threads(
        4,
        lambda r: None if r in (1, 3) else StoreAgreement(store, r, 4, timeout_s=0.3).exchange("plan", r),
    )
    for rank in (0, 2):
        error = out[rank]
        assert isinstance(error, DistributedAgreementError)
        assert error.ranks == (1, 3) and error.round_id == "plan/1"
        assert str(error).startswith("rank 1, rank 3 did not answer within 0.3 s in agreement round 'plan/1'")
        assert "(2 of 4 ranks did); they died, hang or are not running this agreement" in str(error)


def test_a_rank_that_fails_stops_the_others_at_once_with_its_error():
    store = dist.HashStore()

    def work(rank):
        agreement = StoreAgreement(store, rank, 3, timeout_s=600, describe=lambda r: f"worker #{r}")
        if rank == 2:
            agreement.fail("plan", ValueError("no room left\nsecond line"))
            return "failed"
        return agreement.exchange("plan", rank)

    out = _on_threads(3, work)
    assert out[2] == "failed"
    for rank in (0, 1):
        assert isinstance(out[rank], DistributedAgreementError) and out[rank].ranks == (2,)
        assert f"stopped on worker #{rank} because worker #2 failed: ValueError: no room left;" in str(
            out[rank]
        )


def test_a_lost_store_is_a_store_error_naming_the_host_and_no_rank():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
    agreement = StoreAgreement(client, 0, 2, timeout_s=600, run_id="lost")
    del server
    with pytest.raises(StoreUnavailableError) as info:
        agreement.exchange("plan", {})
    host = f"127.0.0.1:{client.port}"
    assert str(info.value).startswith(
        f"rank 0 lost the key-value store at {host} in agreement round 'plan/1'"
    )
    assert "no rank is at fault" in str(info.value)
    assert info.value.host == host and info.value.ranks == () and info.value.round_id == "plan/1"
    assert isinstance(info.value, DistributedAgreementError)  # what callers already catch


def test_a_rerun_on_a_store_with_an_older_attempt_s_keys_agrees_on_its_own_payloads():
    store = dist.HashStore()
    # an older attempt: rank 2 died before the agreement, the others timed out
    _on_threads(
        3, lambda r: None if r == 2 else StoreAgreement(store, r, 3, timeout_s=0.2).exchange("plan", "old")
    )
    # a complete older attempt too
    _on_threads(3, lambda r: StoreAgreement(store, r, 3, timeout_s=10).exchange("plan", f"older {r}"))
    rerun = _on_threads(3, lambda r: StoreAgreement(store, r, 3, timeout_s=10).exchange("plan", f"new {r}"))
    assert all(rerun[r] == ["new 0", "new 1", "new 2"] for r in range(3))


def test_explicit_run_ids_keep_attempts_apart():
    store = dist.HashStore()
    first = _on_threads(2, lambda r: StoreAgreement(store, r, 2, timeout_s=10, run_id="a").exchange("x", r))
    # the same run id again: a second agreement of each rank in this process gets its own keys
    again = _on_threads(2, lambda r: StoreAgreement(store, r, 2, timeout_s=10, run_id="a").exchange("x", -r))
    other = _on_threads(
        2, lambda r: StoreAgreement(store, r, 2, timeout_s=10, run_id="b").exchange("x", r + 5)
    )
    assert first[1] == [0, 1] and again[1] == [0, -1] and other[0] == [5, 6]


def test_a_run_id_reused_by_new_processes_is_refused_on_every_rank(monkeypatch):
    from collections import Counter

    from kvcore.engine import agreement as module
    from kvcore.errors import AttemptReusedError

    store = dist.HashStore()
    first = _on_threads(
        2, lambda r: StoreAgreement(store, r, 2, timeout_s=10, run_id="same").exchange("x", r)
    )
    assert first[0] == first[1] == [0, 1]
    monkeypatch.setattr(module, "_instances", Counter())  # new processes count agreements from 1 again
    again = _on_threads(
        2, lambda r: StoreAgreement(store, r, 2, timeout_s=10, run_id="same").exchange("x", -r)
    )
    for rank in (0, 1):  # never the first run's decision ([0, 1])
        assert isinstance(again[rank], AttemptReusedError), again[rank]
        assert again[rank].attempt == "same/1" and again[rank].ranks == ()
        assert "was used on this store by an earlier run" in str(again[rank])


def test_torchrun_s_run_id_and_restart_count_name_the_attempt(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert elastic_run_id() == "job7/2"
    agreement = StoreAgreement(dist.HashStore(), 0, 1, timeout_s=5, run_id="mine")
    assert agreement.attempt is not None and agreement.attempt.startswith("job7/2/mine/")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert elastic_run_id() is None and StoreAgreement(dist.HashStore(), 0, 1).attempt is None


class _BlindStore:
    """A store through which a rank misses the round's decision once, then stalls past its
    deadline (as a rank that is paused between two polls)."""

    def __init__(self, store, stall_s):
        self.store, self.stall_s, self.blinded = store, stall_s, False

    def __getattr__(self, name):
        return getattr(self.store, name)

    def check(self, keys):
        if not self.blinded and keys[0].endswith("/result"):
            self.blinded = True
            time.sleep(self.stall_s)
            return False
        return self.store.check(keys)


def test_a_rank_past_its_deadline_follows_a_decision_made_before_it_gave_up():
    store = dist.HashStore()
    # rank 1 stalls past its deadline; a deadline of a second leaves rank 0 time to decide even
    # on two busy cores (at 0.3 s it failed once under load)
    stores = [store, _BlindStore(store, stall_s=1.5)]
    agreements = [StoreAgreement(stores[r], r, 2, timeout_s=1.0, run_id="late") for r in range(2)]
    out = _on_threads(2, lambda r: agreements[r].exchange("plan", r))
    assert stores[1].blinded  # rank 1 reached its deadline without having seen the decision
    assert out[0] == out[1] == [0, 1]  # and still returns: a decided round is never aborted


def test_ranks_started_with_different_settings_stop_before_planning_naming_field_and_rank():
    scenario = Scenario(tp=2, pp=2)
    registry = toy_registry()
    store = dist.HashStore()

    def work(rank):
        executor = DistributedExecutor(
            RankExecutor(scenario, rank, registry),
            rank=rank,
            world_size=4,
            store=store,
            tp_size=2,
            timeout_s=30,
        )
        length = 262144 if rank == 2 else scenario.max_model_len
        return initialize_kv_caches(executor, registry=registry, max_model_len=length)

    out = _on_threads(4, work)
    for rank in range(4):
        error = out[rank]
        assert isinstance(error, AgreementMismatchError), error
        assert error.field == "max_model_len" and error.ranks == (2,) and error.round_id == "plan/1"
        assert "ranks disagree on max_model_len: rank 2 (pp stage 1, tp rank 0) has 262144, but " in str(
            error
        )
        assert "fewest blocks" not in str(error)


def test_the_first_abort_wins_and_every_rank_reports_it():
    store = dist.HashStore()

    def work(rank):
        agreement = StoreAgreement(store, rank, 4, timeout_s=600, run_id="first")
        if rank == 3:
            agreement.fail("plan", ValueError("first fault"))
            return "failed"
        if rank == 2:
            time.sleep(0.2)
            agreement.fail("plan", ValueError("second fault"))
            return "failed"
        return agreement.exchange("plan", rank)

    out = _on_threads(4, work)
    for rank in (0, 1):
        assert out[rank].ranks == (3,) and "ValueError: first fault" in str(out[rank])


def test_ranks_disagreeing_on_a_field_are_named_by_the_majority():
    describe = "rank {}".format
    assert majority_mismatch("x", [1, 1, 1], describe) is None
    found = majority_mismatch("max_model_len", [4096, 262144, 4096, 4096], describe)
    assert found is not None and found.ranks == (1,) and found.field == "max_model_len"
    assert found.detail == (
        "ranks disagree on max_model_len: rank 1 has 262144, but rank 0, rank 2, rank 3 have 4096; "
        "start every rank with the same settings"
    )
    tie = majority_mismatch("policy", ["a", "b"], describe)
    assert tie is not None and tie.ranks == (1,)  # rank 0's value wins a tie


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 2, "world_size": 2}, "rank must be an int in [0, 2) (got 2)"),
        ({"rank": 0, "world_size": 0}, "world size must be an int >= 1"),
        ({"rank": 0, "world_size": 1, "timeout_s": 0}, "'timeout_s' must be a number of seconds > 0"),
    ],
)
def test_bad_agreement_arguments(kwargs, message):
    with pytest.raises(InvalidInputError) as info:
        StoreAgreement(dist.HashStore(), **kwargs)
    assert message in str(info.value)


def test_store_from_env_needs_what_torchrun_sets(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidInputError, match="MASTER_ADDR is not set; launch the program with torchrun"):
        store_from_env()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "twelve")
    with pytest.raises(InvalidInputError, match="MASTER_PORT must be an integer"):
        store_from_env()


def test_store_from_env_is_a_client_of_the_agent_store_under_torchrun(monkeypatch):
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    monkeypatch.setenv("RANK", "0")  # rank 0 too: the agent hosts the store, not a rank
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    store = store_from_env(timeout_s=5)
    store.set("probe", "1")
    assert agent.get("kvcore/probe") == b"1"  # every kvcore key is under kvcore/


def test_from_process_group_needs_an_initialized_group():
    assert not dist.is_initialized()
    with pytest.raises(InvalidInputError, match="init_process_group"):
        DistributedExecutor.from_process_group(RankExecutor(Scenario(), 0, toy_registry()))


def test_an_allocation_failure_on_one_rank_stops_every_rank():
    scenario = Scenario(tp=2)
    registry = toy_registry()
    store = dist.HashStore()

    def no_memory(nbytes, device):
        raise RuntimeError("out of memory (injected)")

    def work(rank):
        local = RankExecutor(scenario, rank, registry)
        if rank == 1:
            local.allocator = no_memory
        executor = DistributedExecutor(local, rank=rank, world_size=2, store=store, tp_size=2, timeout_s=600)
        plan = initialize_kv_caches(executor, registry=registry, max_model_len=scenario.max_model_len)
        return plan, executor

    out = _on_threads(2, work)
    assert isinstance(out[1], KVCacheAllocationError)  # rank 1's own error, as is
    assert isinstance(out[0], DistributedAgreementError) and out[0].ranks == (1,)
    assert out[0].round_id == "ready/1"
    assert "rank 1 failed: KVCacheAllocationError: allocating the KV cache on cpu failed" in str(out[0])


def test_ranks_agree_and_keep_every_plan():
    scenario = Scenario(tp=1, pp=2, windows={5: 32, 6: 32})
    registry = toy_registry()
    store = dist.HashStore()

    def work(rank):
        executor = DistributedExecutor(
            RankExecutor(scenario, rank, registry), rank=rank, world_size=2, store=store, timeout_s=30
        )
        plan = initialize_kv_caches(executor, registry=registry, max_model_len=scenario.max_model_len)
        assert executor.plan is plan and executor.local.plan is plan
        return executor.rank_plans

    out = _on_threads(2, work)
    assert out[0] == out[1] and len(out[0]) == 2
    assert out[0][0].num_blocks == out[0][1].num_blocks


@pytest.mark.parametrize("what", ["model options", "model"])
def test_a_whole_stage_with_another_kv_dtype_or_model_is_refused_before_planning(what):
    # pipeline stages hold different layers, so their specs cannot show it: the fingerprint does
    scenario = Scenario(pp=2)
    registry = toy_registry()
    store = dist.HashStore()

    def work(rank):
        local = RankExecutor(scenario, rank, registry)
        identity = {"model": "acme-7b" if rank == 0 else "acme-13b"} if what == "model" else None
        if what == "model options" and rank == 1:
            local._scan_options = ModelOptions(kv_cache_dtype="fp8")
        executor = DistributedExecutor(
            local, rank=rank, world_size=2, store=store, timeout_s=30, identity=identity
        )
        return initialize_kv_caches(executor, registry=registry, max_model_len=scenario.max_model_len)

    out = _on_threads(2, work)
    for rank in range(2):
        assert isinstance(out[rank], AgreementMismatchError), out[rank]
        assert out[rank].field == what and out[rank].ranks == (1,)


def test_agree_on_plan_takes_a_request():
    scenario = Scenario(tp=1, pp=2, windows={5: 32, 6: 32})
    registry = toy_registry()
    context = SizingContext(max_model_len=scenario.max_model_len)

    def agree(store, rank):
        executor = DistributedExecutor(
            RankExecutor(scenario, rank, registry), rank=rank, world_size=2, store=store, timeout_s=30
        )
        specs, memory = executor.get_kv_cache_spec(), executor.determine_available_memory()
        request = PlanRequest.for_context(specs, memory, context, policy=scenario.policy)
        return executor.agree_on_plan(request, registry=registry)

    store = dist.HashStore()
    by_request = _on_threads(2, lambda rank: agree(store, rank))
    assert by_request[0].num_blocks == by_request[1].num_blocks > 0
