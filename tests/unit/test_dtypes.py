import pytest
import torch

from kvcore import InvalidSpecError
from kvcore.dtypes import dtype_name, dtype_size, to_dtype


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("bfloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
        ("torch.float16", torch.float16),
        ("fp8", torch.float8_e4m3fn),
        ("fp8_e5m2", torch.float8_e5m2),
        ("float8_e4m3fn", torch.float8_e4m3fn),
        ("FLOAT32", torch.float32),
        (torch.int8, torch.int8),
    ],
)
def test_to_dtype(name, dtype):
    assert to_dtype(name) is dtype


@pytest.mark.parametrize("bad", ["bfloat61", "", "complex64", 16, None, "Tensor"])
def test_to_dtype_rejects(bad):
    with pytest.raises(InvalidSpecError, match="dtype"):
        to_dtype(bad)


def test_name_and_size_round_trip():
    for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float32):
        assert to_dtype(dtype_name(dtype)) is dtype
    assert dtype_size(torch.float8_e5m2) == 1
    assert dtype_size(torch.float32) == 4
