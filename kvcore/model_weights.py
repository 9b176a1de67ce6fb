"""What a model's weights are, as a family plugin counts them from ``config.json``.

Sizing a KV cache from a GPU (``kvcore plan --gpu-memory 80GiB``) needs the bytes the weights
take before the cache gets the rest. A family plugin answers the ``kvcore_count_parameters``
hook with a :class:`ParameterCount`: the model's parameters in named groups (embeddings,
attention, MLP, experts, norms, towers), each saying where its modules live, so that a
``quantization_config`` can be applied group by group (the planning layer,
:mod:`kvcore.planning.gpu_budget`, turns the count into bytes), and the few widths the
activation estimate needs.

This module is contract: plugin authors import it; it imports nothing below it and no torch.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvcore.dtypes import DType
from kvcore.errors import PluginValidationError


def _name(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise PluginValidationError(
            f"a weight group's {attribute.name} must be a non-empty string (got {value!r})"
        )


def _count(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PluginValidationError(
            f"{type(instance).__name__}.{attribute.name} must be an int >= 0 (got {value!r})"
        )


def _positive(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PluginValidationError(
            f"{type(instance).__name__}.{attribute.name} must be an int >= 1 (got {value!r})"
        )


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class WeightGroup:
    """Parameters of one kind in one place of the model.

    Attributes:
        name: what they are, shown in the budget breakdown (``"attention"``, ``"experts"``,
            ``"embeddings"``, ``"vision tower"``).
        module: where their modules are, as quantization configs name modules
            (``"model.layers.*.self_attn"``, ``"lm_head"``); ``modules_to_not_convert`` and
            ``ignore`` lists are matched against it.
        params: how many parameters.
        quantizable: they are the weight matrices of linear layers, which weight quantization
            (fp8, AWQ, GPTQ, MXFP4, ...) converts; ``False`` for embeddings, norms, biases,
            convolutions and other vectors, which stay in the model's dtype.
    """

    name: str = attrs.field(validator=_name)
    module: str = attrs.field(validator=_name)
    params: int = attrs.field(validator=_count)
    quantizable: bool = True


@attrs.frozen(kw_only=True)
class ParameterCount:
    """A model's parameters, counted from its config (the ``kvcore_count_parameters`` answer).

    Attributes:
        groups: the parameters in groups; together they are the whole checkpoint's weights.
        dtype: the dtype of the weights before quantization (the config's ``torch_dtype``).
        hidden_size: the language model's hidden size.
        vocab_size: rows of the output projection (the logits' width).
        activation_width: elements one token's forward keeps alive at once beyond the hidden
            states, in the widest layer: the MLP's (gate and up outputs plus the activated
            product, for a mixture of experts times the experts each token visits) or the
            attention's (queries, keys and values), whichever is larger.
        notes: what the count leaves out or assumes (a tower absent from the config), shown
            with the figures.
    """

    groups: tuple[WeightGroup, ...] = attrs.field(converter=_tuple)
    dtype: DType
    hidden_size: int = attrs.field(validator=_positive)
    vocab_size: int = attrs.field(validator=_positive)
    activation_width: int = attrs.field(validator=_positive)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_tuple)

    def __attrs_post_init__(self) -> None:
        bad = [g for g in self.groups if not isinstance(g, WeightGroup)]
        if bad or not self.groups:
            raise PluginValidationError(
                f"a ParameterCount needs at least one kvcore.WeightGroup (got {list(self.groups)!r})"
            )
        if not isinstance(self.dtype, DType):
            raise PluginValidationError(
                f"ParameterCount.dtype must be a kvcore.dtypes.DType (got {self.dtype!r})"
            )

    @property
    def params(self) -> int:
        """All parameters."""
        return sum(group.params for group in self.groups)

    def by_name(self) -> dict[str, int]:
        """Parameters per group name, in first-seen order (groups of one name added up)."""
        totals: dict[str, int] = {}
        for group in self.groups:
            totals[group.name] = totals.get(group.name, 0) + group.params
        return totals


@attrs.frozen(kw_only=True)
class CheckpointWeights:
    """What a checkpoint's weights take, read from its safetensors headers (no tensor data):
    the bytes are the checkpoint's own, so a quantized checkpoint's scales and packing are in
    them, where a :class:`ParameterCount` estimates them.

    Attributes:
        total: bytes of tensor data, every tensor of every file.
        elements: tensor elements (a packed 4-bit tensor holds two parameters per element).
        by_dtype: bytes per safetensors dtype (``"BF16"``, ``"F8_E4M3"``), largest first.
        files: the safetensors files read.
        source: where the headers were read, for messages (``"3 safetensors headers on the
            Hugging Face Hub"``).
    """

    total: int = attrs.field(validator=_count)
    elements: int = attrs.field(validator=_count)
    by_dtype: tuple[tuple[str, int], ...] = attrs.field(converter=_tuple)
    files: int = attrs.field(validator=_positive)
    source: str = attrs.field(validator=_name)
