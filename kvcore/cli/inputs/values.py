"""What one command-line value reads: counts, token counts with their suffixes, byte sizes,
fractions, lists, dtypes, distributions (argparse ``type=`` functions, each with a clear error)."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Literal, TypeVar

from kvcore.dtypes import to_dtype
from kvcore.errors import InvalidInputError, InvalidSpecError
from kvcore.limits import MAX_TOKENS
from kvcore.policy import PlanOptions
from kvcore.spec import (
    STATE_CACHE_MODES,
)
from kvcore.units import format_bytes, parse_size

if TYPE_CHECKING:  # the simulation layer loads only for the commands that simulate
    from kvcore.simulation.workload import LengthDist


T = TypeVar("T")


def _shown_text(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:37]!r}... ({len(text)} characters)"


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (of at most 30 digits: no count kvcore takes is longer)."""
    digits = text.strip().lstrip("+-").replace("_", "")
    if len(digits) > 30 and digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a number of at most 30 digits, got {_shown_text(text)}; "
            "no count kvcore takes is that large"
        )
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {_shown_text(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def retention_interval(text: str) -> int | str:
    """argparse type for vLLM's ``prefix_cache_retention_interval``: ``dense`` (vLLM's ``None``),
    0, or a number >= 1."""
    if text.strip().lower() == "dense":
        return "dense"
    if text.strip() == "0":
        return 0
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error} (or 0, or dense)") from None


def comma_list(text: str, item: Callable[[str], T]) -> list[T]:
    """Values separated by commas (spaces around them ignored), each read by ``item``.

    Raises:
        argparse.ArgumentTypeError: a value is empty (``16,,32``), or as ``item`` raises.
    """
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(
            f"empty value in {_shown_text(text)}: give values separated by commas"
        )
    return [item(part) for part in parts]


def positive_ints(text: str) -> list[int]:
    """argparse type: whole numbers >= 1, comma-separated (``16,32``)."""
    return comma_list(text, positive_int)


def names(text: str) -> list[str]:
    """argparse type: names, comma-separated (``shared_buffer,uniform``); each is checked where
    it is used (a policy against the registry)."""
    return comma_list(text, str)


def _dtype(text: str) -> str:
    if text != "auto":
        try:
            to_dtype(text)
        except InvalidSpecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def dtype_names(text: str) -> list[str]:
    """argparse type: cache dtypes, comma-separated (``auto,fp8``); ``auto`` is the specs' own."""
    return comma_list(text, _dtype)


def _state_cache_mode(text: str) -> str:
    if text not in STATE_CACHE_MODES:
        raise argparse.ArgumentTypeError(
            f"expected a state cache mode ({', '.join(STATE_CACHE_MODES)}), got {_shown_text(text)}"
        )
    return text


def state_cache_modes(text: str) -> list[str]:
    """argparse type: state cache modes (:data:`~kvcore.spec.STATE_CACHE_MODES`), comma-separated."""
    return comma_list(text, _state_cache_mode)


def block_counts(text: str) -> int | tuple[int, ...]:
    """argparse type of ``--num-blocks``: one count (``1200``), or one per block pool of the
    policy, comma-separated (``1200,340``), each a :func:`positive_int`."""
    if "," not in text:
        return positive_int(text)
    return tuple(comma_list(text, positive_int))


def pool_fractions(text: str) -> tuple[float, ...]:
    """argparse type of ``--pool-split``: one fraction of the budget per block pool,
    comma-separated (``0.3,0.7``), checked as :attr:`PlanOptions.pool_split` checks them."""
    parts = [part.strip() for part in text.split(",")]
    try:
        fractions = tuple(float(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "expected one fraction of the budget per pool, comma-separated (0.3,0.7), "
            f"got {_shown_text(text)}"
        ) from None
    try:
        PlanOptions(pool_split=fractions)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("'pool_split'", "--pool-split")) from None
    return fractions


class Echoed(int):
    """A number read from text the command line says back (``32k`` is 32,000 tokens; ``80GB``
    is 74.51 GiB), so that a unit never changes a figure silently: :func:`echo_given` prints
    ``note`` for the option and puts the plain ``int`` back."""

    note: str

    def __new__(cls, value: int, note: str = "") -> Echoed:
        number = super().__new__(cls, value)
        number.note = note
        return number


def echo_given(args: argparse.Namespace) -> None:
    """For each option read through a unit or suffix (:class:`Echoed`), print one stderr line
    saying what it was read as (``kvcore: warning: --memory 80GB = 74.51 GiB ...``), and leave
    the plain number in ``args``."""
    for dest, value in vars(args).items():
        if isinstance(value, Echoed):
            print(f"kvcore: warning: --{dest.replace('_', '-')} {value.note}", file=sys.stderr)
            setattr(args, dest, int(value))


#: Suffixes of token counts, as vLLM 0.33 reads ``--max-model-len``: lowercase decimal
#: (``1k`` = 1,000, decimals allowed: ``25.6k``), uppercase binary (``1K`` = 1,024, whole
#: numbers only). Source: vLLM ``vllm/engine/arg_utils.py``, ``human_readable_int``.
_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


_SUFFIXED = re.compile(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)([kmgtKMGT])\s*")


def token_count(text: str) -> int:
    """A whole number >= 1, bare (:func:`positive_int`) or with vLLM's suffixes: ``32k`` =
    32,000 and ``32K`` = 32,768 (:data:`_DECIMAL_SUFFIXES`, :data:`_BINARY_SUFFIXES`).

    A count with a decimal suffix comes back :class:`Echoed`: ``32k`` is 32,000, where a
    context length is usually meant as a power of two, so the reading is said on stderr. A
    binary suffix is not said back (as ``80GiB`` is not): ``32K`` = 32,768 is how context lengths
    are quoted, and saying so on every run was noise (issue 38)."""
    match = _SUFFIXED.fullmatch(text)
    if match is None:
        return positive_int(text)
    number, suffix = match.groups()
    if suffix in _BINARY_SUFFIXES:
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"{_shown_text(text)}: {suffix} is binary (x {_BINARY_SUFFIXES[suffix]:,}) and takes a whole "
                f"number; decimals go with the decimal suffixes, e.g. {number}{suffix.lower()}"
            )
        value = int(number) * _BINARY_SUFFIXES[suffix]
    else:
        exact = Decimal(number) * _DECIMAL_SUFFIXES[suffix]
        if exact != exact.to_integral_value():
            raise argparse.ArgumentTypeError(
                f"{_shown_text(text)} is {exact.normalize():f} tokens, not a whole number"
            )
        value = int(exact)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {_shown_text(text)}")
    if suffix in _BINARY_SUFFIXES:  # 32K = 32,768: how context lengths are quoted; said back never
        return value
    return Echoed(
        value,
        f"{text.strip()} = {value:,} tokens ({suffix} is decimal: 1k = 1,000; 1K = 1,024, as vLLM reads it)",
    )


