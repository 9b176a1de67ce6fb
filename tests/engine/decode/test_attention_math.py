"""The reference runner's attention is transformers' eager attention: same masks, same numbers.

Its visibility rule is checked against transformers' own mask functions (causal, sliding
window, chunked), and its output against the eager attention functions of Llama, Gemma-2
(softcapping) and gpt-oss (sinks), over keys that start where the runner starts reading.
"""

from __future__ import annotations

import pytest
import torch

from kvcore import InvalidInputError
from kvcore.testing.reference.attention import causal_attention, check_supported, visibility, visible_start
from tests.helpers import chunked, full, mla, sliding

transformers = pytest.importorskip("transformers")
masking = pytest.importorskip("transformers.masking_utils")

HEADS, KV_HEADS, HEAD = 4, 2, 8


def _spec(kind, size):
    shape = {"block_size": 4, "heads": KV_HEADS, "head_size": HEAD, "dtype": "float32"}
    if kind == "full":
        return full(**shape)
    return sliding(size, **shape) if kind == "sliding" else chunked(size, **shape)


def _mask_function(kind, size):
    if kind == "full":
        return masking.causal_mask_function
    if kind == "sliding":
        return masking.sliding_window_causal_mask_function(size)
    return masking.chunked_causal_mask_function(size, torch.zeros(1, dtype=torch.long))


KINDS = [
    ("full", 0),
    ("sliding", 1),
    ("sliding", 3),
    ("sliding", 8),
    ("chunked", 1),
    ("chunked", 4),
    ("chunked", 7),
]


@pytest.mark.parametrize(("kind", "size"), KINDS)
def test_visibility_is_transformers_mask(kind, size):
    spec = _spec(kind, size)
    queries = torch.arange(0, 40)[:, None]
    keys = torch.arange(0, 40)[None, :]
    theirs = _mask_function(kind, size)(0, 0, queries, keys)
    assert torch.equal(visibility(spec, 0, 40, 0, 40), theirs)


@pytest.mark.parametrize(("kind", "size"), KINDS)
def test_the_pool_frees_exactly_what_no_query_sees_any_more(kind, size):
    spec = _spec(kind, size)
    for n in range(60):
        assert spec.first_retained_token(n) == visible_start(spec, n)


class _Attention(torch.nn.Module):
    """What transformers' eager functions read from their module."""

    def __init__(self, sinks=None):
        super().__init__()
        self.num_key_value_groups = HEADS // KV_HEADS
        self.head_dim = HEAD
        if sinks is not None:
            self.sinks = torch.nn.Parameter(sinks)


@pytest.mark.parametrize(("kind", "size"), KINDS)
@pytest.mark.parametrize(("query_start", "num_queries"), [(0, 9), (13, 1), (11, 7)])
@pytest.mark.parametrize("flavour", ["llama", "gemma2", "gpt_oss"])
def test_output_is_transformers_eager_attention(kind, size, query_start, num_queries, flavour):
    spec = _spec(kind, size)
    generator = torch.Generator().manual_seed(query_start * 31 + num_queries)
    key_start = visible_start(spec, query_start)
    num_keys = query_start + num_queries - key_start
    query = torch.randn(1, HEADS, num_queries, HEAD, generator=generator)
    key = torch.randn(1, KV_HEADS, num_keys, HEAD, generator=generator)
    value = torch.randn(1, KV_HEADS, num_keys, HEAD, generator=generator)
    seen = _mask_function(kind, size)(
        0,
        0,
        torch.arange(query_start, query_start + num_queries)[:, None],
        torch.arange(key_start, key_start + num_keys)[None, :],
    )
    mask = torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)[None, None]
    options = {}
    if flavour == "llama":
        module = _Attention()
        theirs, _ = transformers.models.llama.modeling_llama.eager_attention_forward(
            module, query, key, value, mask, scaling=0.3, dropout=0.0
        )
    elif flavour == "gemma2":
        module = _Attention()
        options["softcap"] = 2.0
        theirs, _ = transformers.models.gemma2.modeling_gemma2.eager_attention_forward(
            module, query, key, value, mask, scaling=0.3, dropout=0.0, softcap=2.0
        )
    else:
        module = _Attention(sinks=torch.randn(HEADS, generator=generator))
        options["sinks"] = module.sinks.detach()
        theirs, _ = transformers.models.gpt_oss.modeling_gpt_oss.eager_attention_forward(
            module, query, key, value, mask, scaling=0.3, dropout=0.0
        )
    ours = causal_attention(
        query[0],
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        spec=spec,
        query_start=query_start,
        key_start=key_start,
        scaling=0.3,
        **options,
    )
    torch.testing.assert_close(ours, theirs[0].detach(), atol=1e-6, rtol=1e-5)


def test_attention_needs_whole_groups_of_query_heads():
    spec = _spec("full", 0)
    with pytest.raises(InvalidInputError, match="3 query heads cannot share 2 KV heads"):
        causal_attention(
            torch.zeros(3, 1, HEAD),
            torch.zeros(1, 2, HEAD),
            torch.zeros(1, 2, HEAD),
            spec=spec,
            query_start=0,
            key_start=0,
            scaling=1.0,
        )


def test_kinds_the_runner_cannot_attend_over_are_named():
    with pytest.raises(InvalidInputError, match=r"layer 'model.layers.0.self_attn' has a 'mla' cache"):
        check_supported("model.layers.0.self_attn", mla())
