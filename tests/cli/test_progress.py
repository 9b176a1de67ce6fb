import io

import pytest

from kvcore.cli.progress import progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_plain_stream_gets_one_line():
    out = io.StringIO()
    with progress("allocating 1.00 GiB", stream=out):
        pass
    text = out.getvalue()
    assert text.startswith("allocating 1.00 GiB: done in ") and text.endswith(" s\n")
    assert text.count("\n") == 1


def test_terminal_gets_a_spinner_and_failures_are_reported():
    out = _Tty()
    with pytest.raises(RuntimeError), progress("profiling", stream=out, interval=0.001):
        import time

        time.sleep(0.02)
        raise RuntimeError("boom")
    text = out.getvalue()
    assert "\r" in text and "profiling (" in text
    assert "profiling: failed after" in text


def test_a_failure_off_a_terminal_leaves_only_the_error():
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress("allocating", stream=out):
        raise RuntimeError("boom")
    assert out.getvalue() == ""
