"""Family ``phi3``: one sliding window for every layer when ``sliding_window`` is set.

Phi-3-mini-4k-instruct ships ``sliding_window`` 2047 with ``max_position_embeddings`` 4096;
transformers applies it to every layer (``Phi3Config`` defaults it to ``null``: full
attention). Engines have treated this value inconsistently; kvcore follows transformers. It is
multi-head attention (32 KV heads of ``3072 // 32 = 96``). Other fields as ``llama``; an
explicit ``layer_types`` wins. Layers are named ``model.layers.{i}.self_attn``.
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

MODEL_TYPES = ("phi3",)


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Phi-3 config."""
    cfg = ConfigFields(config, "phi3")
    n = cfg.integer("num_hidden_layers")
    window = cfg.optional_integer("sliding_window")
    types = cfg.layer_types(n) or [SLIDING if window is not None else FULL] * n
    geometry = attention(cfg, options, cfg.dtype())
    return build_layers(cfg, types, attention_builders(cfg, geometry), LayerNames())


@hookimpl
def kvcore_layer_specs(
    config: Mapping[str, Any], options: Mapping[str, Any]
) -> Mapping[str, KVCacheSpec] | None:
    return claim(config, options, MODEL_TYPES, layer_specs)
