"""The step-time profile file: measured steps, one JSON object a line, and what measured them.

``kvcore simulate --step-profile FILE`` reads it (:func:`kvcore.simulation.timing.read_profile`
fits it);
``kvcore profile`` writes it. A line is one step::

    {"prefill_tokens": 2048, "decode_requests": 32, "context_tokens": 40000, "seconds": 0.061}

with, optionally, ``attention_pairs`` (the step's query-key pairs), ``requests`` (requests
scheduled: those not decoding are its ``prefill_requests``) and ``spread`` (the relative
spread, ``(most - least) / least``, of the repeats ``seconds`` was taken from). A file
written by ``kvcore profile`` opens with a header line,
``{"kvcore_step_profile": {...}}`` (:class:`ProfileHeader`): the engine, model, device, versions
and settings that ran the steps, the terms the steps are fitted with, and the held-out error the
command measured. A file without a header (the first format) is fitted with the four-term line.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any, Final

import attrs
import cattrs

from kvcore.errors import InvalidInputError
from kvcore.validators import is_number

#: A fitted profile whose samples it misses by more than this share is refused (a file without
#: a header; a header gives its own).
PROFILE_TOLERANCE: Final = 0.05

#: The keys a step-time profile line has.
PROFILE_KEYS: Final = ("prefill_tokens", "decode_requests", "context_tokens", "seconds")

#: The keys a line may add (``kvcore profile`` writes them): the step's query-key pairs, its
#: scheduled requests, and the relative spread of the repeats its seconds are the least of.
PROFILE_OPTIONAL_KEYS: Final = ("attention_pairs", "requests", "spread")

#: A profile's terms, in order: the first four are the line every profile fits.
PROFILE_TERMS: Final = (
    "fixed",
    "prefill_tokens",
    "decode_requests",
    "context_tokens",
    "attention_pairs",
    "prefill_requests",
)

#: The line key each optional term's values come from.
_TERM_KEYS: Final = {"attention_pairs": "attention_pairs", "prefill_requests": "requests"}


def check_terms(terms: Sequence[str], source: str) -> tuple[str, ...]:
    """``terms`` as a tuple, if they are the four-term line's and any of the optional terms
    after them, in :data:`PROFILE_TERMS` order.

    Raises:
        InvalidInputError: other terms, or in another order.
    """
    base, optional = PROFILE_TERMS[:4], PROFILE_TERMS[4:]
    extra = tuple(terms[4:])
    if tuple(terms[:4]) != base or extra != tuple(t for t in optional if t in extra):
        raise InvalidInputError(
            f"{source}: 'terms' must be {list(base)} followed by any of {list(optional)} in that order "
            f"(got {list(terms)})"
        )
    return tuple(terms)


#: The key of a profile file's header line.
HEADER_KEY: Final = "kvcore_step_profile"

#: The header's format version.
FORMAT_VERSION: Final = 1

_EXAMPLE: Final = '{"prefill_tokens": 2048, "decode_requests": 32, "context_tokens": 40000, "seconds": 0.061}'


@attrs.frozen(kw_only=True)
class HeldOutError:
    """How far a fit missed the steps it was not fitted on, over one range of steps.

    Attributes:
        steps: which steps (``prefill 256-1024 tokens``, ``decode, context 0-2048``, ``mixed``).
        samples: held-out steps in the range.
        mean_error: their mean relative error.
        max_error: their largest relative error.
        bias: their seconds summed over the fit's summed, less 1: what a run of them would be
            off by (a step's noise averages out over many steps; a fit's bias does not).
            ``None`` in files written before kvcore measured it.
    """

    steps: str
    samples: int
    mean_error: float
    max_error: float
    bias: float | None = None


@attrs.frozen(kw_only=True)
class ProfileHeader:
    """What measured a profile's steps, and how they are fitted.

    Attributes:
        engine: the engine (``vllm``, ``transformers``).
        engine_version: its release.
        model: the model it ran (a path or a Hub name).
        device: the device it ran on (``cpu (16 cores)``, ``NVIDIA H100 80GB HBM3``).
        versions: other packages' releases (kvcore, torch).
        settings: the engine's settings (block size, batched tokens, dtype, ...) and the
            command's (repeats).
        terms: the terms the steps are fitted with (:data:`PROFILE_TERMS`: the first four, then
            any of the optional ones in order).
        tolerance: the largest relative error the fit may have over the samples.
        held_out: the held-out error of the chosen terms, per range of steps.
        version: the header's format version.
    """

    engine: str
    engine_version: str
    model: str
    device: str
    versions: dict[str, str] = attrs.field(factory=dict)
    settings: dict[str, Any] = attrs.field(factory=dict)
    terms: tuple[str, ...] = PROFILE_TERMS[:4]
    tolerance: float = PROFILE_TOLERANCE
    held_out: tuple[HeldOutError, ...] = ()
    version: int = FORMAT_VERSION


@attrs.frozen(kw_only=True)
class ProfileSample:
    """One measured step (a line of the file)."""

    prefill_tokens: int
    decode_requests: int
    context_tokens: int
    seconds: float
    attention_pairs: int | None = None
    requests: int | None = None
    spread: float | None = None

    def values(self, terms: tuple[str, ...]) -> tuple[float, ...]:
        """``(prefill_tokens, decode_requests, context_tokens, <optional terms>, seconds)``, as
        :func:`~kvcore.simulation.timing.fit_profile` takes a sample fitted with ``terms``
        (``prefill_requests`` are the requests that are not decoding)."""
        extra = {
            "attention_pairs": float(self.attention_pairs or 0),
            "prefill_requests": float((self.requests or 0) - self.decode_requests),
        }
        return (
            float(self.prefill_tokens),
            float(self.decode_requests),
            float(self.context_tokens),
            *(extra[t] for t in terms[4:]),
            self.seconds,
        )


@attrs.frozen(kw_only=True)
class ProfileFile:
    """A profile file: its header (``None`` in the first format) and its steps."""

    header: ProfileHeader | None
    samples: tuple[ProfileSample, ...]

    @property
    def terms(self) -> tuple[str, ...]:
        """The terms the file's steps are fitted with."""
        return self.header.terms if self.header is not None else PROFILE_TERMS[:4]


