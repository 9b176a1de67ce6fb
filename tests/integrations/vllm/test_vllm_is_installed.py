"""The vLLM tests skip without vLLM, except where ``KVCORE_REQUIRE_VLLM=1`` says they must run."""

from __future__ import annotations

import os

import pytest

from tests.integrations.vllm.conftest import HAS_VLLM


def test_vllm_is_installed():
    if HAS_VLLM:
        from kvcore.integrations.vllm.versions import SUPPORTED_MINORS, installed_minor

        assert installed_minor() in SUPPORTED_MINORS  # raises, naming the range, for another release
        expected = os.environ.get("KVCORE_EXPECT_VLLM")  # CI says which release each environment holds
        if expected:
            from kvcore.integrations.vllm.versions import installed_version

            assert installed_version().startswith(expected + "."), (installed_version(), expected)
        return
    if os.environ.get("KVCORE_REQUIRE_VLLM") == "1":
        pytest.fail(
            "KVCORE_REQUIRE_VLLM=1 but vllm is not importable: install kvcore[vllm] in its own environment"
        )
    pytest.skip("vllm is not installed (pip install 'kvcore[vllm]' in an environment of its own)")
