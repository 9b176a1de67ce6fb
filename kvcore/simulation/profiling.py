"""Measuring an engine's steps: the batches a step-time model needs, timed, and the fit chosen.

``kvcore profile`` runs an engine (:class:`StepEngine`: vLLM's offline engine,
:mod:`kvcore.integrations.vllm.profiling`; transformers' continuous batching,
:mod:`kvcore.integrations.transformers.profiling`) through :func:`scenarios`: prompts of many
lengths, decode batches of several widths at several context lengths, mixed steps (a prompt
arriving while others decode) and serving (requests arriving as a server gets them). The decode
scenarios run ``repeats`` times; the engine's scheduler is deterministic, so step ``k`` of every
repeat schedules the same batch, and a step's seconds are the least (or median) over the
repeats, the spread ``(most - least) / least`` beside it. The others run cold
(:attr:`Scenario.cold`): engines keep kernels per token count warm, and serving's prompt chunks
come in every length, so a prompt-chunk step is measured the first time its token count runs.

:func:`choose_terms` fits the four-term line on three of every four steps and measures its
error on the fourth (the held-out steps), per range of steps (:func:`held_out_errors`), on
average and summed (the bias, what a run of such steps would be off by); where the line misses
a range by more than :data:`FEW_PERCENT`, the forms with an attention-pairs term, a
prefill-requests term and both are tried, and one is kept when it cuts the worst range's bias
by a fifth or more.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

from kvcore.errors import InvalidInputError
from kvcore.simulation.profile_file import HeldOutError, ProfileFile, ProfileHeader, ProfileSample
from kvcore.simulation.timing import PROFILE_TERMS, PROFILE_TOLERANCE, StepProfile, fit_profile

#: The held-out error above which the four-term line is extended.
FEW_PERCENT: Final = 0.03

#: The share of the line's held-out error the attention-pairs term must remove to be kept
#: (less is within what a loaded machine's noise moves).
MUST_GAIN: Final = 0.2

#: How a step's repeats become its seconds: the least (the step's own cost: what disturbs a
#: step only adds time) or the median (what the step takes on this machine as loaded now).
STATISTICS: Final = ("least", "median")

#: What a step is timed by: the wall clock (what a user waits, the machine's load included), or
#: the process's CPU time (what the step costs on a core of its own: on a shared machine, time
#: other processes take from the engine's core is not counted). With the engine pinned to one
#: core and one torch thread, the CPU time is the engine's own work.
CLOCKS: Final[dict[str, Callable[[], float]]] = {"wall": time.perf_counter, "cpu": time.process_time}

#: Every how many steps one is held out of the fit.
HOLD_OUT_EVERY: Final = 4


@attrs.frozen(kw_only=True)
class ProfileRequest:
    """A request a scenario sends: its prompt and output tokens, and the step it arrives at
    (0: before the first step)."""

    prompt_tokens: int
    output_tokens: int
    arrival_step: int = 0


@attrs.frozen(kw_only=True)
class Scenario:
    """A set of requests that makes the engine run one kind of step.

    Attributes:
        name: what it measures (``prefill 512``, ``decode 16 x 256``, ``mixed 8 x 64 + 256``).
        requests: the requests, in the order they are added.
        cold: its steps are measured the first time their shapes run, as serving runs its
            prompt chunks: each repeat is a variant of its own (every prompt ``k`` tokens
            shorter in the ``k``-th), run once, not the same batch again. Engines keep
            per-shape kernels warm (vLLM's CPU build keeps 32 token counts per linear layer,
            ``create_onednn_mm(weight, 32)`` in ``vllm/model_executor/layers/utils.py``, and
            builds a new one for a count not among them), and serving's prompt chunks come
            in every length, so a repeated prompt-chunk step measures a warm cache serving
            rarely has: on vLLM's CPU build a new shape's step cost twice to four times the
            repeated one's.
    """

    name: str
    requests: tuple[ProfileRequest, ...]
    cold: bool = False

    def variant(self, k: int) -> Scenario:
        """The ``k``-th variant of a cold scenario: every prompt ``k`` tokens shorter (at
        least 2 tokens)."""
        return attrs.evolve(
            self,
            requests=tuple(attrs.evolve(r, prompt_tokens=max(2, r.prompt_tokens - k)) for r in self.requests),
        )


@attrs.frozen(kw_only=True)
class ScheduledRequest:
    """What one request computed in a step: its new tokens, and the tokens it has cached once
    the step's are written."""

    new_tokens: int
    context_tokens: int


