"""Old spellings of options, removed in kvcore 0.3, refused naming the one to write.

One idea has one spelling across the commands (``--trace`` in ``compare`` as in ``simulate``
and ``tune``; vLLM's ``--max-num-seqs`` and ``--max-num-batched-tokens`` in ``tune``). The old
spellings worked through kvcore 0.2 with a warning; since 0.3 :class:`RemovedOption` stops the
command with a usage error that says what to write instead, rather than "unrecognized
arguments".
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from kvcore.removed import REMOVED_IN


class RemovedOption(argparse.Action):
    """An option's removed spelling: the command exits with ``... error: --old was removed in
    kvcore 0.3; write --new`` (status 2, as any usage error).

    The option is hidden from ``--help`` (``argparse.SUPPRESS``); pass ``new=`` (the option to
    write instead) to :meth:`argparse.ArgumentParser.add_argument`.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", argparse.SUPPRESS)
        kwargs.setdefault("default", argparse.SUPPRESS)  # nothing in the namespace: it never parses
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        parser.error(f"{option_string} was removed in kvcore {REMOVED_IN}; write {self.new}")
