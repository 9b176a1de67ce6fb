"""Family ``qwen3_next``: gated-delta-net (linear attention) layers with a full-attention layer
every ``full_attention_interval`` layers.

Layer ``i`` is full attention iff ``(i + 1) % full_attention_interval == 0`` (default 4), else
a gated delta net; an explicit ``layer_types`` wins. Full layers use ``num_key_value_heads`` x
``head_dim`` (required). A gated-delta-net layer holds a conv state ``(linear_conv_kernel_dim -
1, 2*kh*kd + vh*vd)`` and a recurrent state ``(vh, vd, kd)``, with ``kh, vh =
linear_num_key_heads, linear_num_value_heads`` and ``kd, vd = linear_key_head_dim,
linear_value_head_dim``. ``partial_rotary_factor`` does not change the cache.

Layers are named ``model.layers.{i}.self_attn`` and ``model.layers.{i}.linear_attn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.dtypes import DType
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import (
    FULL,
    LINEAR,
    ConfigFields,
    family_hook,
    gated_delta_net_state,
    hybrid_layers,
)
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("qwen3_next",)
#: ``Qwen3NextConfig``'s default: every 4th layer is full attention.
DEFAULT_FULL_ATTENTION_INTERVAL = 4


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Qwen3-Next config."""
    cfg = ConfigFields(config, "qwen3_next")
    n = cfg.layer_count()
    types = cfg.layer_types(n)
    if types is None:
        interval = cfg.integer("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL)
        types = [LINEAR if (i + 1) % interval else FULL for i in range(n)]

    def state(dtype: DType) -> KVCacheSpec:
        return gated_delta_net_state(
            cfg,
            options,
            dtype,
            key_heads=("linear_num_key_heads", cfg.integer("linear_num_key_heads")),
            value_heads=("linear_num_value_heads", cfg.integer("linear_num_value_heads")),
            key_head_dim=cfg.integer("linear_key_head_dim"),
            value_head_dim=cfg.integer("linear_value_head_dim"),
            conv_kernel=cfg.integer("linear_conv_kernel_dim", minimum=2),
        )

    return hybrid_layers(cfg, options, types, state, state_module="linear_attn", derive_head_dim=False)


#: Qwen3NextConfig's max_position_embeddings
#: (transformers 5.24.0, transformers/models/qwen3_next/configuration_qwen3_next.py:98).
CONFIG_DEFAULTS = {"qwen3_next": {"max_position_embeddings": 32768}}
#: The family as registered.
FAMILY = ModelFamily(
    name="qwen3_next", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
