"""Plan values: structural validation and derived figures."""

import pytest

from kvcore import KVCacheGroup, KVCachePlan, KVCacheTensor, PlanValidationError, SizingContext
from tests.helpers import full, sliding

CTX = SizingContext(max_model_len=512)
P = full(block_size=16, heads=2, head_size=64, dtype="float32").page_size_bytes  # 16384


def _plan(**overrides):
    spec = full(block_size=16, heads=2, head_size=64, dtype="float32")
    fields = {
        "policy": "uniform",
        "num_blocks": 32,
        "bytes_per_block": 2 * P,
        "single_buffer": False,
        "groups": (KVCacheGroup(layer_names=("l1", "l2"), spec=spec),),
        "tensors": (
            KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l1",)),
            KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l2",)),
        ),
        "context": CTX,
        "available_memory_bytes": 2 * 32 * P,
    }
    fields.update(overrides)
    return KVCachePlan(**fields)


def test_figures():
    plan = _plan()
    assert plan.kv_cache_bytes == 2 * 32 * P
    assert plan.blocks_per_request() == 32
    assert plan.max_concurrency() == 1.0
    assert plan.max_concurrency(256) == 2.0
    assert plan.tokens_held(plan.groups[0]) == 512
    assert plan.fits() and plan.largest_fitting_len(10**6) == 512
    assert plan.group_of("l2") is plan.groups[0]
    assert plan.tensor_of("l2").shared_by == ("l2",)


def test_largest_fitting_len_is_exact():
    plan = _plan(
        num_blocks=31,
        tensors=(
            KVCacheTensor(size=31 * P, page_stride=P, shared_by=("l1",)),
            KVCacheTensor(size=31 * P, page_stride=P, shared_by=("l2",)),
        ),
    )
    assert not plan.fits()
    assert plan.largest_fitting_len() == 31 * 16


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"tensors": (KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l1",)),)}, "'l2' .* not covered"),
        (
            {"tensors": (KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l1", "l2")),) * 2},
            "in tensors 0 and 1",
        ),
        (
            {
                "tensors": (
                    KVCacheTensor(size=32 * P, page_stride=P // 2, shared_by=("l1",)),
                    KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l2",)),
                )
            },
            "larger than the tensor's page stride",
        ),
        (
            {
                "tensors": (
                    KVCacheTensor(size=31 * P, page_stride=P, shared_by=("l1",)),
                    KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l2",)),
                )
            },
            "do not fit",
        ),
        (
            {
                "tensors": (
                    KVCacheTensor(size=32 * P, offset=P, page_stride=P, shared_by=("l1",)),
                    KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l2",)),
                )
            },
            "own allocation but has offset",
        ),
        (
            {
                "single_buffer": True,
                "tensors": (
                    KVCacheTensor(size=32 * P, offset=P * 40, page_stride=P, shared_by=("l1",)),
                    KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l2",)),
                ),
            },
            "but the buffer has",
        ),
        (
            {
                "groups": (
                    KVCacheGroup(
                        layer_names=("l1", "l2"),
                        spec=full(block_size=16, heads=2, head_size=64, dtype="float32"),
                    ),
                    KVCacheGroup(layer_names=("l2",), spec=sliding(4)),
                )
            },
            "in groups 0 and 1",
        ),
        (
            {
                "tensors": (
                    KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l1",)),
                    KVCacheTensor(size=32 * P, page_stride=P, shared_by=("l2", "l3")),
                )
            },
            "'l3', which is in no group",
        ),
    ],
)
def test_structural_problems(overrides, match):
    with pytest.raises(PlanValidationError, match=match):
        _plan(**overrides)


def test_all_problems_reported_at_once():
    with pytest.raises(PlanValidationError) as info:
        _plan(tensors=())
    assert len(info.value.problems) == 2
