"""State-space families: Mamba-1 (``mamba``, ``falcon_mamba``), Mamba-2 (``mamba2``), and the
Mamba-2 hybrids GraniteMoeHybrid (``granitemoehybrid``) and Falcon-H1 (``falcon_h1``).

Each layer's state is what vLLM 0.32 allocates for it
(``vllm/model_executor/layers/mamba/mamba_utils.py``, ``MambaStateShapeCalculator``), from the
fields each model's ``get_mamba_state_shape_from_config`` passes it:

- Mamba-1 (``vllm/model_executor/models/mamba.py``, also FalconMamba): every layer a state of
  conv ``(conv_kernel - 1, intermediate_size)`` and SSM ``(intermediate_size, state_size)``;
  ``intermediate_size`` is ``expand * hidden_size`` (transformers' ``MambaConfig`` stores it).
- Mamba-2 (``mamba2.py``): every layer a state of conv ``(conv_kernel - 1, expand *
  hidden_size + 2 * n_groups * state_size)`` and SSM ``(num_heads, head_dim, state_size)``.
- GraniteMoeHybrid (``granitemoehybrid.py``): ``layer_types`` (``linear_attention``: Mamba-2,
  ``full_attention``; the older ``layers_block_type`` ``mamba`` / ``attention`` too), the states
  with ``mamba_expand * hidden_size``, ``mamba_n_groups``, ``mamba_n_heads``, ``mamba_d_head``,
  ``mamba_d_state``, ``mamba_d_conv``; attention of ``num_key_value_heads`` x ``hidden_size /
  num_attention_heads``.
- Falcon-H1 (``falcon_h1.py``): every layer runs attention and Mamba-2 side by side, so each
  layer holds a KV cache (attention first, as vLLM builds ``FalconH1ParallelHybrid``) and a
  state whose inner width is ``mamba_d_ssm`` (else ``mamba_expand * hidden_size``), heads
  ``mamba_n_heads`` x ``mamba_d_head``, ``mamba_n_groups``, ``mamba_d_state``,
  ``mamba_d_conv``; the attention head size is ``head_dim``, else ``hidden_size /
  num_attention_heads``.

Tensor parallelism shards the inner width and the heads (``tp`` must divide them); Mamba-2's
groups follow :func:`~kvcore.plugins.models.kit.mamba2_groups`. States are kept in the model's
dtype unless ``state_dtype`` says otherwise, as a GPU engine does with ``mamba_ssm_cache_dtype``
``auto``.

Layers are named as transformers' modules are: ``backbone.layers.{i}.mixer`` (Mamba 1 and 2),
``model.layers.{i}.mamba`` / ``model.layers.{i}.self_attn`` (the hybrids).
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
    LayerNames,
    attention,
    build_layers,
    family_hook,
    hybrid_layers,
    mamba1_state,
    mamba2_state,
)
from kvcore.spec import KVCacheSpec


def mamba_inner(cfg: ConfigFields, expand_key: str = "expand") -> tuple[str, int]:
    """``(field, value)`` of a Mamba layer's inner width: ``intermediate_size`` where the config
    states it (transformers' ``MambaConfig`` saves it), else ``expand * hidden_size``."""
    if cfg.has("intermediate_size"):
        return "intermediate_size", cfg.integer("intermediate_size")
    return f"{expand_key} * hidden_size", cfg.integer(expand_key) * cfg.integer("hidden_size")


def mamba1_layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """Mamba-1 / FalconMamba: a Mamba-1 state on every layer."""
    cfg = ConfigFields(config, str(config["model_type"]))
    n = cfg.layer_count()
    spec = mamba1_state(
        cfg,
        options,
        options.state_cache_dtype(cfg.dtype()),
        inner=mamba_inner(cfg),
        state_size=cfg.integer("state_size"),
        conv_kernel=cfg.integer("conv_kernel", minimum=2),
    )
    return {f"backbone.layers.{i}.mixer": spec for i in range(n)}


def mamba2_layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """Mamba-2: a Mamba-2 state on every layer."""
    cfg = ConfigFields(config, "mamba2")
    n = cfg.layer_count()
    spec = mamba2_state(
        cfg,
        options,
        options.state_cache_dtype(cfg.dtype()),
        heads=("num_heads", cfg.integer("num_heads")),
        head_dim=cfg.integer("head_dim"),
        n_groups=("n_groups", cfg.integer("n_groups", 1)),
        state_size=cfg.integer("state_size"),
        conv_kernel=cfg.integer("conv_kernel", minimum=2),
        inner=("expand * hidden_size", cfg.integer("expand") * cfg.integer("hidden_size")),
    )
    return {f"backbone.layers.{i}.mixer": spec for i in range(n)}


def _hybrid_state(
    cfg: ConfigFields, options: ModelOptions, dtype: DType, inner: tuple[str, int]
) -> KVCacheSpec:
    """The Mamba-2 state of GraniteMoeHybrid and Falcon-H1 (their ``mamba_*`` fields)."""
    return mamba2_state(
        cfg,
        options,
        dtype,
        heads=("mamba_n_heads", cfg.integer("mamba_n_heads")),
        head_dim=cfg.integer("mamba_d_head"),
        n_groups=("mamba_n_groups", cfg.integer("mamba_n_groups", 1)),
        state_size=cfg.integer("mamba_d_state"),
        conv_kernel=cfg.integer("mamba_d_conv", minimum=2),
        inner=inner,
    )


def granitemoehybrid_layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """GraniteMoeHybrid: Mamba-2 and attention layers as ``layer_types`` lists them."""
    cfg = ConfigFields(config, "granitemoehybrid")
    n = cfg.layer_count()
    types = cfg.layer_types(n) or cfg.layer_types(n, key="layers_block_type")
    if types is None:
        raise cfg.error(
            "layer_types", "is missing; a granitemoehybrid config lists its Mamba and attention layers"
        )
    inner = ("mamba_expand * hidden_size", cfg.integer("mamba_expand") * cfg.integer("hidden_size"))
    return hybrid_layers(
        cfg, options, types, lambda dtype: _hybrid_state(cfg, options, dtype, inner), state_module="mamba"
    )


def falcon_h1_layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """Falcon-H1: attention and a Mamba-2 state on every layer, attention first."""
    cfg = ConfigFields(config, "falcon_h1")
    n = cfg.layer_count()
    dtype = cfg.dtype()
    if cfg.data.get("mamba_d_ssm") is not None:
        inner = ("mamba_d_ssm", cfg.integer("mamba_d_ssm"))
    else:
        inner = ("mamba_expand * hidden_size", cfg.integer("mamba_expand") * cfg.integer("hidden_size"))
    full = build_layers(cfg, [FULL] * n, {FULL: lambda: attention(cfg, options, dtype).full()}, LayerNames())
    states = build_layers(
        cfg,
        [LINEAR] * n,
        {LINEAR: lambda: _hybrid_state(cfg, options, options.state_cache_dtype(dtype), inner)},
        LayerNames(state="mamba"),
    )
    specs: dict[str, KVCacheSpec] = {}
    for (attention_name, attention_spec), (state_name, state_spec) in zip(
        full.items(), states.items(), strict=True
    ):
        specs[attention_name] = attention_spec
        specs[state_name] = state_spec
    return specs


def zamba2_layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """Zamba2: a Mamba-2 state on every layer; a ``hybrid`` layer (``layers_block_type``) runs
    a shared attention block first, which caches keys and values of its own on each hybrid
    layer (the weights are shared, the cache is not)."""
    cfg = ConfigFields(config, "zamba2")
    n = cfg.layer_count()
    types = cfg.layer_types(n, key="layers_block_type") or cfg.layer_types(n)
    if types is None:
        raise cfg.error(
            "layers_block_type", "is missing; a zamba2 config lists its Mamba and hybrid layers there"
        )
    dtype = cfg.dtype()
    state = mamba2_state(
        cfg,
        options,
        options.state_cache_dtype(dtype),
        heads=("n_mamba_heads", cfg.integer("n_mamba_heads")),
        head_dim=cfg.integer("mamba_headdim"),
        n_groups=("mamba_ngroups", cfg.integer("mamba_ngroups", 1)),
        state_size=cfg.integer("mamba_d_state"),
        conv_kernel=cfg.integer("mamba_d_conv", minimum=2),
        inner=("mamba_expand * hidden_size", cfg.integer("mamba_expand") * cfg.integer("hidden_size")),
    )
    full: KVCacheSpec | None = None
    specs: dict[str, KVCacheSpec] = {}
    for i, layer_type in enumerate(types):
        if layer_type == "hybrid":
            if full is None:
                full = attention(
                    cfg, options, dtype, head_dim_keys=("attention_head_dim",), derive_head_dim=False
                ).full()
            specs[f"model.layers.{i}.shared_transformer.self_attn"] = full
            specs[f"model.layers.{i}.mamba_decoder.mamba"] = state
        elif layer_type in (LINEAR, "mamba"):
            specs[f"model.layers.{i}.mamba"] = state
        else:
            raise cfg.error(
                f"layers_block_type[{i}]",
                f"is {layer_type!r}; a zamba2 layer is 'mamba' ({LINEAR!r}) or 'hybrid'",
            )
    return specs


#: The ``max_position_embeddings`` defaults of the hybrids' config classes (transformers 5.24,
#: ``configuration_granitemoehybrid.py``: 2048, ``configuration_falcon_h1.py``: 8192,
#: ``configuration_zamba2.py``: 4096). The Mamba configs state no length (their states do not
#: grow with it): they get the 2048 tokens vLLM 0.32 assumes for a config without one
#: (``vllm/config/model.py:2571``, ``default_max_len``).
MAMBA_LENGTH = {"max_position_embeddings": 2048}
FAMILIES = (
    ModelFamily(
        name="mamba",
        model_types=("mamba", "falcon_mamba"),
        layer_specs=mamba1_layer_specs,
        config_defaults={"mamba": MAMBA_LENGTH, "falcon_mamba": MAMBA_LENGTH},
    ),
    ModelFamily(
        name="mamba2",
        model_types=("mamba2",),
        layer_specs=mamba2_layer_specs,
        config_defaults={"mamba2": MAMBA_LENGTH},
    ),
    ModelFamily(
        name="granitemoehybrid",
        model_types=("granitemoehybrid",),
        layer_specs=granitemoehybrid_layer_specs,
        config_defaults={"granitemoehybrid": {"max_position_embeddings": 2048}},
    ),
    ModelFamily(
        name="falcon_h1",
        model_types=("falcon_h1",),
        layer_specs=falcon_h1_layer_specs,
        config_defaults={"falcon_h1": {"max_position_embeddings": 8192}},
    ),
    ModelFamily(
        name="zamba2",
        model_types=("zamba2",),
        layer_specs=zamba2_layer_specs,
        config_defaults={"zamba2": {"max_position_embeddings": 4096}},
    ),
)

kvcore_register_model_families = family_hook(*FAMILIES)
