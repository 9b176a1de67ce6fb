"""The model-family kit: what a family plugin builds on (public API, used by every built-in family).

A family reads its config through :class:`ConfigFields` (every error names the model type and
the field, e.g. ``gemma3 config: 'text_config.num_key_value_heads' must be an int >= 1 (got
0)``), decides each layer's type (transformers' vocabulary: :data:`FULL`, :data:`SLIDING`,
:data:`CHUNKED`, :data:`LINEAR`, and the cache-less ``mlp`` / ``moe``) and turns the types into
specs with :func:`build_layers`, given one builder per type:

- attention: :func:`attention` gives the per-rank geometry (:class:`Attention`), whose
  ``full()``, ``sliding(window)`` and ``chunked(chunk)`` make specs; :func:`attention_builders`
  maps the three attention types to them, and :func:`attention_layers` builds a model of
  attention layers only; :func:`heads_refusal` and :func:`tp_refusal` say why a ``tp`` does not
  split the heads;
- MLA: :func:`mla`;
- SSM / linear-attention states: :func:`mamba1_state`, :func:`mamba2_state`,
  :func:`gated_delta_net_state`, :func:`kda_state` (with :func:`shard` for the dimensions
  tensor parallelism splits);
  :func:`hybrid_layers` builds a model of full-attention and state layers.

Module names come from :class:`LayerNames`. The family function built from these is registered
as a :class:`kvcore.ModelFamily` (``docs/how-to/add-a-model-family.md``); a family whose layers
are all attention can instead be one row of
:data:`kvcore.plugins.models.attention_only.FAMILIES`.

The rules every family follows (``docs/reference/models.md``):

- *Sizes are required, rules have defaults.* Layer counts, head counts and sizes, windows,
  chunks, MLA ranks and state sizes must be in the config (or follow from the family's documented
  fallback, e.g. ``head_dim = hidden_size // num_attention_heads``); pattern knobs such as
  ``sliding_window_pattern`` take transformers' defaults, as published configs rely on them.
- *An explicit ``layer_types`` always wins* over the family's own pattern fields.
- *Tensor parallelism*: an attention layer keeps ``max(1, kv_heads // tp)`` KV heads per rank,
  an MLA latent is replicated, state channels and heads are sharded and must divide by ``tp``.

This module imports the contract and the built-in spec kinds only (no torch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from kvcore.dtypes import DType, to_dtype
from kvcore.errors import InvalidSpecError, ModelConfigError
from kvcore.hookspecs import hookimpl
from kvcore.limits import MAX_LAYERS, shown
from kvcore.model_family import ModelFamily
from kvcore.model_options import DEFAULT_MODEL_DTYPE, ModelOptions
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.spec import KVCacheSpec
from kvcore.validators import check_int, is_int

#: transformers' layer types that kvcore knows how to cache.
FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"
LINEAR = "linear_attention"
#: A decoder layer attending to an encoder's output (kvcore's name; transformers has none).
CROSS = "cross_attention"
#: Layer types that hold no cache (Nemotron-H's MLP and MoE blocks).
NO_CACHE = frozenset({"mlp", "moe"})
#: Older spellings transformers still reads (``configuration_utils._LEGACY_LAYER_TYPE_REMAP``).
LEGACY_LAYER_TYPES = {"attention": FULL, "mamba": LINEAR}

#: A function that makes the spec of one layer type (called once, when the type first appears).
SpecBuilder = Callable[[], KVCacheSpec]

_MISSING: Any = object()


class ConfigFields:
    """Typed reads of one config object; errors name the model type and the field's path.

    Args:
        data: the config (or a nested part of it, such as ``text_config``).
        model_type: the family name used in messages.
        prefix: the path of ``data`` inside the whole config (``"text_config."``).
        label: what messages start with; default ``"<model_type> config"``.
    """

    def __init__(
        self, data: Mapping[str, Any], model_type: str, prefix: str = "", label: str | None = None
    ) -> None:
        self.data = data
        self.model_type = model_type
        self.prefix = prefix
        self.label = label if label is not None else f"{model_type} config"

    def path(self, key: str) -> str:
        """The field's full path, e.g. ``text_config.sliding_window``."""
        return f"{self.prefix}{key}"

    def error(self, key: str, problem: str) -> ModelConfigError:
        """A :class:`ModelConfigError` about field ``key``: ``<type> config: '<path>' <problem>``.

        Args:
            key: the field, relative to this object.
            problem: what is wrong, e.g. ``"must be an int >= 1 (got 0)"``.

        Returns:
            The error, for the caller to raise.
        """
        return ModelConfigError(f"{self.label}: {self.path(key)!r} {problem}")

    def has(self, key: str) -> bool:
        """Whether ``key`` is present and not ``null``."""
        return self.data.get(key) is not None

    def section(self, key: str) -> ConfigFields:
        """The nested object ``key`` (``text_config``), read with the same model type.

        Args:
            key: the field that holds the nested object.

        Returns:
            Reads of the nested object, whose errors name ``<key>.<field>``.

        Raises:
            ModelConfigError: it is missing or not an object.
        """
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            what = "is missing" if value is None else f"must be a JSON object (got {value!r})"
            raise self.error(key, f"{what}; {self.model_type} configs keep their language model there")
        return ConfigFields(value, self.model_type, f"{self.path(key)}.", self.label)

    def integer(self, key: str, default: int = _MISSING, *, minimum: int = 1) -> int:
        """The int at ``key``.

        Args:
            key: the field.
            default: the value when the field is absent or null; without it the field is required.
            minimum: the smallest value allowed.

        Returns:
            The value.

        Raises:
            ModelConfigError: missing without a default, not an int, or below ``minimum``.
        """
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                if key in self.data:
                    raise self.error(key, "is null; kvcore needs an int there to size the KV cache")
                raise self.error(key, "is missing; kvcore needs it to size the KV cache")
            return int(default)
        return check_int(
            value, repr(self.path(key)), minimum=minimum, error=ModelConfigError, owner=f"{self.label}: "
        )

    def layer_count(self, key: str = "num_hidden_layers", default: int = _MISSING) -> int:
        """The layer count at ``key``: an int in [1, :data:`~kvcore.limits.MAX_LAYERS`].

        Checked before any layer is built, so an absurd count fails at once.

        Args:
            key: the field.
            default: the value when the field is absent or null; without it the field is required.

        Returns:
            The count.

        Raises:
            ModelConfigError: missing without a default, not an int, below 1 or above the cap.
        """
        value = self.integer(key, default)
        if value > MAX_LAYERS:
            raise self.error(
                key,
                f"is {shown(value)}, more than the {MAX_LAYERS:,} layers kvcore plans "
                "(kvcore.limits.MAX_LAYERS); check the config",
            )
        return value

    def optional_integer(self, key: str, *, absent: int | None = None, minimum: int = 1) -> int | None:
        """An int that ``null`` turns off (``"sliding_window": null``).

        Args:
            key: the field.
            absent: the value when the key is missing altogether.
            minimum: the smallest value allowed.

        Returns:
            ``None`` when the field is ``null``, ``absent`` when the key is missing, else the int.

        Raises:
            ModelConfigError: not an int, or below ``minimum``.
        """
        if key not in self.data:
            return absent
        if self.data[key] is None:
            return None
        return self.integer(key, minimum=minimum)

    def boolean(self, key: str, default: bool) -> bool:
        """The bool at ``key`` (``default`` when absent or null).

        Raises:
            ModelConfigError: not true or false.
        """
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false (got {value!r})")
        return value

    def integers(self, key: str) -> list[int] | None:
        """The list of ints at ``key``, or ``None`` when absent or null.

        Raises:
            ModelConfigError: not a list of ints.
        """
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(is_int(v) for v in value):
            raise self.error(key, f"must be a list of ints (got {value!r})")
        return list(value)

    def string(self, key: str) -> str | None:
        """The string at ``key``, or ``None`` when absent or null.

        Raises:
            ModelConfigError: not a string.
        """
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(key, f"must be a string (got {value!r})")
        return value

    def layer_types(self, num_layers: int, key: str = "layer_types") -> list[str] | None:
        """The explicit ``layer_types`` (legacy names mapped), or ``None`` when absent.

        Args:
            num_layers: the layer count the list must match.
            key: where the list is (Nemotron-H dumps it as ``layers_block_type``).

        Returns:
            One type per layer, or ``None`` when the config lists none.

        Raises:
            ModelConfigError: not a list of strings, or its length is not ``num_layers``.
        """
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
            raise self.error(key, f"must be a list of strings (got {value!r})")
        if len(value) != num_layers:
            raise self.error(
                key, f"lists {len(value)} layers but {self.path('num_hidden_layers')!r} is {num_layers}"
            )
        names: list[str] = value
        return [LEGACY_LAYER_TYPES.get(name, name) for name in names]

    def dtype(self, *fallbacks: ConfigFields) -> DType:
        """The model's dtype: ``dtype`` (transformers 5) or ``torch_dtype``.

        Args:
            fallbacks: where else to look, in order (e.g. the wrapper of a ``text_config``).

        Returns:
            The first dtype found here or in ``fallbacks``; :data:`DEFAULT_MODEL_DTYPE` if none.

        Raises:
            ModelConfigError: a dtype field that is not the name of a cache dtype.
        """
        for fields in (self, *fallbacks):
            for key in ("dtype", "torch_dtype"):
                value = fields.data.get(key)
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise fields.error(key, f"must be a dtype name such as 'bfloat16' (got {value!r})")
                try:
                    return to_dtype(value)
                except InvalidSpecError as exc:
                    raise fields.error(key, f"is not a cache dtype: {exc}") from None
        return DEFAULT_MODEL_DTYPE


