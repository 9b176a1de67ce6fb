"""Family ``mistral``: one sliding window for every layer when ``sliding_window`` is set.

Mistral-7B-v0.1 has ``sliding_window`` 4096 on every layer; v0.2 and later (and Nemo) set it to
``null``, so every layer is full attention. A config that omits the key gets transformers'
default of 4096, as ``MistralConfig`` does. Other fields as ``llama``; an explicit
``layer_types`` wins. Layers are named ``model.layers.{i}.self_attn``.
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

MODEL_TYPES = ("mistral",)
#: ``MistralConfig``'s default window, used when the key is absent (``null`` means none).
DEFAULT_SLIDING_WINDOW = 4096


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Mistral config."""
    cfg = ConfigFields(config, "mistral")
    n = cfg.integer("num_hidden_layers")
    window = cfg.optional_integer("sliding_window", absent=DEFAULT_SLIDING_WINDOW)
    types = cfg.layer_types(n) or [SLIDING if window is not None else FULL] * n
    geometry = attention(cfg, options, cfg.dtype())
    builders = attention_builders(cfg, geometry)
    if window is not None:
        builders[SLIDING] = lambda: geometry.sliding(window)
    return build_layers(cfg, types, builders, LayerNames())


@hookimpl
def kvcore_layer_specs(
    config: Mapping[str, Any], options: Mapping[str, Any]
) -> Mapping[str, KVCacheSpec] | None:
    return claim(config, options, MODEL_TYPES, layer_specs)
