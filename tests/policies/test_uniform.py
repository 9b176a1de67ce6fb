from kvcore import SizingContext, plan_kv_cache
from kvcore.planning.invariants import check_plan
from tests.helpers import full, mla


def test_one_group_one_tensor_per_layer(registry):
    specs = {f"l{i}": full() for i in range(4)}
    plan = plan_kv_cache(specs, 2**30, SizingContext(max_model_len=4096), registry=registry, policy="uniform")
    assert len(plan.groups) == 1
    assert plan.groups[0].layer_names == tuple(specs)
    assert [t.shared_by for t in plan.tensors] == [(n,) for n in specs]
    assert not plan.single_buffer
    page = full().page_size_bytes
    assert plan.num_blocks == 2**30 // (4 * page)
    assert all(t.size == plan.num_blocks * page and t.page_stride == page for t in plan.tensors)
    check_plan(plan)


def test_mla_model_is_uniform(registry):
    specs = {f"l{i}": mla() for i in range(61)}
    plan = plan_kv_cache(specs, 80 * 2**30, SizingContext(max_model_len=32768), registry=registry)
    assert plan.policy == "uniform"
    assert plan.num_blocks == 80 * 2**30 // (61 * 16 * 576 * 2)
