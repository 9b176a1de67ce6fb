"""Tiny random-weight models saved locally for vLLM's real engine (no download): a config from
transformers' own config class, ``save_pretrained`` of a model built from it with a fixed seed.
vLLM starts them with ``skip_tokenizer_init=True`` and prompts given as token ids.

Each is the smallest model of its family that keeps the family's cache layout: the layer kinds
in their published order, the sliding window shorter than the test's ``max_model_len``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Widths shared by every tiny model: head size 64 is one the CPU attention kernels take.
_WIDTHS: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    vocab_size=512,
    max_position_embeddings=1024,
)


def _llama() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=2, **_WIDTHS)


def _gemma2() -> Any:
    from transformers import Gemma2Config

    # alternating sliding / full layers; vLLM's Gemma-2 ties its embeddings
    return Gemma2Config(num_hidden_layers=4, sliding_window=64, tie_word_embeddings=True, **_WIDTHS)


def _gemma3() -> Any:
    from transformers import Gemma3TextConfig

    # Gemma-3's five sliding layers to one full, twice
    return Gemma3TextConfig(num_hidden_layers=12, sliding_window=64, tie_word_embeddings=True, **_WIDTHS)


def _qwen3_next() -> Any:
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        num_hidden_layers=4,  # three linear-attention layers to one full, as Qwen3-Next has
        # linear-attention heads of 64: the CPU build's gated delta net kernel takes no smaller
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        **_WIDTHS,
    )


#: name -> config maker, for the models the engine tests run.
TINY_MODELS: dict[str, Callable[[], Any]] = {
    "llama": _llama,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "qwen3_next": _qwen3_next,
}


def save_tiny_model(name: str, where: Path) -> Path:
    """Save the tiny ``name`` model (config and random weights, seed 0) under ``where``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = TINY_MODELS[name]()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    path = where / name
    model.save_pretrained(path)
    return path
