"""Family ``nemotron_h``: Mamba-2, attention and MLP blocks in the order of a pattern string.

``hybrid_override_pattern`` has one character per layer: ``M`` Mamba-2, ``*`` attention,
``-`` MLP, ``E`` MoE (transformers' ``layer_types``: ``linear_attention``, ``full_attention``,
``mlp``, ``moe``). Only ``M`` and ``*`` layers hold a cache. The attention head size is
``attention_head_dim`` (the published key), else ``head_dim``. A Mamba-2 layer holds a conv
state ``(conv_kernel - 1, heads*head_dim + 2*n_groups*ssm_state_size)`` and an SSM state
``(heads, head_dim, ssm_state_size)`` with ``heads = mamba_num_heads``, ``head_dim =
mamba_head_dim`` (the legacy keys ``mamba_n_groups`` / ``mamba_d_conv`` are read too). The SSM
state is kept in the model's dtype unless ``state_dtype`` says otherwise (transformers' own
cache defaults to ``mamba_ssm_cache_dtype`` float32; pass ``state_dtype`` to match an engine
that does so). An explicit ``layer_types`` wins over the pattern.

Layers are named ``model.layers.{i}.mixer`` (transformers 5's ``NemotronHForCausalLM``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.dtypes import DType
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import FULL, LINEAR, ConfigFields, family_hook, hybrid_layers, mamba2_state
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("nemotron_h",)
#: Pattern characters, as transformers' ``NemotronHConfig._pattern_to_list`` maps them.
PATTERN = {"M": LINEAR, "*": FULL, "-": "mlp", "E": "moe"}


def layer_types(cfg: ConfigFields) -> list[str]:
    """The explicit ``layer_types`` (or transformers 5's ``layers_block_type``), else the types
    ``hybrid_override_pattern`` spells."""
    for key in ("layer_types", "layers_block_type"):
        value = cfg.data.get(key)
        if value is not None:
            n = cfg.layer_count("num_hidden_layers", len(value) if isinstance(value, list) else 0)
            return cfg.layer_types(n, key=key) or []
    pattern = cfg.string("hybrid_override_pattern")
    if pattern is None:
        raise cfg.error("hybrid_override_pattern", "is missing; nemotron_h configs spell their layers there")
    types = []
    for i, char in enumerate(pattern):
        if char not in PATTERN:
            raise cfg.error(
                f"hybrid_override_pattern[{i}]",
                f"is {char!r}; use M (Mamba-2), * (attention), - (MLP) or E (MoE)",
            )
        types.append(PATTERN[char])
    n = cfg.layer_count("num_hidden_layers", len(types))
    if n != len(types):
        raise cfg.error(
            "hybrid_override_pattern", f"spells {len(types)} layers but 'num_hidden_layers' is {n}"
        )
    return types


def _first(cfg: ConfigFields, *keys: str, minimum: int = 1) -> int:
    """The first of ``keys`` that is present (the last is required when none is)."""
    for key in keys[:-1]:
        if cfg.has(key):
            return cfg.integer(key, minimum=minimum)
    return cfg.integer(keys[-1], minimum=minimum)


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Nemotron-H config."""
    cfg = ConfigFields(config, "nemotron_h")
    types = layer_types(cfg)

    def state(dtype: DType) -> KVCacheSpec:
        return mamba2_state(
            cfg,
            options,
            dtype,
            heads=("mamba_num_heads", cfg.integer("mamba_num_heads")),
            head_dim=cfg.integer("mamba_head_dim"),
            n_groups=("n_groups", _first(cfg, "mamba_n_groups", "n_groups")),
            state_size=cfg.integer("ssm_state_size"),
            conv_kernel=_first(cfg, "mamba_d_conv", "conv_kernel", minimum=2),
        )

    return hybrid_layers(
        cfg,
        options,
        types,
        state,
        state_module="mixer",
        attention_module="mixer",
        head_dim_keys=("attention_head_dim", "head_dim"),
        derive_head_dim=False,
    )


#: NemotronHConfig's max_position_embeddings
#: (transformers 5.24.0, transformers/models/nemotron_h/configuration_nemotron_h.py:109).
CONFIG_DEFAULTS = {"nemotron_h": {"max_position_embeddings": 4096}}
#: The family as registered.
FAMILY = ModelFamily(
    name="nemotron_h", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
