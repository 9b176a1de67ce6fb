"""Family ``gpt_oss``: sliding (window ``sliding_window``, 128) and full attention alternate.

The published configs list ``layer_types`` explicitly (sliding at layer 0); without it the
default is the same alternation, layer ``i`` sliding iff ``(i + 1) % 2``. ``head_dim`` is
required (64, where ``hidden_size // num_attention_heads`` is 45). The per-head attention sinks
hold no per-token cache. Layers are named ``model.layers.{i}.self_attn``.
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

MODEL_TYPES = ("gpt_oss",)


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a gpt-oss config."""
    cfg = ConfigFields(config, "gpt_oss")
    n = cfg.integer("num_hidden_layers")
    types = cfg.layer_types(n) or [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
    geometry = attention(cfg, options, cfg.dtype(), derive_head_dim=False)
    return build_layers(cfg, types, attention_builders(cfg, geometry), LayerNames())


@hookimpl
def kvcore_layer_specs(
    config: Mapping[str, Any], options: Mapping[str, Any]
) -> Mapping[str, KVCacheSpec] | None:
    return claim(config, options, MODEL_TYPES, layer_specs)
