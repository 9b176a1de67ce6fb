"""Families ``qwen3_next`` and ``qwen3_5``: gated-delta-net (linear attention) layers with a
full-attention layer every ``full_attention_interval`` layers.

Layer ``i`` is full attention iff ``(i + 1) % full_attention_interval == 0`` (default 4), else
a gated delta net; an explicit ``layer_types`` wins. Full layers use ``num_key_value_heads`` x
``head_dim`` (required). A gated-delta-net layer holds a conv state ``(linear_conv_kernel_dim -
1, 2*kh*kd + vh*vd)`` and a recurrent state ``(vh, vd, kd)``, with ``kh, vh =
linear_num_key_heads, linear_num_value_heads`` and ``kd, vd = linear_key_head_dim,
linear_value_head_dim``. ``partial_rotary_factor`` does not change the cache.

Layers are named ``model.layers.{i}.self_attn`` and ``model.layers.{i}.linear_attn``.

Qwen3.5 and Qwen3.5-MoE (``qwen3_5_text``, ``qwen3_5_moe_text``, and the vision-language
wrappers ``qwen3_5`` / ``qwen3_5_moe`` whose language model sits under ``text_config``, its
layers under ``model.language_model.layers``) read the same fields: their config classes
(transformers 5.24, ``models/qwen3_5/configuration_qwen3_5.py``) derive ``layer_types`` with the
same rule and keep the Qwen3-Next gated delta net and gated attention, as vLLM 0.32's
``Qwen3_5DecoderLayer`` does (``vllm/model_executor/models/qwen3_5.py:125-160``; state shapes from
``gated_delta_net_state_shape``). A Qwen3.5 config may name the recurrent state's dtype,
``mamba_ssm_dtype`` (published ones say ``float32``): vLLM stores the recurrent state in it unless
``--mamba-ssm-cache-dtype`` is given (``Qwen3_5ForConditionalGenerationConfig``,
``vllm/model_executor/models/config.py:853-877``), and so does kvcore unless ``state_dtype`` is
set; the convolution state keeps the model's dtype (or ``state_dtype``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.dtypes import DType, to_dtype
from kvcore.errors import InvalidSpecError
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import (
    FULL,
    LINEAR,
    ConfigFields,
    LayerNames,
    attention,
    build_layers,
    family_hook,
    gated_delta_net_state,
    hybrid_layers,
)
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("qwen3_next",)
#: ``Qwen3NextConfig``'s default: every 4th layer is full attention.
DEFAULT_FULL_ATTENTION_INTERVAL = 4


def _layer_types(cfg: ConfigFields) -> list[str]:
    n = cfg.layer_count()
    types = cfg.layer_types(n)
    if types is None:
        interval = cfg.integer("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL)
        types = [LINEAR if (i + 1) % interval else FULL for i in range(n)]
    return types


def _state(
    cfg: ConfigFields, options: ModelOptions, dtype: DType, recurrent_dtype: DType | None = None
) -> KVCacheSpec:
    return gated_delta_net_state(
        cfg,
        options,
        dtype,
        key_heads=("linear_num_key_heads", cfg.integer("linear_num_key_heads")),
        value_heads=("linear_num_value_heads", cfg.integer("linear_num_value_heads")),
        key_head_dim=cfg.integer("linear_key_head_dim"),
        value_head_dim=cfg.integer("linear_value_head_dim"),
        conv_kernel=cfg.integer("linear_conv_kernel_dim", minimum=2),
        recurrent_dtype=recurrent_dtype,
    )


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Qwen3-Next config."""
    cfg = ConfigFields(config, "qwen3_next")
    types = _layer_types(cfg)

    def state(dtype: DType) -> KVCacheSpec:
        return _state(cfg, options, dtype)

    return hybrid_layers(cfg, options, types, state, state_module="linear_attn", derive_head_dim=False)


def ssm_dtype(cfg: ConfigFields) -> DType | None:
    """A Qwen3.5 config's ``mamba_ssm_dtype`` (the recurrent state's element type), if stated."""
    name = cfg.string("mamba_ssm_dtype")
    if name is None:
        return None
    try:
        return to_dtype(name)
    except InvalidSpecError as exc:
        raise cfg.error("mamba_ssm_dtype", f"is not a state dtype: {exc}") from None


def qwen3_5_layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Qwen3.5 / Qwen3.5-MoE config (module docstring)."""
    model_type = str(config["model_type"])
    top = ConfigFields(config, model_type)
    wrapped = model_type in QWEN3_5_WRAPPERS
    cfg = top.section("text_config") if wrapped else top
    types = _layer_types(cfg)
    dtype = cfg.dtype(top)
    state_dtype = options.state_cache_dtype(dtype)
    recurrent_dtype = options.state_dtype or ssm_dtype(cfg)
    builders = {
        FULL: lambda: attention(cfg, options, dtype, derive_head_dim=False).full(),
        LINEAR: lambda: _state(cfg, options, state_dtype, recurrent_dtype),
    }
    prefix = "model.language_model.layers" if wrapped else "model.layers"
    return build_layers(cfg, types, builders, LayerNames(prefix=prefix, state="linear_attn"))


#: Qwen3NextConfig's max_position_embeddings
#: (transformers 5.24.0, transformers/models/qwen3_next/configuration_qwen3_next.py:98).
CONFIG_DEFAULTS = {"qwen3_next": {"max_position_embeddings": 32768}}
#: The family as registered.
FAMILY = ModelFamily(
    name="qwen3_next", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

#: Qwen3.5's model types: the text models and the vision-language wrappers.
QWEN3_5_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
QWEN3_5_WRAPPERS = frozenset({"qwen3_5", "qwen3_5_moe"})
#: Qwen3_5TextConfig's and Qwen3_5MoeTextConfig's max_position_embeddings (transformers 5.24.0,
#: models/qwen3_5/configuration_qwen3_5.py:88, models/qwen3_5_moe/configuration_qwen3_5_moe.py:94).
QWEN3_5_DEFAULTS = {model_type: {"max_position_embeddings": 32768} for model_type in QWEN3_5_TYPES}
#: The Qwen3.5 family as registered.
QWEN3_5 = ModelFamily(
    name="qwen3_5",
    model_types=QWEN3_5_TYPES,
    layer_specs=qwen3_5_layer_specs,
    config_defaults=QWEN3_5_DEFAULTS,
)

kvcore_register_model_families = family_hook(FAMILY, QWEN3_5)
