"""Draft-model layers a speculative-decoding engine adds to a model's cache.

With :attr:`~kvcore.model_options.ModelOptions.speculative` set, the layers a family read from
a config are followed by the draft model's cache-holding layers, planned with the target's as
engines plan them (vLLM puts MTP and EAGLE layers in the target's KV-cache config):

- ``mtp``: the model's own multi-token-prediction modules, ``num_nextn_predict_layers`` of them
  (DeepSeek-V3: 1). Each is a decoder layer like the target's last one, so each gets the spec
  of the target's last MLA or full-attention layer, and of that layer's sub-layer caches
  (DeepSeek-V3.2's ``.indexer``);
- ``eagle``: one EAGLE-style decoder layer, full attention with the target's attention geometry
  (the last full-attention layer's spec, or a full-attention spec of the last attention layer's
  KV heads, head size and dtype).

Draft layers continue the target's layer numbering, as engines name them
(``model.layers.61.self_attn`` after DeepSeek-V3's 61 layers). The draft tokens per step are
the sizing context's ``num_speculative_tokens``, set apart from this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvcore.errors import ModelConfigError
from kvcore.model_options import ModelOptions
from kvcore.planning.registry import Registry
from kvcore.spec import KVCacheSpec

#: A layer name with its layer index: ``prefix``, ``index``, ``suffix``.
_INDEXED = re.compile(r"^(?P<prefix>.*?\.)(?P<index>\d+)(?P<suffix>(\..*)?)$")
#: Spec kinds an MTP module's attention may copy, in order of preference per layer.
_MTP_KINDS = ("mla", "full_attention")
#: Fields a full-attention spec takes from another attention spec.
_ATTENTION_FIELDS = ("block_size", "num_kv_heads", "head_size", "dtype")


def mtp_layer_count(config: Mapping[str, Any]) -> int:
    """``num_nextn_predict_layers`` of the config (or of its ``text_config``); 0 when absent."""
    for part in (config, config.get("text_config")):
        if isinstance(part, Mapping):
            value = part.get("num_nextn_predict_layers")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def _draft_names(specs: Mapping[str, KVCacheSpec], donor: str, count: int) -> list[str]:
    """``count`` names continuing the numbering of ``donor``'s layer list."""
    match = _INDEXED.match(donor)
    if match is None:
        return [f"{donor}.draft.{i}" for i in range(count)]
    prefix, suffix = match["prefix"], match["suffix"]
    indices = [int(m["index"]) for m in map(_INDEXED.match, specs) if m is not None and m["prefix"] == prefix]
    first = max(indices) + 1
    return [f"{prefix}{first + i}{suffix}" for i in range(count)]


def _last_of(specs: Mapping[str, KVCacheSpec], kinds: tuple[str, ...]) -> str | None:
    for name in reversed(list(specs)):
        if specs[name].kind in kinds:
            return name
    return None


def with_draft_layers(
    config: Mapping[str, Any],
    specs: Mapping[str, KVCacheSpec],
    options: ModelOptions,
    registry: Registry,
) -> dict[str, KVCacheSpec]:
    """``specs`` followed by the draft model's layers ``options.speculative`` asks for.

    Args:
        config: the model's parsed config (``num_nextn_predict_layers`` for ``mtp``).
        specs: the target model's ``{layer name: spec}``, in model order.
        options: the model options (``speculative``).
        registry: where the ``full_attention`` kind comes from (for ``eagle``).

    Returns:
        The target's layers, then the draft's; ``specs`` unchanged without ``speculative``.

    Raises:
        ModelConfigError: ``mtp`` on a config without MTP layers, or a draft layer without an
            attention layer to take its geometry from.
    """
    out = dict(specs)
    method = options.speculative
    if method is None or not specs:
        return out
    model_type = config.get("model_type")
    if method == "mtp":
        count = mtp_layer_count(config)
        if not count:
            raise ModelConfigError(
                f"{model_type} config: speculative 'mtp' needs the model's multi-token-prediction layers, "
                "but 'num_nextn_predict_layers' is missing or 0; use 'eagle' for an EAGLE draft layer"
            )
        donor = _last_of(specs, _MTP_KINDS)
        if donor is None:
            raise ModelConfigError(
                f"{model_type} config: speculative 'mtp' copies the last MLA or full-attention layer, "
                "and the model has none"
            )
        # the donor's own sub-layer caches come along (DeepSeek-V3.2's indexer keys: vLLM builds an
        # indexer on every MTP layer, vllm/model_executor/models/deepseek_v2.py:1158-1168)
        companions = [n.removeprefix(donor) for n in specs if n.startswith(donor + ".")]
        for name in _draft_names(specs, donor, count):
            out[name] = specs[donor]
            out.update({name + rest: specs[donor + rest] for rest in companions})
        return out
    donor = _last_of(specs, ("full_attention",))
    if donor is not None:
        spec = specs[donor]
    else:
        donor = next(
            (n for n in reversed(list(specs)) if all(hasattr(specs[n], f) for f in _ATTENTION_FIELDS)), None
        )
        if donor is None:
            raise ModelConfigError(
                f"{model_type} config: speculative 'eagle' adds a full-attention layer with the model's "
                "attention geometry (KV heads, head size), and the model has no attention layer to take it "
                "from; use 'mtp' for a model with MTP layers"
            )
        fields = {f: getattr(specs[donor], f) for f in _ATTENTION_FIELDS}
        spec = registry.spec_class("full_attention")(**fields)
    (name,) = _draft_names(specs, donor, 1)
    out[name] = spec
    return out