# -- attention -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Attention:
    """What the attention layers of a model share, per tensor-parallel rank.

    Attributes:
        num_kv_heads: KV heads one rank holds.
        head_size: elements per head.
        dtype: the cache's element type.
        block_size: tokens per block.
    """

    num_kv_heads: int
    head_size: int
    dtype: DType
    block_size: int
    refusal: ModelConfigError | None = attrs.field(default=None, eq=False, repr=False)
    """Why these layers cannot be served as asked (a tp that does not split the heads), raised
    when the first attention spec is made, so that a model's first layer names the problem."""

    def _fields(self) -> dict[str, Any]:
        if self.refusal is not None:
            raise self.refusal
        return {
            "block_size": self.block_size,
            "num_kv_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "dtype": self.dtype,
        }

    def full(self) -> FullAttentionSpec:
        """A full-attention spec."""
        return FullAttentionSpec(**self._fields())

    def sliding(self, window: int) -> SlidingWindowSpec:
        """A sliding-window spec of ``window`` tokens."""
        return SlidingWindowSpec(**self._fields(), sliding_window=window)

    def chunked(self, chunk: int) -> ChunkedLocalAttentionSpec:
        """A chunked-local spec of ``chunk`` tokens."""
        return ChunkedLocalAttentionSpec(**self._fields(), attention_chunk_size=chunk)

    def cross(self, encoder_tokens: int) -> CrossAttentionSpec:
        """A cross-attention spec over an encoder output of ``encoder_tokens`` tokens."""
        return CrossAttentionSpec(**self._fields(), max_encoder_tokens=encoder_tokens)


