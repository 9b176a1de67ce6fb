"""Family ``deepseek_v2`` / ``deepseek_v3``: multi-head latent attention on every layer.

An MLA layer caches one latent vector per token, shared by all heads:
``kv_lora_rank + qk_rope_head_dim`` elements (512 + 64 = 576 on DeepSeek-V3), with no separate
V. ``num_key_value_heads`` and the ``head_dim`` of transformers-5 dumps (set from
``qk_rope_head_dim``) do not describe the cache and are ignored. The latent is replicated on
every tensor-parallel rank. ``first_k_dense_replace`` / ``moe_layer_freq`` pick MLPs only; the
``num_nextn_predict_layers`` MTP layer lies outside ``num_hidden_layers``: it is planned only
when asked (``ModelOptions(speculative="mtp")``, ``--speculative mtp``: ``model.layers.61.self_attn``,
:mod:`kvcore.frontends.draft_layers`).
Layers are named ``model.layers.{i}.self_attn``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvcore.hookspecs import hookimpl
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import FULL, ConfigFields, LayerNames, build_layers, mla
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("deepseek_v2", "deepseek_v3")


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a DeepSeek V2 / V3 config."""
    cfg = ConfigFields(config, str(config["model_type"]))
    n = cfg.layer_count()
    types = cfg.layer_types(n) or [FULL] * n
    dtype = cfg.dtype()
    return build_layers(cfg, types, {FULL: lambda: mla(cfg, options, dtype)}, LayerNames())


#: The family as registered.
FAMILY = ModelFamily(name="deepseek", model_types=MODEL_TYPES, layer_specs=layer_specs)


@hookimpl
def kvcore_register_model_families(register: Callable[[ModelFamily], None]) -> None:
    register(FAMILY)
