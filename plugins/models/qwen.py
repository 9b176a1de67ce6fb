"""Family ``qwen2`` / ``qwen3`` / ``qwen3_moe``: sliding windows only with ``use_sliding_window``.

The window is off unless ``use_sliding_window`` is true (Qwen2.5 ships ``sliding_window``
131072 with ``use_sliding_window: false``, which is all full attention). When it is on, layer
``i`` is sliding iff ``i >= max_window_layers``: the first ``max_window_layers`` layers are
full. Defaults as transformers: ``use_sliding_window`` false, ``sliding_window`` 4096 when the
key is absent, ``max_window_layers`` 28 (``qwen2``, ``qwen3``). transformers 5 dropped
``max_window_layers`` from ``Qwen3MoeConfig`` and slides every layer; kvcore honours the field
when a ``qwen3_moe`` config states it and otherwise slides every layer, as transformers does.
``head_dim`` is explicit on Qwen3 (128, not ``hidden_size // num_attention_heads``). An
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

MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe")
#: transformers' defaults when a key is absent.
DEFAULT_SLIDING_WINDOW = 4096
DEFAULT_MAX_WINDOW_LAYERS = {"qwen2": 28, "qwen3": 28, "qwen3_moe": 0}


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Qwen2 / Qwen3 / Qwen3-MoE config."""
    model_type = str(config["model_type"])
    cfg = ConfigFields(config, model_type)
    n = cfg.integer("num_hidden_layers")
    window = None
    if cfg.boolean("use_sliding_window", False):
        window = cfg.optional_integer("sliding_window", absent=DEFAULT_SLIDING_WINDOW)
    first_sliding = cfg.integer("max_window_layers", DEFAULT_MAX_WINDOW_LAYERS[model_type], minimum=0)
    types = cfg.layer_types(n) or [
        SLIDING if window is not None and i >= first_sliding else FULL for i in range(n)
    ]
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
