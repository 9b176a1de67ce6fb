"""The command line refuses a file that never ends (``/dev/zero``) with one error line, for a
saved plan and a spec file alike, after reading ``kvcore.limits.MAX_INPUT_BYTES`` + 1 bytes."""

from __future__ import annotations

from typing import Any

import pytest

from kvcore import limits


def test_the_cli_refuses_dev_zero_with_one_line(run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_INPUT_BYTES", 1 << 16)
    for argv in (
        ["check", "/dev/zero"],
        ["plan", "--specs", "/dev/zero", "--memory", "1GiB", "--max-model-len", "64"],
    ):
        status, _, err = run_cli(*argv)
        assert status == 1
        assert err.strip() == (
            "kvcore: error: /dev/zero holds more than 65,536 bytes (kvcore.limits.MAX_INPUT_BYTES), "
            "more than any spec file, config, plan or trace; check the path (a device such as /dev/zero "
            "never ends), or raise kvcore.limits.MAX_INPUT_BYTES from Python"
        )
