"""The attention-only families, one table: Llama, Mistral, Qwen 2/3, Phi-3, Gemma 2/3, Laguna,
gpt-oss.

Their layers are all full or sliding-window attention and they differ only in data, so each is
one :class:`AttentionOnlyFamily` row of :data:`FAMILIES`:

- *which model types* it claims;
- *its pattern rule*: which layers slide, and over what window, when the config lists no
  ``layer_types`` (an explicit ``layer_types`` always wins): :class:`AllFull`,
  :class:`UniformWindow`, :class:`LocalGlobal` or :class:`WindowFromLayer`;
- *which config fields* give the head size (``head_dim``, else ``hidden_size //
  num_attention_heads`` unless the row requires ``head_dim``), and whether the language model
  sits under ``text_config`` (a vision-language wrapper);
- *layer naming*: ``{layers}.{i}.self_attn``.

Every row reads the rest alike: ``num_hidden_layers``; ``num_key_value_heads`` (default: the
attention heads) divided by ``tp``; the model's ``dtype`` / ``torch_dtype`` (on the wrapper too);
``sliding_window`` for sliding layers; ``attention_chunk_size`` for chunked layers an explicit
``layer_types`` may list. ``rope_scaling``, attention sinks (gpt-oss) and Gemma's legacy
``sliding_window_size`` / ``cache_implementation`` do not change the cache and are ignored.
Per-family notes are in ``docs/reference/models.md``.

A plugin author with another attention-only model can register a row of their own::

    @hookimpl
    def kvcore_register_model_families(register):
        row = AttentionOnlyFamily(name="acme", model_types=("acme",), pattern=LocalGlobal(period=4))
        register(row.family())
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from kvcore.hookspecs import hookimpl
from kvcore.model_family import ModelFamily
from kvcore.model_options import ModelOptions
from kvcore.plugins.models.kit import FULL, SLIDING, ConfigFields, LayerNames, attention_layers
from kvcore.spec import KVCacheSpec

# -- pattern rules -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LayerPattern:
    """What a family's pattern fields say about one config.

    Attributes:
        types: each layer's type when the config lists no ``layer_types``.
        window: the window of sliding layers when the pattern fields settle it (a default a
            config may omit); ``None``: sliding layers read ``sliding_window`` when one exists.
    """

    types: tuple[str, ...]
    window: int | None = None


class PatternRule(Protocol):
    """Which layers of a family slide: read from the config before its ``layer_types``."""

    def read(self, cfg: ConfigFields, num_layers: int) -> LayerPattern:
        """The pattern of a config of ``num_layers`` layers.

        Args:
            cfg: the config (its ``text_config`` for a wrapper).
            num_layers: ``num_hidden_layers``.

        Returns:
            The default layer types and, if the rule settles it, the window.

        Raises:
            ModelConfigError: a pattern field is bad.
        """
        ...  # pragma: no cover - a protocol


@attrs.frozen
class AllFull:
    """Every layer is full attention (Llama)."""

    def read(self, cfg: ConfigFields, num_layers: int) -> LayerPattern:
        """See :meth:`PatternRule.read`."""
        return LayerPattern(types=(FULL,) * num_layers)


@attrs.frozen(kw_only=True)
class UniformWindow:
    """One window for every layer when ``sliding_window`` is set, else all full (Mistral, Phi-3).

    Attributes:
        absent: the window when the config omits the key (``null`` always means none).
    """

    absent: int | None = None

    def read(self, cfg: ConfigFields, num_layers: int) -> LayerPattern:
        """See :meth:`PatternRule.read`."""
        window = cfg.optional_integer("sliding_window", absent=self.absent)
        return LayerPattern(types=(SLIDING if window is not None else FULL,) * num_layers, window=window)


@attrs.frozen(kw_only=True)
class LocalGlobal:
    """Sliding layers with a full one every ``period`` layers: layer ``i`` slides iff
    ``(i + 1) % period`` (Gemma 2, gpt-oss: period 2, sliding first; Gemma 3: 6).

    Attributes:
        period: the period, or its default when ``period_key`` is absent from the config.
        period_key: the config field that states the period, if the family has one.
        window_excludes_current: the config's ``sliding_window`` counts the tokens before the
            current one, so a sliding layer sees and caches ``sliding_window + 1`` (Cohere 2:
            a layer attends to ``[pos - sliding_window, pos]``).
    """

    period: int
    period_key: str | None = None
    window_excludes_current: bool = False

    def read(self, cfg: ConfigFields, num_layers: int) -> LayerPattern:
        """See :meth:`PatternRule.read`."""
        period = cfg.integer(self.period_key, self.period) if self.period_key else self.period
        types = tuple(SLIDING if (i + 1) % period else FULL for i in range(num_layers))
        window = cfg.optional_integer("sliding_window") if self.window_excludes_current else None
        return LayerPattern(types=types, window=None if window is None else window + 1)


@attrs.frozen(kw_only=True)
class WindowFromLayer:
    """A window only when ``use_sliding_window`` is true, then on layers ``i >=
    max_window_layers`` (Qwen 2 / 3).

    Attributes:
        first_sliding: ``max_window_layers`` when the config omits it.
        absent: the window when ``sliding_window`` is omitted (``null``: none).
    """

    first_sliding: int
    absent: int = 4096

    def read(self, cfg: ConfigFields, num_layers: int) -> LayerPattern:
        """See :meth:`PatternRule.read`."""
        window = None
        if cfg.boolean("use_sliding_window", False):
            window = cfg.optional_integer("sliding_window", absent=self.absent)
        first = cfg.integer("max_window_layers", self.first_sliding, minimum=0)
        types = tuple(SLIDING if window is not None and i >= first else FULL for i in range(num_layers))
        return LayerPattern(types=types, window=window)


# -- the rows ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AttentionOnlyFamily:
    """One attention-only family: a row of :data:`FAMILIES`.

    Attributes:
        name: the family's name in messages and listings.
        model_types: the ``model_type`` values it claims; default the name alone.
        pattern: which layers slide when the config lists no ``layer_types``.
        head_dim_required: ``head_dim`` must be stated (the head size is not ``hidden_size //
            num_attention_heads``, as on Gemma and gpt-oss).
        text_config: the language model's fields are under ``text_config`` (a wrapper); the
            model's dtype may be stated on the wrapper only.
        layers: the decoder layer list: layer ``i`` is ``{layers}.{i}.self_attn``.
        max_position_embeddings: the default of the family's transformers config class, for
            a config that omits the field (:attr:`~kvcore.ModelFamily.config_defaults`).
    """

    name: str
    model_types: tuple[str, ...] = attrs.field(
        default=attrs.Factory(lambda row: (row.name,), takes_self=True)
    )
    pattern: PatternRule = AllFull()
    head_dim_required: bool = False
    text_config: bool = False
    layers: str = "model.layers"
    max_position_embeddings: int | None = None

    def layer_specs(self, config: Mapping[str, Any], options: ModelOptions) -> dict[str, KVCacheSpec]:
        """``{layer name: spec}`` of a config of this family.

        Args:
            config: the whole parsed config.
            options: the model options.

        Returns:
            The attention layers in model order.

        Raises:
            ModelConfigError: a field is missing or bad; the message names the model type and
                the field.
        """
        top = ConfigFields(config, str(config["model_type"]))
        cfg = top.section("text_config") if self.text_config else top
        n = cfg.layer_count()
        pattern = self.pattern.read(cfg, n)
        types = cfg.layer_types(n) or list(pattern.types)
        return attention_layers(
            cfg,
            options,
            types,
            cfg.dtype(top),
            names=LayerNames(prefix=self.layers),
            derive_head_dim=not self.head_dim_required,
            window=pattern.window,
        )

    def family(self) -> ModelFamily:
        """The row as the :class:`~kvcore.ModelFamily` a plugin registers."""
        length = self.max_position_embeddings
        defaults = (
            {} if length is None else {t: {"max_position_embeddings": length} for t in self.model_types}
        )
        return ModelFamily(
            name=self.name,
            model_types=self.model_types,
            layer_specs=self.layer_specs,
            config_defaults=defaults,
        )


#: Gemma 3's language model: 5 local : 1 global; the 27b text_config relies on the default
#: period 6. Gemma3TextConfig: 131_072 (configuration_gemma3.py:81); the 27b text_config omits it.
_GEMMA3_TEXT = AttentionOnlyFamily(
    name="gemma3_text",
    pattern=LocalGlobal(period=6, period_key="sliding_window_pattern"),
    head_dim_required=True,
    max_position_embeddings=131_072,
)

#: The built-in attention-only families (``docs/reference/models.md`` has the same table).
#: Each ``max_position_embeddings`` is the default of the family's config class in transformers
#: 5.24.0, ``transformers/models/<type>/configuration_<type>.py`` (the line is named beside it).
FAMILIES: tuple[AttentionOnlyFamily, ...] = (
    # Llama 2, 3, 3.1, 3.2
    # LlamaConfig: max_position_embeddings 2048 (configuration_llama.py:70)
    AttentionOnlyFamily(name="llama", max_position_embeddings=2048),
    # Mistral-7B-v0.1: window 4096 on every layer; v0.2 and later (and Nemo) set it to null.
    # A config that omits the key gets MistralConfig's default, 4096.
    # MistralConfig: max_position_embeddings 4096 * 32 (configuration_mistral.py:70)
    AttentionOnlyFamily(
        name="mistral",
        pattern=UniformWindow(absent=4096),
        max_position_embeddings=4096 * 32,
    ),
    # Qwen2.5 ships sliding_window 131072 with use_sliding_window false: all full. transformers 5
    # dropped max_window_layers from Qwen3MoeConfig and slides every layer (default 0 here);
    # a qwen3_moe config that states the field is honoured.
    # Qwen2Config and Qwen3Config: 32768 (configuration_qwen2.py:67, configuration_qwen3.py:69)
    AttentionOnlyFamily(
        name="qwen",
        model_types=("qwen2", "qwen3"),
        pattern=WindowFromLayer(first_sliding=28),
        max_position_embeddings=32768,
    ),
    # Qwen3MoeConfig: 32768 (configuration_qwen3_moe.py:87)
    AttentionOnlyFamily(
        name="qwen3_moe",
        pattern=WindowFromLayer(first_sliding=0),
        max_position_embeddings=32768,
    ),
    # Phi-3-mini-4k: sliding_window 2047 on every layer, as transformers applies it
    # (Phi3Config defaults it to null: full attention).
    # Phi3Config: 4096 (configuration_phi3.py:70)
    AttentionOnlyFamily(name="phi3", pattern=UniformWindow(), max_position_embeddings=4096),
    # Gemma 2: even layers local (window 4096 on the published models), head_dim 256.
    # Gemma2Config: 8192 (configuration_gemma2.py:75)
    AttentionOnlyFamily(
        name="gemma2",
        pattern=LocalGlobal(period=2),
        head_dim_required=True,
        max_position_embeddings=8192,
    ),
    # Gemma3ForConditionalGeneration: Gemma 3's language model under text_config, its layers
    # under model.language_model.
    attrs.evolve(
        _GEMMA3_TEXT,
        name="gemma3",
        model_types=("gemma3",),
        text_config=True,
        layers="model.language_model.layers",
    ),
    _GEMMA3_TEXT,
    # Laguna: one KV geometry (num_key_value_heads x head_dim) on every layer, full unless
    # layer_types says sliding (window sliding_window); num_attention_heads_per_layer varies the
    # query heads only (transformers 5.24 LagunaConfig; vLLM 0.32 laguna.py:248-310, 500-506).
    # LagunaConfig: max_position_embeddings 131072 (configuration_laguna.py:98)
    AttentionOnlyFamily(name="laguna", max_position_embeddings=131072),
    # Command R (Cohere 1): every layer full. CohereConfig: 8192 (configuration_cohere.py:74)
    AttentionOnlyFamily(name="cohere", max_position_embeddings=8192),
    # Command R7B, Command A (Cohere 2, and its MoE): three sliding layers to one full (the
    # configs list layer_types). A sliding layer attends to [pos - sliding_window, pos], so vLLM
    # gives it a window of sliding_window + 1 (vLLM 0.32 commandr.py:237-244,
    # cohere2_moe.py:205-213), and kvcore caches as many.
    # Cohere2Config: 8192 (configuration_cohere2.py:73); Cohere2MoeConfig: 8192
    # (configuration_cohere2_moe.py:104)
    AttentionOnlyFamily(
        name="cohere2",
        model_types=("cohere2", "cohere2_moe"),
        pattern=LocalGlobal(period=4, period_key="sliding_window_pattern", window_excludes_current=True),
        max_position_embeddings=8192,
    ),
    # Gemma (1): every layer full, head_dim 256 stated. GemmaConfig: 8192 (configuration_gemma.py:74)
    AttentionOnlyFamily(name="gemma", head_dim_required=True, max_position_embeddings=8192),
    # Llama-like decoders, every layer full attention of num_key_value_heads x head_dim (else
    # hidden_size / num_attention_heads); each checked against vLLM's own specs
    # (docs/reference/models.md, "Checked against vLLM's own specs").
    # GraniteConfig, GraniteMoeConfig, GraniteMoeSharedConfig: 2048 (configuration_granite.py:70,
    # configuration_granitemoe.py:65, configuration_granitemoeshared.py:76)
    AttentionOnlyFamily(
        name="granite",
        model_types=("granite", "granitemoe", "granitemoeshared"),
        max_position_embeddings=2048,
    ),
    # Glm4Config: 131072 (configuration_glm4.py:64)
    AttentionOnlyFamily(name="glm4", max_position_embeddings=131072),
    # Ernie4_5Config, Ernie4_5_MoeConfig: 131072 (configuration_ernie4_5.py:70,
    # configuration_ernie4_5_moe.py:100)
    AttentionOnlyFamily(
        name="ernie4_5", model_types=("ernie4_5", "ernie4_5_moe"), max_position_embeddings=131072
    ),
    # ApertusConfig: 65536 (configuration_apertus.py:70)
    AttentionOnlyFamily(name="apertus", max_position_embeddings=65536),
    # OlmoeConfig, StableLmConfig, NemotronConfig: 4096 (configuration_olmoe.py:69,
    # configuration_stablelm.py:51, configuration_nemotron.py:61); HyperCLOVAXConfig: 2048
    # (configuration_hyperclovax.py:85)
    AttentionOnlyFamily(name="olmoe", max_position_embeddings=4096),
    AttentionOnlyFamily(name="stablelm", max_position_embeddings=4096),
    AttentionOnlyFamily(name="nemotron", max_position_embeddings=4096),
    AttentionOnlyFamily(name="hyperclovax", max_position_embeddings=2048),
    # Mixtral and Ministral 3: a window on every layer when sliding_window is set (transformers'
    # modeling_mixtral.py / modeling_ministral3.py pass it to every layer's attention; vLLM reads
    # the config's window for every layer), else all full; the configs default it to null.
    # MixtralConfig: 4096 * 32 (configuration_mixtral.py:74); Ministral3Config: 262144
    # (configuration_ministral3.py:81)
    AttentionOnlyFamily(name="mixtral", pattern=UniformWindow(), max_position_embeddings=4096 * 32),
    AttentionOnlyFamily(name="ministral3", pattern=UniformWindow(), max_position_embeddings=262144),
    # gpt-oss: the published configs list layer_types (sliding first, window 128); head_dim 64.
    # GptOssConfig: 131072 (configuration_gpt_oss.py:63)
    AttentionOnlyFamily(
        name="gpt_oss",
        pattern=LocalGlobal(period=2),
        head_dim_required=True,
        max_position_embeddings=131072,
    ),
)


@hookimpl
def kvcore_register_model_families(register: Callable[[ModelFamily], None]) -> None:
    for row in FAMILIES:
        register(row.family())
