"""Family ``gemma3`` (the vision-language wrapper) and ``gemma3_text``: 5 local : 1 global.

Layer ``i`` is sliding iff ``(i + 1) % sliding_window_pattern`` (default 6, which the published
27b ``text_config`` relies on), so layers 5, 11, 17, ... are full. The wrapper keeps the
language model under ``text_config``; its dtype may be stated on the wrapper only.
``head_dim`` is required (128 on gemma-3-27b, where ``hidden_size // num_attention_heads`` is
168). An explicit ``layer_types`` wins.

Layer names follow transformers 5: ``model.language_model.layers.{i}.self_attn`` in
``Gemma3ForConditionalGeneration`` (the wrapper), ``model.layers.{i}.self_attn`` in
``Gemma3ForCausalLM`` (``gemma3_text``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.frontends.hf_config import ModelOptions
from kvcore.hookspecs import hookimpl
from kvcore.plugins.models.common import (
    FULL,
    SLIDING,
    ConfigFields,
    LayerNames,
    attention,
    attention_builders,
    build_layers,
    claim,
)
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("gemma3", "gemma3_text")
#: ``Gemma3TextConfig``'s default period of the local/global pattern.
DEFAULT_SLIDING_WINDOW_PATTERN = 6


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Gemma 3 config (wrapper or text-only)."""
    top = ConfigFields(config, str(config["model_type"]))
    wrapped = config["model_type"] == "gemma3"
    cfg = top.section("text_config") if wrapped else top
    n = cfg.integer("num_hidden_layers")
    period = cfg.integer("sliding_window_pattern", DEFAULT_SLIDING_WINDOW_PATTERN)
    types = cfg.layer_types(n) or [SLIDING if (i + 1) % period else FULL for i in range(n)]
    geometry = attention(cfg, options, cfg.dtype(top), derive_head_dim=False)
    names = LayerNames(prefix="model.language_model.layers" if wrapped else "model.layers")
    return build_layers(cfg, types, attention_builders(cfg, geometry), names)


@hookimpl
def kvcore_layer_specs(
    config: Mapping[str, Any], options: Mapping[str, Any]
) -> Mapping[str, KVCacheSpec] | None:
    return claim(config, options, MODEL_TYPES, layer_specs)
