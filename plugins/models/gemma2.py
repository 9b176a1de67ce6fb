"""Family ``gemma2``: sliding and full attention alternate, sliding first.

Layer ``i`` is sliding iff ``(i + 1) % 2`` (even layers are local), with window
``sliding_window`` (4096 on the published models). ``head_dim`` is required: Gemma's head size
(256) is not ``hidden_size // num_attention_heads``. The legacy ``sliding_window_size`` key and
``cache_implementation`` are ignored. An explicit ``layer_types`` wins. Layers are named
``model.layers.{i}.self_attn``.
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

MODEL_TYPES = ("gemma2",)


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Gemma 2 config."""
    cfg = ConfigFields(config, "gemma2")
    n = cfg.integer("num_hidden_layers")
    types = cfg.layer_types(n) or [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
    geometry = attention(cfg, options, cfg.dtype(), derive_head_dim=False)
    return build_layers(cfg, types, attention_builders(cfg, geometry), LayerNames())


@hookimpl
def kvcore_layer_specs(
    config: Mapping[str, Any], options: Mapping[str, Any]
) -> Mapping[str, KVCacheSpec] | None:
    return claim(config, options, MODEL_TYPES, layer_specs)
