"""A KV-cache budget from a GPU's memory: what is left once the weights and activations are in.

``kvcore plan --gpu-memory 80GiB`` sizes the cache as an engine like vLLM does at start-up:

    KV budget = GPU memory x utilization - weights - activation peak - reserve

- **weights**: the model's parameters, counted from its ``config.json`` by the family plugins
  (the ``kvcore_count_parameters`` hook, :class:`kvcore.ParameterCount`), times the bytes each
  group takes: the model's dtype, or what its ``quantization_config`` makes of the groups it
  converts (:func:`weight_bytes`; fp8, MXFP4, AWQ / GPTQ and other 4-bit formats with their group
  scales);
- **activation peak**: an estimate of what the profile forward of ``max_num_batched_tokens``
  tokens holds at its peak (:func:`activation_peak_bytes`; the formula and its assumptions are
  in ``docs/explanation/gpu-budget.md``);
- **reserve**: a fixed :data:`RESERVE_BYTES` for what no profile of the forward sees (the CUDA
  context, library workspaces, CUDA graphs).

Every figure is an estimate of what an engine measures; the weights are exact for an
unquantized model whose family counts it (``tests/plugins/models/test_parameters.py`` holds the counts
against the published ones), the rest say what they assume. No torch.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from kvcore.errors import InvalidInputError, ModelConfigError, PluginValidationError, UnknownModelError
from kvcore.model_weights import CheckpointWeights, ParameterCount, WeightGroup
from kvcore.planning.registry import Registry
from kvcore.units import format_bytes

#: vLLM's default share of the GPU an engine may use.
DEFAULT_UTILIZATION = 0.9
#: Memory no profile of the forward sees: the CUDA context (~0.5 GiB), cuBLAS / NCCL workspaces
#: and the CUDA graphs engines capture after profiling (a few hundred MiB).
RESERVE_BYTES = 2**30
#: Rows of logits the profile computes at most: vLLM samples one token for each of at most
#: ``max_num_seqs`` (256 by default) requests.
MAX_NUM_SEQS = 256
#: Bytes per logit row element: the logits in the model's dtype, then a float32 copy and the
#: float32 probabilities the sampler computes from them.
_FLOAT32 = 4


# -- quantization ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Quantization:
    """How a ``quantization_config`` stores the weights it converts.

    Attributes:
        method: the ``quant_method`` (``"fp8"``, ``"mxfp4"``, ``"awq"``, ...), or ``"none"``.
        bits_per_param: bits one converted parameter takes, its share of the scales and zero
            points included.
        excluded: module patterns the config leaves unconverted (``modules_to_not_convert``,
            ``ignore``, ``ignored_layers``), matched against each group's ``module``.
        estimate: what in ``bits_per_param`` is an estimate (scales assumed per group of the
            input dimension, rounding of partial blocks ignored); empty when exact.
    """

    method: str = "none"
    bits_per_param: float = 0.0
    excluded: tuple[str, ...] = ()
    estimate: str = ""

    def converts(self, group: WeightGroup) -> bool:
        """Whether this quantization converts ``group`` (a linear weight not excluded)."""
        if self.method == "none" or not group.quantizable:
            return False
        return not any(_matches(group.module, pattern) for pattern in self.excluded)

    def describe(self) -> str:
        """``'mxfp4 (4.25 bits per converted parameter)'``, or ``'none'``."""
        if self.method == "none":
            return "none"
        return f"{self.method} ({self.bits_per_param:g} bits per converted parameter)"


def _matches(module: str, pattern: str) -> bool:
    pattern = pattern.strip()
    if pattern.startswith("re:"):
        return re.search(pattern[3:], module) is not None
    wildcard = pattern.replace(".", "\\.").replace("*", "[^.]+")
    if re.search(rf"(^|\.){wildcard}(\.|$)", module):
        return True
    return fnmatch.fnmatch(module, pattern) or fnmatch.fnmatch(module, f"{pattern}.*")


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence):
        return tuple(v for v in value if isinstance(v, str))
    return ()


def _int(section: Mapping[str, Any], key: str, default: int, source: str) -> int:
    value = section.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"{source}: 'quantization_config.{key}' must be an int (got {value!r})")
    return int(value)


def _grouped(bits: int, group_size: int, scale_bits: int, zero_bits: int) -> tuple[float, str]:
    if group_size <= 0:  # one scale per output channel: too few to count
        return float(bits), "per-channel scales not counted"
    return bits + (scale_bits + zero_bits) / group_size, ""


def quantization(config: Mapping[str, Any], source: str = "config") -> Quantization:
    """The :class:`Quantization` of a config's ``quantization_config`` (or its ``text_config``'s).

    Known methods: ``fp8`` / ``fbgemm_fp8`` (8 bits, float32 scales per ``weight_block_size``
    block when given), ``mxfp4`` (4 bits and one 8-bit scale per 32), ``awq`` / ``gptq`` and
    their Marlin forms (``bits``, 16-bit scales and ``bits``-bit zero points per
    ``group_size``), ``bitsandbytes`` (NF4 with a float32 scale per 64, or int8),
    ``compressed-tensors`` (the first config group's ``num_bits`` and ``group_size``).

    Raises:
        ModelConfigError: a ``quant_method`` kvcore cannot size, or a malformed field.
    """
    section = config.get("quantization_config")
    inner = config.get("text_config")
    if not isinstance(section, Mapping) and isinstance(inner, Mapping):
        section = inner.get("quantization_config")
    if section is None:
        return Quantization()
    if not isinstance(section, Mapping):
        raise ModelConfigError(f"{source}: 'quantization_config' must be a JSON object (got {section!r})")
    method = str(section.get("quant_method", "")).lower().replace("-", "_")
    excluded = (
        _names(section.get("modules_to_not_convert"))
        + _names(section.get("ignore"))
        + _names(section.get("ignored_layers"))
    )
    sizer = _QUANT_METHODS.get(method)
    found = sizer(section, method, source) if sizer is not None else None
    if found is not None:
        return attrs.evolve(found, excluded=excluded)
    known = "fp8, fbgemm_fp8, mxfp4, awq, gptq, bitsandbytes, compressed-tensors"
    raise ModelConfigError(
        f"{source}: kvcore cannot size weights quantized with quant_method {section.get('quant_method')!r} "
        f"(it knows {known}); give the KV cache a byte budget of its own instead"
    )


def _fp8(section: Mapping[str, Any], method: str, source: str) -> Quantization:
    block = section.get("weight_block_size")
    if isinstance(block, Sequence) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
        return Quantization(
            method=method,
            bits_per_param=8 + 32 / (block[0] * block[1]),
            estimate=f"a float32 scale per {block[0]}x{block[1]} block, partial blocks not rounded up",
        )
    return Quantization(method=method, bits_per_param=8.0, estimate="per-channel scales not counted")


def _mxfp4(section: Mapping[str, Any], method: str, source: str) -> Quantization:
    return Quantization(method=method, bits_per_param=4 + 8 / 32)


def _awq_gptq(section: Mapping[str, Any], method: str, source: str) -> Quantization:
    bits = _int(section, "bits", _int(section, "w_bit", 4, source), source)
    group_size = _int(section, "group_size", _int(section, "q_group_size", 128, source), source)
    per_param, note = _grouped(bits, group_size, 16, bits)
    return Quantization(
        method=method,
        bits_per_param=per_param,
        estimate=note or f"16-bit scales and {bits}-bit zero points per group of {group_size} inputs",
    )


def _bitsandbytes(section: Mapping[str, Any], method: str, source: str) -> Quantization:
    if section.get("load_in_4bit"):
        return Quantization(
            method="bitsandbytes 4-bit",
            bits_per_param=4 + 32 / 64,
            estimate="a float32 absmax per block of 64, double quantization ignored",
        )
    return Quantization(
        method="bitsandbytes 8-bit", bits_per_param=8.0, estimate="per-row scales not counted"
    )


def _compressed_tensors(section: Mapping[str, Any], method: str, source: str) -> Quantization | None:
    groups = section.get("config_groups")
    weights: Any = None
    if isinstance(groups, Mapping) and groups:
        first = next(iter(groups.values()))
        weights = first.get("weights") if isinstance(first, Mapping) else None
    if not isinstance(weights, Mapping):
        return None  # no weights section to size: refused with the unknown methods
    bits = _int(weights, "num_bits", 8, source)
    stated: Any = weights.get("group_size")
    size = int(stated) if isinstance(stated, int) and not isinstance(stated, bool) else 0
    per_param, note = _grouped(bits, size, 16, 0)
    return Quantization(
        method=method, bits_per_param=per_param, estimate=note or f"16-bit scales per group of {size} inputs"
    )


#: How each ``quant_method`` kvcore knows is sized: ``(section, method, source)`` to a
#: :class:`Quantization` (its ``excluded`` modules filled in by :func:`quantization`), or ``None``
#: where the section gives nothing to size.
_QUANT_METHODS: dict[str, Callable[[Mapping[str, Any], str, str], Quantization | None]] = {
    "fp8": _fp8,
    "fbgemm_fp8": _fp8,
    "mxfp4": _mxfp4,
    **dict.fromkeys(("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin"), _awq_gptq),
    "bitsandbytes": _bitsandbytes,
    "compressed_tensors": _compressed_tensors,
}


# -- weights, activations, the budget ----------------------------------------------------------


@attrs.frozen(kw_only=True)
class WeightBytes:
    """The bytes of a model's weights.

    Attributes:
        total: all of them.
        by_group: per group name, in the count's order.
        converted_params: parameters the quantization converts.
        params: all parameters.
    """

    total: int
    by_group: tuple[tuple[str, int], ...]
    converted_params: int
    params: int


def weight_bytes(count: ParameterCount, quant: Quantization) -> WeightBytes:
    """The bytes ``count``'s weights take: groups ``quant`` converts at its bits per parameter,
    the others at the count's dtype.

    Args:
        count: the parameters.
        quant: the config's quantization (:func:`quantization`).

    Returns:
        The total and the bytes per group name.
    """
    by_group: dict[str, float] = {}
    converted = 0
    for group in count.groups:
        if quant.converts(group):
            size = group.params * quant.bits_per_param / 8
            converted += group.params
        else:
            size = group.params * count.dtype.itemsize
        by_group[group.name] = by_group.get(group.name, 0.0) + size
    rounded = tuple((name, round(size)) for name, size in by_group.items())
    return WeightBytes(
        total=sum(size for _, size in rounded),
        by_group=rounded,
        converted_params=converted,
        params=count.params,
    )


def activation_peak_bytes(count: ParameterCount, max_num_batched_tokens: int, *, tp: int = 1) -> int:
    """The activation peak of a profile forward of ``max_num_batched_tokens`` tokens (estimate).

    ``T x b x (2 h + W / tp) + min(T, 256) x (V / tp) x (b + 8)``, with ``T`` the batched tokens,
    ``b`` the bytes of the model's dtype, ``h`` the hidden size, ``W`` the widest per-token
    intermediate (:attr:`~kvcore.ParameterCount.activation_width`), ``V`` the vocabulary: the
    hidden states and the residual, the widest layer's intermediates, and the logits of the
    sampled rows in the model's dtype plus two float32 copies (``docs/explanation/gpu-budget.md``).

    Args:
        count: the model's count (dtype and widths).
        max_num_batched_tokens: tokens one engine step runs.
        tp: tensor-parallel ranks: the intermediates and logits split across them.

    Returns:
        Bytes.
    """
    b = count.dtype.itemsize
    tokens = max_num_batched_tokens
    hidden = tokens * b * (2 * count.hidden_size + count.activation_width // tp)
    logits = min(tokens, MAX_NUM_SEQS) * (count.vocab_size // tp) * (b + 2 * _FLOAT32)
    return hidden + logits


@attrs.frozen(kw_only=True)
class GpuBudget:
    """A KV-cache budget worked out from a GPU's memory, with each term.

    Attributes:
        gpu_memory: the GPU's memory (``--gpu-memory``).
        utilization: the share an engine may use (``--utilization``).
        weights: bytes of the weights on one rank.
        activation: the activation peak estimate on one rank.
        reserve: the fixed reserve.
        kv_cache: what is left for the KV cache: ``gpu_memory x utilization - weights -
            activation - reserve``.
        params: the model's parameters (all ranks).
        weight_groups: bytes per group name (all ranks).
        quantization: the config's quantization.
        max_num_batched_tokens: the batch the activation estimate is for.
        ranks: the ranks the weights are split across (``tp x pp``).
        notes: what the count left out or assumed.
        weights_source: where the weights' bytes came from: ``""`` when counted from the
            config, else the safetensors headers they were read from (``weight_groups`` are
            then bytes per safetensors dtype).
    """

    gpu_memory: int
    utilization: float
    weights: int
    activation: int
    reserve: int
    kv_cache: int
    params: int
    weight_groups: tuple[tuple[str, int], ...]
    quantization: Quantization
    max_num_batched_tokens: int
    ranks: int = 1
    notes: tuple[str, ...] = ()
    weights_source: str = ""

    @property
    def usable(self) -> int:
        """``gpu_memory x utilization``, in bytes."""
        return int(self.gpu_memory * self.utilization)

    def lines(self) -> list[str]:
        """The breakdown as the command line prints it, one term a line."""
        per_rank = f" per rank (1/{self.ranks} of the model)" if self.ranks > 1 else ""
        groups = ", ".join(f"{name} {format_bytes(size)}" for name, size in self.weight_groups)
        quant = "" if self.quantization.method == "none" else f"; {self.quantization.describe()}"
        what = (
            f"read from {self.weights_source}: {groups}"
            if self.weights_source
            else f"{self.params / 1e9:,.2f}B parameters{quant}: {groups}"
        )
        lines = [
            f"GPU {format_bytes(self.gpu_memory)} x utilization {self.utilization:g} = "
            f"{format_bytes(self.usable)}",
            f"  - weights       {format_bytes(self.weights):>11}{per_rank}  ({what})",
            f"  - activations   {format_bytes(self.activation):>11}  "
            f"(estimate for {self.max_num_batched_tokens:,} batched tokens)",
            f"  - reserve       {format_bytes(self.reserve):>11}  (CUDA context, workspaces, CUDA graphs)",
            f"  = KV cache      {format_bytes(self.kv_cache):>11}",
        ]
        estimates = [*self.notes]
        if self.quantization.estimate and not self.weights_source:
            estimates.append(f"quantized weights: {self.quantization.estimate}")
        lines += [f"  note: {note}" for note in estimates]
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON (``gpu_budget`` in ``kvcore plan --json``)."""
        counted_estimate = self.quantization.estimate and not self.weights_source
        return {
            "gpu_memory_bytes": self.gpu_memory,
            "utilization": self.utilization,
            "usable_bytes": self.usable,
            "weights_bytes": self.weights,
            "activation_bytes": self.activation,
            "reserve_bytes": self.reserve,
            "kv_cache_bytes": self.kv_cache,
            "parameters": self.params,
            "weights_by_group": dict(self.weight_groups),
            "quantization": self.quantization.method,
            "bits_per_converted_parameter": self.quantization.bits_per_param or None,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "ranks": self.ranks,
            "weights_source": self.weights_source or "counted from the config",
            "notes": list(self.notes) + ([self.quantization.estimate] if counted_estimate else []),
        }


def count_parameters(config: Mapping[str, Any], registry: Registry, source: str = "config") -> ParameterCount:
    """The model's parameters from the ``kvcore_count_parameters`` hook.

    Raises:
        UnknownModelError: no plugin counts this model type.
        PluginValidationError: a plugin answered something other than a ParameterCount.
        ModelConfigError: a field the count needs is missing or bad.
    """
    count = registry.pm.hook.kvcore_count_parameters(config=config)
    if count is None:
        raise UnknownModelError(
            f"{source}: no plugin counts the weights of model type {config.get('model_type')!r} "
            "(a family plugin can, through kvcore_count_parameters); give the KV cache a byte budget "
            "of its own instead"
        )
    if not isinstance(count, ParameterCount):
        raise PluginValidationError(
            f"kvcore_count_parameters returned {count!r} for model type {config.get('model_type')!r}; "
            "expected a kvcore.ParameterCount"
        )
    return count


def _remedies(
    gpu_memory: int, usable: int, per_rank: int, weights: int, activation: int, reserve: int
) -> str:
    """What would leave room for a KV cache, naming only what can: a higher utilization helps
    only when the whole GPU would hold the rest, a smaller batch only when the weights and the
    reserve fit without activations; weights larger than the GPU need more GPUs, a quantized
    checkpoint or a larger GPU."""
    if per_rank >= gpu_memory:
        fewest = -(-weights // max(usable, 1))  # GPUs whose usable memory the weights alone fill
        return (
            f"the weights alone ({format_bytes(per_rank)}) are more than the whole GPU: shard them over "
            f"more tensor-parallel ranks (tp) (the weights fill at least {fewest} such GPUs), serve a "
            "quantized checkpoint (FP8 halves 16-bit weights), or use a larger GPU"
        )
    ways = ["use a larger GPU", "more tensor-parallel ranks (tp)"]
    if gpu_memory - per_rank - activation - reserve > 0:
        ways.append("a higher utilization")
    if usable - per_rank - reserve > 0:
        ways.append("a smaller max_num_batched_tokens")
    return f"{', '.join(ways[:-1])} or {ways[-1]}"


def gpu_budget(
    config: Mapping[str, Any],
    registry: Registry,
    gpu_memory: int,
    *,
    utilization: float = DEFAULT_UTILIZATION,
    max_num_batched_tokens: int,
    tp: int = 1,
    pp: int = 1,
    reserve: int = RESERVE_BYTES,
    source: str = "config",
    checkpoint: CheckpointWeights | None = None,
) -> GpuBudget:
    """The KV-cache budget of one rank when the model is served on GPUs of ``gpu_memory`` bytes.

    With ``tp x pp`` ranks, each rank holds ``1 / (tp x pp)`` of the weights (an estimate: norms
    are replicated, embeddings and lm_head sit on the first and last stage) and ``1 / tp`` of the
    widest intermediates and the logits.

    Args:
        config: the model's parsed ``config.json``.
        registry: whose plugins count the parameters.
        gpu_memory: one GPU's memory in bytes.
        utilization: the share of it an engine may use, in (0, 1].
        max_num_batched_tokens: tokens one engine step runs (the activation estimate).
        tp: tensor-parallel ranks.
        pp: pipeline stages.
        reserve: bytes set aside for what profiling does not see.
        source: the config's name, for messages.
        checkpoint: the weights read from the checkpoint's safetensors headers: their bytes
            replace the count's (which still gives the activation estimate's widths).

    Returns:
        The budget and its terms.

    Raises:
        InvalidInputError: nothing is left for the KV cache (the message gives every term).
        UnknownModelError, ModelConfigError, PluginValidationError: as :func:`count_parameters`
            and :func:`quantization`.
    """
    if not 0 < utilization <= 1:
        raise InvalidInputError(f"utilization must be in (0, 1] (got {utilization})")
    count = count_parameters(config, registry, source)
    quant = quantization(config, source)
    weights = weight_bytes(count, quant)
    if checkpoint is not None:
        weights = WeightBytes(
            total=checkpoint.total,
            by_group=checkpoint.by_dtype,
            converted_params=weights.converted_params,
            params=weights.params,
        )
    ranks = tp * pp
    per_rank = -(-weights.total // ranks)
    activation = activation_peak_bytes(count, max_num_batched_tokens, tp=tp)
    usable = int(gpu_memory * utilization)
    left = usable - per_rank - activation - reserve
    if left <= 0:
        raise InvalidInputError(
            f"{source}: nothing is left for a KV cache on a {format_bytes(gpu_memory)} GPU: "
            f"{format_bytes(usable)} usable (utilization {utilization:g}) - weights {format_bytes(per_rank)}"
            f"{' per rank' if ranks > 1 else ''} - activations {format_bytes(activation)} - reserve "
            f"{format_bytes(reserve)} = {format_bytes(left)}; "
            + _remedies(gpu_memory, usable, per_rank, weights.total, activation, reserve)
        )
    return GpuBudget(
        gpu_memory=gpu_memory,
        utilization=utilization,
        weights=per_rank,
        activation=activation,
        reserve=reserve,
        kv_cache=left,
        params=weights.params,
        weight_groups=weights.by_group,
        quantization=quant,
        max_num_batched_tokens=max_num_batched_tokens,
        ranks=ranks,
        notes=count.notes if checkpoint is None else (),
        weights_source=checkpoint.source if checkpoint is not None else "",
    )
