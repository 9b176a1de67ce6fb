import subprocess
import sys

import pytest
import torch

from kvcore import InvalidInputError, InvalidSpecError, dtypes
from kvcore.dtypes import SUPPORTED, DType, dtype_name, dtype_size, is_torch_dtype, to_dtype
from kvcore.runtime.torch_dtypes import torch_dtype

#: Every name under which torch offers a dtype (``torch.half``, ``torch.long``, ...).
TORCH_DTYPE_NAMES = sorted(name for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype))


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("bfloat16", dtypes.bfloat16),
        ("bf16", dtypes.bfloat16),
        ("torch.float16", dtypes.float16),
        ("fp8", dtypes.float8_e4m3fn),
        ("fp8_e5m2", dtypes.float8_e5m2),
        ("float8_e4m3fn", dtypes.float8_e4m3fn),
        ("FLOAT32", dtypes.float32),
        (" half ", dtypes.float16),
        (dtypes.int8, dtypes.int8),
        (torch.int8, dtypes.int8),
        (torch.bfloat16, dtypes.bfloat16),
    ],
)
def test_to_dtype(name, dtype):
    assert to_dtype(name) is dtype


@pytest.mark.parametrize("bad", ["bfloat61", "", "complex64", 16, None, "Tensor", torch.int64, torch.bool])
def test_to_dtype_rejects(bad):
    with pytest.raises(InvalidSpecError, match="dtype"):
        to_dtype(bad)


def test_messages_say_what_is_wrong():
    with pytest.raises(InvalidSpecError, match=r"must be a torch dtype name such as 'bfloat16'.*'bf61'"):
        to_dtype("bf61")
    with pytest.raises(InvalidSpecError, match=r"'int64' cannot hold a KV cache; use one of float64, "):
        to_dtype("long")
    with pytest.raises(InvalidSpecError, match=r"'complex64' cannot hold a KV cache"):
        to_dtype(torch.cfloat)
    with pytest.raises(InvalidSpecError, match=r"must be a torch.dtype or its name \(got 16 that is a int\)"):
        to_dtype(16)
    with pytest.raises(InvalidSpecError, match=r"'float24' cannot hold a KV cache"):
        to_dtype(DType("float24", 3))
    with pytest.raises(InvalidSpecError, match=r"'bfloat16' cannot hold a KV cache"):
        to_dtype(DType("bfloat16", 4))  # a wrong size is not bfloat16


@pytest.mark.parametrize("name", TORCH_DTYPE_NAMES)
def test_every_torch_dtype_name_reads_as_torch_reads_it(name):
    """Without torch, a name gives the dtype torch gives it, or the error torch's dtype would."""
    wanted = getattr(torch, name)
    canonical = str(wanted).removeprefix("torch.")
    if canonical in dtypes.SUPPORTED_BY_NAME:
        got = to_dtype(name)
        assert (got.name, got.itemsize) == (canonical, wanted.itemsize)
        assert torch_dtype(got) is wanted
        assert to_dtype(wanted) is got
    else:
        message = rf"'dtype' '{canonical}' cannot hold a KV cache"
        with pytest.raises(InvalidSpecError, match=message):
            to_dtype(name)
        with pytest.raises(InvalidSpecError, match=message):
            to_dtype(wanted)


@pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
def test_sizes_and_names_match_torch(dtype):
    assert dtype_size(dtype) == dtype.itemsize == torch_dtype(dtype).itemsize
    assert dtype_name(dtype) == str(dtype) == repr(dtype) == dtype.name
    assert dtype_name(torch_dtype(dtype)) == dtype.name
    assert dtype_size(torch_dtype(dtype)) == dtype.itemsize


def test_name_and_size_round_trip():
    for dtype in (dtypes.bfloat16, dtypes.float8_e4m3fn, dtypes.float32):
        assert to_dtype(dtype_name(dtype)) is dtype
    assert dtype_size(to_dtype("fp8_e5m2")) == 1
    assert dtype_size(dtypes.float32) == 4


def test_dtypes_are_values():
    assert DType("bfloat16", 2) == dtypes.bfloat16
    assert hash(DType("bfloat16", 2)) == hash(dtypes.bfloat16)
    # kvcore 0.1 specs held torch dtypes: comparing with one is refused naming the kvcore dtype
    with pytest.raises(
        InvalidInputError, match=r"kvcore\.dtypes\.bfloat16 \(or to_dtype\(torch\.bfloat16\)\)"
    ):
        assert dtypes.bfloat16 == torch.bfloat16
    with pytest.raises(InvalidInputError):
        assert dtypes.bfloat16 != torch.float16
    assert dtypes.bfloat16 != "bfloat16"  # names are converted with to_dtype, never equal
    assert is_torch_dtype(torch.float16)
    assert not is_torch_dtype(dtypes.float16) and not is_torch_dtype("float16")


def test_torch_dtype_converts_names_and_checks_torch_dtypes():
    assert torch_dtype("bf16") is torch.bfloat16
    assert torch_dtype(torch.float16) is torch.float16
    with pytest.raises(InvalidSpecError, match="cannot hold a KV cache"):
        torch_dtype(torch.int64)


def test_reading_dtypes_imports_no_torch():
    code = (
        "import sys; from kvcore.dtypes import to_dtype, dtype_size; "
        "assert dtype_size(to_dtype('fp8')) == 1; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
