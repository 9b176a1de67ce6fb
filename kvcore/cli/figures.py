"""What every picture the command line draws with matplotlib shares: pyplot on a file-only
backend, the two stacked line panels of ``kvcore simulate --plot`` (the steps, or the tier
curve), and writing the file.

The path is checked first, before any work, by :func:`kvcore.cli.memory_map.check_map_path`
(the suffix, the folder, matplotlib installed).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvcore.errors import InvalidInputError


def add_picture_option(parser: argparse.ArgumentParser, flag: str, drawing: str) -> None:
    """An option naming the file to draw a picture into (``--map FILE``, ``--plot FILE``).

    Args:
        parser: the command's parser.
        flag: the option.
        drawing: what is drawn, into FILE, as the help says it after "also draw".
    """
    help_text = f"also draw {drawing} (.png or .svg; needs the 'plot' extra)"
    parser.add_argument(flag, metavar="FILE", help=help_text)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: the pictures go to files, never to a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path, *, what: str, dpi: int) -> Path:
    """Write ``fig`` to ``out`` and close it, written or not.

    Args:
        fig: the matplotlib figure.
        out: the checked path (its suffix picks PNG or SVG).
        what: the picture, as the message names it (``'the memory map'``).
        dpi: the resolution of a PNG.

    Returns:
        ``out``.

    Raises:
        InvalidInputError: the file cannot be written (the folder is read-only, the disk full).
    """
    try:
        fig.savefig(out, dpi=dpi)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {what} to {out}: {exc.strerror or exc}") from None
    finally:
        pyplot().close(fig)
    return out


@contextmanager
def line_panels(out: Path, *, what: str, title: str, size: tuple[float, float]) -> Iterator[tuple[Any, Any]]:
    """Two stacked panels sharing their x axis, for the caller to draw one line per plan into;
    when the ``with`` block ends they get one style (small ticks, a light grid, the legend of
    the top panel, ``title`` above) and the figure is written to ``out``
    (:func:`save_figure`). An error inside the block closes the figure unwritten.

    Args:
        out: the checked path.
        what: the picture, as messages name it.
        title: the figure's title (none when empty).
        size: the figure's width and height in inches.

    Yields:
        The top and bottom axes.
    """
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=size, sharex=True)
    try:
        yield top, bottom
    except BaseException:
        plt.close(fig)
        raise
    for ax in (top, bottom):
        ax.tick_params(labelsize=7)
        ax.grid(True, linewidth=0.3)
    top.legend(fontsize=7, loc="best")
    if title:
        top.set_title(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, out, what=what, dpi=100)