def head_size(cfg: ConfigFields, *, keys: Sequence[str] = ("head_dim",), derive: bool = True) -> int:
    """The attention head size.

    Args:
        cfg: the config.
        keys: the fields that may state it, in order.
        derive: whether ``hidden_size // num_attention_heads`` (as transformers derives it)
            stands in when none of ``keys`` is present; else ``keys[0]`` is required.

    Returns:
        The head size.

    Raises:
        ModelConfigError: naming the missing or bad field.
    """
    for key in keys:
        if cfg.has(key):
            return cfg.integer(key)
    if not derive:
        raise cfg.error(
            keys[0], f"is missing; {cfg.model_type} configs state their attention head size there"
        )
    hidden = cfg.integer("hidden_size")
    heads = cfg.integer("num_attention_heads")
    if hidden // heads < 1:
        raise cfg.error(
            "hidden_size",
            f"({hidden}) divided by 'num_attention_heads' ({heads}) gives a head size of 0; set 'head_dim'",
        )
    return hidden // heads


def kv_heads(cfg: ConfigFields) -> int:
    """``num_key_value_heads``, or ``num_attention_heads`` when it is absent (multi-head).

    Raises:
        ModelConfigError: naming the missing or bad field.
    """
    heads = cfg.integer("num_attention_heads")
    kv = cfg.integer("num_key_value_heads", default=heads)
    if heads % kv:
        raise cfg.error(
            "num_key_value_heads",
            f"({kv}) must divide 'num_attention_heads' ({heads}): each KV head serves a whole group "
            "of query heads",
        )
    return kv


