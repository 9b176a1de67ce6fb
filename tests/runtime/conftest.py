"""The ``cuda`` fixture of the runtime tests that run on a real device (``test_cuda_*.py``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def cuda():
    """The current CUDA device, with torch's cache emptied before and after the test (so that
    what the driver reports free is what the test left). Only for tests skipped without CUDA."""
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.empty_cache()
    yield device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
