"""The vLLM tests skip without vLLM, except where ``KVCORE_REQUIRE_VLLM=1`` says they must run."""

from __future__ import annotations

import os

import pytest

from tests.integrations.vllm.conftest import HAS_VLLM


def test_vllm_is_installed():
    if HAS_VLLM:
        import vllm

        assert vllm.__version__.startswith("0.33."), (
            f"kvcore[vllm] targets vllm>=0.33,<0.34, not {vllm.__version__}"
        )
        return
    if os.environ.get("KVCORE_REQUIRE_VLLM") == "1":
        pytest.fail(
            "KVCORE_REQUIRE_VLLM=1 but vllm is not importable: install kvcore[vllm] in its own environment"
        )
    pytest.skip("vllm is not installed (pip install 'kvcore[vllm]' in an environment of its own)")
