"""Family ``gemma4`` / ``gemma4_text``: Gemma 4's sliding and full attention, with per-layer head
sizes and KV heads, and the last layers reading earlier layers' caches.

What the cache holds, as transformers 5.24 builds the model (``models/gemma4/``) and vLLM 0.32
serves it (``vllm/model_executor/models/gemma4.py``):

- *Layer types*: ``layer_types``, else five sliding layers to one full
  (``Gemma4TextConfig.__post_init__``: ``(i + 1) % 6``); the last layer is always full attention
  (transformers forces it, with a warning, and vLLM reads the forced list).
- *Per-layer geometry*: layer ``i`` has ``head_dim`` and ``num_key_value_heads`` unless
  ``per_layer_config[i]`` overrides them (transformers 5.24 dumps it, keys such as ``"05"``;
  vLLM reads ``config.per_layer_config[layer_idx]``, ``gemma4.py:578-580``). A config without
  ``per_layer_config`` (as published before transformers 5.24) gets what
  ``Gemma4TextConfig.__post_init__`` builds from it: full layers take ``global_head_dim``
  (default 512) and, when ``attention_k_eq_v`` is true, ``num_global_key_value_heads`` KV heads
  (when stated); sliding layers keep ``head_dim`` and ``num_key_value_heads``.
- *Shared KV* (``num_kv_shared_layers``, default 0): the last ``num_kv_shared_layers`` layers
  ("reuse" layers of ``Gemma4TextConfig.kv_sharing_modes``) compute no keys or values and read
  the cache of the last earlier layer of their own type. They hold no cache of their own and
  are left out; the layer they read keeps its own spec, a sliding window included: vLLM gives a
  reuse layer ``kv_sharing_target_layer_name`` and no spec (``gemma4.py:471-510``), and
  transformers makes it a ``DummyLayer`` of its cache (``cache_utils.get_layer_types_and_kwargs``)
  while the "store" layer's cache stays a sliding one; the full-length keys a "store" layer
  hands on live only for one forward pass (``shared_kv_states``), not in the cache.
- *K equals V* (``attention_k_eq_v``): full layers have no ``v_proj`` and project the values
  with the key weights, but the cache still holds keys and values as two tensors of the layer's
  geometry (the values are normed, the keys normed and rotated): transformers'
  ``cache.update(key_states, value_states, ...)`` and vLLM loading the key weights into both
  the K and V slots (``gemma4.py:90-118``). It changes the weights, not the cache bytes.

``use_bidirectional_attention: "all"`` (an encoder-style variant, no causal decoding) is refused.
Gemma 4 Unified (``gemma4_unified``, ``gemma4_unified_text``) has the same text config
(``Gemma4UnifiedTextConfig.__post_init__`` and ``kv_sharing_modes`` are Gemma 4's) and is read
alike. Layers are named ``model.layers.{i}.self_attn`` (the ``_text`` configs) or
``model.language_model.layers.{i}.self_attn`` (the wrappers, the language model under
``text_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.dtypes import DType
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import (
    FULL,
    SLIDING,
    Attention,
    ConfigFields,
    LayerNames,
    family_hook,
    tp_refusal,
)
from kvcore.spec import KVCacheSpec
from kvcore.validators import is_int

MODEL_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
#: The wrappers whose language model sits under ``text_config``.
WRAPPERS = frozenset({"gemma4", "gemma4_unified"})
#: ``Gemma4TextConfig.__post_init__``: five sliding layers to one full when ``layer_types`` is absent.
DEFAULT_PERIOD = 6
#: ``Gemma4TextConfig.__post_init__``: ``kwargs.pop("global_head_dim", 512)``.
DEFAULT_GLOBAL_HEAD_DIM = 512


def per_layer_overrides(cfg: ConfigFields, n: int) -> dict[int, Mapping[str, Any]] | None:
    """``per_layer_config`` as ``{layer index: overrides}``, or ``None`` when absent."""
    value = cfg.data.get("per_layer_config")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise cfg.error("per_layer_config", f"must be an object of layer index -> fields (got {value!r})")
    overrides: dict[int, Mapping[str, Any]] = {}
    for key, fields in value.items():
        index = int(key) if isinstance(key, str) and key.isdigit() else key
        if not is_int(index) or not 0 <= index < n or not isinstance(fields, Mapping):
            raise cfg.error(
                "per_layer_config",
                f"has entry {key!r}: {fields!r}; keys must be layer indices in [0, {n}) and values "
                "objects of fields",
            )
        overrides[index] = fields
    return overrides


def layer_geometry(
    cfg: ConfigFields,
    overrides: dict[int, Mapping[str, Any]] | None,
    index: int,
    layer_type: str,
) -> tuple[int, int]:
    """``(head size, KV heads)`` of layer ``index``, as ``Gemma4TextAttention`` reads them."""
    head_dim, kv = cfg.integer("head_dim"), cfg.integer("num_key_value_heads")
    if overrides is None:  # what Gemma4TextConfig.__post_init__ builds per_layer_config from
        if layer_type == FULL:
            head_dim = cfg.integer("global_head_dim", DEFAULT_GLOBAL_HEAD_DIM)
            if cfg.boolean("attention_k_eq_v", False) and cfg.has("num_global_key_value_heads"):
                kv = cfg.integer("num_global_key_value_heads")
        return head_dim, kv
    layer = ConfigFields(
        overrides.get(index, {}), cfg.model_type, f"{cfg.path('per_layer_config')}.{index}.", cfg.label
    )
    return layer.integer("head_dim", head_dim), layer.integer("num_key_value_heads", kv)


def layer_types(cfg: ConfigFields, n: int) -> list[str]:
    """Each layer's type: ``layer_types`` or the 5:1 default, the last layer made full."""
    types = cfg.layer_types(n) or [SLIDING if (i + 1) % DEFAULT_PERIOD else FULL for i in range(n)]
    types[-1] = FULL
    return types


