"""One capacity value per plan: every figure the report, compare, the engine log and the memory
map show comes from :class:`Capacity`."""

import pytest

from kvcore import Capacity, SizingContext, efficiency, ideal_concurrency, plan_kv_cache, request_bytes
from kvcore.cli.memory_map import memory_map
from kvcore.cli.report import format_plan, plan_report
from kvcore.engine.workflow import capacity_summary
from kvcore.planning.capacity import blocks_that_fit
from kvcore.planning.compare import compare_policies
from kvcore.planning.request import PlanRequest
from tests.helpers import full, mix, sliding

CTX = SizingContext(max_model_len=4096)
SPECS = mix((4, full()), (8, sliding(512)))
BUDGET = 3 * 2**30 + 12345


@pytest.fixture
def plan(registry):
    return plan_kv_cache(SPECS, BUDGET, CTX, registry=registry)


def test_the_figures_of_one_plan(plan):
    capacity = Capacity.of(plan, SPECS)
    need = request_bytes(SPECS, CTX)
    assert capacity.max_model_len == 4096
    assert capacity.blocks_per_request == plan.blocks_per_request()
    assert capacity.request_bytes == plan.blocks_per_request() * plan.bytes_per_block
    assert capacity.ideal_request_bytes == need
    assert capacity.padding_bytes == capacity.request_bytes - need
    assert capacity.max_concurrency == plan.max_concurrency()
    assert capacity.ideal_concurrency == ideal_concurrency(SPECS, BUDGET, CTX) == BUDGET / need
    assert (
        capacity.efficiency
        == capacity.max_concurrency / capacity.ideal_concurrency
        == efficiency(plan, SPECS)
    )
    assert capacity.kv_cache_tokens == int(plan.max_concurrency() * 4096)
    assert capacity.blocks_that_fit == BUDGET // plan.bytes_per_block == plan.num_blocks
    assert capacity.tokens_held == tuple(plan.tokens_held(g) for g in plan.groups)


def test_without_specs_the_group_specs_stand_in(plan):
    # no group's block size was enlarged here, so the stand-ins are exact
    assert Capacity.of(plan) == Capacity.of(plan, SPECS)


def test_blocks_that_fit():
    assert blocks_that_fit(100, 30) == 3
    assert blocks_that_fit(100, 0) == 0


def test_every_reader_shows_the_same_figures(plan, registry):
    capacity = Capacity.of(plan, SPECS)
    report = plan_report(plan, SPECS, registry)
    assert (report["max_concurrency"], report["ideal_concurrency"], report["efficiency"]) == (
        capacity.max_concurrency,
        capacity.ideal_concurrency,
        capacity.efficiency,
    )
    assert report["kv_cache_tokens"] == capacity.kv_cache_tokens
    assert [g["tokens_held"] for g in report["groups"]] == list(capacity.tokens_held)
    concurrency = f"{capacity.max_concurrency:,.2f} requests of 4,096 tokens"
    assert concurrency in format_plan(plan, SPECS)
    assert f"efficiency {100 * capacity.efficiency:.2f}%" in format_plan(plan, SPECS)
    assert concurrency in capacity_summary(plan, SPECS)
    assert f"{capacity.max_concurrency:.2f} requests" in memory_map(plan).title
    (candidate,) = compare_policies(
        PlanRequest.for_context(SPECS, BUDGET, CTX), registry=registry, policies=["shared_buffer"]
    )
    assert candidate.capacity == capacity
    assert candidate.padding_bytes == capacity.padding_bytes
