"""Causal attention of one request's new tokens over its cached context, in plain torch ops.

The math is transformers' eager attention, step for step, so that a model run through the
reference runner gives the logits transformers gives (float32: within rounding):

- scores ``q @ k^T * scaling``, with grouped-query heads repeated as ``repeat_kv`` does;
- Gemma-2's logit softcapping ``tanh(scores / softcap) * softcap`` before the mask;
- the mask: the query at position ``p`` sees the keys at ``visible_start(spec, p) .. p`` (every
  earlier token for full attention, the last ``sliding_window`` tokens for a sliding window,
  the tokens of ``p``'s own chunk for chunked local attention), as transformers' causal,
  sliding-window and chunked masks do;
- softmax in float32 (eager), or, with gpt-oss's attention sinks, a per-head sink logit joined
  to each row, the row's maximum subtracted and the sink's probability dropped after the
  softmax.

:func:`masked_attention` is that math under any mask; :func:`causal_attention` gives it the
mask of a layer's spec and :func:`encoder_attention` none (the example engine in
``examples/engine`` calls it too).
"""

from __future__ import annotations

import torch

from kvcore.errors import InvalidInputError
from kvcore.plugins.attention import AttentionSpec
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.spec import KVCacheSpec

#: The spec kinds whose visibility rule the reference runner knows.
SUPPORTED_KINDS = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, CrossAttentionSpec)


def check_supported(name: str, spec: KVCacheSpec) -> AttentionSpec:
    """``spec`` if the reference runner can attend over it.

    Raises:
        InvalidInputError: another kind (MLA, a state, a third-party kind), naming the layer.
    """
    if not isinstance(spec, SUPPORTED_KINDS):
        kinds = ", ".join(cls.kind for cls in SUPPORTED_KINDS)
        raise InvalidInputError(
            f"layer {name!r} has a {spec.kind!r} cache; the reference runner attends over {kinds} layers only"
        )
    return spec


def visible_start(spec: AttentionSpec, position: int) -> int:
    """The first key position the query at ``position`` sees (it sees up to itself).

    Args:
        spec: a full-attention, sliding-window or chunked-local spec.
        position: the query's token position.

    Returns:
        ``0`` (full), ``max(0, position - sliding_window + 1)`` (sliding window: the query and
        the ``sliding_window - 1`` tokens before it), ``position // chunk * chunk`` (chunked).
    """
    if isinstance(spec, SlidingWindowSpec):
        return max(0, position - spec.sliding_window + 1)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return position // spec.attention_chunk_size * spec.attention_chunk_size
    return 0


def visibility(
    spec: AttentionSpec, query_start: int, num_queries: int, key_start: int, num_keys: int
) -> torch.Tensor:
    """Which keys each query sees: causal, within the spec's window or chunk.

    Args:
        spec: the layer's spec (its kind decides the window).
        query_start: position of the first query; queries are consecutive.
        num_queries: how many queries.
        key_start: position of the first key; keys are consecutive.
        num_keys: how many keys.

    Returns:
        ``(num_queries, num_keys)`` booleans, ``True`` where the query sees the key.
    """
    queries = torch.arange(query_start, query_start + num_queries)
    keys = torch.arange(key_start, key_start + num_keys)
    starts = torch.tensor([visible_start(spec, int(p)) for p in queries])
    return (keys[None, :] <= queries[:, None]) & (keys[None, :] >= starts[:, None])


def masked_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    seen: torch.Tensor,
    *,
    scaling: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """transformers' eager attention of queries over keys and values, under a given mask.

    Args:
        query: ``(num_heads, T, head_size)``.
        keys: ``(S, num_kv_heads, head_size)``.
        values: the same for V.
        seen: ``(T, S)`` booleans, ``True`` where query ``t`` sees key ``s``.
        scaling: the factor on ``q @ k^T``.
        softcap: logit softcapping (before the mask), or ``None``.
        sinks: ``(num_heads,)`` attention-sink logits, or ``None``.

    Returns:
        ``(T, num_heads, head_size)``, in the query's dtype.

    Raises:
        InvalidInputError: the query heads are not a multiple of the KV heads.
    """
    heads, num_queries, _ = query.shape
    kv_heads = keys.shape[1]
    if heads % kv_heads:
        raise InvalidInputError(f"{heads} query heads cannot share {kv_heads} KV heads evenly")
    repeat = heads // kv_heads
    k = keys.to(query.dtype).transpose(0, 1).repeat_interleave(repeat, dim=0)  # (heads, S, D)
    v = values.to(query.dtype).transpose(0, 1).repeat_interleave(repeat, dim=0)
    scores = torch.matmul(query, k.transpose(1, 2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~seen.to(scores.device), torch.finfo(scores.dtype).min)
    if sinks is not None:
        sink = sinks.to(scores.dtype).reshape(heads, 1, 1).expand(heads, num_queries, 1)
        combined = torch.cat([scores, sink], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(v.dtype)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, v).transpose(0, 1)


def causal_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    spec: AttentionSpec,
    query_start: int,
    key_start: int,
    scaling: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one request's new tokens over the keys and values read from its pages.

    Args:
        query: ``(num_heads, T, head_size)``, the new tokens' queries (positions
            ``query_start ..``).
        keys: ``(S, num_kv_heads, head_size)``, positions ``key_start .. key_start + S - 1``,
            which must include every key a query sees.
        values: the same for V.
        spec: the layer's spec (:func:`visibility` gives the mask).
        query_start: position of the first query.
        key_start: position of the first key.
        scaling: the factor on ``q @ k^T``.
        softcap: logit softcapping, or ``None``.
        sinks: ``(num_heads,)`` attention-sink logits, or ``None``.

    Returns:
        ``(T, num_heads, head_size)``, in the query's dtype.

    Raises:
        InvalidInputError: the query heads are not a multiple of the KV heads.
    """
    seen = visibility(spec, query_start, query.shape[1], key_start, keys.shape[0])
    return masked_attention(query, keys, values, seen, scaling=scaling, softcap=softcap, sinks=sinks)


def encoder_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, scaling: float
) -> torch.Tensor:
    """Cross attention: every query of a request sees every key of its encoder output (no mask).

    Args:
        query: ``(num_heads, T, head_size)``.
        keys: ``(E, num_kv_heads, head_size)``, the encoder output's keys read from the pages.
        values: the same for V.
        scaling: the factor on ``q @ k^T``.

    Returns:
        ``(T, num_heads, head_size)``, in the query's dtype.

    Raises:
        InvalidInputError: the query heads are not a multiple of the KV heads.
    """
    seen = torch.ones(query.shape[1], keys.shape[0], dtype=torch.bool)
    return masked_attention(query, keys, values, seen, scaling=scaling)
