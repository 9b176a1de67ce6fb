"""Family ``whisper``: an encoder-decoder speech model; only the decoder holds a cache.

The encoder attends over the audio once per request and keeps nothing. Each of the
``decoder_layers`` decoder layers holds two caches: causal self attention over the request's
own tokens (full attention; Whisper decodes at most ``max_target_positions`` tokens, 448 for
large-v3) and cross attention over the encoder's output, ``max_source_positions`` audio frames
(1500: 30 s of audio), fixed per request whatever its length. Attention is multi-head
(``decoder_attention_heads`` KV heads of ``d_model / decoder_attention_heads``).

Layers are named as in ``WhisperForConditionalGeneration``: ``model.decoder.layers.{i}.self_attn``
and ``model.decoder.layers.{i}.encoder_attn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import Attention, ConfigFields, family_hook, heads_refusal
from kvcore.spec import KVCacheSpec

MODEL_TYPES = ("whisper",)
#: Where the decoder's layers are in ``WhisperForConditionalGeneration``.
PREFIX = "model.decoder.layers"


def geometry(cfg: ConfigFields, options: ModelOptions) -> Attention:
    """The decoder's attention geometry on one tensor-parallel rank.

    Raises:
        ModelConfigError: a missing or bad field, or a ``tp`` that does not divide the heads.
    """
    heads = cfg.integer("decoder_attention_heads")
    width = cfg.integer("d_model")
    if width % heads:
        raise cfg.error("d_model", f"({width}) must divide by 'decoder_attention_heads' ({heads})")
    refusal = heads_refusal(cfg, "decoder_attention_heads", heads, options)
    if refusal is not None:
        raise refusal
    return Attention(
        num_kv_heads=options.kv_heads_per_rank(heads),
        head_size=width // heads,
        dtype=options.cache_dtype(cfg.dtype()),
        block_size=options.block_size,
    )


def layer_specs(config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
    """The specs of a Whisper config: per decoder layer, self attention then cross attention."""
    cfg = ConfigFields(config, "whisper")
    n = cfg.layer_count("decoder_layers")
    attention = geometry(cfg, options)
    own = attention.full()
    cross = attention.cross(cfg.integer("max_source_positions"))
    specs: dict[str, KVCacheSpec] = {}
    for i in range(n):
        specs[f"{PREFIX}.{i}.self_attn"] = own
        specs[f"{PREFIX}.{i}.encoder_attn"] = cross
    return specs


#: WhisperConfig's max_target_positions, the decoder's longest output
#:
#: (transformers 5.24.0, transformers/models/whisper/configuration_whisper.py:147).
CONFIG_DEFAULTS = {"whisper": {"max_target_positions": 448}}
#: The family as registered.
FAMILY = ModelFamily(
    name="whisper", model_types=MODEL_TYPES, layer_specs=layer_specs, config_defaults=CONFIG_DEFAULTS
)

kvcore_register_model_families = family_hook(FAMILY)
