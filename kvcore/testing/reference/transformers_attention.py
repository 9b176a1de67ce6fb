"""The attention function transformers calls: the reference runner behind transformers' own hook.

transformers models compute attention through a function looked up by name in
``transformers.AttentionInterface`` (the model's ``attn_implementation``). :func:`register_attention`
registers :func:`paged_attention_forward` under :data:`ATTENTION_NAME`; a model set to that
implementation keeps its own projections, rotary embeddings, norms and output projection, and
hands each layer's queries, keys and values (after RoPE and any q/k norm) here, with its
attention knobs as keyword arguments: ``scaling``, ``softcap`` (Gemma-2), ``sliding_window``
(Gemma, Qwen, gpt-oss, Mistral) and ``s_aux`` (gpt-oss's attention sinks).

No attention-mask function is registered under that name, so transformers builds no mask
(it does so for any implementation it has no mask function for); the runner applies the
causal, sliding-window or chunked rule itself from each layer's kvcore spec. Everything about
the current engine step (which request owns which tokens, their block tables) arrives in the
keyword argument :data:`STEP_KWARG`, which transformers passes through from the model call.

transformers is imported only when :func:`register_attention` runs.
"""

from __future__ import annotations

from typing import Any, Final, Protocol, runtime_checkable

import attrs
import torch

from kvcore.errors import InvalidInputError

#: The ``attn_implementation`` name the reference runner registers.
ATTENTION_NAME: Final = "kvcore_reference"
#: The model-call keyword argument that carries the step to every attention call.
STEP_KWARG: Final = "kvcore_step"


@attrs.frozen(kw_only=True, eq=False)
class AttentionCall:
    """One attention layer's call as transformers makes it, its defaults resolved.

    Attributes:
        module: the attention module (bound to a planned layer).
        query: ``(1, num_heads, T, head_size)``: the step's tokens of every request, packed.
        key: ``(1, num_kv_heads, T, head_size)``.
        value: the same for V.
        scaling: the factor on ``q @ k^T``.
        softcap: logit softcapping, or ``None``.
        sliding_window: the window transformers uses for this layer, or ``None``.
        sinks: attention-sink logits per head, or ``None``.
    """

    module: torch.nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float
    softcap: float | None
    sliding_window: int | None
    sinks: torch.Tensor | None


@runtime_checkable
class PagedStep(Protocol):
    """What a model call through the runner carries: one engine step, able to attend."""

    def attend(self, call: AttentionCall) -> torch.Tensor:
        """Store this step's K and V in the layer's pages and attend over the pages."""
        ...


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature, answered by the step in ``kwargs``.

    Args:
        module: the attention module (its ``head_dim`` gives the default scaling).
        query: ``(1, num_heads, T, head_size)``: the step's tokens of every request, packed.
        key: ``(1, num_kv_heads, T, head_size)``.
        value: the same for V.
        attention_mask: ignored (none is built for this implementation); the spec decides.
        scaling: the factor on ``q @ k^T``; default ``head_dim ** -0.5``.
        dropout: must be 0 (inference).
        softcap: logit softcapping, or ``None``.
        sliding_window: the window transformers would mask with, checked against the spec.
        s_aux: attention-sink logits per head, or ``None``.
        kwargs: must hold :data:`STEP_KWARG`; the rest (``position_ids``, ...) is ignored.

    Returns:
        ``(output, None)``: output ``(1, T, num_heads, head_size)`` as eager attention returns it.

    Raises:
        InvalidInputError: the model was called without a runner step, or with dropout.
    """
    step = kwargs.get(STEP_KWARG)
    if not isinstance(step, PagedStep):
        raise InvalidInputError(
            f"attention implementation {ATTENTION_NAME!r} needs the {STEP_KWARG!r} argument that "
            "PagedAttentionRunner.step passes; call the model through the runner (or set another "
            "attn_implementation)"
        )
    if dropout:
        raise InvalidInputError(
            f"the reference runner runs inference only (got dropout={dropout}); call model.eval()"
        )
    head_dim = getattr(module, "head_dim", query.shape[-1])
    call = AttentionCall(
        module=module,
        query=query,
        key=key,
        value=value,
        scaling=scaling if scaling is not None else float(head_dim) ** -0.5,
        softcap=softcap,
        sliding_window=sliding_window,
        sinks=s_aux,
    )
    return step.attend(call), None


def register_attention() -> str:
    """Register :func:`paged_attention_forward` with ``transformers.AttentionInterface``.

    Returns:
        :data:`ATTENTION_NAME`, for ``model.set_attn_implementation``.

    Raises:
        InvalidInputError: transformers is not installed (the message says which extra).
    """
    try:
        from transformers import AttentionInterface
    except ImportError:
        raise InvalidInputError(
            "the reference runner plugs into transformers models; install it with: "
            "pip install 'kvcore[transformers]'"
        ) from None
    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    return ATTENTION_NAME
