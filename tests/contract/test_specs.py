"""Per-kind formulas against hand-computed numbers, validation, and grouping keys."""

import attrs
import pytest
import torch

from kvcore import (
    InvalidSpecError,
    KVCacheSpec,
    SizingContext,
    SpecMismatchError,
    dtypes,
    is_kv_cache_type_uniform,
)
from kvcore.spec import describe_spec, spec_differences
from tests.helpers import chunked, full, mla, sliding


def test_full_attention_page_hand_computed():
    # 2 (K, V) x 16 tokens x 2 heads x 64 elements x 4 bytes
    spec = full(block_size=16, heads=2, head_size=64, dtype="float32")
    assert spec.page_size_bytes == 16384
    assert spec.bytes_per_token == 1024


def test_full_attention_blocks_per_request():
    spec = full(block_size=16)
    assert spec.max_num_blocks(SizingContext(max_model_len=32768)) == 2048
    assert spec.max_num_blocks(SizingContext(max_model_len=33)) == 3
    # 8 heads x 128 x bf16: 64 KiB per block, 2048 blocks
    assert spec.max_memory_usage_bytes(SizingContext(max_model_len=32768)) == 2048 * 65536


def test_sliding_window_worst_case():
    spec = sliding(1024, block_size=16)
    ctx = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)
    # ceil((1024 - 1 + 2048) / 16) + 1 = 192 + 1
    assert spec.max_num_blocks(ctx) == 193
    # a window wider than the request never costs more than full attention
    assert spec.max_num_blocks(SizingContext(max_model_len=100)) == 7
    small = sliding(128, block_size=16)
    assert small.max_num_blocks(SizingContext(max_model_len=32768, max_num_batched_tokens=1)) == 9


