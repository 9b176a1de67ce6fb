"""A progress line for steps that can take seconds (profiling, allocating large buffers).

On a terminal it shows a spinner with the elapsed time and ends with ``done in 1.23 s``;
elsewhere (pipes, CI logs) it prints one line when the step ends, so logs stay readable, and
nothing when it fails (the error message that follows says what went wrong).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

_FRAMES = "|/-\\"


def eta(done: int, total: int, elapsed: float) -> str:
    """What is left of a loop at the pace so far, for a progress line: ``"ETA 42 s"``,
    ``"ETA 3 min 5 s"``; ``""`` before the first item is done (no pace yet).

    Args:
        done: items done so far.
        total: items in all.
        elapsed: seconds since the loop started.
    """
    if done <= 0 or done >= total:
        return ""
    left = round(elapsed / done * (total - done))
    minutes, seconds = divmod(left, 60)
    return f"ETA {minutes} min {seconds} s" if minutes else f"ETA {seconds} s"


@contextmanager
def progress(
    label: str,
    *,
    stream: TextIO | None = None,
    interval: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> Iterator[None]:
    """Show ``label`` while the block runs; report the elapsed time when it ends.

    Args:
        label: what is happening, e.g. ``"allocating 40.00 GiB on cuda:0"``.
        stream: where to write (default ``sys.stderr``).
        interval: seconds between spinner frames on a terminal.
        detail: called at every frame on a terminal; what it returns follows the label (e.g.
            ``"1,200/5,000 requests"``, from a loop's callback).
    """
    out = stream if stream is not None else sys.stderr
    live = bool(getattr(out, "isatty", lambda: False)())
    start = time.perf_counter()
    stop = threading.Event()

    def spin() -> None:
        frame = 0
        while not stop.wait(interval):
            elapsed = time.perf_counter() - start
            # a status can shrink: clear what a longer one left behind
            more = f" {detail()}\033[K" if detail is not None else ""
            out.write(f"\r{_FRAMES[frame % len(_FRAMES)]} {label} ({elapsed:.1f} s){more}")
            out.flush()
            frame += 1

    thread = threading.Thread(target=spin, daemon=True) if live else None
    if thread is not None:
        thread.start()
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        elapsed = time.perf_counter() - start
        # A failure off a terminal prints nothing: the error that follows is the one line to read.
        if live or not failed:
            status = "failed after" if failed else "done in"
            clear = "\033[K" if live and detail is not None else ""
            out.write(f"{chr(13) if live else ''}{label}: {status} {elapsed:.2f} s{clear}\n")
            out.flush()
