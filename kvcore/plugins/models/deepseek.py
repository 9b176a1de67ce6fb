"""Family ``deepseek_v2`` / ``deepseek_v3`` / ``deepseek_v32``: multi-head latent attention on
every layer, and on DeepSeek-V3.2 a sparse-attention (DSA) indexer key cache beside it.

An MLA layer caches one latent vector per token, shared by all heads:
``kv_lora_rank + qk_rope_head_dim`` elements (512 + 64 = 576 on DeepSeek-V3), with no separate
V. ``num_key_value_heads`` and the ``head_dim`` of transformers-5 dumps (set from
``qk_rope_head_dim``) do not describe the cache and are ignored. The latent is replicated on
every tensor-parallel rank. ``first_k_dense_replace`` / ``moe_layer_freq`` pick MLPs only; the
``num_nextn_predict_layers`` MTP layer lies outside ``num_hidden_layers``: it is planned only
when asked (``ModelOptions(speculative="mtp")``, ``--speculative mtp``: ``model.layers.61.self_attn``,
:mod:`kvcore.frontends.draft_layers`).
Layers are named ``model.layers.{i}.self_attn``.

A config with ``index_topk`` is a DSA model (vLLM 0.33 reads it so: ``self.is_v32 =
hasattr(config, "index_topk")``, ``vllm/model_executor/models/deepseek_v2.py:1138``). Its layers
that compute their own top-k also cache the indexer's keys (:class:`~kvcore.plugins.dsa_indexer
.DSAIndexerSpec`, ``index_head_dim`` fp8 elements and a float32 scale per 128: 132 bytes), named
after the indexer module, ``model.layers.{i}.self_attn.indexer`` (vLLM names its cache
``....indexer.k_cache``: :func:`kvcore.integrations.vllm.convert.vllm_layer_name`). A layer skips its
indexer as vLLM decides (``deepseek_v2.py:1144-1168``): by ``index_topk_pattern`` (``"S"``: skip)
when given, else when ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq != 0``
(defaults 2 and 1: no layer skips, as on DeepSeek-V3.2). With an fp8 cache
(``--kv-cache-dtype fp8``) a DSA model's latent is stored as its sparse kernels read it: 512 fp8
elements, their 4 float32 scales and the 64 rotary elements in bfloat16, 656 bytes
(:mod:`kvcore.plugins.mla`; vLLM's ``fp8`` is an alias of ``fp8_ds_mla`` on its sparse MLA
backend, ``vllm/v1/attention/backends/mla/flashmla_sparse.py:150-154``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.dsa_indexer import INDEXER_DTYPE, DSAIndexerSpec, dsa_latent
from kvcore.plugins.models.kit import FULL, ConfigFields, LayerNames, build_layers, family_hook, mla
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32")
#: The indexer module's attribute on an attention layer (vLLM's ``f"{prefix}.indexer"``,
#: ``deepseek_v2.py:1187``; transformers' ``self.indexer``).
INDEXER_SUFFIX = ".indexer"
#: ``index_skip_topk_offset`` when a config leaves it out (vLLM's default, ``deepseek_v2.py:1147``).
DEFAULT_SKIP_OFFSET = 2


def indexer_layers(cfg: ConfigFields, n: int) -> list[bool]:
    """Which of the ``n`` layers of a DSA config compute their own top-k (hold an indexer cache),
    by vLLM's rule (module docstring)."""
    pattern = cfg.data.get("index_topk_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise cfg.error(
                "index_topk_pattern", f"must be a string of 'S' and other letters (got {pattern!r})"
            )
        return [not (i < len(pattern) and pattern[i] == "S") for i in range(n)]
    freq = cfg.integer("index_topk_freq", 1)
    offset = cfg.integer("index_skip_topk_offset", DEFAULT_SKIP_OFFSET, minimum=0)
    return [max(i - offset + 1, 0) % freq == 0 for i in range(n)]


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a DeepSeek V2 / V3 / V3.2 config."""
    cfg = ConfigFields(config, str(config["model_type"]))
    n = cfg.layer_count()
    types = cfg.layer_types(n) or [FULL] * n
    dtype = cfg.dtype()
    if not cfg.has("index_topk"):
        return build_layers(cfg, types, {FULL: lambda: mla(cfg, options, dtype)}, LayerNames())
    cfg.integer("index_topk")  # checked: a DSA config's top-k is a positive int
    latent = dsa_latent(mla(cfg, options, dtype))
    indexer = DSAIndexerSpec(
        block_size=options.block_size, index_head_dim=cfg.integer("index_head_dim"), dtype=INDEXER_DTYPE
    )
    layers = build_layers(cfg, types, {FULL: lambda: latent}, LayerNames())
    with_indexer = indexer_layers(cfg, n)
    names = LayerNames()
    specs: dict[str, KVCacheSpec] = {}
    for name, spec in layers.items():
        specs[name] = spec
        index = int(name.removeprefix(f"{names.prefix}.").split(".", 1)[0])
        if with_indexer[index]:
            specs[name + INDEXER_SUFFIX] = indexer
    return specs


#: The config classes' max_position_embeddings
#: (transformers 5.24.0, transformers/models/deepseek_v2/configuration_deepseek_v2.py:82
#: and deepseek_v3/configuration_deepseek_v3.py:103, deepseek_v32/configuration_deepseek_v32.py:107).
CONFIG_DEFAULTS = {
    "deepseek_v2": {"max_position_embeddings": 2048},
    "deepseek_v3": {"max_position_embeddings": 4096},
    "deepseek_v32": {"max_position_embeddings": 163840},
}
#: The family as registered.
FAMILY = ModelFamily(
    name="deepseek", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