def reuse_layers(cfg: ConfigFields, types: list[str]) -> range:
    """The layers that read an earlier layer's cache (``num_kv_shared_layers`` at the end).

    Raises:
        ModelConfigError: every layer would reuse one, or a reused layer type has no earlier
            layer that stores it (transformers and vLLM fail on both).
    """
    n = len(types)
    shared = cfg.integer("num_kv_shared_layers", 0, minimum=0)
    if shared >= n:
        raise cfg.error(
            "num_kv_shared_layers",
            f"is {shared} of {n} layers: no layer would compute keys and values for the others to read",
        )
    first = n - shared
    for index in range(first, n):
        if types[index] not in types[:first]:
            raise cfg.error(
                "num_kv_shared_layers",
                f"({shared}) makes layer {index} ({types[index]}) reuse the cache of an earlier "
                f"{types[index]} layer, but none of layers 0-{first - 1} is one",
            )
    return range(first, n)


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Gemma 4 config (module docstring)."""
    model_type = str(config["model_type"])
    top = ConfigFields(config, model_type)
    wrapped = model_type in WRAPPERS
    cfg = top.section("text_config") if wrapped else top
    if cfg.string("use_bidirectional_attention") == "all":
        raise cfg.error(
            "use_bidirectional_attention",
            "is 'all': every token attends both ways (an encoder-style model), so there is no causal "
            "KV cache to plan",
        )
    n = cfg.layer_count()
    types = layer_types(cfg, n)
    reuse = reuse_layers(cfg, types)
    overrides = per_layer_overrides(cfg, n)
    dtype: DType = options.cache_dtype(cfg.dtype(top))
    heads = cfg.integer("num_attention_heads")
    window = cfg.integer("sliding_window") if SLIDING in types else None
    names = LayerNames(prefix="model.language_model.layers" if wrapped else "model.layers")
    built: dict[tuple[int, int, str], KVCacheSpec] = {}
    specs: dict[str, KVCacheSpec] = {}
    for index, layer_type in enumerate(types):
        if layer_type not in (FULL, SLIDING):
            raise cfg.error(
                f"layer_types[{index}]",
                f"is {layer_type!r}, which a {model_type} model cannot cache; use one of {FULL}, {SLIDING}",
            )
        if index in reuse:
            continue
        head_dim, kv = layer_geometry(cfg, overrides, index, layer_type)
        key = (head_dim, kv, layer_type)
        if key not in built:
            if heads % kv:
                raise cfg.error(
                    "num_key_value_heads",
                    f"of layer {index} ({kv}) must divide 'num_attention_heads' ({heads})",
                )
            geometry = Attention(
                num_kv_heads=options.kv_heads_per_rank(kv),
                head_size=head_dim,
                dtype=dtype,
                block_size=options.block_size,
                refusal=tp_refusal(cfg, options, heads, kv),
            )
            built[key] = geometry.full() if layer_type == FULL or window is None else geometry.sliding(window)
        specs[names.name(index, layer_type)] = built[key]
    return specs


#: Gemma4TextConfig's and Gemma4UnifiedTextConfig's max_position_embeddings (transformers 5.24.0,
#: models/gemma4/configuration_gemma4.py ``131_072``, models/gemma4_unified/configuration_gemma4_unified.py
#: ``262_144``).
CONFIG_DEFAULTS = {
    "gemma4": {"max_position_embeddings": 131_072},
    "gemma4_text": {"max_position_embeddings": 131_072},
    "gemma4_unified": {"max_position_embeddings": 262_144},
    "gemma4_unified_text": {"max_position_embeddings": 262_144},
}
#: The family as registered.
FAMILY = ModelFamily(
    name="gemma4", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
