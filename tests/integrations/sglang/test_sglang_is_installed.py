"""The SGLang tests skip without SGLang, except where ``KVCORE_REQUIRE_SGLANG=1`` says they must run."""

from __future__ import annotations

import os

import pytest

from tests.integrations.sglang.conftest import HAS_SGLANG


def test_sglang_is_installed():
    if HAS_SGLANG:
        from importlib.metadata import version

        assert version("sglang").startswith("0.5."), (
            f"kvcore[sglang] targets sglang 0.5, not {version('sglang')}"
        )
        return
    if os.environ.get("KVCORE_REQUIRE_SGLANG") == "1":
        pytest.fail(
            "KVCORE_REQUIRE_SGLANG=1 but sglang is not importable: install kvcore[sglang] in its own "
            "environment"
        )
    pytest.skip("sglang is not installed (see docs/how-to/serve-with-sglang.md)")
