"""Family ``llama4`` (the vision-language wrapper) and ``llama4_text``: chunked local attention
with a global layer every ``no_rope_layer_interval`` layers.

``no_rope_layers[i] == 1`` means layer ``i`` *uses* RoPE and is chunked local attention over
``attention_chunk_size`` tokens; ``0`` marks a NoPE layer, which is full attention. Without
``no_rope_layers`` (an empty list counts as absent) transformers derives
``int((i + 1) % no_rope_layer_interval != 0)`` (interval 4 by default), so layers 3, 7, 11, ...
are full. A ``null`` ``attention_chunk_size`` makes every layer full. ``head_dim`` is required.
An explicit ``layer_types`` wins.

Layer names follow transformers 5: ``language_model.model.layers.{i}.self_attn`` in
``Llama4ForConditionalGeneration`` (the wrapper's ``architectures``),
``model.layers.{i}.self_attn`` in ``Llama4ForCausalLM`` (``llama4_text``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import CHUNKED, FULL, ConfigFields, LayerNames, attention_layers, family_hook
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("llama4", "llama4_text")
#: ``Llama4TextConfig``'s default: a NoPE (global) layer every 4 layers.
DEFAULT_NO_ROPE_LAYER_INTERVAL = 4


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Llama 4 config (wrapper or text-only)."""
    top = ConfigFields(config, str(config["model_type"]))
    wrapped = config["model_type"] == "llama4"
    cfg = top.section("text_config") if wrapped else top
    n = cfg.layer_count()
    types = cfg.layer_types(n)
    if types is None:
        chunk = cfg.optional_integer("attention_chunk_size")
        rope = cfg.integers("no_rope_layers")
        if not rope:
            interval = cfg.integer("no_rope_layer_interval", DEFAULT_NO_ROPE_LAYER_INTERVAL)
            rope = [int((i + 1) % interval != 0) for i in range(n)]
        elif len(rope) != n:
            raise cfg.error("no_rope_layers", f"lists {len(rope)} layers but there are {n}")
        types = [CHUNKED if uses_rope and chunk is not None else FULL for uses_rope in rope]
    names = LayerNames(prefix="language_model.model.layers" if wrapped else "model.layers")
    return attention_layers(cfg, options, types, cfg.dtype(top), names=names, derive_head_dim=False)


#: Llama4TextConfig's max_position_embeddings, for the wrapper's text_config too
#:
#: (transformers 5.24.0, transformers/models/llama4/configuration_llama4.py:138).
CONFIG_DEFAULTS = {model_type: {"max_position_embeddings": 4096 * 32} for model_type in MODEL_TYPES}
#: The family as registered.
FAMILY = ModelFamily(
    name="llama4", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