def tokens(text: str) -> int:
    """argparse type: a token count, an int in [1, :data:`~kvcore.limits.MAX_TOKENS`], bare or
    with a suffix (:func:`token_count`)."""
    value = token_count(text)
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_TOKENS:,} tokens (kvcore.limits.MAX_TOKENS), got {value:,}; "
            "no model serves requests that long"
        )
    return value


def token_counts(text: str) -> list[int]:
    """argparse type: token counts, comma-separated (``2048,4096``), each as :func:`tokens`."""
    return [int(value) for value in comma_list(text, tokens)]


def max_model_len(text: str) -> int | Literal["auto"]:
    """argparse type: ``auto`` or a token count (:func:`tokens`)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return tokens(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or auto)") from None


def size(text: str) -> int:
    """argparse type: a byte size such as ``24GiB``; one given in decimal units (``80GB``) comes
    back :class:`Echoed` (``80GB = 74.51 GiB``). A bare ``G`` is binary, as documented, and
    GPU memory is quoted that way: it is not echoed."""
    try:
        value = parse_size(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    unit = text.strip().lstrip("0123456789_.eE+-").strip()
    if unit.lower() in ("kb", "mb", "gb", "tb"):
        return Echoed(
            value,
            f"{text.strip()} = {format_bytes(value)} ({unit} is decimal, 1000-based; "
            f"write {unit[0].upper()}iB for 1024-based)",
        )
    return value


def number(text: str, fits: Callable[[float], bool], expected: str) -> float:
    """A number read for an option: a float that ``fits``; else an error saying what was expected
    (``expected a number in [0, 1), got 1.5``) for argparse to print.

    Args:
        text: the option's value.
        fits: whether a number is in the option's range (``nan`` never is: it fails every comparison).
        expected: the range in words, after "expected" (``'a number in (0, 1]'``).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {_shown_text(text)}") from None
    if not fits(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text.strip()}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1)."""
    return number(text, lambda value: 0 <= value < 1, "a number in [0, 1)")


def revision(text: str) -> str:
    """argparse type: a Hub revision, a branch, tag or commit (no spaces, at most 200 characters)."""
    value = text.strip()
    if not value or len(value) > 200 or any(c.isspace() for c in value) or ".." in value:
        raise argparse.ArgumentTypeError(
            f"expected a branch, tag or commit of a Hugging Face repository, got {_shown_text(text)}"
        )
    return value


def utilization(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    return number(text, lambda value: 0 < value <= 1, "a number in (0, 1]")


def length_dist(text: str) -> LengthDist:
    """argparse type: a request length distribution (:func:`kvcore.simulation.workload.parse_length`):
    ``512``, ``uniform:LO:HI`` or ``lognormal:MEAN:SIGMA``."""
    from kvcore.simulation.workload import parse_length

    try:
        return parse_length(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate(text: str) -> float:
    """argparse type: a number of requests per step, > 0."""
    return number(text, lambda value: value > 0 and math.isfinite(value), "a number > 0")


def share(text: str) -> float:
    """argparse type: a share of requests, a number from 0 to 1."""
    return number(text, lambda value: 0 <= value <= 1, "a number from 0 to 1")


def seed(text: str) -> int:
    """argparse type: a random seed, an int >= 0."""
    try:
        value = int(text) if len(text.strip()) <= 30 else -1
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {_shown_text(text)}")
    return value