_converter = cattrs.Converter(forbid_extra_keys=True)


def profile_to_lines(profile: ProfileFile) -> str:
    """The file's text: the header line (when there is one), then a line per step."""
    lines = []
    if profile.header is not None:
        lines.append(json.dumps({HEADER_KEY: _converter.unstructure(profile.header)}))
    for sample in profile.samples:
        lines.append(json.dumps({k: v for k, v in _converter.unstructure(sample).items() if v is not None}))
    return "\n".join(lines) + "\n"


def write_profile_file(path: str | os.PathLike[str], profile: ProfileFile) -> None:
    """Write ``profile`` to ``path``.

    Raises:
        InvalidInputError: the file cannot be written.
    """
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(profile_to_lines(profile))
    except OSError as exc:
        raise InvalidInputError(
            f"cannot write the step-time profile {os.fspath(path)}: {exc.strerror or exc}"
        ) from None


def _header(item: Any, here: str) -> ProfileHeader:
    try:
        header = _converter.structure(item, ProfileHeader)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        detail = (
            "; ".join(cattrs.transform_error(exc)) if isinstance(exc, cattrs.BaseValidationError) else exc
        )
        raise InvalidInputError(f"{here}: the {HEADER_KEY!r} header is not valid: {detail}") from None
    if header.version != FORMAT_VERSION:
        raise InvalidInputError(
            f"{here}: header format version {header.version}; this kvcore reads version {FORMAT_VERSION}"
        )
    check_terms(header.terms, here)
    if not is_number(header.tolerance) or not 0 < header.tolerance < math.inf:
        raise InvalidInputError(f"{here}: 'tolerance' must be a share > 0 (got {header.tolerance!r})")
    return header


def _sample(item: Any, here: str, terms: tuple[str, ...]) -> ProfileSample:
    allowed = set(PROFILE_KEYS) | set(PROFILE_OPTIONAL_KEYS)
    if not isinstance(item, dict) or not set(PROFILE_KEYS) <= set(item) or not set(item) <= allowed:
        raise InvalidInputError(
            f"{here}: a line is one object with exactly the keys {', '.join(PROFILE_KEYS)} (and optionally "
            f"{', '.join(PROFILE_OPTIONAL_KEYS)}), e.g. {_EXAMPLE}"
        )
    for key, value in item.items():
        low_ok = is_number(value) and (value > 0 if key == "seconds" else value >= 0)
        if not low_ok or not math.isfinite(value):
            bound = "> 0" if key == "seconds" else ">= 0"
            raise InvalidInputError(f"{here}: {key!r} must be a finite number {bound} (got {value!r})")
    for term in terms[4:]:
        if _TERM_KEYS[term] not in item:
            raise InvalidInputError(
                f"{here}: the header fits {term!r}, and this line has no {_TERM_KEYS[term]!r}"
            )
    return ProfileSample(**item)


def read_profile_file(path: str | os.PathLike[str]) -> ProfileFile:
    """Read a profile file (either format).

    Raises:
        InvalidInputError: the file cannot be read, or a line is wrong (``<path>:<line>:`` and
            what), or it has no steps.
    """
    where = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InvalidInputError(f"cannot read the step-time profile {where}: {reason}") from None
    header: ProfileHeader | None = None
    samples: list[ProfileSample] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        here = f"{where}:{number}"
        try:
            item = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InvalidInputError(f"{here}: not valid JSON ({exc}); a line is {_EXAMPLE}") from None
        if isinstance(item, dict) and HEADER_KEY in item:
            if header is not None or samples or len(item) != 1:
                raise InvalidInputError(f"{here}: the {HEADER_KEY!r} header is the file's first line, alone")
            header = _header(item[HEADER_KEY], here)
            continue
        samples.append(_sample(item, here, header.terms if header is not None else PROFILE_TERMS[:4]))
    if not samples:
        raise InvalidInputError(f"{where}: the step-time profile has no samples; a line is {_EXAMPLE}")
    return ProfileFile(header=header, samples=tuple(samples))
