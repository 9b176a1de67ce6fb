"""The GPU budget's arithmetic over random Llama-shaped configs and quantizations."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kvcore.errors import InvalidInputError
from kvcore.planning.gpu_budget import Quantization, gpu_budget, weight_bytes
from kvcore.planning.registry import Registry
from kvcore.plugins.models.parameters import kvcore_count_parameters

pytestmark = pytest.mark.property

REGISTRY = Registry.default(autoload=False)


@st.composite
def llama_configs(draw: st.DrawFn) -> dict:
    heads = draw(st.sampled_from([4, 8, 16, 32]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0]))
    return {
        "model_type": "llama",
        "num_hidden_layers": draw(st.integers(1, 80)),
        "hidden_size": heads * draw(st.sampled_from([32, 64, 128])),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": draw(st.integers(1, 30000)),
        "vocab_size": draw(st.integers(1, 300000)),
        "tie_word_embeddings": draw(st.booleans()),
    }


@given(config=llama_configs())
def test_a_llama_count_is_the_closed_form(config):
    h, n, i, v = (config[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"))
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    embeddings = v * h * (1 if config["tie_word_embeddings"] else 2)
    assert (
        kvcore_count_parameters(config=config).params
        == embeddings + n * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h
    )


@given(config=llama_configs(), bits=st.sampled_from([4.25, 4 + 20 / 128, 8, 8 + 32 / 16384]))
def test_quantization_shrinks_only_the_converted_groups(config, bits):
    count = kvcore_count_parameters(config=config)
    plain = weight_bytes(count, Quantization())
    quantized = weight_bytes(count, Quantization(method="q", bits_per_param=bits))
    assert plain.total == 2 * count.params
    unconverted = sum(g.params for g in count.groups if not g.quantizable)
    assert quantized.converted_params == count.params - unconverted
    exact = 2 * unconverted + quantized.converted_params * bits / 8
    assert abs(quantized.total - exact) <= len(count.by_name())  # each group's bytes rounded once
    assert quantized.total <= plain.total


@given(
    config=llama_configs(),
    gpu=st.integers(1, 2**40),
    utilization=st.floats(0.05, 1.0),
    tokens=st.integers(1, 65536),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_the_budget_is_what_the_terms_leave_and_more_ranks_never_leave_less(
    config, gpu, utilization, tokens, tp
):
    try:
        budget = gpu_budget(
            config, REGISTRY, gpu, utilization=utilization, max_num_batched_tokens=tokens, tp=tp
        )
    except InvalidInputError as exc:  # nothing left: the message gives the terms
        assert "nothing is left for a KV cache" in str(exc)
        return
    assert budget.kv_cache == budget.usable - budget.weights - budget.activation - budget.reserve > 0
    more = gpu_budget(
        config, REGISTRY, gpu, utilization=utilization, max_num_batched_tokens=tokens, tp=2 * tp
    )
    assert more.weights <= budget.weights and more.kv_cache >= budget.kv_cache
