"""Reading kvcore's input files: at most :data:`~kvcore.limits.MAX_INPUT_BYTES` bytes, JSON at
most :data:`~kvcore.limits.MAX_JSON_DEPTH` deep, numbers at most Python's 4,300 digits.

Every file door (spec files, ``config.json``, saved plans, traces) reads through
:func:`read_bounded` and parses through :func:`loads`, so a file that never ends, nests
thousands of levels deep or holds a number of 5,000 digits is refused with an
:class:`~kvcore.errors.InvalidInputError` naming the limit, never a ``MemoryError``,
``RecursionError`` or ``ValueError``. The callers word the other errors (a missing file, text
that is not JSON) for their own format.

This module is part of the contract: of kvcore it imports :mod:`kvcore.errors` and
:mod:`kvcore.limits` only.
"""

from __future__ import annotations

import json
import os
import re
import sys
from itertools import accumulate
from typing import Any

from kvcore import limits
from kvcore.errors import InvalidInputError

#: A JSON string, escapes included (the unrolled form, linear on long strings).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Every byte but the four brackets, deleted to leave a document's skeleton.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: +1 for an opening bracket, -1 for a closing one, indexed by byte.
_STEP = [0] * 256
for _byte in b"[{":
    _STEP[_byte] = 1
for _byte in b"]}":
    _STEP[_byte] = -1


def read_bounded(path: str | os.PathLike[str], source: str | None = None) -> bytes:
    """The bytes of ``path``, refused past :data:`kvcore.limits.MAX_INPUT_BYTES`.

    At most the limit plus one byte is read, whatever the file is (a device, a pipe).

    Args:
        path: the file.
        source: what messages call it (default: the path).

    Returns:
        The whole file.

    Raises:
        InvalidInputError: the file holds more than the limit.
        OSError: the file cannot be opened or read (the caller words it).
    """
    limit = limits.MAX_INPUT_BYTES
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)  # one byte past the limit tells a file at the limit from a longer one
    if len(data) > limit:
        raise InvalidInputError(
            f"{source or os.fspath(path)} holds more than {limit:,} bytes (kvcore.limits.MAX_INPUT_BYTES), "
            "more than any spec file, config, plan or trace; check the path (a device such as /dev/zero "
            "never ends), or raise kvcore.limits.MAX_INPUT_BYTES from Python"
        )
    return data


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text`` (0 for a bare value).

    Brackets inside strings do not count. The scan is linear and recurses nowhere, so it can
    measure text that would overflow the JSON reader's stack. On text that is not JSON the
    figure is that of its brackets, unbalanced or not.
    """
    skeleton = _STRING.sub("", text).encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    return max(accumulate(_STEP[b] for b in skeleton), default=0)


def loads(text: str, source: str, **kwargs: Any) -> Any:
    """``json.loads(text, **kwargs)``, refusing nesting and numbers past kvcore's limits first.

    Args:
        text: the JSON.
        source: where it came from (a path), for messages.
        kwargs: passed to :func:`json.loads` (``object_pairs_hook``).

    Returns:
        The parsed value.

    Raises:
        InvalidInputError: arrays or objects nest deeper than :data:`kvcore.limits.MAX_JSON_DEPTH`,
            or a number has more digits than Python reads (``sys.get_int_max_str_digits()``).
        json.JSONDecodeError: the text is not JSON (the caller words it).
    """
    # fewer opening brackets than the limit cannot nest past it (a trace line): skip the scan
    openers = text.count("[") + text.count("{")
    depth = json_depth(text) if openers > limits.MAX_JSON_DEPTH else 0
    if depth > limits.MAX_JSON_DEPTH:
        raise InvalidInputError(
            f"{source} nests JSON arrays or objects {depth:,} deep; kvcore reads at most "
            f"{limits.MAX_JSON_DEPTH} levels (kvcore.limits.MAX_JSON_DEPTH), and its formats need 7: "
            "check the file"
        )
    try:
        return json.loads(text, **kwargs)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        if type(exc) is not ValueError or "digits" not in str(exc):  # a hook's own error is the caller's
            raise
        raise InvalidInputError(
            f"{source} holds a number of more than {sys.get_int_max_str_digits():,} digits, more than "
            "Python reads (sys.get_int_max_str_digits()); no size, length or count kvcore reads is that long"
        ) from None
    except RecursionError:  # unreachable within MAX_JSON_DEPTH unless the caller is already deep
        raise InvalidInputError(f"{source} nests JSON arrays or objects too deeply to read") from None
