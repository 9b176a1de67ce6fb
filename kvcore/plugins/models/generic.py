"""The fallback family: any config with ``layer_types`` whose model type no family claims.

It honours transformers' attention layer types: ``full_attention``, ``sliding_attention``
(window ``sliding_window``) and ``chunked_attention`` (chunk ``attention_chunk_size``);
``mlp`` / ``moe`` blocks hold no cache. A ``linear_attention`` layer (an SSM or linear-attention
state) needs a family plugin that knows the state's shapes, as does any other type: the error
says so. Head sizes and KV heads as ``llama`` (``head_dim``, else ``hidden_size //
num_attention_heads``; ``num_key_value_heads``, else the attention heads). The model's language
model may sit under ``text_config``. Layers are named ``model.layers.{i}.self_attn``.

It is registered as a fallback (:attr:`kvcore.ModelFamily.fallback`): asked only when no
family claims the config's model type, and after any fallback a later plugin registers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.model_family import ADD_FAMILY_DOC, ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import ConfigFields, attention_layers, family_hook
from kvcore.spec import KVCacheSpec

#: Added to the error for a layer type the fallback cannot cache.
HINT = f"other types, such as state layers, need a family plugin for the model type ({ADD_FAMILY_DOC})"


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a config that lists its ``layer_types``.

    Args:
        config: the whole parsed config; ``layer_types`` here or in its ``text_config``.
        options: the model options.

    Returns:
        The attention layers in model order.

    Raises:
        ModelConfigError: a field is missing or bad, or a layer type is not an attention type.
    """
    top = ConfigFields(config, str(config.get("model_type") or "unknown"))
    nested = config.get("layer_types") is None and isinstance(config.get("text_config"), Mapping)
    cfg = top.section("text_config") if nested else top
    n = cfg.layer_count()
    types = cfg.layer_types(n) or []
    return attention_layers(cfg, options, types, cfg.dtype(top), hint=HINT)


def has_layer_types(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (or its ``text_config``) lists ``layer_types``: what the fallback reads."""
    inner = config.get("text_config")
    return config.get("layer_types") is not None or (
        isinstance(inner, Mapping) and inner.get("layer_types") is not None
    )


#: The family as registered: a fallback that claims no model type.
FAMILY = ModelFamily(name="generic", layer_specs=layer_specs, fallback=has_layer_types)

kvcore_register_model_families = family_hook(FAMILY)