@attrs.frozen(kw_only=True)
class TimedStep:
    """One engine step: what it scheduled and how long it took (seconds, wall clock)."""

    scheduled: tuple[ScheduledRequest, ...]
    seconds: float

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(prefill_tokens, decode_requests, context_tokens, attention_pairs, requests)``,
        counted as :class:`~kvcore.simulation.steps.StepRecord` counts them."""
        prefill = sum(r.new_tokens for r in self.scheduled if r.new_tokens > 1)
        decode = sum(1 for r in self.scheduled if r.new_tokens == 1)
        context = sum(r.context_tokens for r in self.scheduled)
        pairs = sum(
            r.new_tokens * r.context_tokens - r.new_tokens * (r.new_tokens - 1) // 2 for r in self.scheduled
        )
        return prefill, decode, context, pairs, len(self.scheduled)


class StepEngine(Protocol):
    """An engine kvcore can time step by step."""

    def run(self, scenario: Scenario) -> list[TimedStep]:
        """Run the scenario's requests to the end; every step it took, timed, in order."""


@attrs.frozen(kw_only=True)
class EngineLimits:
    """The engine settings the scenarios are sized by.

    Attributes:
        max_batched_tokens: the most tokens one step schedules.
        max_num_seqs: the most requests one step schedules.
        max_model_len: the longest request.
        kv_tokens: the tokens the KV cache holds (no scenario needs more at once).
    """

    max_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    kv_tokens: int


def _sizes(top: int, count: int, low: int = 1) -> list[int]:
    """Up to ``count`` sizes from ``top`` down, halving, none below ``low``."""
    out: list[int] = []
    size = top
    while size >= low and len(out) < count:
        out.append(size)
        size //= 2
    return sorted(set(out))


def _spread(low: int, high: int, count: int) -> list[int]:
    """``count`` lengths from ``low`` to ``high``, evenly apart on a log scale (as many short
    prompts as long ones: a prompt chunk's cost changes fastest where it is short)."""
    if high <= low or count < 2:
        return [high]
    ratio = (high / low) ** (1 / (count - 1))
    return sorted({min(high, round(low * ratio**k)) for k in range(count)})


#: How many prompt lengths the prefill scenarios measure.
PREFILL_LENGTHS: Final = 12