def heads_refusal(
    cfg: ConfigFields, key: str, heads: int, options: ModelOptions, kv: int | None = None
) -> ModelConfigError | None:
    """Why ``options.tp`` cannot split ``heads`` attention heads evenly across ranks, or ``None``.

    Args:
        cfg: the config, for messages.
        key: the heads' field (``num_attention_heads``, Whisper's ``decoder_attention_heads``).
        heads: the attention heads.
        options: the model options (``tp``).
        kv: the KV heads, when the tps offered must also fit them (see :func:`tp_refusal`).

    Returns:
        The error to raise, naming the tps that fit, or ``None`` when ``tp`` divides the heads.
    """
    tp = options.tp
    if heads % tp == 0:
        return None
    fits = [
        n
        for n in range(1, min(heads, 1024) + 1)
        if heads % n == 0 and (kv is None or kv % n == 0 or n % kv == 0)
    ]
    return cfg.error(
        key,
        f"({heads}) does not divide by tp={tp}; engines split the attention heads evenly across "
        f"tensor-parallel ranks: choose a tp in {fits[:12]}",
    )


def tp_refusal(cfg: ConfigFields, options: ModelOptions, heads: int, kv: int) -> ModelConfigError | None:
    """Why ``options.tp`` cannot split these attention heads, as engines split them, or ``None``.

    ``tp`` must divide the attention heads, and either divide the KV heads (each rank holds
    ``kv // tp``) or be a multiple of them (each KV head is replicated on ``tp // kv`` ranks).

    Args:
        cfg: the config, for messages.
        options: the model options (``tp``).
        heads: ``num_attention_heads``.
        kv: the KV heads.

    Returns:
        The error to raise, or ``None`` when ``tp`` fits.
    """
    tp = options.tp
    refusal = heads_refusal(cfg, "num_attention_heads", heads, options, kv)
    if refusal is not None:
        return refusal
    if kv % tp and tp % kv:
        return cfg.error(
            "num_key_value_heads",
            f"({kv}) and tp={tp} must divide one another (the KV heads are split across ranks, or "
            "replicated when tp is a multiple of them); choose another tp",
        )
    return None


def attention(
    cfg: ConfigFields,
    options: ModelOptions,
    model_dtype: DType,
    *,
    head_dim_keys: Sequence[str] = ("head_dim",),
    derive_head_dim: bool = True,
) -> Attention:
    """The attention geometry of a config for one tensor-parallel rank.

    Args:
        cfg: the config (or its ``text_config``).
        options: the model options (``tp`` divides the KV heads; ``kv_cache_dtype`` and
            ``block_size`` apply).
        model_dtype: the model's dtype (:meth:`ConfigFields.dtype`), used when
            ``kv_cache_dtype`` is auto.
        head_dim_keys: the fields that may state the head size, in order.
        derive_head_dim: see :func:`head_size`.

    Returns:
        KV heads per rank (``max(1, kv_heads // tp)``), head size, cache dtype and block size;
        where ``tp`` does not split the heads (:func:`tp_refusal`), making a spec from it raises.

    Raises:
        ModelConfigError: naming the missing or bad field, or KV heads that do not divide the
            attention heads.
    """
    kv = kv_heads(cfg)
    return Attention(
        num_kv_heads=options.kv_heads_per_rank(kv),
        head_size=head_size(cfg, keys=head_dim_keys, derive=derive_head_dim),
        dtype=options.cache_dtype(model_dtype),
        block_size=options.block_size,
        refusal=tp_refusal(cfg, options, cfg.integer("num_attention_heads"), kv),
    )


# -- layers --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LayerNames:
    """How cache-holding modules are named: ``f"{prefix}.{i}.{attribute}"``.

    Attributes:
        prefix: the decoder layer list, e.g. ``model.layers`` or
            ``model.language_model.layers``.
        attention: the attribute of an attention layer's module (``self_attn``).
        state: the attribute of an SSM / linear-attention module (``mamba``, ``linear_attn``).
        cross: the attribute of a cross-attention module (:data:`CROSS`; ``cross_attn``).
    """

    prefix: str = "model.layers"
    attention: str = "self_attn"
    state: str = "self_attn"
    cross: str = "cross_attn"

    def name(self, index: int, layer_type: str) -> str:
        """The module name of layer ``index`` of type ``layer_type``."""
        if layer_type == LINEAR:
            attribute = self.state
        elif layer_type == CROSS:
            attribute = self.cross
        else:
            attribute = self.attention
        return f"{self.prefix}.{index}.{attribute}"


