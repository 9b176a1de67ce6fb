"""A plan made with ``PlanOptions.pool_split`` records its split, so that what its budget holds
(``Capacity.blocks_that_fit``, the per-rank report) is split the same way, not by the worst
case; and its JSON carries the split while a plan split by need reads and writes as before."""

import json

import attrs
import pytest

from kvcore import Capacity, PlanOptions, PlanValidationError, SizingContext, plan_kv_cache
from kvcore.cli.report import format_ranks
from kvcore.planning.capacity import own_pool_blocks, split_budget
from kvcore.planning.planner import plan
from kvcore.planning.ranks import Parallelism
from kvcore.planning.request import PlanRequest
from kvcore.planning.serialization import plan_from_json, plan_to_json
from tests.helpers import full, mix, sliding

GIB = 2**30
CTX = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)
SPECS = mix((10, full()), (50, sliding(1024)))
SPLIT = (0.3, 0.7)


def _pools(registry, **kwargs):
    return plan_kv_cache(SPECS, 20 * GIB, CTX, registry=registry, policy="kind_pools", **kwargs)


def test_a_split_plan_records_its_split(registry):
    plan = _pools(registry, options=PlanOptions(pool_split=SPLIT))
    assert plan.pool_split == SPLIT
    assert _pools(registry).pool_split is None
    forced = _pools(registry, options=PlanOptions(pool_split=SPLIT), num_blocks=[400, 4000])
    assert forced.pool_split is None  # forced counts were not split from the budget


def test_blocks_that_fit_follow_the_split(registry):
    plan = _pools(registry, options=PlanOptions(pool_split=SPLIT))
    counts = tuple(p.num_blocks for p in plan.pools)
    worst = split_budget(
        plan.available_memory_bytes,
        [p.bytes_per_block for p in plan.pools],
        plan.blocks_per_request_by_pool(),
    )
    assert worst != counts  # the worst-case split would count other blocks
    assert own_pool_blocks(plan) == counts
    assert Capacity.of(plan).blocks_that_fit == sum(counts)


def test_the_ranks_report_names_the_split_and_not_a_forced_count(registry):
    first = sliding(1024)
    specs = {f"model.layers.{i}": (full() if i % 6 == 5 else first) for i in range(12)}
    stages = [list(specs)[:6], list(specs)[6:]]
    request = PlanRequest.for_context(
        specs,
        [10 * GIB, 10 * GIB],
        CTX,
        policy="kind_pools",
        options=PlanOptions(pool_split=SPLIT),
        rank_layers=stages,
    )
    plans = plan(request, registry=registry).plans
    text = format_ranks(plans, Parallelism(tp_size=1, pp_size=2))
    assert "pool_split 30.0%/70.0%" in text
    assert "forced" not in text


def test_json_keeps_the_split_and_old_json_still_loads(registry):
    plan = _pools(registry, options=PlanOptions(pool_split=SPLIT))
    text = plan_to_json(plan, registry)
    assert json.loads(text)["pool_split"] == list(SPLIT)
    assert plan_from_json(text, registry) == plan
    plain = _pools(registry)
    data = json.loads(plan_to_json(plain, registry))
    assert "pool_split" not in data  # a plan split by need writes as it always did
    assert plan_from_json(json.dumps(data), registry) == plain


def test_a_split_of_the_wrong_length_is_refused(registry):
    plan = _pools(registry, options=PlanOptions(pool_split=SPLIT))
    with pytest.raises(PlanValidationError, match="'pool_split' gives 3 fractions"):
        attrs.evolve(plan, pool_split=(0.2, 0.3, 0.5))
    with pytest.raises(PlanValidationError, match=r"in \(0, 1\)"):
        attrs.evolve(plan, pool_split=(0.0, 1.0))
