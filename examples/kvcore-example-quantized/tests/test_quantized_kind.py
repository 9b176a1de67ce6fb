"""The quantized kind: kvcore's conformance suite, hand-computed page sizes, and a real page."""

import math

import pytest
import torch

from kvcore import InvalidSpecError, SizingContext
from kvcore.runtime.torch_dtypes import torch_dtype
from kvcore.testing.conformance import SpecKindConformance
from kvcore_example_quantized import QuantizedKVSpec, quantized


class TestQuantizedKind(SpecKindConformance):
    @pytest.fixture
    def spec_cls(self):
        return QuantizedKVSpec

    @pytest.fixture
    def kvcore_plugins(self):
        return (quantized,)

    @pytest.fixture
    def invalid_kwargs(self):
        return (
            {"num_kv_heads": 0},
            {"head_size": -128},
            {"payload_dtype": "bfloat16"},  # two bytes: not a quantized payload
            {"scale_dtype": "int8"},
            {"scale_group_size": 0},
            {"head_size": 128, "scale_group_size": 48},  # 48 does not divide 128
        )


def llama_int8(**kw):
    fields = dict(block_size=16, num_kv_heads=8, head_size=128, payload_dtype="int8", scale_dtype="float16")
    return QuantizedKVSpec(**{**fields, **kw})


def test_page_counts_payload_and_scales():
    spec = llama_int8()
    assert spec.scale_group_size == 128  # one scale per token per head by default
    assert spec.payload_bytes == 2 * 16 * 8 * 128  # 32768
    assert spec.scale_bytes == 2 * 16 * 8 * 1 * 2  # 512
    assert spec.page_size_bytes == 33280  # vs 65536 for the same layer in bfloat16
    grouped = llama_int8(scale_dtype="float32", scale_group_size=32)
    assert grouped.scale_bytes == 2 * 16 * 8 * 4 * 4  # four fp32 scales per head
    assert grouped.page_size_bytes == 32768 + 4096


def test_scales_start_aligned_after_an_odd_payload():
    spec = QuantizedKVSpec(
        block_size=1, num_kv_heads=1, head_size=3, payload_dtype="fp8", scale_dtype="float32"
    )
    assert spec.payload_bytes == 6
    assert spec.scale_offset_bytes == 8  # the next multiple of 4
    assert spec.page_size_bytes == 8 + 2 * 4
    assert spec.alignment_bytes == 4


def test_a_request_holds_one_block_per_block_size_tokens():
    assert llama_int8().max_num_blocks(SizingContext(max_model_len=8193)) == 513
    assert llama_int8().max_memory_usage_bytes(SizingContext(max_model_len=8192)) == 512 * 33280


def test_bad_group_size_says_what_to_use():
    with pytest.raises(InvalidSpecError, match=r"'scale_group_size' must divide 'head_size' 128 \(got 48\)"):
        llama_int8(scale_group_size=48)
    with pytest.raises(InvalidSpecError, match="'payload_dtype' must be one of int8, uint8"):
        llama_int8(payload_dtype="bfloat16")


def _part_view(buffer, part, page_size, pages):
    """The layer view of one part over ``pages`` pages (block dim inserted), as an allocator builds it."""
    size = part.dtype.itemsize
    strides = [math.prod(part.shape[i + 1 :]) for i in range(len(part.shape))]
    shape = [*part.shape[: part.block_dim], pages, *part.shape[part.block_dim :]]
    stride = [*strides[: part.block_dim], page_size // size, *strides[part.block_dim :]]
    return torch.as_strided(buffer.view(torch_dtype(part.dtype)), shape, stride, part.offset_bytes // size)


def test_a_page_holds_quantized_kv_and_its_scales(make_kvcore_registry):
    spec = llama_int8(block_size=4, num_kv_heads=2, head_size=8, scale_dtype="float32", scale_group_size=4)
    layout = make_kvcore_registry(quantized).cache_layout(spec)
    pages, page = 3, spec.page_size_bytes
    buffer = torch.zeros(pages * page, dtype=torch.uint8)
    views = {part.name: _part_view(buffer, part, page, pages) for part in layout.parts}
    assert views["payload"].shape == (2, pages, 4, 2, 8)
    assert views["scale"].shape == (2, pages, 4, 2, 2)

    kv = torch.randn(2, 4, 2, 8, generator=torch.Generator().manual_seed(0))
    groups = kv.reshape(2, 4, 2, 2, 4)
    scale = groups.abs().amax(-1) / 127
    views["payload"][:, 1] = torch.round(groups / scale[..., None]).to(torch.int8).reshape(2, 4, 2, 8)
    views["scale"][:, 1] = scale

    back = views["payload"][:, 1].float().reshape(2, 4, 2, 2, 4) * views["scale"][:, 1][..., None]
    assert torch.allclose(back.reshape(kv.shape), kv, atol=float(scale.max()) / 2 + 1e-6)
    assert int(buffer[:page].count_nonzero()) == 0  # page 0 untouched
    assert int(buffer[2 * page :].count_nonzero()) == 0  # page 2 untouched
