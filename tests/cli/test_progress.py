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


def test_eta_is_the_time_left_at_the_pace_so_far():
    from kvcore.cli.progress import eta

    assert eta(0, 100, 5.0) == ""  # no pace yet
    assert eta(25, 100, 10.0) == "ETA 30 s"
    assert eta(10, 100, 25.0) == "ETA 3 min 45 s"
    assert eta(100, 100, 9.0) == ""  # nothing left


def test_the_simulation_progress_line_shows_the_eta():
    from kvcore.cli.replay import FinishedCount

    now = [100.0]
    count = FinishedCount(5000, clock=lambda: now[0])
    assert count.text() == "0/5,000 finished"
    now[0] = 103.0
    count.on_step(800, 1200)
    assert count.text() == "1,200/5,000 finished, ETA 10 s"
