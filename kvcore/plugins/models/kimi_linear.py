"""Family ``kimi_linear``: Kimi delta attention (KDA, a linear-attention state) layers with
multi-head latent attention (MLA) layers between them.

Fields as ``KimiLinearConfig`` (transformers 5.24, ``models/kimi_linear/configuration_kimi_linear.py``)
reads them. Published checkpoints keep the linear-attention fields in a ``linear_attn_config``
object (``num_heads``, ``head_dim``, ``short_conv_kernel_size``, and the 1-based layer lists
``full_attn_layers`` / ``kda_layers``), which wins over the flat ``linear_num_heads``,
``linear_head_dim`` and ``linear_conv_kernel_dim`` that transformers dumps. Layer types: an
explicit ``layer_types``, else the two lists, else transformers' default (layer ``i`` is full
attention iff ``i > 0`` and ``i % 4 == 0``).

- A full-attention layer is MLA (vLLM 0.32 builds ``MultiHeadLatentAttention`` for every non-KDA
  layer, ``vllm/models/kimi_k3/nvidia/model.py:908-934``): one latent of ``kv_lora_rank +
  qk_rope_head_dim`` elements per token, replicated on every rank (:func:`~kvcore.plugins.models
  .kit.mla`).
- A KDA layer keeps a convolution state over queries, keys and values, ``(conv - 1, 3*h*d / tp)``
  in the model's dtype (or ``state_dtype``), and a recurrent state ``(h / tp, d, d)`` in float32
  unless ``state_dtype`` is set (:func:`~kvcore.plugins.models.kit.kda_state`, vLLM's
  ``kda_state_shape`` / ``kda_state_dtype``).

Layers are named ``model.layers.{i}.self_attn`` (both kinds, as in transformers and vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.dtypes import float32
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import (
    FULL,
    LINEAR,
    ConfigFields,
    LayerNames,
    build_layers,
    family_hook,
    kda_state,
    mla,
)
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("kimi_linear",)
#: KimiLinearConfig's default: every 4th layer (from layer 4, 0-based) is full attention.
DEFAULT_FULL_ATTENTION_INTERVAL = 4


def layer_types(cfg: ConfigFields, linear: ConfigFields | None, n: int) -> list[str]:
    """Each layer's type: ``layer_types``, else ``linear_attn_config``'s 1-based lists, else the
    default pattern (module docstring)."""
    explicit = cfg.layer_types(n)
    if explicit is not None:
        return explicit
    if linear is not None and linear.has("full_attn_layers") and linear.has("kda_layers"):
        types: list[str | None] = [None] * n
        for key, layer_type in (("full_attn_layers", FULL), ("kda_layers", LINEAR)):
            for layer in linear.integers(key) or []:
                if not 1 <= layer <= n:
                    raise linear.error(key, f"lists layer {layer}; layers are numbered 1 to {n} there")
                types[layer - 1] = layer_type
        missing = [i + 1 for i, t in enumerate(types) if t is None]
        if missing:
            raise linear.error(
                "full_attn_layers",
                f"and 'kda_layers' leave layers {missing[:8]} (1-based) without a type; list every layer",
            )
        return [t for t in types if t is not None]
    interval = DEFAULT_FULL_ATTENTION_INTERVAL
    return [FULL if i and i % interval == 0 else LINEAR for i in range(n)]


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Kimi-Linear config (module docstring)."""
    cfg = ConfigFields(config, "kimi_linear")
    linear = cfg.section("linear_attn_config") if cfg.has("linear_attn_config") else None
    n = cfg.layer_count()
    types = layer_types(cfg, linear, n)
    dtype = cfg.dtype()

    def read(nested: str, flat: str, minimum: int = 1) -> int:
        if linear is not None and linear.has(nested):
            return linear.integer(nested, minimum=minimum)
        return cfg.integer(flat, minimum=minimum)

    def state() -> KVCacheSpec:
        return kda_state(
            cfg,
            options,
            options.state_cache_dtype(dtype),
            heads=("linear_num_heads", read("num_heads", "linear_num_heads")),
            head_dim=read("head_dim", "linear_head_dim"),
            conv_kernel=read("short_conv_kernel_size", "linear_conv_kernel_dim", minimum=2),
            recurrent_dtype=options.state_dtype or float32,
        )

    builders = {FULL: lambda: mla(cfg, options, dtype), LINEAR: state}
    return build_layers(cfg, types, builders, LayerNames())


#: KimiLinearConfig's max_position_embeddings, stored as ``model_max_length``
#: (transformers 5.24.0, transformers/models/kimi_linear/configuration_kimi_linear.py:95).
CONFIG_DEFAULTS = {"kimi_linear": {"max_position_embeddings": 1_048_576}}
#: The family as registered.
FAMILY = ModelFamily(
    name="kimi_linear", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
