"""Family ``llama`` (Llama 2, 3, 3.1, 3.2): every layer is full attention.

Fields: ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (default: the
attention heads), ``head_dim`` (default ``hidden_size // num_attention_heads``), ``dtype`` /
``torch_dtype``. ``rope_scaling`` does not change the cache. An explicit ``layer_types`` wins.
Layers are named ``model.layers.{i}.self_attn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.frontends.hf_config import ModelOptions
from kvcore.hookspecs import hookimpl
from kvcore.plugins.models.common import (
    FULL,
    ConfigFields,
    LayerNames,
    attention,
    attention_builders,
    build_layers,
    claim,
)
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("llama",)


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Llama config."""
    cfg = ConfigFields(config, "llama")
    n = cfg.integer("num_hidden_layers")
    types = cfg.layer_types(n) or [FULL] * n
    geometry = attention(cfg, options, cfg.dtype())
    return build_layers(cfg, types, attention_builders(cfg, geometry), LayerNames())


@hookimpl
def kvcore_layer_specs(
    config: Mapping[str, Any], options: Mapping[str, Any]
) -> Mapping[str, KVCacheSpec] | None:
    return claim(config, options, MODEL_TYPES, layer_specs)