def build_layers(
    cfg: ConfigFields,
    layer_types: Sequence[str],
    builders: Mapping[str, SpecBuilder],
    names: LayerNames,
    *,
    hint: str = "",
) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` for the layers' types.

    Each builder is called once, when a layer of its type first appears (so a window is only
    required when a sliding layer exists); layers of the types in :data:`NO_CACHE` are left out.

    Args:
        cfg: the config, for messages.
        layer_types: one type per layer, in model order.
        builders: the spec builder of each type this family caches.
        names: how the layers' modules are named.
        hint: appended to the error about a layer type without a builder.

    Returns:
        The cache-holding layers, in model order.

    Raises:
        ModelConfigError: a layer type this family has no builder for (naming
            ``layer_types[i]``), or no layer that holds a cache.
    """
    built: dict[str, KVCacheSpec] = {}
    specs: dict[str, KVCacheSpec] = {}
    for index, layer_type in enumerate(layer_types):
        if layer_type in NO_CACHE:
            continue
        if layer_type not in built:
            builder = builders.get(layer_type)
            if builder is None:
                known = ", ".join(sorted({*builders, *NO_CACHE}))
                raise cfg.error(
                    f"layer_types[{index}]",
                    f"is {layer_type!r}, which a {cfg.model_type} model cannot cache; use one of {known}"
                    + (f"; {hint}" if hint else ""),
                )
            built[layer_type] = builder()
        specs[names.name(index, layer_type)] = built[layer_type]
    if not specs:
        raise ModelConfigError(
            f"{cfg.label}: no layer holds a KV cache or a state (layer types "
            f"{sorted(set(layer_types))}), so there is nothing to plan"
        )
    return specs


def attention_builders(cfg: ConfigFields, geometry: Attention) -> dict[str, SpecBuilder]:
    """Builders for the three attention layer types.

    Args:
        cfg: the config; ``sliding_window`` and ``attention_chunk_size`` are read on first use.
        geometry: the attention geometry (:func:`attention`).

    Returns:
        ``{FULL: ..., SLIDING: ..., CHUNKED: ...}``, a new dict the caller may change.
    """
    return {
        FULL: geometry.full,
        SLIDING: lambda: geometry.sliding(cfg.integer("sliding_window")),
        CHUNKED: lambda: geometry.chunked(cfg.integer("attention_chunk_size")),
    }


def attention_layers(
    cfg: ConfigFields,
    options: ModelOptions,
    layer_types: Sequence[str],
    model_dtype: DType,
    *,
    names: LayerNames | None = None,
    derive_head_dim: bool = True,
    window: int | None = None,
    hint: str = "",
) -> dict[str, KVCacheSpec]:
    """:func:`build_layers` for a model whose layers are all attention of one geometry
    (:func:`attention`): full, sliding and chunked (:func:`attention_builders`).

    Args:
        cfg: the config (or its ``text_config``).
        options: the model options.
        layer_types: one type per layer, in model order.
        model_dtype: the model's dtype (:meth:`ConfigFields.dtype`).
        names: how the layers' modules are named (default :class:`LayerNames`'s).
        derive_head_dim: see :func:`head_size`.
        window: the sliding window when the family's own fields gave it (else
            ``sliding_window`` is read when a sliding layer first appears).
        hint: see :func:`build_layers`.

    Returns:
        The attention layers in model order.

    Raises:
        ModelConfigError: a missing or bad field, or a layer type that is not attention.
    """
    geometry = attention(cfg, options, model_dtype, derive_head_dim=derive_head_dim)
    builders = attention_builders(cfg, geometry)
    if window is not None:
        builders[SLIDING] = partial(geometry.sliding, window)
    return build_layers(cfg, layer_types, builders, names or LayerNames(), hint=hint)


def hybrid_layers(
    cfg: ConfigFields,
    options: ModelOptions,
    layer_types: Sequence[str],
    state: Callable[[DType], KVCacheSpec],
    *,
    state_module: str,
    attention_module: str = "self_attn",
    head_dim_keys: Sequence[str] = ("head_dim",),
    derive_head_dim: bool = True,
) -> dict[str, KVCacheSpec]:
    """:func:`build_layers` for a hybrid: :data:`FULL` attention layers and :data:`LINEAR` ones
    holding an SSM or linear-attention state (Jamba, Nemotron-H, Qwen3-Next).

    Each spec is made when a layer of its type first appears, so a model without attention
    layers needs no attention fields.

    Args:
        cfg: the config.
        options: the model options.
        layer_types: one type per layer, in model order (``mlp`` / ``moe`` hold no cache).
        state: the state spec of one layer, given the state's element type
            (``options.state_cache_dtype`` of the model's dtype).
        state_module: the attribute of a state layer's module (``mamba``, ``linear_attn``).
        attention_module: the attribute of an attention layer's module.
        head_dim_keys: see :func:`attention`.
        derive_head_dim: see :func:`head_size`.

    Returns:
        The cache-holding layers in model order, named ``model.layers.{i}.{attribute}``.

    Raises:
        ModelConfigError: a missing or bad field, or a layer type the hybrid cannot cache.
    """
    dtype = cfg.dtype()

    def full() -> KVCacheSpec:
        return attention(
            cfg, options, dtype, head_dim_keys=head_dim_keys, derive_head_dim=derive_head_dim
        ).full()

    builders = {FULL: full, LINEAR: lambda: state(options.state_cache_dtype(dtype))}
    return build_layers(
        cfg, layer_types, builders, LayerNames(attention=attention_module, state=state_module)
    )


# -- states (SSM and linear attention) -----------------------------------------------------
#
# Each state builder takes the config (``cfg``, for messages), the model options (``tp`` shards
# the dimensions it names; ``block_size``) and the state's element type (``dtype``:
# ``options.state_cache_dtype(model dtype)``), then its own sizes; it returns the state spec of
# one layer on one rank, whose convolution keeps the last ``conv_kernel - 1`` inputs (the
# current one is computed), as inference engines store it (transformers keeps ``conv_kernel``).


def _conv_state(
    options: ModelOptions,
    dtype: DType,
    conv_kernel: int,
    channels: int,
    state: StatePart,
    *,
    checkpoint_slots: int = 0,
    checkpoint_alignment: int = 0,
) -> StateSpec:
    """A state of a convolution over ``channels`` and the recurrent ``state`` part, with the
    prefill checkpoint states vLLM's mixer asks for in align mode (:class:`StateSpec`)."""
    conv = StatePart(name="conv", shape=(conv_kernel - 1, channels), dtype=dtype)
    return StateSpec(
        block_size=options.block_size,
        parts=(conv, state),
        checkpoint_slots=checkpoint_slots,
        checkpoint_alignment=checkpoint_alignment,
    )


def shard(cfg: ConfigFields, key: str, value: int, options: ModelOptions) -> int:
    """``value // tp`` for a state dimension that tensor parallelism splits.

    Args:
        cfg: the config, for messages.
        key: the field (or expression) ``value`` came from, for messages.
        value: the dimension.
        options: the model options (``tp``).

    Returns:
        The dimension on one rank.

    Raises:
        ModelConfigError: ``value`` does not divide by ``tp``; names the field and the tp.
    """
    if value % options.tp:
        raise cfg.error(
            key, f"is {value}, which tp={options.tp} does not divide; choose a tp that divides it"
        )
    return value // options.tp


def mamba1_state(
    cfg: ConfigFields,
    options: ModelOptions,
    dtype: DType,
    *,
    inner: tuple[str, int],
    state_size: int,
    conv_kernel: int,
) -> StateSpec:
    """A Mamba-1 state: conv ``(conv_kernel - 1, inner / tp)`` and SSM ``(inner / tp, state_size)``
    (vLLM's ``mamba1_state_shape``).

    Args:
        inner: ``(field, value)`` of the inner width (``d_inner = expand * hidden_size``); it
            must divide by ``tp``.
        state_size: the SSM state size (``d_state``).
        conv_kernel: the convolution's kernel size.

    Raises:
        ModelConfigError: ``tp`` does not divide the inner width.
    """
    width = shard(cfg, inner[0], inner[1], options)
    ssm = StatePart(name="ssm", shape=(width, state_size), dtype=dtype)
    return _conv_state(options, dtype, conv_kernel, width, ssm)


def mamba2_groups(cfg: ConfigFields, key: str, n_groups: int, options: ModelOptions) -> int:
    """Mamba-2 groups after tensor parallelism.

    Args:
        cfg: the config, for messages.
        key: the groups' field, for messages.
        n_groups: the groups in the config.
        options: the model options (``tp``).

    Returns:
        ``n_groups`` when ``tp`` divides it; ``tp`` when ``n_groups`` divides ``tp`` (the groups
        are replicated so that every rank holds one group's B and C).

    Raises:
        ModelConfigError: neither divides the other.
    """
    if n_groups % options.tp == 0:
        return n_groups
    if options.tp % n_groups == 0:
        return options.tp
    raise cfg.error(key, f"({n_groups}) and tp={options.tp} must divide one another; choose another tp")


def mamba2_state(
    cfg: ConfigFields,
    options: ModelOptions,
    dtype: DType,
    *,
    heads: tuple[str, int],
    head_dim: int,
    n_groups: tuple[str, int],
    state_size: int,
    conv_kernel: int,
    inner: tuple[str, int] | None = None,
) -> StateSpec:
    """A Mamba-2 state: conv ``(conv_kernel - 1, (inner + 2*groups*state_size) / tp)`` and SSM
    ``(heads / tp, head_dim, state_size)`` (vLLM's ``mamba2_state_shape``), where ``inner`` is
    ``heads*head_dim`` unless the family gives vLLM another width (Mamba-2, Zamba2,
    GraniteMoeHybrid: ``expand * hidden_size``; Falcon-H1: ``mamba_d_ssm``).

    With one prefill checkpoint state, on alignment 1: vLLM 0.33's ``MambaMixer2``, which every
    family here runs, asks for it whatever the backend (``get_kv_cache_spec`` in
    ``vllm/model_executor/layers/mamba/mamba_mixer2.py``); it is held in align mode only.

    Args:
        heads: ``(field, value)`` of the SSM heads; they must divide by ``tp``.
        head_dim: elements per SSM head.
        n_groups: ``(field, value)`` of the groups; see :func:`mamba2_groups`.
        state_size: the SSM state size.
        conv_kernel: the convolution's kernel size.
        inner: ``(field, value)`` of the SSM's inner width where it is not ``heads*head_dim``;
            it must divide by ``tp``.

    Raises:
        ModelConfigError: ``tp`` does not divide the heads, or does not fit the groups.
    """
    heads_per_rank = shard(cfg, heads[0], heads[1], options)
    groups_per_rank = mamba2_groups(cfg, n_groups[0], n_groups[1], options) // options.tp
    width = heads_per_rank * head_dim if inner is None else shard(cfg, inner[0], inner[1], options)
    conv_channels = width + 2 * groups_per_rank * state_size
    ssm = StatePart(name="ssm", shape=(heads_per_rank, head_dim, state_size), dtype=dtype)
    return _conv_state(
        options, dtype, conv_kernel, conv_channels, ssm, checkpoint_slots=1, checkpoint_alignment=1
    )


def gated_delta_net_state(
    cfg: ConfigFields,
    options: ModelOptions,
    dtype: DType,
    *,
    key_heads: tuple[str, int],
    value_heads: tuple[str, int],
    key_head_dim: int,
    value_head_dim: int,
    conv_kernel: int,
    recurrent_dtype: DType | None = None,
) -> StateSpec:
    """A gated-delta-net state (Qwen3-Next, Qwen3.5): conv ``(conv_kernel - 1, (2*kh*kd + vh*vd) /
    tp)`` and recurrent ``(vh / tp, vd, kd)`` (vLLM's ``gated_delta_net_state_shape``).

    With one prefill checkpoint state: vLLM 0.33 holds it in align mode where the layer's
    prefill runs FlashInfer's GDN kernel, its default on Hopper GPUs (H100, H200) and on
    Blackwell with key heads of 128 (``_resolve_gdn_prefill_backend`` in
    ``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``), and not elsewhere: kvcore
    counts it everywhere, so that a plan never promises more requests than those GPUs hold (one
    state a layer more than a Triton run needs). Its alignment is vLLM's prefix-cache grid,
    known to the engine only (0 here).

    Args:
        key_heads: ``(field, value)`` of the key heads; they must divide by ``tp``.
        value_heads: ``(field, value)`` of the value heads; they must divide by ``tp``.
        key_head_dim: elements per key head.
        value_head_dim: elements per value head.
        conv_kernel: the convolution's kernel size.
        recurrent_dtype: the recurrent state's element type when it differs from the
            convolution's (Qwen3.5's ``mamba_ssm_dtype``); default ``dtype``.

    Raises:
        ModelConfigError: ``tp`` does not divide the key or value heads.
    """
    kh = shard(cfg, key_heads[0], key_heads[1], options)
    vh = shard(cfg, value_heads[0], value_heads[1], options)
    recurrent = StatePart(
        name="recurrent", shape=(vh, value_head_dim, key_head_dim), dtype=recurrent_dtype or dtype
    )
    channels = 2 * kh * key_head_dim + vh * value_head_dim
    return _conv_state(options, dtype, conv_kernel, channels, recurrent, checkpoint_slots=1)


def kda_state(
    cfg: ConfigFields,
    options: ModelOptions,
    dtype: DType,
    *,
    heads: tuple[str, int],
    head_dim: int,
    conv_kernel: int,
    recurrent_dtype: DType,
) -> StateSpec:
    """A Kimi delta attention (KDA) state (Kimi-Linear): conv ``(conv_kernel - 1, 3*h*d / tp)``
    over the queries, keys and values, and recurrent ``(h / tp, d, d)``.

    vLLM 0.32's ``MambaStateShapeCalculator.kda_state_shape``
    (``vllm/model_executor/layers/mamba/mamba_utils.py:304-327``): ``conv_dim = proj_size + 2 *
    proj_k_size`` with the key heads and head size equal to the value ones (Kimi-Linear passes
    neither), state length ``conv_kernel_size - 1``; recurrent ``(num_heads / tp, head_dim,
    head_dim)``. Its ``kda_state_dtype`` (same file, ``:133-149``) keeps the recurrent state in
    float32 unless ``mamba_ssm_cache_dtype`` says otherwise.

    Args:
        heads: ``(field, value)`` of the KDA heads; they must divide by ``tp``.
        head_dim: elements per head (queries, keys and values alike).
        conv_kernel: the short convolution's kernel size.
        recurrent_dtype: the recurrent state's element type.

    Raises:
        ModelConfigError: ``tp`` does not divide the heads.
    """
    h = shard(cfg, heads[0], heads[1], options)
    recurrent = StatePart(name="recurrent", shape=(h, head_dim, head_dim), dtype=recurrent_dtype)
    return _conv_state(options, dtype, conv_kernel, 3 * h * head_dim, recurrent)


def mla(cfg: ConfigFields, options: ModelOptions, model_dtype: DType) -> MLAAttentionSpec:
    """An MLA spec from ``kv_lora_rank`` and ``qk_rope_head_dim`` (replicated across tp ranks).

    Args:
        cfg: the config.
        options: the model options (``kv_cache_dtype`` and ``block_size`` apply).
        model_dtype: the model's dtype, used when ``kv_cache_dtype`` is auto.

    Returns:
        The MLA spec of every layer.

    Raises:
        ModelConfigError: either field is missing or bad, or ``tp`` does not divide
            ``num_attention_heads`` (engines split the query heads across ranks).
    """
    if cfg.has("num_attention_heads"):
        refusal = heads_refusal(cfg, "num_attention_heads", cfg.integer("num_attention_heads"), options)
        if refusal is not None:
            raise refusal
    return MLAAttentionSpec(
        block_size=options.block_size,
        kv_lora_rank=cfg.integer("kv_lora_rank"),
        qk_rope_head_dim=cfg.integer("qk_rope_head_dim"),
        dtype=options.cache_dtype(model_dtype),
    )


def family_hook(*families: ModelFamily) -> Callable[[Callable[[ModelFamily], None]], None]:
    """The ``kvcore_register_model_families`` implementation that registers ``families``.

    Bind it to that name at module level (pluggy finds hook implementations by name)::

        kvcore_register_model_families = family_hook(FAMILY)
    """

    @hookimpl
    def kvcore_register_model_families(register: Callable[[ModelFamily], None]) -> None:
        for family in families:
            register(family)

    return kvcore_register_model_families
