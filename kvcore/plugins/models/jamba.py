"""Family ``jamba``: Mamba-1 layers with an attention layer every ``attn_layer_period`` layers.

Layer ``i`` is attention iff ``i % attn_layer_period == attn_layer_offset`` (defaults 8 and 4:
layers 4, 12, 20, 28 of 32), else Mamba-1. An attention layer is full attention (transformers
ignores Jamba's ``sliding_window``). A Mamba layer holds a fixed state per request, with
``d_inner = mamba_expand * hidden_size``: a conv state ``(mamba_d_conv - 1, d_inner)`` and an
SSM state ``(d_inner, mamba_d_state)``; ``mamba_dt_rank`` is a weight dimension only. An
explicit ``layer_types`` wins (``linear_attention`` = Mamba).

Layers are named ``model.layers.{i}.self_attn`` and ``model.layers.{i}.mamba``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.dtypes import DType
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import FULL, LINEAR, ConfigFields, family_hook, hybrid_layers, mamba1_state
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("jamba",)
#: ``JambaConfig``'s defaults.
DEFAULT_ATTN_LAYER_PERIOD = 8
DEFAULT_ATTN_LAYER_OFFSET = 4


def layer_types(cfg: ConfigFields, n: int) -> list[str]:
    """``full_attention`` where ``i % period == offset``, ``linear_attention`` (Mamba) elsewhere."""
    period = cfg.integer("attn_layer_period", DEFAULT_ATTN_LAYER_PERIOD)
    offset = cfg.integer("attn_layer_offset", DEFAULT_ATTN_LAYER_OFFSET, minimum=0)
    if offset >= period:
        raise cfg.error(
            "attn_layer_offset", f"({offset}) must be smaller than 'attn_layer_period' ({period})"
        )
    return [FULL if i % period == offset else LINEAR for i in range(n)]


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Jamba config."""
    cfg = ConfigFields(config, "jamba")
    n = cfg.layer_count()
    types = cfg.layer_types(n) or layer_types(cfg, n)

    def state(dtype: DType) -> KVCacheSpec:
        inner = cfg.integer("mamba_expand") * cfg.integer("hidden_size")
        return mamba1_state(
            cfg,
            options,
            dtype,
            inner=("mamba_expand * hidden_size", inner),
            state_size=cfg.integer("mamba_d_state"),
            conv_kernel=cfg.integer("mamba_d_conv", minimum=2),
        )

    return hybrid_layers(cfg, options, types, state, state_module="mamba")


#: JambaConfig's max_position_embeddings
#: (transformers 5.24.0, transformers/models/jamba/configuration_jamba.py:82).
CONFIG_DEFAULTS = {"jamba": {"max_position_embeddings": 262144}}
#: The family as registered.
FAMILY = ModelFamily(
    name="jamba", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
