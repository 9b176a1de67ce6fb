"""Old spellings of options, kept for a release as deprecated aliases.

One idea has one spelling across the commands (``--trace`` in ``compare`` as in ``simulate``
and ``tune``; vLLM's ``--max-num-seqs`` and ``--max-num-batched-tokens`` in ``tune``). An old
spelling still works until kvcore 0.3: :class:`DeprecatedAlias` stores its value where the new
option's goes and says, once on stderr, what to write instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class DeprecatedAlias(argparse.Action):
    """An option's old spelling: stores as the new option does (same ``dest`` and ``type``) and
    prints ``kvcore: warning: --old is deprecated ...; write --new`` on stderr.

    Give the new spelling as ``help``'s first word is not needed: the alias is hidden from
    ``--help`` (``argparse.SUPPRESS``) and the new option is the one documented. Pass
    ``new=`` (the option to write instead) to :meth:`argparse.ArgumentParser.add_argument`.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"kvcore: warning: {option_string} is deprecated and goes away in kvcore 0.3; write {self.new}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)
