"""The issue's capacity target on every bundled model: at 80 GiB and max_model_len =
min(max_position_embeddings, 131072), the default plan holds >= 99 % of the ideal concurrency."""

from __future__ import annotations

import pytest

from kvcore import SizingContext, efficiency, layer_specs_from_config, plan_kv_cache
from kvcore.frontends.hf_config import bundled_models, max_position_embeddings
from kvcore.planning.invariants import check_plan

GIB = 2**30


@pytest.mark.parametrize("model", bundled_models(), ids=lambda m: m.name)
def test_bundled_model_reaches_the_bound(registry, model):
    config = model.config()
    specs = layer_specs_from_config(config, registry)
    length = min(max_position_embeddings(config) or 131072, 131072)
    plan = plan_kv_cache(specs, 80 * GIB, SizingContext(max_model_len=length), registry=registry)
    assert efficiency(plan, specs) >= 0.99
    assert plan.kv_cache_bytes <= 80 * GIB
    check_plan(plan)
