"""KV-sharing layers in a plan: in their target's group, viewing its tensor, taking no bytes."""

from __future__ import annotations

import pytest

from kvcore import PlanValidationError, SizingContext, plan_kv_cache
from kvcore.planning.invariants import plan_problems
from kvcore.planning.serialization import plan_from_dict, plan_to_dict
from tests.helpers import full, mix, sliding

CTX = SizingContext(max_model_len=256)


@pytest.fixture
def plan(registry):
    specs = mix((2, full(heads=1, head_size=8)), (2, sliding(32, heads=1, head_size=8)))
    return plan_kv_cache(specs, 2**22, CTX, registry=registry).with_kv_sharing(
        {"model.layers.9": "model.layers.0"}
    )


def test_a_sharing_layer_reads_its_targets_block_table(plan):
    target = "model.layers.0"
    assert plan.group_of("model.layers.9") is plan.group_of(target)
    assert plan.tensor_of("model.layers.9") is plan.tensor_of(target)
    index = plan.groups.index(plan.group_of(target))
    assert plan.block_table_layers(index)[-1] == "model.layers.9"
    assert ("model.layers.9", plan.group_of(target), plan.tensor_of(target)) in list(plan.iter_layers())
    assert "model.layers.9" not in plan.layer_names  # it has no cache of its own
    assert plan_problems(plan) == []


def test_sharing_round_trips_through_json_and_is_left_out_when_empty(plan, registry):
    data = plan_to_dict(plan, registry)
    assert data["kv_sharing"] == {"model.layers.9": "model.layers.0"}
    assert plan_from_dict(data, registry) == plan
    plain = plan_kv_cache({"a": full()}, 2**26, CTX, registry=registry)
    assert "kv_sharing" not in plan_to_dict(plain, registry)


@pytest.mark.parametrize(
    ("sharing", "match"),
    [
        ({"model.layers.1": "model.layers.0"}, "also has a cache of its own"),
        ({"x": "nowhere"}, "'nowhere', which is not planned"),
        ({"x": "y", "y": "model.layers.0"}, "itself shares"),
    ],
)
def test_bad_sharing_is_refused(plan, sharing, match):
    with pytest.raises(PlanValidationError, match=match):
        plan.with_kv_sharing(sharing)
