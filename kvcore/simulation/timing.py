"""From scheduler steps to seconds: step-time models, and the latencies of a timed run.

Two :class:`~kvcore.simulation.steps.StepTimeModel` kinds turn a
:class:`~kvcore.simulation.steps.StepRecord` into seconds:

- :class:`Roofline` (built by :func:`roofline` from a model's config, its plan and a GPU of
  :mod:`kvcore.simulation.gpus`): a step takes at least the time its FLOPs take at the GPU's
  dense tensor peak, and at least the time its bytes (weights, KV cache) take at the memory
  bandwidth, so ``max(FLOPs / peak, bytes / bandwidth)``. Real steps are slower (kernels reach
  a share of the peaks; launches, sampling, the scheduler and tensor-parallel all-reduces cost
  time the roofline does not count), so its seconds are a lower bound;
- :class:`StepProfile` (read by :func:`read_profile` from a file of measured steps): a linear
  model ``seconds = a + b * prefill_tokens + c * decode_requests + d * context_tokens`` fitted by
  least squares to the samples.

:func:`latency_report` reads a timed run's :class:`~kvcore.simulation.steps.Timeline`: time to
first token, inter-token latency and end-to-end latency (p50 / p90 / p99), output tokens per
second, and goodput under latency targets. The formulas and their sources are in
``docs/explanation/steps-to-seconds.md``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from kvcore.errors import InvalidInputError
from kvcore.plan import KVCachePlan
from kvcore.planning.gpu_budget import count_parameters, quantization, weight_bytes
from kvcore.planning.registry import Registry
from kvcore.simulation.gpus import Gpu
from kvcore.simulation.profile_file import (
    PROFILE_KEYS as PROFILE_KEYS,
    PROFILE_OPTIONAL_KEYS as PROFILE_OPTIONAL_KEYS,
    PROFILE_TERMS as PROFILE_TERMS,
    PROFILE_TOLERANCE as PROFILE_TOLERANCE,
    check_terms,
    read_profile_file,
)
from kvcore.simulation.profile_reach import MeasuredRange, ProfileReach, measured_ranges
from kvcore.simulation.simulator import percentile
from kvcore.simulation.steps import StepRecord, Timeline
from kvcore.spec import KVCacheSpec
from kvcore.validators import check_int, is_number

#: Weight groups a text step never runs (a vision tower, an audio encoder and their projector
#: run once per image or clip, not per token): matched as parts of the group's name.
NOT_PER_TOKEN: Final = ("tower", "encoder", "projector")

#: Config keys that name a mixture of experts' routed experts, and the experts each token visits.
_EXPERT_KEYS: Final = ("num_experts", "num_local_experts", "n_routed_experts")
_TOP_K_KEYS: Final = ("num_experts_per_tok", "experts_per_token", "moe_topk")


#: The percentiles reports show.
PERCENTILES: Final = (50, 90, 99)


# -- the roofline --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Roofline:
    """A step's lower-bound duration on one GPU model: ``max(FLOPs / peak, bytes / bandwidth)``
    per tensor-parallel rank.

    Attributes:
        gpu: the GPU.
        tp: tensor-parallel ranks; weights and FLOPs are split evenly among them (the plan's KV
            figures are already one rank's).
        fp8: the weights are FP8, so the matmuls run at the FP8 peak.
        matmul_params: parameters one token multiplies through (2 FLOPs each): the active
            parameters (routed experts at ``experts_per_token / num_experts``) less the input
            embeddings, less the lm_head.
        lm_head_params: the output projection's parameters, computed once per scheduled request
            (the logits of its last token).
        dense_weight_bytes: weight bytes every step reads (all but the routed experts, the
            input embedding table when the lm_head has its own, and the towers).
        expert_weight_bytes: the routed experts' bytes (0 for a dense model).
        num_experts: routed experts per MoE layer (0 for a dense model).
        experts_per_token: experts each token visits.
        attention_flops_per_pair: FLOPs of one query-key pair summed over the full-attention
            layers (``2 * heads * d_qk + 2 * heads * d_v`` per layer: scores and the weighted sum).
        kv_bytes_per_token: KV bytes one cached token takes in the full-attention layers (one
            rank, from the plan's page sizes).
        windows: ``(window, bytes_per_token)`` of the layers that read a window of the context.
        state_bytes: bytes of pages that do not grow with the context (per-request states, an
            encoder output's K and V), read once per scheduled request.
    """

    gpu: Gpu
    tp: int = 1
    fp8: bool = False
    matmul_params: float
    lm_head_params: float = 0.0
    dense_weight_bytes: float
    expert_weight_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    attention_flops_per_pair: float = 0.0
    kv_bytes_per_token: float = 0.0
    windows: tuple[tuple[int, float], ...] = ()
    state_bytes: float = 0.0

    @property
    def description(self) -> str:
        """``roofline on H100-SXM (tp 2, fp8), a lower bound``."""
        extras = [f"tp {self.tp}"] if self.tp > 1 else []
        if self.fp8 and self.gpu.fp8_tflops is not None:
            extras.append("fp8")
        inside = f" ({', '.join(extras)})" if extras else ""
        return f"roofline on {self.gpu.name}{inside}, a lower bound"

    def flops(self, record: StepRecord) -> float:
        """The step's FLOPs, all ranks together."""
        tokens = record.prefill_tokens + record.decode_tokens
        return (
            2 * self.matmul_params * tokens
            + 2 * self.lm_head_params * record.requests
            + self.attention_flops_per_pair * record.attention_pairs
        )

    def bytes_read(self, record: StepRecord) -> float:
        """The bytes the step moves through one rank's memory: its share of the weights, and
        the KV cache its requests read (one rank's already)."""
        weights = self.dense_weight_bytes
        if self.expert_weight_bytes:
            tokens = record.prefill_tokens + record.decode_tokens
            # the experts a batch touches, expected under uniform routing: E (1 - (1 - k/E)^T)
            untouched = (1 - self.experts_per_token / self.num_experts) ** tokens
            weights += self.expert_weight_bytes * (1 - untouched)
        kv = self.kv_bytes_per_token * record.context_tokens + self.state_bytes * record.requests
        for window, per_token in self.windows:
            kv += per_token * min(record.context_tokens, window * record.requests)
        return weights / self.tp + kv

    def __call__(self, record: StepRecord) -> float:
        if not record.requests:
            return 0.0
        compute = self.flops(record) / (self.tp * self.gpu.peak_flops(self.fp8))
        memory = self.bytes_read(record) / self.gpu.memory_bandwidth
        return max(compute, memory)


def _field(config: Mapping[str, Any], *keys: str) -> Any:
    """The first of ``keys`` the config (or its ``text_config``) sets, else ``None``."""
    inner = config.get("text_config")
    for section in (inner if isinstance(inner, Mapping) else {}, config):
        for key in keys:
            value = section.get(key)
            if value is not None:
                return value
    return None


def _int_field(config: Mapping[str, Any], *keys: str) -> int:
    value = _field(config, *keys)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def roofline(
    config: Mapping[str, Any],
    registry: Registry,
    plan: KVCachePlan,
    gpu: Gpu,
    *,
    tp: int = 1,
    source: str = "config",
) -> Roofline:
    """The roofline of a model (its ``config.json``) served by ``plan`` on ``gpu``.

    Args:
        config: the model's config.
        registry: whose family plugins count the parameters (``kvcore_count_parameters``).
        plan: one rank's plan: its layers' page sizes give the KV bytes per token.
        gpu: the GPU.
        tp: tensor-parallel ranks.
        source: how messages name the config.

    Raises:
        UnknownModelError, ModelConfigError: the parameters cannot be counted.
        InvalidInputError: ``tp`` is not an int >= 1.
    """
    check_int(tp, "'tp'", minimum=1)
    count = count_parameters(config, registry, source)
    quant = quantization(config, source)
    sizes = dict(weight_bytes(count, quant).by_group)
    params = count.by_name()
    skipped = [name for name in params if any(word in name for word in NOT_PER_TOKEN)]
    experts, top_k = _int_field(config, *_EXPERT_KEYS), _int_field(config, *_TOP_K_KEYS)
    routed = params.get("experts", 0) if experts and top_k and top_k < experts else 0
    routed_bytes = sizes.get("experts", 0) if routed else 0
    embeddings = params.get("embeddings", 0)
    head = params.get("lm_head", embeddings)  # tied: the embedding matrix is the lm_head
    active: float = sum(params.values()) - sum(params[name] for name in skipped)
    active -= routed - routed * top_k / experts if routed else 0
    dense_bytes = sum(sizes.values()) - sum(sizes.get(name, 0) for name in skipped) - routed_bytes
    if "lm_head" in params:  # the input table is looked up a row a token, not read whole
        dense_bytes -= sizes.get("embeddings", 0)
    return Roofline(
        gpu=gpu,
        tp=tp,
        fp8=quant.method in ("fp8", "fbgemm_fp8"),
        matmul_params=active - embeddings - params.get("lm_head", 0),
        lm_head_params=head,
        dense_weight_bytes=dense_bytes,
        expert_weight_bytes=routed_bytes,
        num_experts=experts if routed else 0,
        experts_per_token=top_k if routed else 0,
        attention_flops_per_pair=_attention_flops(config, plan),
        **_kv_bytes(plan),
    )


def _attention_flops(config: Mapping[str, Any], plan: KVCachePlan) -> float:
    """FLOPs per query-key pair over the plan's full-attention layers, all ranks together."""
    heads = _int_field(config, "num_attention_heads")
    hidden = _int_field(config, "hidden_size")
    nope, rope = _int_field(config, "qk_nope_head_dim"), _int_field(config, "qk_rope_head_dim")
    if nope or rope:  # MLA: queries and keys of nope + rope dims, values of v_head_dim
        d_qk, d_v = nope + rope, _int_field(config, "v_head_dim") or nope
    else:
        d_qk = d_v = _int_field(config, "head_dim") or (hidden // heads if heads else 0)
    full = sum(1 for _, kind in _layer_reads(plan) if kind == "full")
    return float(full * (2 * heads * d_qk + 2 * heads * d_v))


def _layer_reads(plan: KVCachePlan) -> list[tuple[Any, str]]:
    """Each layer's spec and how a step reads it: ``"full"`` (every cached token),
    ``"window"`` (the last tokens only) or ``"fixed"`` (pages that do not grow with the
    context: a per-request state, an encoder output's K and V)."""
    out = []
    big = max(plan.context.max_model_len, 1)
    for name, group, _tensor in plan.iter_layers():
        spec = group.spec_of(name)
        own_pages = type(spec).live_pages is not KVCacheSpec.live_pages
        if spec.tokens_per_page is None or (
            own_pages and len(spec.live_pages(1)) == len(spec.live_pages(big))
        ):
            out.append((spec, "fixed"))
        elif spec.first_retained_token(big) > 0:
            out.append((spec, "window"))
        else:
            out.append((spec, "full"))
    return out


def _kv_bytes(plan: KVCachePlan) -> dict[str, Any]:
    full = 0.0
    windows: dict[int, float] = {}
    states = 0.0
    big = max(plan.context.max_model_len, 1)
    for spec, kind in _layer_reads(plan):
        if kind == "fixed":
            states += len(spec.live_pages(big)) * spec.page_size_bytes
            continue
        per_token = spec.page_size_bytes / spec.tokens_per_page
        if kind == "full":
            full += per_token
        else:  # token n reads from first_retained_token(n) to itself; the widest span is the
            # window (a sliding window at any n, a chunk just before a chunk starts)
            first = spec.first_retained_token(big)
            window = max(n - spec.first_retained_token(n) + 1 for n in (big, first - 1))
            windows[window] = windows.get(window, 0.0) + per_token
    return {
        "kv_bytes_per_token": full,
        "windows": tuple(sorted(windows.items())),
        "state_bytes": states,
    }


# -- a measured profile --------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StepProfile:
    """Step times fitted to measured samples: ``seconds = intercept + per_prefill_token *
    prefill_tokens + per_decode_request * decode_tokens + per_context_token * context_tokens
    [+ per_attention_pair * attention_pairs] [+ per_prefill_request * prefill_requests]``
    (never below 0).

    The bracketed terms are fitted only when the file asks for them (a profile written by
    ``kvcore profile`` whose steps the four-term line did not follow): the attention arithmetic
    of a prefill chunk, which grows with the chunk times its context, not with either alone;
    and a cost per request that prefills (an engine that runs prompt chunks through kernels of
    their own pays it once per chunk, however short).

    Attributes:
        source: where the samples came from (the file).
        intercept: seconds of a step's fixed cost.
        per_prefill_token: seconds per prefill token.
        per_decode_request: seconds per decoding request.
        per_context_token: seconds per cached token read.
        samples: how many samples were fitted.
        max_error: the largest relative error of the fit over its samples.
        per_attention_pair: seconds per query-key pair (0 unless fitted).
        per_prefill_request: seconds per request computing more than one token (0 unless fitted).
        terms: the terms fitted (:data:`PROFILE_TERMS` names).
        measured: the range the samples measured of each term they vary (a run's steps beyond
            them are extrapolated: :mod:`kvcore.simulation.profile_reach`); empty for a profile
            made from coefficients alone.
    """

    source: str
    intercept: float
    per_prefill_token: float
    per_decode_request: float
    per_context_token: float
    samples: int
    max_error: float
    per_attention_pair: float = 0.0
    per_prefill_request: float = 0.0
    terms: tuple[str, ...] = ("fixed", "prefill_tokens", "decode_requests", "context_tokens")
    measured: tuple[MeasuredRange, ...] = attrs.field(default=(), repr=False)

    @property
    def description(self) -> str:
        """``measured profile FILE (12 samples, fit within 0.8 %)``."""
        fit = f"{self.samples} samples, fit within {100 * self.max_error:.1f} %"
        extra = [t.replace("_", " ") for t in self.terms[4:]]
        if extra:
            fit += f", with {' and '.join(extra)} terms"
        return f"measured profile {self.source} ({fit})"

    def predict(
        self,
        prefill_tokens: float,
        decode_requests: float,
        context_tokens: float,
        attention_pairs: float = 0.0,
        prefill_requests: float = 0.0,
    ) -> float:
        """The fitted seconds of a step (never below 0)."""
        seconds = (
            self.intercept
            + self.per_prefill_token * prefill_tokens
            + self.per_decode_request * decode_requests
            + self.per_context_token * context_tokens
            + self.per_attention_pair * attention_pairs
            + self.per_prefill_request * prefill_requests
        )
        return max(seconds, 0.0)

    def __call__(self, record: StepRecord) -> float:
        if not record.requests:
            return 0.0
        return self.predict(
            record.prefill_tokens,
            record.decode_tokens,
            record.context_tokens,
            record.attention_pairs,
            record.requests - record.decode_tokens,
        )


def fit_profile(
    samples: Sequence[Sequence[float]],
    source: str = "samples",
    *,
    terms: Sequence[str] = PROFILE_TERMS[:4],
    tolerance: float = PROFILE_TOLERANCE,
) -> StepProfile:
    """Fit :class:`StepProfile` to ``(prefill_tokens, decode_requests, context_tokens,
    seconds)`` samples by least squares on the relative error (each row weighted by
    ``1 / seconds``, so a short step counts as much as a long one; then reweighted twice by
    ``1 / fitted seconds``, so that on noisy steps the fit sits at their mean, not under it).

    With optional ``terms`` (``attention_pairs``, ``prefill_requests``: :data:`PROFILE_TERMS`
    after the first four), each sample carries their values after ``context_tokens``, in that
    order, before ``seconds``.

    A term no sample varies (every sample has 0 prefill tokens, say) gets a coefficient of 0.

    Raises:
        InvalidInputError: no samples, terms that are not the line's and optional ones, samples
            of another width, fewer samples than the terms they vary, samples that cannot tell
            two terms apart, or a fit that misses a sample by more than ``tolerance`` (default
            :data:`PROFILE_TOLERANCE`: the samples are not linear in the terms; measure the
            range the simulation runs, or fewer mixed shapes).
    """
    chosen = check_terms(terms, source)
    if not samples:
        raise InvalidInputError(f"{source}: the step-time profile has no samples")
    width = len(chosen)  # the fixed cost has no value; seconds take its place
    if any(len(row) != width for row in samples):
        raise InvalidInputError(
            f"{source}: every sample must have {width} values ({', '.join(chosen[1:])}, seconds)"
        )
    slots = [PROFILE_TERMS.index(t) for t in chosen[1:]]
    rows = []
    for r in samples:
        values = [0.0] * len(PROFILE_TERMS)
        values[0] = 1.0
        for slot, value in zip(slots, r[:-1], strict=True):
            values[slot] = float(value)
        rows.append((values, float(r[-1])))
    columns = [0] + [j for j in slots if any(v[j] for v, _ in rows)]
    if len(rows) < len(columns):
        raise InvalidInputError(
            f"{source}: {len(rows)} sample(s) cannot fit {len(columns)} terms (a fixed cost and one per "
            "quantity the samples vary): measure at least as many steps of different shapes"
        )
    solution = _reweighted_least_squares(rows, columns, source)
    coefficients = [0.0] * len(PROFILE_TERMS)
    for j, value in zip(columns, solution, strict=True):
        coefficients[j] = value
    profile = StepProfile(
        source=source,
        intercept=coefficients[0],
        per_prefill_token=coefficients[1],
        per_decode_request=coefficients[2],
        per_context_token=coefficients[3],
        per_attention_pair=coefficients[4],
        per_prefill_request=coefficients[5],
        samples=len(rows),
        max_error=0.0,
        terms=chosen,
        measured=measured_ranges(
            [PROFILE_TERMS[j] for j in columns[1:]], [[values[j] for j in columns[1:]] for values, _ in rows]
        ),
    )
    errors = [abs(profile.predict(*values[1:]) - seconds) / seconds for values, seconds in rows]
    worst = max(range(len(errors)), key=errors.__getitem__)
    if errors[worst] > tolerance:
        values, seconds = rows[worst]
        shown = ", ".join(f"{values[PROFILE_TERMS.index(t)]:g} {t.replace('_', ' ')}" for t in chosen[1:])
        raise InvalidInputError(
            f"{source}: the linear fit misses sample {worst + 1} ({shown}, {seconds:g} s) "
            f"by {100 * errors[worst]:.1f} %, more than {100 * tolerance:g} %: the steps are not linear "
            "in these terms over this range; measure the range the simulation runs, or check the samples"
        )
    return attrs.evolve(profile, max_error=errors[worst])


def _reweighted_least_squares(
    rows: Sequence[tuple[list[float], float]], columns: Sequence[int], source: str
) -> list[float]:
    """The coefficients of ``columns`` that fit ``rows`` (``(values, seconds)``) on the relative error."""
    size = len(columns)
    # weighted by 1 / seconds: relative residuals. Then twice more by 1 / the fit's own seconds:
    # where a shape's steps scatter (a loaded machine), weighting by each step's own seconds
    # counts its slow repeats least and puts the fit under their mean; weighted by the fit, the
    # relative residuals average zero, so the fitted seconds sum to what the steps took
    # (iteratively reweighted least squares). Steps on the fit are fitted the same either way.
    weights = [1 / seconds for _, seconds in rows]
    solution: list[float] = []
    for _ in range(3):
        normal = [[0.0] * (size + 1) for _ in range(size)]
        for (values, seconds), weight in zip(rows, weights, strict=True):
            x = [values[j] * weight for j in columns]
            for i in range(size):
                for j in range(size):
                    normal[i][j] += x[i] * x[j]
                normal[i][size] += x[i] * seconds * weight
        solution = _solve(normal, source)
        fitted = [sum(values[j] * c for j, c in zip(columns, solution, strict=True)) for values, _ in rows]
        # a fit at or under zero for some step keeps that step's own weight
        weights = [
            1 / f if f > 0.1 * seconds else 1 / seconds for f, (_, seconds) in zip(fitted, rows, strict=True)
        ]
    return solution


def _solve(matrix: list[list[float]], source: str) -> list[float]:
    """Solve the augmented system ``matrix`` by Gaussian elimination with partial pivoting
    (columns scaled to 1 first, so token counts and a fixed cost compare)."""
    size = len(matrix)
    scale = [math.sqrt(matrix[j][j]) or 1.0 for j in range(size)]
    a = [
        [matrix[i][j] / (scale[i] * scale[j]) for j in range(size)] + [matrix[i][size] / scale[i]]
        for i in range(size)
    ]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-10:
            raise InvalidInputError(
                f"{source}: the samples cannot tell the profile's terms apart (two quantities grow together "
                "in every sample): measure steps where prefill tokens, decode requests and context tokens "
                "vary independently"
            )
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(size):
            if r != col and a[r][col]:
                factor = a[r][col] / a[col][col]
                for k in range(col, size + 1):
                    a[r][k] -= factor * a[col][k]
    return [a[i][size] / a[i][i] / scale[i] for i in range(size)]


def read_profile(path: str | os.PathLike[str]) -> StepProfile:
    """Read and fit a step-time profile (:mod:`kvcore.simulation.profile_file`): JSON lines of
    measured steps, each ``{"prefill_tokens": P, "decode_requests": D, "context_tokens": C,
    "seconds": S}`` (counts ``>= 0``, seconds ``> 0``; blank lines skipped), after an optional
    header line that ``kvcore profile`` writes (the terms to fit, the tolerance).

    Raises:
        InvalidInputError: the file cannot be read, a line is wrong (``<path>:<line>:`` and
            what), or the samples do not fit (:func:`fit_profile`).
    """
    where = os.fspath(path)
    read = read_profile_file(path)
    terms = read.header.terms if read.header is not None else PROFILE_TERMS[:4]
    rows = [sample.values(terms) for sample in read.samples]
    tolerance = read.header.tolerance if read.header is not None else PROFILE_TOLERANCE
    return fit_profile(rows, source=where, terms=terms, tolerance=tolerance)


# -- latencies -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Spread:
    """A latency's distribution over requests, in seconds (percentiles by nearest rank)."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (all 0 when there are none)."""
        if not values:
            return cls(mean=0.0, p50=0.0, p90=0.0, p99=0.0)
        ordered = sorted(values)
        p50, p90, p99 = (float(percentile(ordered, q)) for q in PERCENTILES)
        return cls(mean=sum(ordered) / len(ordered), p50=p50, p90=p90, p99=p99)


@attrs.frozen(kw_only=True)
class LatencyReport:
    """What a timed run says about latency and throughput.

    Attributes:
        model: which step-time model produced the seconds.
        seconds: the run's length (from time 0 to the last token).
        ttft: time to first token: arrival to the first output token.
        itl: inter-token latency, per request: ``(finish - first token) / (output tokens - 1)``
            (requests of one output token have none).
        e2e: end-to-end latency: arrival to the last output token.
        output_tokens_per_second: every output token over the run's length.
        requests_per_second: finished requests over the run's length.
        slo_ttft: the TTFT target in seconds (``None``: none).
        slo_itl: the inter-token target in seconds (``None``: none).
        good_requests: requests that met both targets.
        goodput_requests_per_second: those over the run's length.
        goodput_tokens_per_second: their output tokens over the run's length.
        reach: with a measured profile, how far the run's steps went beyond the steps it
            measured (:mod:`kvcore.simulation.profile_reach`).
    """

    model: str
    seconds: float
    ttft: Spread
    itl: Spread
    e2e: Spread
    output_tokens_per_second: float
    requests_per_second: float
    slo_ttft: float | None = None
    slo_itl: float | None = None
    good_requests: int = 0
    goodput_requests_per_second: float = 0.0
    goodput_tokens_per_second: float = 0.0
    reach: ProfileReach | None = None

    def to_dict(self) -> dict[str, Any]:
        """As JSON (the spreads as objects)."""
        return attrs.asdict(self)


def _check_slo(value: float | None, name: str) -> None:
    if value is not None and (not is_number(value) or not math.isfinite(value) or value <= 0):
        raise InvalidInputError(f"{name!r} must be a number of seconds > 0, or None (got {value!r})")


def latency_report(
    timeline: Timeline,
    output_tokens: Sequence[int],
    *,
    slo_ttft: float | None = None,
    slo_itl: float | None = None,
) -> LatencyReport:
    """Latencies and throughput of a timed run.

    Args:
        timeline: the run (every request finished).
        output_tokens: each request's output tokens, in the timeline's order.
        slo_ttft: a target for the time to first token, seconds (``None``: any).
        slo_itl: a target for the inter-token latency, seconds (``None``: any).

    Returns:
        The report; goodput counts the requests that meet both targets given.

    Raises:
        InvalidInputError: a target that is not a number > 0, ``output_tokens`` of another
            length than the timeline's requests, or a request that never finished.
    """
    _check_slo(slo_ttft, "slo_ttft")
    _check_slo(slo_itl, "slo_itl")
    count = len(timeline.arrival)
    if len(output_tokens) != count:
        raise InvalidInputError(f"{len(output_tokens)} output counts for {count} requests")
    if any(math.isnan(t) for t in timeline.finish):
        raise InvalidInputError(
            "the timeline has requests that never finished: run the simulation to the end"
        )
    ttft = [first - arrival for first, arrival in zip(timeline.first_token, timeline.arrival, strict=True)]
    e2e = [finish - arrival for finish, arrival in zip(timeline.finish, timeline.arrival, strict=True)]
    itl: list[float | None] = [
        (finish - first) / (out - 1) if out > 1 else None
        for first, finish, out in zip(timeline.first_token, timeline.finish, output_tokens, strict=True)
    ]
    good = [
        (slo_ttft is None or t <= slo_ttft) and (slo_itl is None or i is None or i <= slo_itl)
        for t, i in zip(ttft, itl, strict=True)
    ]
    span = timeline.seconds
    rate = 1 / span if span > 0 else 0.0
    return LatencyReport(
        model=timeline.model,
        seconds=span,
        ttft=Spread.of(ttft),
        itl=Spread.of([i for i in itl if i is not None]),
        e2e=Spread.of(e2e),
        output_tokens_per_second=sum(output_tokens) * rate,
        requests_per_second=count * rate,
        slo_ttft=slo_ttft,
        slo_itl=slo_itl,
        good_requests=sum(good),
        goodput_requests_per_second=sum(good) * rate,
        goodput_tokens_per_second=sum(out for out, ok in zip(output_tokens, good, strict=True) if ok) * rate,
        reach=timeline.reach,
    )
