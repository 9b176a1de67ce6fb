"""Family ``gemma3n`` / ``gemma3n_text``: Gemma 3n's sliding and full attention, the last
``num_kv_shared_layers`` layers reading earlier layers' caches.

What the cache holds, as transformers 5.24 builds the model (``models/gemma3n/``) and vLLM 0.32
serves it (``vllm/model_executor/models/gemma3n.py:305-410``):

- *Layer types*: ``layer_types`` (the config class lists them: four sliding layers to one full),
  sliding layers with ``sliding_window``; every layer ``num_key_value_heads`` x ``head_dim``
  (required: 256 on the published models, not ``hidden_size / num_attention_heads``).
- *Shared KV* (``num_kv_shared_layers``, ``Gemma3nTextConfig``'s default 15): the last
  ``num_kv_shared_layers`` layers compute no keys or values and read the cache of the last
  earlier layer of their type (transformers' ``kv_sharing_modes`` "reuse"; vLLM gives them a
  ``kv_sharing_target_layer_name`` and no cache of their own), so they are left out, as Gemma 4's
  are (:func:`kvcore.plugins.models.gemma4.reuse_layers`, which refuses a count that leaves no
  layer to read from).

Layers are named ``model.layers.{i}.self_attn`` (``gemma3n_text``) or
``model.language_model.layers.{i}.self_attn`` (``gemma3n``, the language model under
``text_config``). AltUp, LAuReL and the per-layer input embeddings change the weights, not the
cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.gemma4 import reuse_layers
from kvcore.plugins.models.kit import ConfigFields, LayerNames, attention_layers, family_hook
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("gemma3n", "gemma3n_text")


def text_fields(config: Mapping[str, Any]) -> tuple[ConfigFields, ConfigFields, str]:
    """The language model's fields, the whole config's, and where its layers are."""
    top = ConfigFields(config, str(config["model_type"]))
    if top.model_type == "gemma3n":
        return top.section("text_config"), top, "model.language_model.layers"
    return top, top, "model.layers"


def layer_types(cfg: ConfigFields, n: int) -> list[str]:
    """``layer_types`` (required: the config class always writes it)."""
    types = cfg.layer_types(n)
    if types is None:
        raise cfg.error("layer_types", "is missing; Gemma 3n configs list each layer's attention type")
    return types


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Gemma 3n config: the layers before the shared ones."""
    cfg, top, layers = text_fields(config)
    types = layer_types(cfg, cfg.layer_count())
    reused = reuse_layers(cfg, types)
    return attention_layers(
        cfg,
        options,
        types[: reused.start],
        cfg.dtype(top),
        names=LayerNames(prefix=layers),
        derive_head_dim=False,
    )


#: Gemma3nTextConfig's max_position_embeddings (transformers 5.24,
#: ``models/gemma3n/configuration_gemma3n.py``: 32768).
CONFIG_DEFAULTS = {model_type: {"max_position_embeddings": 32768} for model_type in MODEL_TYPES}
#: The family as registered.
FAMILY = ModelFamily(
    name="gemma3n", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