def scenarios(limits: EngineLimits, *, decode_steps: int = 8) -> list[Scenario]:
    """The scenarios a step-time model needs, sized to the engine.

    - prefill (cold): one request whose prompt is a single chunk, at :data:`PREFILL_LENGTHS`
      lengths from 16 tokens to ``max_batched_tokens``, evenly apart on a log scale, then
      one more step;
    - decode: ``width`` requests (1, a sixteenth, a quarter and all of ``max_num_seqs``) with
      prompts of 16 tokens, a sixteenth, a quarter and half of ``max_model_len``, decoding
      ``decode_steps`` tokens each;
    - mixed (cold): ``width`` requests (1, 4, a quarter and all but one of ``max_num_seqs``)
      decoding at a context of 64 tokens and of a quarter of ``max_model_len``, joined once
      their prompts are in by a prompt of an eighth, a half and all of
      ``max_batched_tokens``: a request's first step beside others' decodes, as serving runs
      it;
    - serving (cold): :func:`serving_scenarios`.

    Scenarios whose requests the KV cache cannot hold at once are left out.
    """
    out: list[Scenario] = []
    chunk_cap = min(limits.max_batched_tokens, limits.max_model_len - 2)
    for prompt in _spread(min(16, chunk_cap), chunk_cap, PREFILL_LENGTHS):
        out.append(
            Scenario(
                name=f"prefill {prompt}",
                requests=(ProfileRequest(prompt_tokens=prompt, output_tokens=2),),
                cold=True,
            )
        )
    contexts = sorted(
        {
            16,
            *(
                c
                for c in (limits.max_model_len // 16, limits.max_model_len // 4, limits.max_model_len // 2)
                if c > 16
            ),
        }
    )
    top = limits.max_num_seqs
    for width in sorted({w for w in (1, top // 16, top // 4, top) if w > 0}):
        for context in contexts:
            context = min(context, limits.max_model_len - decode_steps - 1)
            if (
                width * (context + decode_steps) > limits.kv_tokens
                or width * context > 16 * limits.max_batched_tokens
            ):
                continue
            request = ProfileRequest(prompt_tokens=context, output_tokens=decode_steps + 1)
            out.append(Scenario(name=f"decode {width} x {context}", requests=(request,) * width))
    widths = sorted({w for w in (1, 4, top // 4, top - 1) if 0 < w < top})
    mixed_contexts = sorted(
        {c for c in (64, limits.max_model_len // 4) if c + 2 * decode_steps < limits.max_model_len}
    )
    for width in widths:
        for context in mixed_contexts:
            for prompt in sorted({max(16, chunk_cap // 8), max(16, chunk_cap // 2), chunk_cap}):
                # each context its own prompt lengths: a step of a token count already run is warm
                prompt = max(2, prompt - 16 * mixed_contexts.index(context))
                # the decoding requests' prompts first, two decode steps, then the new prompt,
                # its chunks beside their decodes
                joins = -(-width * context // limits.max_batched_tokens) + 2
                chunks = -(-prompt // max(1, limits.max_batched_tokens - width))
                output = joins + chunks + decode_steps
                if context + output > limits.max_model_len:
                    continue
                if width * (context + output) + prompt + 2 > limits.kv_tokens:
                    continue
                decoding = (ProfileRequest(prompt_tokens=context, output_tokens=output),) * width
                joining = ProfileRequest(prompt_tokens=prompt, output_tokens=2, arrival_step=joins)
                out.append(
                    Scenario(
                        name=f"mixed {width} x {context} + {prompt}",
                        requests=(*decoding, joining),
                        cold=True,
                    )
                )
    out.extend(serving_scenarios(limits))
    return out


#: The serving scenarios' requests, and how many steps apart they arrive on average (light:
#: a few requests at once; busy: most of ``max_num_seqs``).
SERVING: Final = (("light", 48, 4.0), ("busy", 96, 1.0))


def serving_scenarios(limits: EngineLimits, *, seed: int = 0) -> list[Scenario]:
    """Requests arriving as a server gets them (cold): prompts of lengths evenly apart on a log
    scale from 16 tokens to ``max_batched_tokens`` in a seeded random order, 4 to 32 output
    tokens, arriving a seeded exponential number of steps apart (:data:`SERVING`). Their steps
    are what the controlled scenarios cannot set up: every mix of prompt chunks (whole, split,
    several at once) beside decodes at every width, run back to back as serving runs them."""
    import random

    draw = random.Random(seed)
    chunk_cap = min(limits.max_batched_tokens, limits.max_model_len - 40)
    out = []
    for name, count, apart in SERVING:
        step = 0.0
        requests = []
        for _ in range(count):
            prompt = round(16 * (max(chunk_cap, 17) / 16) ** draw.random())
            requests.append(
                ProfileRequest(
                    prompt_tokens=prompt, output_tokens=draw.randint(4, 32), arrival_step=int(step)
                )
            )
            step += draw.expovariate(1 / apart)
        need = sum(r.prompt_tokens + r.output_tokens for r in requests)
        if need > limits.kv_tokens:  # a busy scenario the KV cache cannot hold: fewer requests
            keep = max(1, int(count * limits.kv_tokens / need))
            requests = requests[:keep]
        out.append(Scenario(name=f"serving {name}", requests=tuple(requests), cold=True))
    return out


def measure(
    engine: StepEngine,
    plan: Sequence[Scenario],
    *,
    repeats: int = 3,
    statistic: str = "least",
    progress: Callable[[str], None] | None = None,
) -> list[ProfileSample]:
    """Run every scenario ``repeats`` times (after one warm-up run of the first) and return a
    sample per step: its shape, and the least (or, with ``statistic="median"``, the median) of
    its repeats' seconds, with their spread ``(most - least) / least``. A cold scenario's
    repeats are its variants (:meth:`Scenario.variant`), each run once and each step of each
    a sample of its own (no spread): its prompt-chunk steps are kept where their token count
    (the rows of the step's matmuls) is one no earlier step ran, its decode steps where it is
    one an earlier step ran, as serving runs them.

    Raises:
        InvalidInputError: ``repeats`` below 1, or a scenario whose repeats scheduled different
            batches (the engine is not deterministic: a step's repeats cannot be matched).
    """
    if repeats < 1:
        raise InvalidInputError(f"'repeats' must be >= 1 (got {repeats})")
    if statistic not in STATISTICS:
        raise InvalidInputError(f"'statistic' must be one of {', '.join(STATISTICS)} (got {statistic!r})")
    seen: set[int] = set()  # the token counts of every step run so far: the engine's warm shapes

    def note(run: list[TimedStep]) -> list[TimedStep]:
        for step in run:
            seen.add(sum(r.new_tokens for r in step.scheduled))
        return run

    if plan:
        note(engine.run(plan[0]))  # warm-up: first calls allocate and compile
    samples: list[ProfileSample] = []
    for scenario in plan:
        if scenario.cold:
            samples += _cold_samples(engine, scenario, repeats, seen)
            if progress is not None:
                progress(f"{scenario.name}: {repeats} variants, run once each")
            continue
        warm = _warm_samples([note(engine.run(scenario)) for _ in range(repeats)], scenario, statistic)
        samples += warm
        if progress is not None:
            progress(f"{scenario.name}: {len(warm)} steps")
    return samples


def _cold_samples(
    engine: StepEngine, scenario: Scenario, repeats: int, seen: set[int]
) -> list[ProfileSample]:
    """A cold scenario's samples: each variant run once, each kept step a sample of its own.

    ``seen`` holds the token counts the engine has run (its warm shapes) and gains these steps'.
    """
    samples: list[ProfileSample] = []
    for k in range(repeats):
        for step in engine.run(scenario.variant(k)):
            shape = step.shape  # computed from the step's requests: read once
            prefill, decode, _, _, requests = shape
            tokens = prefill + decode
            new = tokens not in seen
            seen.add(tokens)
            # a prompt chunk's step is kept when its token count is new to the engine (cold, as
            # serving's are), a decode step when it is not (warm, as serving's decode widths are)
            if requests and new == bool(prefill):
                samples.append(_sample(shape, step.seconds))
    return samples


def _warm_samples(runs: Sequence[list[TimedStep]], scenario: Scenario, statistic: str) -> list[ProfileSample]:
    """A scenario's repeats matched step by step: a sample per step of the least (or median)
    seconds and the repeats' spread.

    Raises:
        InvalidInputError: the repeats scheduled different batches.
    """
    shapes = [[step.shape for step in run] for run in runs]
    if any(s != shapes[0] for s in shapes[1:]):
        raise InvalidInputError(
            f"scenario {scenario.name!r}: its {len(runs)} repeats scheduled different batches, so their "
            "steps cannot be matched; profile with prefix caching off and nothing else running on "
            "the engine"
        )
    samples: list[ProfileSample] = []
    for k, shape in enumerate(shapes[0]):
        if not shape[4]:  # no request ran
            continue
        times = sorted(run[k].seconds for run in runs)
        least = times[0]
        kept = least if statistic == "least" else statistics.median(times)
        samples.append(_sample(shape, kept, spread=(times[-1] - least) / least if least > 0 else 0.0))
    return samples


def _sample(
    shape: tuple[int, int, int, int, int], seconds: float, *, spread: float | None = None
) -> ProfileSample:
    """The sample of a step of ``shape`` (prefill tokens, decode requests, context tokens,
    attention pairs, requests) that took ``seconds``; ``spread`` is ``None`` for a step run once."""
    prefill, decode, context, pairs, requests = shape
    return ProfileSample(
        prefill_tokens=prefill,
        decode_requests=decode,
        context_tokens=context,
        attention_pairs=pairs,
        requests=requests,
        seconds=seconds,
        spread=spread,
    )


def _kind(sample: ProfileSample) -> str:
    if sample.prefill_tokens and sample.decode_requests:
        return "mixed"
    return "prefill" if sample.prefill_tokens else "decode"


def _ranges(samples: Sequence[ProfileSample]) -> list[tuple[str, list[ProfileSample]]]:
    """The held-out steps grouped by kind and term range: prefill by chunk tokens, decode by
    width and by context (each split at its median), mixed alone."""
    groups: list[tuple[str, list[ProfileSample]]] = []
    prefill = [s for s in samples if _kind(s) == "prefill"]
    decode = [s for s in samples if _kind(s) == "decode"]
    mixed = [s for s in samples if _kind(s) == "mixed"]
    ranges: tuple[tuple[str, list[ProfileSample], Callable[[ProfileSample], int]], ...] = (
        ("prefill tokens", prefill, lambda s: s.prefill_tokens),
        ("decode requests", decode, lambda s: s.decode_requests),
        ("decode context tokens", decode, lambda s: s.context_tokens),
    )
    for name, items, key in ranges:
        if not items:
            continue
        values = sorted(key(s) for s in items)
        cut = values[len(values) // 2]
        low = [s for s in items if key(s) < cut]
        high = [s for s in items if key(s) >= cut]
        if low:
            groups.append((f"{name} {values[0]:,}-{max(key(s) for s in low):,}", low))
        groups.append((f"{name} {cut:,}-{values[-1]:,}", high))
    if mixed:
        groups.append(("mixed steps", mixed))
    return groups


def held_out_errors(profile: StepProfile, held_out: Sequence[ProfileSample]) -> tuple[HeldOutError, ...]:
    """The fit's relative error over ``held_out``, per range of steps, and over all of them."""

    def error(s: ProfileSample) -> float:
        *values, seconds = s.values(PROFILE_TERMS)
        return abs(profile.predict(*values) - seconds) / seconds

    def predicted(s: ProfileSample) -> float:
        *values, _ = s.values(PROFILE_TERMS)
        return profile.predict(*values)

    out = []
    for name, items in [*_ranges(held_out), ("all held-out steps", list(held_out))]:
        errors = [error(s) for s in items]
        if errors:
            guess = sum(predicted(s) for s in items)
            out.append(
                HeldOutError(
                    steps=name,
                    samples=len(errors),
                    mean_error=statistics.fmean(errors),
                    max_error=max(errors),
                    bias=sum(s.seconds for s in items) / guess - 1 if guess > 0 else math.inf,
                )
            )
    return tuple(out)


def worst_bias(errors: Sequence[HeldOutError]) -> float:
    """The largest ``|bias|`` over the ranges (:class:`HeldOutError`)."""
    return max(abs(e.bias) if e.bias is not None else math.inf for e in errors)


@attrs.frozen(kw_only=True)
class TermsChoice:
    """The terms chosen for a profile, and the held-out errors that chose them.

    Attributes:
        terms: the chosen terms.
        held_out: the chosen fit's held-out errors.
        line_held_out: the four-term line's (the same as ``held_out`` when it was chosen).
        fit: the chosen terms fitted on every sample.
    """

    terms: tuple[str, ...]
    held_out: tuple[HeldOutError, ...]
    line_held_out: tuple[HeldOutError, ...]
    fit: StepProfile


#: The model forms tried, fewest terms first: the line, and the line with each optional term
#: and with both.
FORMS: Final = (
    PROFILE_TERMS[:4],
    (*PROFILE_TERMS[:4], "attention_pairs"),
    (*PROFILE_TERMS[:4], "prefill_requests"),
    PROFILE_TERMS,
)


def _fit(samples: Sequence[ProfileSample], terms: tuple[str, ...]) -> StepProfile:
    return fit_profile(
        [s.values(terms) for s in samples], source="measured steps", terms=terms, tolerance=math.inf
    )


def choose_terms(samples: Sequence[ProfileSample]) -> TermsChoice:
    """Fit on three of every four steps, measure the error on the fourth, and choose the terms.

    The four-term line is kept unless it misses some held-out range's steps by more than
    :data:`FEW_PERCENT`, on average or summed (its bias: a run of such steps, a request's
    latency, would be off by that much); then each form of :data:`FORMS` is fitted, and the
    one whose worst range bias is least is kept if it cuts the line's by at least
    :data:`MUST_GAIN` of it (of two within that share of each other, the one of fewer terms).
    The bias decides, not the mean error: on a loaded machine every form misses single steps
    by the noise, which averages out over the many steps of a latency; a bias does not.

    Raises:
        InvalidInputError: too few steps to hold some out, or steps that cannot tell the terms
            apart.
    """
    fitted = [s for k, s in enumerate(samples) if k % HOLD_OUT_EVERY != HOLD_OUT_EVERY - 1]
    held = [s for k, s in enumerate(samples) if k % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1]
    if len(held) < 2:
        raise InvalidInputError(
            f"{len(samples)} measured steps are too few to hold some out: measure more scenarios"
        )
    line = held_out_errors(_fit(fitted, FORMS[0]), held)
    chosen: tuple[str, ...] = FORMS[0]
    errors = line
    if any(e.mean_error > FEW_PERCENT for e in line) or worst_bias(line) > FEW_PERCENT:
        for form in FORMS[1:]:
            try:
                tried = held_out_errors(_fit(fitted, form), held)
            except InvalidInputError:  # the steps cannot tell this form's terms apart
                continue
            if worst_bias(tried) < (1 - MUST_GAIN) * worst_bias(errors):
                chosen, errors = form, tried
    return TermsChoice(terms=chosen, held_out=errors, line_held_out=line, fit=_fit(samples, chosen))


class ProfiledEngine(StepEngine, Protocol):
    """A :class:`StepEngine` that says how it is sized and set."""

    def limits(self) -> EngineLimits:
        """The settings the scenarios are sized by."""

    def settings(self) -> dict[str, Any]:
        """The settings a profile records."""


@attrs.frozen(kw_only=True)
class Measured:
    """What :func:`profile_engine` measured: the file to write, and how its terms were chosen.

    Attributes:
        file: the profile file (header and steps).
        choice: the terms, their held-out errors and their fit on every step.
        median_spread: the median over the repeated steps of their repeats' spread (how loaded
            the machine was).
    """

    file: ProfileFile
    choice: TermsChoice
    median_spread: float


def profile_engine(
    engine: ProfiledEngine,
    *,
    engine_name: str,
    engine_version: str,
    model: str,
    device: str,
    versions: Mapping[str, str],
    repeats: int = 5,
    statistic: str = "least",
    decode_steps: int = 8,
    progress: Callable[[str], None] | None = None,
) -> Measured:
    """Measure ``engine`` over :func:`scenarios`, choose the terms (:func:`choose_terms`) and
    make the profile file.

    The header's tolerance is the chosen fit's largest error over the steps (rounded up to a
    whole percent), so ``--step-profile`` reads the file it was written with; the held-out
    errors beside it say how far the fit is from steps it has not seen.

    Raises:
        InvalidInputError: ``repeats`` or ``decode_steps`` below 1, the engine's repeats differ,
            or too few steps to fit.
    """
    if decode_steps < 1:
        raise InvalidInputError(f"'decode_steps' must be >= 1 (got {decode_steps})")
    limits = engine.limits()
    samples = measure(
        engine,
        scenarios(limits, decode_steps=decode_steps),
        repeats=repeats,
        statistic=statistic,
        progress=progress,
    )
    choice = choose_terms(samples)
    tolerance = max(PROFILE_TOLERANCE, math.ceil(100 * choice.fit.max_error + 1e-9) / 100)
    header = ProfileHeader(
        engine=engine_name,
        engine_version=engine_version,
        model=model,
        device=device,
        versions=dict(versions),
        settings={
            **engine.settings(),
            "repeats": repeats,
            "statistic": statistic,
            "decode_steps": decode_steps,
        },
        terms=choice.terms,
        tolerance=tolerance,
        held_out=choice.held_out,
    )
    # the repeated steps' spread (a cold step runs once: it has none)
    spreads = sorted(s.spread for s in samples if s.spread is not None)
    return Measured(
        file=ProfileFile(header=header, samples=tuple(samples)),
        choice=choice,
        median_spread=statistics.median(spreads) if spreads else 0.0,
    )
