"""Family ``mllama`` (Llama-3.2-Vision): full attention, and cross attention to the image tokens
on the layers ``text_config.cross_attention_layers`` lists.

The language model has ``text_config.num_hidden_layers`` layers (40 for 11B). A layer in
``cross_attention_layers`` (3, 8, ..., 38) attends to the vision encoder's output instead of the
request's tokens: its cache holds the image tokens, fixed per request:
``vision_config.max_num_tiles x ((image_size / patch_size)^2 + 1)`` (a class token per tile;
``4 x (40^2 + 1) = 6404`` for 560-pixel tiles of 14-pixel patches). Every other layer is full
attention. Both have the text model's geometry (``num_key_value_heads``, ``head_dim`` or
``hidden_size / num_attention_heads``).

Layers are named as in transformers 5's ``MllamaForConditionalGeneration``:
``model.language_model.layers.{i}.self_attn`` and ``model.language_model.layers.{i}.cross_attn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import (
    CROSS,
    FULL,
    ConfigFields,
    LayerNames,
    attention,
    build_layers,
    family_hook,
)
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("mllama",)


def image_tokens(vision: ConfigFields) -> int:
    """Image tokens one request brings: ``max_num_tiles x ((image_size // patch_size)^2 + 1)``.

    Raises:
        ModelConfigError: a missing or bad field, or a patch larger than the image.
    """
    size = vision.integer("image_size")
    patch = vision.integer("patch_size")
    if patch > size:
        raise vision.error("patch_size", f"({patch}) is larger than 'image_size' ({size})")
    return vision.integer("max_num_tiles") * ((size // patch) ** 2 + 1)


def vision_fields(top: ConfigFields) -> ConfigFields:
    """Reads of ``vision_config``.

    Raises:
        ModelConfigError: it is missing or not an object.
    """
    if not isinstance(top.data.get("vision_config"), Mapping):
        raise top.error(
            "vision_config",
            "is missing or not a JSON object; mllama configs keep the vision encoder's sizes there "
            "(image_size, patch_size, max_num_tiles), which size the cross-attention layers",
        )
    return ConfigFields(top.data["vision_config"], "mllama", "vision_config.", top.label)


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Llama-3.2-Vision config."""
    top = ConfigFields(config, "mllama")
    cfg = top.section("text_config")
    n = cfg.layer_count()
    cross = cfg.integers("cross_attention_layers") or []
    outside = [i for i in cross if not 0 <= i < n]
    if outside:
        raise cfg.error("cross_attention_layers", f"names layers {outside} outside 0..{n - 1}")
    geometry = attention(cfg, options, cfg.dtype(top))
    marked = set(cross)
    types = [CROSS if i in marked else FULL for i in range(n)]
    builders = {FULL: geometry.full, CROSS: lambda: geometry.cross(image_tokens(vision_fields(top)))}
    return build_layers(cfg, types, builders, LayerNames(prefix="model.language_model.layers"))


#: MllamaTextConfig's max_position_embeddings
#: (transformers 5.24.0, transformers/models/mllama/configuration_mllama.py:133).
CONFIG_DEFAULTS = {"mllama": {"max_position_embeddings": 131_072}}
#: The family as registered.
FAMILY = ModelFamily(
    name="mllama", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