def test_sliding_window_grows_with_step_size():
    spec = sliding(4096)
    small = spec.max_num_blocks(SizingContext(max_model_len=131072, max_num_batched_tokens=512))
    large = spec.max_num_blocks(SizingContext(max_model_len=131072, max_num_batched_tokens=8192))
    assert small == -(-(4095 + 512) // 16) + 1
    assert large == -(-(4095 + 8192) // 16) + 1


def test_chunked_local_attention_worst_case():
    spec = chunked(8192, block_size=16)
    ctx = SizingContext(max_model_len=131072, max_num_batched_tokens=2048)
    assert spec.max_num_blocks(ctx) == -(-(8191 + 2048) // 16)  # chunk aligned to blocks
    misaligned = chunked(1000, block_size=16)
    # chunk k starts at 1000k mod 16, a multiple of gcd(1000, 16) = 8: 8 tokens into a block at
    # the latest, so its step holds ceil((8 + 999 + 2048) / 16) = 191 blocks (not 192: a chunk
    # that starts mid-block never starts 15 tokens in)
    assert misaligned.max_num_blocks(ctx) == -(-(8 + 999 + 2048) // 16) == 191
    assert spec.max_num_blocks(SizingContext(max_model_len=64)) == 4


def test_mla_page_is_one_latent_per_token():
    spec = mla(block_size=16, rank=512, rope=64, dtype="bfloat16")
    assert spec.latent_size == 576
    assert spec.page_size_bytes == 16 * 576 * 2
    assert spec.max_num_blocks(SizingContext(max_model_len=1000)) == 63


def test_fp8_halves_the_page():
    assert full(dtype="fp8").page_size_bytes * 2 == full(dtype="bfloat16").page_size_bytes
    assert full(dtype="fp8").dtype is dtypes.float8_e4m3fn
    assert full(dtype=torch.float8_e4m3fn) == full(dtype="fp8")  # a torch dtype is converted


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_kv_heads": 0}, "'num_kv_heads' must be >= 1 \\(got 0\\)"),
        ({"head_size": -4}, "'head_size' must be >= 1"),
        ({"block_size": 0}, "'block_size' must be >= 1"),
        ({"num_kv_heads": "8"}, "must be a positive int \\(got '8' that is a str\\)"),
        ({"num_kv_heads": True}, "positive int"),
        ({"head_size": 1.5}, "positive int"),
        ({"dtype": "bfloat61"}, "dtype"),
    ],
)
def test_invalid_fields_raise_invalid_spec_error(kwargs, match):
    base = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}
    from kvcore.plugins.full_attention import FullAttentionSpec

    with pytest.raises(InvalidSpecError, match=match):
        FullAttentionSpec(**{**base, **kwargs})


def test_missing_field_is_a_type_error_from_attrs_not_deep_inside():
    from kvcore.plugins.sliding_window import SlidingWindowSpec

    with pytest.raises(TypeError, match="sliding_window"):
        SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")


def test_specs_are_frozen_and_hashable():
    spec = full()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.block_size = 32  # type: ignore[misc]
    assert {spec: 1}[full()] == 1
    assert spec.with_block_size(32).page_size_bytes == 2 * spec.page_size_bytes
    assert spec.with_block_size(32).block_size == 32


def test_group_key_and_uniformity():
    assert full().group_key == full().group_key
    assert full().group_key != sliding(128).group_key
    assert full().group_key != full(head_size=64).group_key
    assert is_kv_cache_type_uniform({"a": full(), "b": full()})
    assert not is_kv_cache_type_uniform({"a": full(), "b": sliding(128)})
    assert is_kv_cache_type_uniform({})


def test_merge_equal_specs_and_name_the_difference():
    assert full().merge([full(), full()]) == full()
    with pytest.raises(SpecMismatchError, match=r"num_kv_heads \(8 vs 4\)"):
        full().merge([full(), full(heads=4)])
    with pytest.raises(SpecMismatchError, match="kind"):
        full().merge([full(), sliding(8)])


def test_describe_spec():
    text = describe_spec(sliding(1024))
    assert text.startswith("sliding_window(block_size=16")
    assert "dtype=bfloat16" in text
    assert "sliding_window=1024" in text
    assert spec_differences(full(), full(dtype="fp8")) == ["dtype (bfloat16 vs float8_e4m3fn)"]


def test_sizing_context_validates():
    with pytest.raises(InvalidSpecError):
        SizingContext(max_model_len=0)
    ctx = SizingContext(max_model_len=100, max_num_batched_tokens=4096)
    assert ctx.max_tokens_per_step == 100
    assert ctx.with_max_model_len(10).max_model_len == 10


@attrs.frozen(kw_only=True)
class _Declared(KVCacheSpec):
    """A plugin kind whose page size and alignment are whatever it declares."""

    kind = "test.declared"
    page: object = 64
    align: object = 1

    @property
    def page_size_bytes(self):
        return self.page

    @property
    def alignment_bytes(self):
        return self.align


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"page": -64}, r"page_size_bytes must be an int >= 1 \(got -64 for test\.declared\("),
        ({"page": 0}, r"page_size_bytes must be an int >= 1 \(got 0"),
        ({"page": 64.0}, r"page_size_bytes must be an int >= 1 \(got 64\.0"),
        ({"align": 0}, r"alignment_bytes must be an int >= 1 \(got 0\)"),
        ({"align": True}, r"alignment_bytes must be an int >= 1 \(got True\)"),
        ({"page": 66, "align": 4}, r"page_size_bytes 66 is not a multiple of alignment_bytes 4"),
    ],
)
def test_a_bad_page_is_caught_when_the_spec_is_built(fields, match):
    # named by kind and class (so by its plugin module), not blamed later on a healthy layer
    with pytest.raises(InvalidSpecError, match=match) as info:
        _Declared(block_size=16, **fields)
    assert str(info.value).startswith("spec kind 'test.declared' (tests.contract.test_specs:_Declared)")


def test_a_bad_page_is_caught_when_a_block_size_makes_it(registry):
    ok = _Declared(block_size=16, page=64, align=1)
    with pytest.raises(InvalidSpecError, match="page_size_bytes must be an int >= 1"):
        attrs.evolve(ok, page=-1)
    assert _Declared(block_size=16, page=64, align=4).page_size_bytes == 64


def test_the_planner_worst_case_is_read_off_live_pages_by_default():
    spec = _Declared(block_size=16)
    assert spec.live_pages(33) == range(3) and spec.live_pages(33, 32) == range(3)  # frees nothing
    assert spec.max_num_blocks(SizingContext(max_model_len=33)) == 3
    assert full(block_size=16).max_num_blocks(SizingContext(max_model_len=32768)) == 2048
