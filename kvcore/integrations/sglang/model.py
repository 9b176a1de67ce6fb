"""What SGLang 0.5 runs for one model: the one answer every SGLang figure of kvcore reads.

``kvcore compare --engine sglang``, ``kvcore tune``'s SGLang flags
(:func:`kvcore.integrations.tuned.sglang_settings`) and the SGLang plugin
(:mod:`kvcore.integrations.sglang.plugin`) all ask :func:`sglang_model` whether SGLang gives a
model its separate sliding-window pool, and plan the layers as it returns them, so that they
cannot disagree.

The decision is SGLang's own (sglang 0.5.23): ``ModelConfig.is_hybrid_swa`` is
``is_hybrid_swa_model(architectures, hf_text_config) and not disable_hybrid_swa_memory``
(``sglang/srt/configs/model_config.py``). ``is_hybrid_swa_model`` answers yes for the
architectures on its allowlist (:data:`~kvcore.integrations.sglang.rules.HYBRID_SWA_ARCHITECTURES`:
Llama 4, gpt-oss, MiMo-V2, Step-3.5, Gemma 4, DeepSeek-V4, Laguna and a few more; Beam only
with ``sliding_attention`` in its ``layer_types``, Laguna only with a ``sliding_window``), or for
a text config that sets ``is_hybrid_swa``. ``disable_hybrid_swa_memory`` is the server flag
``--disable-hybrid-swa-memory``, which SGLang also sets itself for Gemma 2, Gemma 3 and 3n, Olmo 2,
and EXAONE 4 with a ``sliding_window_pattern`` (``sglang/srt/arg_groups/model_overrides/``:
``gemma2_gemma3.py``, ``olmo2.py``, ``exaone.py``). Without the sliding pool every sliding layer
keeps every token in the full pool: SGLang sizes the model as full attention.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from kvcore.integrations.sglang.rules import (
    DEFAULT_MAMBA_SSM_DTYPE,
    DSA_PAGE_SIZE,
    HYBRID_SWA_ARCHITECTURES,
    NO_SGLANG_MODEL,
    as_sglang_runs,
    is_dsa,
    refuse_dsa,
)
from kvcore.spec import KVCacheSpec

#: Architectures whose sliding pool SGLang turns off itself (``disable_hybrid_swa_memory`` set by
#: ``sglang/srt/arg_groups/model_overrides/gemma2_gemma3.py`` and ``olmo2.py``).
SWA_MEMORY_DISABLED: frozenset[str] = frozenset(
    {
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForCausalLM",
        "Gemma3nForConditionalGeneration",
        "Olmo2ForCausalLM",
    }
)

#: Architectures whose sliding pool SGLang turns off when the config has a
#: ``sliding_window_pattern`` (``sglang/srt/arg_groups/model_overrides/exaone.py``).
SWA_MEMORY_DISABLED_WITH_PATTERN: frozenset[str] = frozenset(
    {"Exaone4ForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM"}
)


def text_config(config: Mapping[str, object]) -> Mapping[str, object]:
    """SGLang's ``hf_text_config``: a multimodal config's ``text_config``, else the config."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def on_hybrid_swa_list(architectures: Sequence[str], text: Mapping[str, object] | None = None) -> bool:
    """SGLang's ``is_hybrid_swa_model``: an architecture on its allowlist (Beam with a
    ``sliding_attention`` layer, Laguna with a ``sliding_window``), or a text config ``text``
    that sets ``is_hybrid_swa``."""
    if not any(a in HYBRID_SWA_ARCHITECTURES for a in architectures):
        return bool(text is not None and text.get("is_hybrid_swa"))
    if text is None:
        return True
    if "BeamForCausalLM" in architectures:
        layer_types = text.get("layer_types")
        return isinstance(layer_types, Sequence) and "sliding_attention" in layer_types
    # Laguna only with a sliding window
    return "LagunaForCausalLM" not in architectures or bool(text.get("sliding_window"))


def swa_memory_disabled(architectures: Sequence[str], config: Mapping[str, object]) -> bool:
    """Whether SGLang's model overrides turn the sliding pool off for this model."""
    if any(a in SWA_MEMORY_DISABLED for a in architectures):
        return True
    return any(a in SWA_MEMORY_DISABLED_WITH_PATTERN for a in architectures) and (
        config.get("sliding_window_pattern") is not None
    )


