"""Workloads: the requests a simulation replays, from a JSON-lines trace or drawn at random.

A :class:`Request` is a prompt length, an output length and when it arrives: at a scheduler step
(``arrival_step``), or at a time in seconds (``arrival_time``, which a simulation with a step-time
model reads; :mod:`kvcore.simulation.timing`). A trace file (:func:`read_trace`) has one JSON
object a line::

    {"prompt_tokens": 812, "output_tokens": 143}
    {"prompt_tokens": 2048, "output_tokens": 512, "arrival_step": 40}
    {"prompt_tokens": 900, "output_tokens": 64, "prefix_id": "system-a", "prefix_tokens": 600}

Requests with one ``prefix_id`` share their first ``prefix_tokens`` tokens (a system prompt),
which a simulation with prefix caching finds cached.

A synthetic workload (:func:`synthetic`) draws the lengths from a :class:`LengthDist` (fixed,
uniform or log-normal; :func:`parse_length` reads ``"512"``, ``"uniform:128:4096"`` or
``"lognormal:1024:1.0"``) and the arrivals from a Poisson process, with a seed, so the same
arguments give the same requests on every machine (``random.Random``, no numpy).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from typing import Final, Literal

import attrs

from kvcore.errors import InvalidInputError
from kvcore.json_input import loads, read_bounded
from kvcore.limits import MAX_TOKENS, check_at_most
from kvcore.validators import check_int, int_at_least, is_number

#: The most requests a workload (a trace file or a synthetic one) may have: 1,000,000.
MAX_REQUESTS: Final = 1_000_000

#: The latest step a request may arrive at: 10,000,000 (a simulation records every step).
MAX_ARRIVAL_STEP: Final = 10_000_000

#: The latest time in seconds a request may arrive at: 10,000,000 s (about 116 days).
MAX_ARRIVAL_TIME: Final = 10_000_000.0

#: The keys a trace line may have; the first two are required, ``prefix_id`` and
#: ``prefix_tokens`` go together, and a trace gives ``arrival_step`` or ``arrival_time``, not both.
TRACE_KEYS: Final = (
    "prompt_tokens",
    "output_tokens",
    "arrival_step",
    "prefix_id",
    "prefix_tokens",
    "arrival_time",
)

#: The longest ``prefix_id`` string a trace may give.
MAX_PREFIX_ID_CHARS: Final = 200


def _check_prefix(request: Request, attribute: attrs.Attribute[int], value: int) -> None:
    """``prefix_tokens`` is an int from 0 to the prompt and needs a ``prefix_id``."""
    if not value and type(value) is int:
        return
    check_int(value, "'prefix_tokens'", minimum=0)
    if value > request.prompt_tokens:
        raise InvalidInputError(
            f"request {request.id}: prefix_tokens ({value}) is more than its prompt "
            f"({request.prompt_tokens} tokens)"
        )
    if value and request.prefix_id is None:
        raise InvalidInputError(f"request {request.id}: prefix_tokens ({value}) needs a prefix_id")


def _check_arrival_time(request: Request, attribute: attrs.Attribute[float | None], value: object) -> None:
    """``arrival_time`` is ``None`` or a number of seconds from 0 to MAX_ARRIVAL_TIME."""
    if value is None:
        return
    if not is_number(value) or not 0 <= value <= MAX_ARRIVAL_TIME:
        raise InvalidInputError(
            f"request {request.id}: 'arrival_time' must be a number of seconds from 0 to "
            f"{MAX_ARRIVAL_TIME:,.0f} (kvcore.simulation.workload.MAX_ARRIVAL_TIME) (got {value!r})"
        )
    if request.arrival_step:
        raise InvalidInputError(
            f"request {request.id}: give 'arrival_step' or 'arrival_time', not both "
            "(steps without a step-time model, seconds with one)"
        )


LengthKind = Literal["fixed", "uniform", "lognormal"]


@attrs.frozen
class Request:
    """One request of a workload.

    Attributes:
        id: the request's number (a trace's requests are numbered from 0 in file order).
        prompt_tokens: tokens of the prompt (``>= 1``).
        output_tokens: tokens the request generates (``>= 1``).
        arrival_step: the scheduler step it arrives at (``>= 0``).
        prefix_id: requests with one id share their first ``prefix_tokens`` tokens (an int or a
            string; ``None``: the prompt is the request's own).
        prefix_tokens: how many leading prompt tokens ``prefix_id`` names (``0`` to
            ``prompt_tokens``).
        arrival_time: when it arrives, in seconds from the start (``None``: at
            ``arrival_step``); simulating such a request needs a step-time model.
        line: the trace line it was read from (counted from 1, as editors count), for
            messages; ``None`` for a request not read from a trace.
    """

    id: int = attrs.field(validator=int_at_least(0))
    prompt_tokens: int = attrs.field(validator=int_at_least(1))
    output_tokens: int = attrs.field(validator=int_at_least(1))
    arrival_step: int = attrs.field(default=0, validator=int_at_least(0))
    prefix_id: int | str | None = attrs.field(default=None)
    prefix_tokens: int = attrs.field(default=0, validator=_check_prefix)
    arrival_time: float | None = attrs.field(default=None, validator=_check_arrival_time)
    line: int | None = attrs.field(
        default=None, kw_only=True, eq=False, validator=attrs.validators.optional(int_at_least(1))
    )

    @property
    def label(self) -> str:
        """The request as messages name it: ``'the request on line 7 of the trace'`` for one read
        from a trace (ids count from 0, lines from 1), else ``'request 6'``."""
        return (
            f"the request on line {self.line} of the trace" if self.line is not None else f"request {self.id}"
        )

    @property
    def total_tokens(self) -> int:
        """Prompt plus output tokens: the length ``max_model_len`` must admit."""
        return self.prompt_tokens + self.output_tokens


def _sorted_requests(requests: object) -> tuple[Request, ...]:
    if not isinstance(requests, (list, tuple)) or not all(isinstance(r, Request) for r in requests):
        raise InvalidInputError(
            f"a workload's requests must be a sequence of Request (got {type(requests).__name__})"
        )
    timed = sum(r.arrival_time is not None for r in requests)
    if timed not in (0, len(requests)):
        raise InvalidInputError(
            f"{timed} of the workload's {len(requests)} requests give an arrival_time: give every request "
            "an arrival_time in seconds, or none (arrival_step)"
        )
    ordered = tuple(sorted(requests, key=lambda r: (r.arrival_step, r.arrival_time or 0.0, r.id)))
    ids = {r.id for r in ordered}
    if len(ids) != len(ordered):
        raise InvalidInputError(
            f"a workload's request ids must be unique ({len(ordered) - len(ids)} repeated)"
        )
    return ordered


def _request_tuple(requests: Sequence[Request]) -> tuple[Request, ...]:
    return tuple(requests)


@attrs.frozen
class Workload:
    """Requests to replay, sorted by arrival (step or time), then id.

    Attributes:
        requests: the requests (sorted when the workload is made; ids unique).
        name: what the workload is called in reports (a trace's file name, or a description).
        rejected: requests refused before any step, as an engine refuses a request longer than
            its ``max_model_len`` and serves the rest (:meth:`admit`); not replayed.
    """

    requests: tuple[Request, ...] = attrs.field(converter=_sorted_requests, repr=False)
    name: str
    rejected: tuple[Request, ...] = attrs.field(default=(), converter=_request_tuple, repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    def admit(self, max_model_len: int) -> Workload:
        """The workload an engine of ``max_model_len`` serves: every request of at most that
        many tokens (prompt plus output), the longer ones in :attr:`rejected`.

        vLLM refuses such a request with an error for it alone and serves the others: its
        OpenAI server refuses a prompt plus ``max_tokens`` over ``max_model_len`` ("This
        model's maximum context length is ..."), and its input processor a prompt of
        ``max_model_len`` tokens or more (vLLM ``vllm/v1/engine/input_processor.py``,
        ``_validate_model_input``). A replay does the same instead of stopping.

        Raises:
            InvalidInputError: every request is longer (nothing would be served), naming the
                longest and the limit.
        """
        check_int(max_model_len, "'max_model_len'", minimum=1)
        kept = [r for r in self.requests if r.total_tokens <= max_model_len]
        longer = [r for r in self.requests if r.total_tokens > max_model_len]
        if not longer:
            return self
        if not kept:
            raise InvalidInputError(
                f"every request of {self.name} is longer than max_model_len ({max_model_len:,}): the "
                f"longest has {self.longest:,} tokens (prompt + output), the shortest "
                f"{min(r.total_tokens for r in self.requests):,}; plan for a longer max_model_len"
            )
        return Workload(kept, self.name, rejected=(*self.rejected, *longer))

    @property
    def longest(self) -> int:
        """The most tokens (prompt plus output) one request has; 0 when there are none."""
        return max((r.total_tokens for r in self.requests), default=0)


# -- traces ------------------------------------------------------------------------------------


def read_trace(path: str | os.PathLike[str]) -> Workload:
    """Read a JSON-lines trace: one request a line, blank lines skipped.

    Each line is an object with ``prompt_tokens`` and ``output_tokens`` (ints ``>= 1``, at most
    :data:`kvcore.limits.MAX_TOKENS`) and optionally ``arrival_step`` (an int ``>= 0``, at most
    :data:`MAX_ARRIVAL_STEP`; default 0) or ``arrival_time`` (seconds, a number ``>= 0``, at
    most :data:`MAX_ARRIVAL_TIME`; every line or none), and ``prefix_id`` with
    ``prefix_tokens``; no other keys. Requests are numbered from 0 in file order and remember
    their line (from 1), which the simulator's messages name. A trace has 1
    to :data:`MAX_REQUESTS` requests.

    Args:
        path: the trace file.

    Returns:
        The workload, named after the file.

    Raises:
        InvalidInputError: the file cannot be read, or a line is wrong: the message starts with
            ``<path>:<line>:`` and says what is wrong.
    """
    where = os.fspath(path)
    try:
        raw_lines = read_bounded(path, f"the trace {where}").split(b"\n")
    except OSError as exc:
        raise InvalidInputError(f"cannot read the trace {where}: {exc.strerror or exc}") from None
    requests: list[Request] = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"{where}:{number}: not UTF-8 text (byte {exc.start + 1} of the line)"
            ) from None
        if not text.strip():
            continue
        if len(requests) == MAX_REQUESTS:
            raise InvalidInputError(
                f"{where}:{number}: a trace has at most {MAX_REQUESTS:,} requests "
                "(kvcore.simulation.workload.MAX_REQUESTS); split it"
            )
        requests.append(_request_from_line(text, len(requests), f"{where}:{number}", number))
    if not requests:
        raise InvalidInputError(f"{where}: the trace has no requests (one JSON object a line)")
    try:
        return Workload(tuple(requests), name=os.path.basename(where) or where)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None


def _request_from_line(text: str, index: int, where: str, line: int) -> Request:
    try:
        item = loads(text, "the line")
    except InvalidInputError as exc:  # nested too deep, or a number too long
        raise InvalidInputError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise InvalidInputError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(item, dict):
        raise InvalidInputError(
            f"{where}: each line must be a JSON object such as "
            f'{{"prompt_tokens": 512, "output_tokens": 128}} (got {type(item).__name__})'
        )
    missing = [key for key in TRACE_KEYS[:2] if key not in item]
    if ("prefix_id" in item) != ("prefix_tokens" in item):
        missing.append("prefix_tokens" if "prefix_id" in item else "prefix_id")
    if missing:
        raise InvalidInputError(f"{where}: missing {', '.join(repr(k) for k in missing)}")
    extra = sorted(str(key) for key in item if key not in TRACE_KEYS)
    if extra:
        raise InvalidInputError(
            f"{where}: unknown key(s) {', '.join(repr(k) for k in extra)}; a line has "
            f"{', '.join(repr(k) for k in TRACE_KEYS)} only"
        )
    values: dict[str, int] = {}
    for key, minimum, limit, constant in (
        ("prompt_tokens", 1, MAX_TOKENS, "kvcore.limits.MAX_TOKENS"),
        ("output_tokens", 1, MAX_TOKENS, "kvcore.limits.MAX_TOKENS"),
        ("arrival_step", 0, MAX_ARRIVAL_STEP, "kvcore.simulation.workload.MAX_ARRIVAL_STEP"),
        ("prefix_tokens", 0, MAX_TOKENS, "kvcore.limits.MAX_TOKENS"),
    ):
        if key not in item:
            continue
        value = check_int(item[key], repr(key), minimum=minimum, owner=f"{where}: ")
        values[key] = check_at_most(
            value, limit, f"{where}: {key!r} ({constant})", "shorten the trace's requests"
        )
    arrival_time = item.get("arrival_time")
    if "arrival_time" in item and (not is_number(arrival_time) or not 0 <= arrival_time <= MAX_ARRIVAL_TIME):
        raise InvalidInputError(
            f"{where}: 'arrival_time' must be a number of seconds from 0 to {MAX_ARRIVAL_TIME:,.0f} "
            f"(kvcore.simulation.workload.MAX_ARRIVAL_TIME) (got {arrival_time!r})"
        )
    prefix_id = item.get("prefix_id")
    if "prefix_id" in item and (
        type(prefix_id) not in (int, str)
        or (isinstance(prefix_id, str) and not 1 <= len(prefix_id) <= MAX_PREFIX_ID_CHARS)
    ):
        raise InvalidInputError(
            f"{where}: 'prefix_id' must be an int or a string of 1 to {MAX_PREFIX_ID_CHARS} characters "
            f"(got {type(prefix_id).__name__})"
        )
    try:
        return Request(
            id=index,
            prefix_id=prefix_id,
            line=line,
            arrival_time=None if arrival_time is None else float(arrival_time),
            **values,
        )
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {str(exc).removeprefix(f'request {index}: ')}") from None


# -- synthetic workloads -----------------------------------------------------------------------


@attrs.frozen
class LengthDist:
    """A distribution of token counts.

    Attributes:
        kind: ``"fixed"`` (always ``a``), ``"uniform"`` (an int from ``a`` to ``b``, both
            included) or ``"lognormal"`` (mean ``a`` tokens; ``b`` the standard deviation of
            the length's logarithm, the spread).
        a: the length, the low end, or the mean.
        b: the high end or the spread (unused for ``"fixed"``).
    """

    kind: LengthKind
    a: float
    b: float = 0.0

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise InvalidInputError(
                f"length kind must be 'fixed', 'uniform' or 'lognormal' (got {self.kind!r})"
            )
        for name in ("a", "b"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value):
                raise InvalidInputError(
                    f"{self.kind} length: {name!r} must be a finite number (got {value!r})"
                )
        if self.kind in ("fixed", "uniform"):
            if not (float(self.a).is_integer() and float(self.b).is_integer()):
                raise InvalidInputError(f"{self.kind} lengths are whole token counts (got {self})")
            if self.a < 1 or self.a > MAX_TOKENS:
                raise InvalidInputError(f"{self}: the length must be from 1 to {MAX_TOKENS:,} tokens")
        if self.kind == "uniform" and not self.a <= self.b <= MAX_TOKENS:
            raise InvalidInputError(f"{self}: the high end must be from the low end to {MAX_TOKENS:,} tokens")
        if self.kind == "lognormal" and not (1 <= self.a <= MAX_TOKENS and 0 <= self.b <= 10):
            raise InvalidInputError(
                f"{self}: the mean must be from 1 to {MAX_TOKENS:,} tokens and the spread from 0 to 10"
            )

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}:{int(self.b)}"
        return f"lognormal:{self.a:g}:{self.b:g}"

    def sample(self, rng: random.Random, n: int, max_len: int) -> list[int]:
        """Draw ``n`` lengths, each clipped to ``[1, max_len]``.

        Args:
            rng: the random source (the draws depend on it alone).
            n: how many.
            max_len: the longest length allowed (``>= 1``).

        Returns:
            The lengths.
        """
        check_int(n, "'n'", minimum=0)
        check_int(max_len, "'max_len'", minimum=1)
        if self.kind == "fixed":
            return [min(int(self.a), max_len)] * n
        if self.kind == "uniform":
            low, high = int(self.a), int(self.b)
            return [min(rng.randint(low, high), max_len) for _ in range(n)]
        sigma = self.b
        mu = math.log(self.a) - sigma * sigma / 2  # so that the mean is ``a``
        draw = rng.lognormvariate
        return [max(1, min(round(draw(mu, sigma)), max_len)) for _ in range(n)]


def parse_length(text: str) -> LengthDist:
    """Read a length distribution: ``"512"`` or ``"fixed:512"``, ``"uniform:LO:HI"``,
    ``"lognormal:MEAN:SIGMA"`` (``MEAN`` the mean in tokens, ``SIGMA`` the spread of the log).

    Args:
        text: the distribution as the command line writes it.

    Returns:
        The distribution.

    Raises:
        InvalidInputError: naming the text and the accepted forms.
    """
    forms = "give 512, fixed:512, uniform:LO:HI or lognormal:MEAN:SIGMA"
    parts = str(text).strip().lower().split(":")
    kind, numbers = ("fixed", parts) if len(parts) == 1 else (parts[0], parts[1:])
    wanted = {"fixed": 1, "uniform": 2, "lognormal": 2}.get(kind)
    if wanted is None or len(numbers) != wanted:
        raise InvalidInputError(f"cannot read the length {text!r}: {forms}")
    values: list[float] = []
    for number in numbers:
        try:
            value = int(number) if kind != "lognormal" else float(number)
        except ValueError:
            raise InvalidInputError(
                f"cannot read the length {text!r}: {number!r} is not a number; {forms}"
            ) from None
        values.append(value)
    try:
        return LengthDist(kind, values[0], values[1] if len(values) > 1 else 0.0)  # type: ignore[arg-type]
    except InvalidInputError as exc:
        raise InvalidInputError(f"cannot use the length {text!r}: {exc}") from None


def synthetic(
    count: int,
    prompt: LengthDist,
    output: LengthDist,
    *,
    rate: float | None = None,
    seed: int = 0,
    max_model_len: int,
    prefix_share: float = 0.0,
    prefix_tokens: int = 0,
    per_second: bool = False,
) -> Workload:
    """Draw a workload: ``count`` requests with random lengths and arrivals.

    Prompts are clipped to ``[1, max_model_len - 1]`` and outputs to ``[1, max_model_len -
    prompt]``, so every request fits ``max_model_len``. With ``rate`` ``None`` every request
    arrives at step 0; otherwise arrivals are a Poisson process of ``rate`` requests per step
    (exponential gaps, the arrival step the time rounded down).

    With ``prefix_share`` and ``prefix_tokens``, each request starts with one shared prefix (a
    system prompt, ``prefix_id`` 0) of ``prefix_tokens`` tokens with probability
    ``prefix_share``: its prompt is the prefix plus the drawn prompt length (clipped as
    above, so a clipped prompt may be all prefix). The other requests' prompts are their own.

    With ``per_second``, ``rate`` is requests per second and the requests get an
    ``arrival_time`` (the Poisson process's times, in seconds) instead of an arrival step.

    Args:
        count: requests (1 to :data:`MAX_REQUESTS`).
        prompt: the prompt-length distribution.
        output: the output-length distribution.
        rate: mean arrivals per step (per second with ``per_second``; ``> 0``), or ``None``.
        seed: seeds ``random.Random``; the same arguments give the same workload.
        max_model_len: the longest request (prompt plus output, ``>= 2``).
        prefix_share: the share of requests that start with the shared prefix (0 to 1).
        prefix_tokens: the shared prefix's length (``0`` to ``max_model_len - 2``; ``0``: none).
        per_second: ``rate`` is per second, and arrivals are times (``arrival_time``; at once:
            every request at time 0).

    Returns:
        The workload, named after its arguments.

    Raises:
        InvalidInputError: an argument is out of range, or the rate is so low that arrivals
            would run past :data:`MAX_ARRIVAL_STEP`.
    """
    _check_synthetic(count, max_model_len, seed, rate, prefix_share, prefix_tokens, per_second=per_second)
    rng = random.Random(seed)
    prompts = prompt.sample(rng, count, max_model_len - 1)
    outputs = output.sample(rng, count, max_model_len - 1)
    arrivals, times = _poisson_arrivals(rng, count, rate, per_second=per_second)
    shared = [False] * count
    if prefix_share and prefix_tokens:  # drawn after the rest, so the other draws stay the same
        shared = [rng.random() < prefix_share for _ in range(count)]
    requests = []
    for index, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        if shared[index]:
            p = min(p + prefix_tokens, max_model_len - 1)
        requests.append(
            Request(
                index,
                p,
                min(o, max_model_len - p),
                arrivals[index],
                prefix_id=0 if shared[index] else None,
                prefix_tokens=prefix_tokens if shared[index] else 0,
                arrival_time=times[index],
            )
        )
    arriving = "at once" if rate is None else f"Poisson {rate:g}/{'s' if per_second else 'step'}"
    name = f"{count} requests, prompt {prompt}, output {output}, {arriving}, seed {seed}"
    if prefix_share and prefix_tokens:
        name += f", {prefix_share:g} share a {prefix_tokens}-token prefix"
    return Workload(tuple(requests), name=name)


def _check_synthetic(
    count: int,
    max_model_len: int,
    seed: int,
    rate: float | None,
    prefix_share: float,
    prefix_tokens: int,
    *,
    per_second: bool,
) -> None:
    """:func:`synthetic`'s argument checks (its ``Raises``)."""
    check_int(count, "'count'", minimum=1)
    check_at_most(
        count, MAX_REQUESTS, "'count' (kvcore.simulation.workload.MAX_REQUESTS)", "simulate fewer requests"
    )
    check_int(max_model_len, "'max_model_len'", minimum=2)
    check_at_most(
        max_model_len, MAX_TOKENS, "'max_model_len' (kvcore.limits.MAX_TOKENS)", "give a shorter length"
    )
    check_int(seed, "'seed'")
    unit = "second" if per_second else "step"
    if rate is not None and (not is_number(rate) or not math.isfinite(rate) or rate <= 0):
        raise InvalidInputError(f"'rate' must be a number of requests per {unit} > 0, or None (got {rate!r})")
    if not is_number(prefix_share) or not 0 <= prefix_share <= 1:
        raise InvalidInputError(f"'prefix_share' must be a number from 0 to 1 (got {prefix_share!r})")
    check_int(prefix_tokens, "'prefix_tokens'", minimum=0, below=max_model_len - 1)


def _poisson_arrivals(
    rng: random.Random, count: int, rate: float | None, *, per_second: bool
) -> tuple[list[int], list[float | None]]:
    """Each request's arrival step and time: all at once without ``rate``, else a Poisson process
    (steps, or with ``per_second`` times in seconds and every step 0)."""
    arrivals = [0] * count
    times: list[float | None] = [0.0 if per_second else None] * count
    if rate is None:
        return arrivals, times
    now = 0.0
    for index in range(count):
        now += rng.expovariate(rate)
        arrivals[index] = int(now)
        if per_second:
            times[index] = now
    if per_second:
        if now > MAX_ARRIVAL_TIME:
            raise InvalidInputError(
                f"at {rate:g} requests per second, {count} requests arrive until {now:,.0f} s, past "
                f"{MAX_ARRIVAL_TIME:,.0f} s (kvcore.simulation.workload.MAX_ARRIVAL_TIME); raise the rate"
            )
        return [0] * count, times  # the times say when
    if arrivals[-1] > MAX_ARRIVAL_STEP:
        raise InvalidInputError(
            f"at {rate:g} requests per step, {count} requests arrive until step {arrivals[-1]:,}, past "
            f"{MAX_ARRIVAL_STEP:,} (kvcore.simulation.workload.MAX_ARRIVAL_STEP); raise the rate"
        )
    return arrivals, times