def runs_hybrid_swa(
    architectures: Sequence[str],
    config: Mapping[str, object] | None = None,
    *,
    disable_hybrid_swa_memory: bool = False,
) -> bool:
    """SGLang's ``ModelConfig.is_hybrid_swa``: whether a model of ``architectures`` (and
    ``config.json`` ``config``) gets a sliding pool; ``disable_hybrid_swa_memory`` is the server
    flag of that name."""
    if disable_hybrid_swa_memory:
        return False
    text = text_config(config) if config is not None else None
    if not on_hybrid_swa_list(architectures, text):
        return False
    return config is None or not swa_memory_disabled(architectures, config)


@attrs.frozen(kw_only=True)
class SglangModel:
    """A model as SGLang 0.5 runs it.

    Attributes:
        specs: the layers as SGLang keeps them: without the sliding pool a sliding layer is full
            attention of the same heads; a state's recurrent tensors in SGLang's SSM dtype
            (:func:`~kvcore.integrations.sglang.rules.as_sglang_runs`).
        hybrid_swa: whether SGLang builds its separate sliding-window pool.
        has_sliding: whether the model (kvcore's layers) has sliding-window layers.
        architectures: ``config.json``'s (empty for a ``--specs`` file).
        has_model_class: ``False`` for an architecture SGLang 0.5 has no model class for: its
            rules are applied to kvcore's layers all the same.
    """

    specs: Mapping[str, KVCacheSpec] = attrs.field(eq=False, repr=False)
    hybrid_swa: bool
    has_sliding: bool
    architectures: tuple[str, ...] = ()
    has_model_class: bool = True

    @property
    def sliding_in_full_pool(self) -> bool:
        """Whether the model's sliding layers keep every token in SGLang's full pool."""
        return self.has_sliding and not self.hybrid_swa

    def note(self) -> str:
        """One clause on the sliding pool, for a report (``""`` when the model has no sliding
        layer or SGLang gives them their pool)."""
        if not self.sliding_in_full_pool:
            return ""
        return (
            "SGLang gives this model no sliding pool, so its sliding layers keep every token in the full pool"
        )

    def page_size(self, block_size: int) -> int:
        """SGLang's ``--page-size`` for a plan of ``block_size``-token blocks: 64 for a DSA
        model (SGLang's DSA pool takes 64-token pages), else the block size."""
        return DSA_PAGE_SIZE if is_dsa(self.specs) else block_size


def sglang_model(
    specs: Mapping[str, KVCacheSpec],
    config: Mapping[str, object] | None,
    *,
    fix: str = "serve it without kvcore's SGLang plugin (unset KVCORE_SGLANG_POLICY)",
    disable_hybrid_swa_memory: bool = False,
    mamba_ssm_dtype: str = DEFAULT_MAMBA_SSM_DTYPE,
) -> SglangModel:
    """What SGLang runs for the layers ``specs`` of a model whose ``config.json`` is ``config``
    (``None``: a specs file, taken as a model SGLang gives its sliding pool).

    Args:
        specs: kvcore's layers.
        config: the model's ``config.json``.
        fix: what to do when SGLang runs the model in a form kvcore does not plan.
        disable_hybrid_swa_memory: SGLang's server flag of that name.
        mamba_ssm_dtype: SGLang's ``--mamba-ssm-dtype``.

    Raises:
        SglangIntegrationError: a DSA model whose indexer kvcore does not plan
            (:func:`~kvcore.integrations.sglang.rules.refuse_dsa`).
    """
    architectures = tuple(str(a) for a in (config or {}).get("architectures") or ())  # type: ignore[attr-defined]
    if config is not None:
        refuse_dsa(architectures, config, fix)
    hybrid = (
        not disable_hybrid_swa_memory
        if config is None
        else runs_hybrid_swa(architectures, config, disable_hybrid_swa_memory=disable_hybrid_swa_memory)
    )
    return SglangModel(
        specs=as_sglang_runs(specs, hybrid, mamba_ssm_dtype),
        hybrid_swa=hybrid,
        has_sliding=any(s.kind == "sliding_window" for s in specs.values()),
        architectures=architectures,
        has_model_class=not any(a in NO_SGLANG_MODEL for a in architectures),
    )
