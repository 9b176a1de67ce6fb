"""Built-in parameter counts: every built-in family's weights, counted from ``config.json``.

Implements ``kvcore_count_parameters`` (``trylast=True``, so a plugin's own count of a model
type wins) with one counting function per model type, :data:`COUNTERS`; a plugin can also add a
row to it through the hook (see ``docs/reference/hooks.md``). Each function returns a
:class:`kvcore.ParameterCount` whose groups are what the checkpoint holds:

- embeddings (``vocab_size x hidden_size``) and, unless ``tie_word_embeddings``, the lm_head;
- attention: Q, K, V and O projections (with biases where the family has them, Qwen3 / Gemma 3
  QK norms, gpt-oss sinks), or MLA's low-rank projections (DeepSeek);
- the MLP: gated (``3 x hidden x intermediate``) or plain (Nemotron-H), with biases where the
  family has them; a mixture of experts: the routed experts, shared experts and the router;
- norms (two per layer, four on Gemma 2 / 3 / 4, plus the final one);
- DeepSeek-V4's compressors, Lightning indexer and hyper-connections;
- SSM and linear-attention mixers of hybrids (Jamba's Mamba-1, Nemotron-H's Mamba-2,
  Qwen3-Next's and Qwen3.5's gated delta nets, Kimi-Linear's Kimi delta attention);
- Gemma 4's per-layer input embeddings, and the K / V projections its shared-KV and K = V
  layers do not have;
- vision and audio towers where the config describes them (Gemma 3's SigLIP, Qwen3.5's vision
  tower, Llama 4's and Llama-3.2-Vision's encoders, Whisper's audio encoder); Gemma 4's towers
  are left out, and the notes say so.

Counts follow the transformers modules of each architecture. What they leave out is said in
``ParameterCount.notes`` (a tower the config omits, DeepSeek-V3's MTP layer). A model type with
no row is counted as a Llama-like decoder when its config has the fields, and the note says it
is an estimate. ``tests/plugins/models/test_parameters.py`` checks every bundled model against its
published parameter count; ``tests/plugins/models/test_recent_families.py`` holds the counts of
Gemma 4, Qwen3.5 and Kimi-Linear, and ``tests/plugins/models/test_deepseek_v4.py`` DeepSeek-V4's,
to the parameters of the transformers model built from the same config.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from kvcore.dtypes import DType
from kvcore.hookspecs import hookimpl
from kvcore.model_weights import ParameterCount, WeightGroup
from kvcore.plugins.models.deepseek_v4 import INDEXED_RATIO, layer_ratios
from kvcore.plugins.models.gemma3n import (
    layer_types as gemma3n_layer_types,
    text_fields as gemma3n_text_fields,
)
from kvcore.plugins.models.gemma4 import (
    layer_geometry,
    layer_types as gemma4_layer_types,
    per_layer_overrides,
    reuse_layers,
)
from kvcore.plugins.models.kimi_linear import layer_types as kimi_layer_types
from kvcore.plugins.models.kit import FULL, LINEAR, ConfigFields, head_size, kv_heads
from kvcore.plugins.models.nemotron_h import layer_types as nemotron_h_layer_types

#: A counting function: the whole config in, the count out.
Counter = Callable[[Mapping[str, Any]], ParameterCount]


class Groups:
    """Collects :class:`~kvcore.WeightGroup` parameters, adding up groups of one name, module
    and quantizability (public: plugin authors build their counts with it)."""

    def __init__(self) -> None:
        self._params: dict[tuple[str, str, bool], int] = {}

    def add(self, name: str, module: str, params: int, *, quantizable: bool = True) -> None:
        """Add ``params`` parameters to group ``name`` at ``module``.

        Args:
            name: what they are (``"attention"``).
            module: where their modules are (``"model.layers.*.self_attn"``).
            params: how many (0 adds nothing).
            quantizable: linear weight matrices (see :class:`~kvcore.WeightGroup`).
        """
        if params:
            key = (name, module, quantizable)
            self._params[key] = self._params.get(key, 0) + params

    def linear(
        self, name: str, module: str, d_in: int, d_out: int, *, bias: bool = False, count: int = 1
    ) -> None:
        """``count`` linear layers of ``d_in -> d_out``: the weights quantizable, a bias not."""
        self.add(name, module, count * d_in * d_out)
        if bias:
            self.add(name, module, count * d_out, quantizable=False)

    def vector(self, name: str, module: str, params: int) -> None:
        """Parameters quantization never converts (norms, biases, convolutions, embeddings)."""
        self.add(name, module, params, quantizable=False)

    def groups(self) -> tuple[WeightGroup, ...]:
        """The groups, in the order first added."""
        return tuple(
            WeightGroup(name=name, module=module, params=params, quantizable=quantizable)
            for (name, module, quantizable), params in self._params.items()
        )


def embeddings(
    groups: Groups,
    vocab: int,
    hidden: int,
    *,
    tied: bool,
    embed: str = "model.embed_tokens",
    head: str = "lm_head",
) -> None:
    """The input embeddings and, unless ``tied``, the lm_head (never quantized by default)."""
    groups.vector("embeddings", embed, vocab * hidden)
    if not tied:
        groups.vector("lm_head", head, vocab * hidden)


def attention_projections(
    groups: Groups,
    module: str,
    *,
    hidden: int,
    heads: int,
    kv: int,
    head_dim: int,
    layers: int,
    qkv_bias: bool = False,
    o_bias: bool = False,
    qk_norm: bool = False,
) -> int:
    """Q, K, V, O of ``layers`` attention layers; returns the per-token width of Q, K and V."""
    q, k = heads * head_dim, kv * head_dim
    groups.linear("attention", module, hidden, q, bias=qkv_bias, count=layers)
    groups.linear("attention", module, hidden, k, bias=qkv_bias, count=2 * layers)
    groups.linear("attention", module, q, hidden, bias=o_bias, count=layers)
    if qk_norm:
        groups.vector("norms", module, 2 * head_dim * layers)
    return q + 2 * k


def gated_mlp(
    groups: Groups, name: str, module: str, hidden: int, inner: int, *, count: int, bias: bool = False
) -> None:
    """``count`` gated MLPs (gate, up, down) of width ``inner``."""
    groups.linear(name, module, hidden, inner, bias=bias, count=2 * count)
    groups.linear(name, module, inner, hidden, bias=bias, count=count)


def config_attention(
    groups: Groups,
    cfg: ConfigFields,
    module: str = "model.layers.*.self_attn",
    *,
    layers: int,
    head_dim: int | None = None,
    bias: bool | None = None,
    qkv_bias: bool = False,
    qk_norm: bool = False,
) -> int:
    """:func:`attention_projections` with the widths ``cfg`` states: ``hidden_size``,
    ``num_attention_heads``, the KV heads (:func:`kv_heads`) and the head size
    (:func:`head_size`, unless ``head_dim`` is given).

    Args:
        bias: whether the Q, K, V and O projections have biases; ``None`` reads the config's
            ``attention_bias`` (default false).
        qkv_bias: Q, K and V have biases whatever ``bias`` says (Qwen 2).

    Returns:
        The per-token width of Q, K and V.
    """
    if bias is None:
        bias = cfg.boolean("attention_bias", False)
    return attention_projections(
        groups,
        module,
        hidden=cfg.integer("hidden_size"),
        heads=cfg.integer("num_attention_heads"),
        kv=kv_heads(cfg),
        head_dim=head_size(cfg) if head_dim is None else head_dim,
        layers=layers,
        qkv_bias=qkv_bias or bias,
        o_bias=bias,
        qk_norm=qk_norm,
    )


def _decoder(
    cfg: ConfigFields,
    *outer: ConfigFields,
    tied: bool = False,
    vocab: int | None = None,
    embed: str = "model.embed_tokens",
    head: str = "lm_head",
) -> tuple[Groups, int, int, int]:
    """New groups holding a text decoder's embeddings (and lm_head unless tied: ``tied`` is the
    family's default, the config or an ``outer`` section may say otherwise), with its layer
    count, hidden size and vocabulary (``vocab`` when the family defaults it)."""
    n, hidden = cfg.layer_count(), cfg.integer("hidden_size")
    vocab = cfg.integer("vocab_size") if vocab is None else vocab
    groups = Groups()
    embeddings(groups, vocab, hidden, tied=_tied(cfg, tied, *outer), embed=embed, head=head)
    return groups, n, hidden, vocab


def _tied(cfg: ConfigFields, default: bool, *outer: ConfigFields) -> bool:
    for fields in (cfg, *outer):
        if "tie_word_embeddings" in fields.data:
            return fields.boolean("tie_word_embeddings", default)
    return default


def _count(
    groups: Groups, dtype: DType, hidden: int, vocab: int, width: int, notes: tuple[str, ...] = ()
) -> ParameterCount:
    return ParameterCount(
        groups=groups.groups(),
        dtype=dtype,
        hidden_size=hidden,
        vocab_size=vocab,
        activation_width=width,
        notes=notes,
    )


# -- decoder-only attention families (the attention_only table, Llama 4) --------------------

#: Per model type: (norms per layer, tie_word_embeddings default, QKV bias, QK norm, vocab default).
_DENSE: dict[str, tuple[int, bool, bool, bool, int | None]] = {
    "llama": (2, False, False, False, None),
    "mistral": (2, False, False, False, None),
    "qwen2": (2, False, True, False, None),
    "qwen3": (2, False, False, True, None),
    "phi3": (2, False, False, False, None),
    "gemma2": (4, True, False, False, None),
    "gemma3_text": (4, True, False, True, 262_208),
    "gemma3": (4, True, False, True, 262_208),
}


def dense_decoder(config: Mapping[str, Any]) -> ParameterCount:
    """Llama, Mistral, Qwen 2 / 3, Phi-3, Gemma 2 / 3 (Gemma 3's SigLIP tower included)."""
    model_type = str(config["model_type"])
    top = ConfigFields(config, model_type)
    cfg = top.section("text_config") if model_type == "gemma3" else top
    norms_per_layer, tied_default, qkv_bias, qk_norm, vocab_default = _DENSE[model_type]
    vocab = cfg.integer("vocab_size", vocab_default) if vocab_default else None
    groups, n, hidden, vocab = _decoder(cfg, top, tied=tied_default, vocab=vocab)
    layers = "model.language_model.layers" if model_type == "gemma3" else "model.layers"
    qkv = config_attention(groups, cfg, f"{layers}.*.self_attn", layers=n, qkv_bias=qkv_bias, qk_norm=qk_norm)
    inner = cfg.integer("intermediate_size")
    gated_mlp(groups, "mlp", f"{layers}.*.mlp", hidden, inner, count=n, bias=cfg.boolean("mlp_bias", False))
    groups.vector("norms", f"{layers}.*", (norms_per_layer * n + 1) * hidden)
    if model_type == "gemma3":
        siglip_tower(groups, top.section("vision_config"), text_hidden=hidden)
    return _count(groups, cfg.dtype(top), hidden, vocab, max(3 * inner, qkv))


# -- decoders described by data: dense and mixture-of-experts rows ------------------------


def _always(cfg: ConfigFields, n: int) -> list[bool]:
    """Every layer has the mixture of experts (Mixtral, OLMoE, Granite-MoE)."""
    return [True] * n


def _sparse_step(cfg: ConfigFields, n: int) -> list[bool]:
    """Qwen2-MoE / Qwen3-MoE: layer ``i`` has experts iff it is not in ``mlp_only_layers``,
    ``num_experts`` is positive and ``(i + 1) % decoder_sparse_step == 0``
    (transformers' ``Qwen2MoeDecoderLayer`` / ``Qwen3MoeDecoderLayer``)."""
    step = cfg.integer("decoder_sparse_step", 1)
    dense_only = set(cfg.integers("mlp_only_layers") or [])
    return [i not in dense_only and (i + 1) % step == 0 for i in range(n)]


def _ernie_interval(cfg: ConfigFields, n: int) -> list[bool]:
    """ERNIE 4.5 MoE: layer ``i`` has experts iff ``(i + 1) % moe_layer_interval == 0`` and
    ``moe_layer_start_index <= i <= moe_layer_end_index`` (transformers'
    ``Ernie4_5_MoeDecoderLayer``; the end defaults to the last layer)."""
    interval = cfg.integer("moe_layer_interval", 1)
    first = cfg.integer("moe_layer_start_index", 0, minimum=0)
    last = n - 1
    if cfg.data.get("moe_layer_end_index") is not None:
        last = cfg.integer("moe_layer_end_index", minimum=0)
    return [(i + 1) % interval == 0 and first <= i <= last for i in range(n)]


def _mlp_layer_types(cfg: ConfigFields, n: int) -> list[bool]:
    """Cohere 2 MoE: experts where ``mlp_layer_types`` says ``sparse``, a dense MLP where it says
    ``dense``; without the list, dense on the first ``first_k_dense_replace`` layers (default 0)."""
    types = cfg.data.get("mlp_layer_types")
    if isinstance(types, list):
        if len(types) != n:
            raise cfg.error("mlp_layer_types", f"lists {len(types)} layers, not {n}")
        return [t == "sparse" for t in types]
    first = cfg.integer("first_k_dense_replace", 0, minimum=0)
    return [i >= first for i in range(n)]


@attrs.frozen(kw_only=True)
class Experts:
    """A family's mixture of experts, as its config states it (public: a plugin counting a MoE
    family of its own builds one). Every field naming a config key says which key is read.

    Attributes:
        count: the keys of the routed experts' number, the first present read.
        inner: the key of one routed expert's width (``moe_intermediate_size``, or
            ``intermediate_size`` where the family's experts are as wide as a dense MLP).
        layers: which layers hold the experts (the others a dense MLP).
        dense_inner: the key of the dense MLP's width on the other layers.
        shared_inner: the key of one shared expert's width (``shared_expert_intermediate_size``;
            0 or absent: none).
        shared_count: the key of the number of shared experts, each ``shared_width`` wide
            (``moe_num_shared_experts``), read where ``shared_inner`` is not set.
        shared_width: the key of the width each of ``shared_count`` shared experts has.
        shared_gate: a ``hidden -> 1`` gate scales the shared expert (Qwen2-MoE).
        router_bias: the router keeps a per-expert ``e_score_correction_bias`` (ERNIE 4.5).
        top_k: the keys of the experts each token is routed to (for the activation width).
    """

    count: tuple[str, ...]
    inner: str
    layers: Callable[[ConfigFields, int], list[bool]] = _always
    dense_inner: str = "intermediate_size"
    shared_inner: str | None = None
    shared_count: str | None = None
    shared_width: str = "moe_intermediate_size"
    shared_gate: bool = False
    router_bias: bool = False
    top_k: tuple[str, ...] = ("num_experts_per_tok",)

    def number(self, cfg: ConfigFields) -> int:
        """The routed experts (0 when the config states none)."""
        for key in self.count:
            if cfg.has(key):
                return cfg.integer(key, minimum=0)
        return 0

    def shared(self, cfg: ConfigFields) -> int:
        """The width of all shared experts together (0: none)."""
        if self.shared_inner is not None and cfg.data.get(self.shared_inner) is not None:
            return cfg.integer(self.shared_inner, 0, minimum=0)
        if self.shared_count is not None and cfg.data.get(self.shared_count) is not None:
            return cfg.integer(self.shared_count, 0, minimum=0) * cfg.integer(self.shared_width)
        return 0


def moe_block(
    groups: Groups,
    cfg: ConfigFields,
    experts: Experts,
    module: str,
    hidden: int,
    *,
    gated: bool = True,
    bias: bool = False,
) -> int:
    """The MLPs of every layer of a decoder whose layers :attr:`Experts.layers` picks hold a
    mixture of experts: per such layer the router (``hidden x experts``, plus the score bias),
    the routed experts (gated or not, of ``inner``), the shared experts (and their gate); a dense
    MLP of ``dense_inner`` on the others (the dense and shared MLPs with biases where ``bias``;
    the routed experts never have any). Returns the widest MLP activation per token.

    Shared by the families whose layers mix dense and MoE MLPs (Mixtral, OLMoE, Granite-MoE,
    Qwen2/3-MoE, ERNIE 4.5 MoE, Cohere 2 MoE)."""
    n = cfg.layer_count()
    number = experts.number(cfg)
    sparse = [is_moe and number > 0 for is_moe in experts.layers(cfg, n)]
    moe, dense = sparse.count(True), sparse.count(False)
    parts = 3 if gated else 2
    width = 0
    if dense:
        dense_inner = cfg.integer(experts.dense_inner)
        groups.linear("mlp", module, hidden, dense_inner, bias=bias, count=(parts - 1) * dense)
        groups.linear("mlp", module, dense_inner, hidden, bias=bias, count=dense)
        width = parts * dense_inner
    if moe:
        inner = cfg.integer(experts.inner)
        groups.add("router", f"{module}.gate", hidden * number * moe, quantizable=False)
        if experts.router_bias:
            groups.vector("router", f"{module}.gate", number * moe)
        groups.linear("experts", f"{module}.experts", hidden, inner, count=(parts - 1) * number * moe)
        groups.linear("experts", f"{module}.experts", inner, hidden, count=number * moe)
        shared = experts.shared(cfg)
        if shared:
            groups.linear(
                "shared experts",
                f"{module}.shared_experts",
                hidden,
                shared,
                bias=bias,
                count=(parts - 1) * moe,
            )
            groups.linear("shared experts", f"{module}.shared_experts", shared, hidden, bias=bias, count=moe)
            if experts.shared_gate:
                groups.add("shared experts", f"{module}.shared_expert_gate", hidden * moe, quantizable=False)
        top_k = next((cfg.integer(key) for key in experts.top_k if cfg.has(key)), 1)
        width = max(width, parts * (inner * top_k + shared))
    return width


@attrs.frozen(kw_only=True)
class Decoder:
    """A Llama-like decoder family described by data (one row of :data:`DECODERS`): each
    attribute says which config field it reads or what transformers' modules hold.

    Attributes:
        tied: ``tie_word_embeddings``' default in the family's config class.
        bias: the config key that puts biases on Q, K, V and O (``attention_bias``).
        qkv_bias: the config key that puts biases on Q, K and V only (Qwen2-MoE's ``qkv_bias``,
            StableLM's ``use_qkv_bias``); ``qkv_bias_default`` when absent.
        qk_norm: ``"head"``: one norm of ``head_dim`` on queries and one on keys (Qwen3, Apertus);
            ``"width"``: norms over the whole query and key projections (OLMoE).
        gated: the MLPs are gated (gate, up, down) rather than plain (up, down: Apertus,
            Nemotron).
        mlp_bias: the config key that puts biases on the MLPs (``mlp_bias``).
        norms: norms per layer (one on parallel blocks: Cohere).
        norm_bias: the norms are LayerNorms with a bias (Nemotron's ``LayerNorm1P``).
        sinks: one attention sink per head on every layer (Granite-SWA).
        head_bias: the config key that puts a bias on the lm_head (ERNIE 4.5's ``use_bias``).
        qk_norm_key: the config key without which there is no QK norm (StableLM's
            ``qk_layernorm``); ``None``: ``qk_norm`` always applies.
        optional_norms: ``(key, default, norms)``: a config flag that adds ``norms`` per layer
            when true (HyperCLOVAX's ``use_post_norm``: 2; StableLM's ``use_parallel_residual``:
            -1, one norm fewer).
        experts: the mixture of experts, if the family has one.
        activation_params: parameters of a learned activation, per layer, when ``hidden_act``
            names it (Apertus' xIELU: ``alpha_p`` and ``alpha_n``).
    """

    tied: bool = False
    bias: str | None = "attention_bias"
    qkv_bias: str | None = None
    qkv_bias_default: bool = False
    qk_norm: str | None = None
    gated: bool = True
    mlp_bias: str | None = "mlp_bias"
    norms: int = 2
    norm_bias: bool = False
    sinks: bool = False
    head_bias: str | None = None
    qk_norm_key: str | None = None
    optional_norms: tuple[str, bool, int] | None = None
    experts: Experts | None = None
    activation_params: Mapping[str, int] = attrs.field(factory=dict)


def decoder(config: Mapping[str, Any], shape: Decoder) -> ParameterCount:
    """The count of a decoder family :data:`DECODERS` describes: embeddings (and the lm_head
    unless tied), attention (``hidden_size``, ``num_attention_heads``, the KV heads and head
    size), the MLPs or :func:`moe_block`, the norms."""
    model_type = str(config["model_type"])
    cfg = ConfigFields(config, model_type)
    groups, n, hidden, vocab = _decoder(cfg, tied=shape.tied)
    bias = cfg.boolean(shape.bias, False) if shape.bias else False
    qkv_bias = cfg.boolean(shape.qkv_bias, shape.qkv_bias_default) if shape.qkv_bias else False
    heads, kv, head_dim = cfg.integer("num_attention_heads"), kv_heads(cfg), head_size(cfg)
    qk_norm = shape.qk_norm if shape.qk_norm_key is None or cfg.boolean(shape.qk_norm_key, False) else None
    qkv = attention_projections(
        groups,
        _ATTENTION,
        hidden=hidden,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        layers=n,
        qkv_bias=bias or qkv_bias,
        o_bias=bias,
        qk_norm=qk_norm == "head",
    )
    if qk_norm == "width":
        groups.vector("norms", _ATTENTION, n * (heads + kv) * head_dim)
    if shape.sinks:
        groups.vector("attention", _ATTENTION, n * heads)
    if shape.head_bias and cfg.boolean(shape.head_bias, False):
        groups.vector("lm_head", "lm_head", vocab)
    mlp = "model.layers.*.mlp"
    mlp_bias = cfg.boolean(shape.mlp_bias, False) if shape.mlp_bias else False
    if shape.experts is not None:
        width = moe_block(groups, cfg, shape.experts, mlp, hidden, gated=shape.gated, bias=mlp_bias)
    else:
        inner = cfg.integer("intermediate_size")
        groups.linear("mlp", mlp, hidden, inner, bias=mlp_bias, count=(2 if shape.gated else 1) * n)
        groups.linear("mlp", mlp, inner, hidden, bias=mlp_bias, count=n)
        width = (3 if shape.gated else 2) * inner
    groups.vector("mlp", mlp, n * shape.activation_params.get(str(config.get("hidden_act")), 0))
    norms = shape.norms
    if shape.optional_norms is not None:
        key, default, added = shape.optional_norms
        norms += added if cfg.boolean(key, default) else 0
    per_norm = 2 * hidden if shape.norm_bias else hidden
    groups.vector("norms", "model.layers.*", (norms * n + 1) * per_norm)
    return _count(groups, cfg.dtype(), hidden, vocab, max(width, qkv))


def siglip_tower(groups: Groups, vision: ConfigFields, *, text_hidden: int) -> None:
    """Gemma 3's SigLIP encoder and its projector into the language model."""
    h, inner = vision.integer("hidden_size"), vision.integer("intermediate_size")
    patch, image = vision.integer("patch_size"), vision.integer("image_size")
    channels = vision.integer("num_channels", 3)
    module = "model.vision_tower"
    groups.vector("vision tower", module, channels * patch * patch * h + h + (image // patch) ** 2 * h)
    n = vision.layer_count()
    groups.linear("vision tower", module, h, h, bias=True, count=4 * n)
    groups.linear("vision tower", module, h, inner, bias=True, count=n)
    groups.linear("vision tower", module, inner, h, bias=True, count=n)
    groups.vector("vision tower", module, (4 * n + 2) * h)  # two layer norms per layer, post norm
    groups.vector("vision tower", "model.multi_modal_projector", h * text_hidden + h)


def gpt_oss(config: Mapping[str, Any]) -> ParameterCount:
    """gpt-oss: attention with biases and sinks, a mixture of experts with biased projections."""
    cfg = ConfigFields(config, "gpt_oss")
    groups, n, hidden, vocab = _decoder(cfg)
    qkv = config_attention(groups, cfg, layers=n, bias=True)
    groups.vector("attention", "model.layers.*.self_attn", cfg.integer("num_attention_heads") * n)  # sinks
    experts = cfg.integer("num_local_experts")
    inner = cfg.integer("intermediate_size")
    groups.linear("router", "model.layers.*.mlp.router", hidden, experts, bias=True, count=n)
    groups.linear("experts", "model.layers.*.mlp.experts", hidden, 2 * inner, bias=True, count=experts * n)
    groups.linear("experts", "model.layers.*.mlp.experts", inner, hidden, bias=True, count=experts * n)
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    top_k = cfg.integer("num_experts_per_tok", cfg.integer("experts_per_token", 4))
    return _count(groups, cfg.dtype(), hidden, vocab, max(3 * inner * top_k, qkv))


def llama4(config: Mapping[str, Any]) -> ParameterCount:
    """Llama 4: MoE layers (routed experts, a shared expert, the router) every
    ``interleave_moe_layer_step`` layers, dense MLPs of ``intermediate_size_mlp`` between; the
    vision encoder when the config describes it."""
    model_type = str(config["model_type"])
    top = ConfigFields(config, model_type)
    wrapped = model_type == "llama4"
    cfg = top.section("text_config") if wrapped else top
    layers = "language_model.model.layers" if wrapped else "model.layers"
    groups, n, hidden, vocab = _decoder(
        cfg,
        top,
        embed=f"{layers.removesuffix('.layers')}.embed_tokens",
        head="language_model.lm_head" if wrapped else "lm_head",
    )
    # use_qk_norm is an L2 norm without weights
    qkv = config_attention(
        groups, cfg, f"{layers}.*.self_attn", layers=n, head_dim=head_size(cfg, derive=False)
    )
    step = cfg.integer("interleave_moe_layer_step", 1)
    moe_layers = cfg.integers("moe_layers")
    moe = len(moe_layers) if moe_layers is not None else len(range(step - 1, n, step))
    experts, inner = cfg.integer("num_local_experts"), cfg.integer("intermediate_size")
    dense_inner = cfg.integer("intermediate_size_mlp")
    module = f"{layers}.*.feed_forward"
    groups.linear("router", f"{module}.router", hidden, experts, count=moe)
    gated_mlp(groups, "experts", f"{module}.experts", hidden, inner, count=experts * moe)
    gated_mlp(groups, "shared experts", f"{module}.shared_expert", hidden, inner, count=moe)
    gated_mlp(groups, "mlp", module, hidden, dense_inner, count=n - moe)
    groups.vector("norms", f"{layers}.*", (2 * n + 1) * hidden)
    notes: tuple[str, ...] = ()
    if wrapped and top.has("vision_config"):
        llama4_vision(groups, top.section("vision_config"), text_hidden=hidden)
    elif wrapped:
        notes = ("the config has no vision_config: the vision encoder is not counted",)
    top_k = cfg.integer("num_experts_per_tok", 1)
    width = max(3 * inner * (top_k + 1) if moe else 0, 3 * dense_inner if moe < n else 0, qkv)
    return _count(groups, cfg.dtype(top), hidden, vocab, width, notes)


def llama4_vision(groups: Groups, vision: ConfigFields, *, text_hidden: int) -> None:
    """Llama 4's vision encoder, its pixel-shuffle adapter and the projector."""
    h, inner = vision.integer("hidden_size"), vision.integer("intermediate_size")
    patch, image = vision.integer("patch_size"), vision.integer("image_size")
    channels = vision.integer("num_channels", 3)
    module = "vision_model"
    positions = (image // patch) ** 2 + 1
    groups.vector("vision tower", module, channels * patch * patch * h + h + positions * h + 4 * h)
    n = vision.layer_count()
    groups.linear("vision tower", module, h, h, bias=True, count=4 * n)
    groups.linear("vision tower", module, h, inner, bias=True, count=n)
    groups.linear("vision tower", module, inner, h, bias=True, count=n)
    groups.vector("vision tower", module, 4 * n * h)
    ratio = vision.data.get("pixel_shuffle_ratio", 0.5)
    shuffled = int(h / (ratio * ratio)) if isinstance(ratio, (int, float)) and ratio > 0 else 4 * h
    projector_in = vision.integer("projector_input_dim", inner)
    projector_out = vision.integer("projector_output_dim", projector_in)
    groups.linear("vision tower", f"{module}.vision_adapter", shuffled, projector_in)
    groups.linear("vision tower", f"{module}.vision_adapter", projector_in, projector_out)
    groups.linear(
        "vision tower",
        "multi_modal_projector",
        vision.integer("vision_output_dim", projector_out),
        text_hidden,
    )


# -- MLA, hybrids ----------------------------------------------------------------------------


#: Where a decoder layer's attention weights live (transformers' module names).
_ATTENTION = "model.layers.*.self_attn"


@attrs.frozen
class _MlaCounted:
    """What counting MLA's attention leaves its family: the query latent's rank (``None``: the
    queries are projected from the hidden state) and the widest attention activation."""

    q_rank: int | None
    width: int


def _mla_attention(cfg: ConfigFields, groups: Groups, hidden: int, *, count: int) -> _MlaCounted:
    """MLA's attention weights on ``count`` layers (DeepSeek V2/V3 on every layer, Kimi-Linear on
    its full layers): the queries (through a latent of ``q_lora_rank`` where set), the joint KV
    latent and its rotary part, the up-projection to keys and values, and the output."""
    heads = cfg.integer("num_attention_heads")
    nope, rope, v_dim = (
        cfg.integer("qk_nope_head_dim"),
        cfg.integer("qk_rope_head_dim"),
        cfg.integer("v_head_dim"),
    )
    kv_rank, q_rank = cfg.integer("kv_lora_rank"), cfg.optional_integer("q_lora_rank")
    if q_rank is None:
        groups.linear("attention", _ATTENTION, hidden, heads * (nope + rope), count=count)
    else:
        groups.linear("attention", _ATTENTION, hidden, q_rank, count=count)
        groups.vector("norms", _ATTENTION, q_rank * count)
        groups.linear("attention", _ATTENTION, q_rank, heads * (nope + rope), count=count)
    groups.linear("attention", _ATTENTION, hidden, kv_rank + rope, count=count)
    groups.vector("norms", _ATTENTION, kv_rank * count)
    groups.linear("attention", _ATTENTION, kv_rank, heads * (nope + v_dim), count=count)
    groups.linear("attention", _ATTENTION, heads * v_dim, hidden, count=count)
    return _MlaCounted(q_rank=q_rank, width=heads * (2 * nope + rope + v_dim))


def deepseek(config: Mapping[str, Any]) -> ParameterCount:
    """DeepSeek V2 / V3 / V3.2: MLA (and on V3.2 a sparse-attention indexer) on every layer, dense
    MLPs in the first ``first_k_dense_replace`` layers, then routed and shared experts every
    ``moe_layer_freq`` layers. The MTP layers (``num_nextn_predict_layers``) are not counted:
    engines load them only for MTP speculative decoding."""
    cfg = ConfigFields(config, str(config["model_type"]))
    groups, n, hidden, vocab = _decoder(cfg)
    mla = _mla_attention(cfg, groups, hidden, count=n)
    q_rank, attn = mla.q_rank, _ATTENTION
    if cfg.has("index_topk"):
        # DeepSeek-V3.2's indexer on every layer (transformers' DeepseekV32Indexer): wq_b from the
        # query latent, wk and weights_proj from the hidden state (weights_proj is stored bf16 in
        # the fp8 checkpoint), k_norm a LayerNorm with bias
        index_dim, index_heads = cfg.integer("index_head_dim"), cfg.integer("index_n_heads")
        indexer = f"{attn}.indexer"
        groups.linear("indexer", indexer, q_rank or hidden, index_heads * index_dim, count=n)
        groups.linear("indexer", indexer, hidden, index_dim, count=n)
        groups.add("indexer", f"{indexer}.weights_proj", hidden * index_heads * n, quantizable=False)
        groups.vector("norms", f"{indexer}.k_norm", 2 * index_dim * n)
    first_dense = cfg.integer("first_k_dense_replace", 0, minimum=0)
    freq = cfg.integer("moe_layer_freq", 1)
    routed = cfg.integer("n_routed_experts", 0, minimum=0)
    moe = sum(1 for i in range(n) if routed and i >= first_dense and i % freq == 0)
    mlp = "model.layers.*.mlp"
    dense_inner = cfg.integer("intermediate_size")
    gated_mlp(groups, "mlp", mlp, hidden, dense_inner, count=n - moe)
    width = mla.width
    if moe:
        inner = cfg.integer("moe_intermediate_size")
        shared = cfg.integer("n_shared_experts", 0, minimum=0)
        groups.add("router", f"{mlp}.gate", hidden * routed * moe, quantizable=False)
        if cfg.string("topk_method") == "noaux_tc":
            groups.vector("router", f"{mlp}.gate", routed * moe)  # e_score_correction_bias
        gated_mlp(groups, "experts", f"{mlp}.experts", hidden, inner, count=routed * moe)
        gated_mlp(groups, "shared experts", f"{mlp}.shared_experts", hidden, shared * inner, count=moe)
        width = max(width, 3 * inner * (cfg.integer("num_experts_per_tok", 1) + shared))
    width = max(width, 3 * dense_inner if moe < n else 0)
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    mtp = cfg.integer("num_nextn_predict_layers", 0, minimum=0)
    notes = (
        (
            f"the {mtp} MTP layer(s) (num_nextn_predict_layers) are not counted: engines load them only "
            "for MTP speculative decoding",
        )
        if mtp
        else ()
    )
    return _count(groups, cfg.dtype(), hidden, vocab, width, notes)


def deepseek_v4(config: Mapping[str, Any]) -> ParameterCount:
    """DeepSeek-V4 (transformers 5.24's ``DeepseekV4*`` modules): on every layer a shared-KV
    attention (query LoRA ``q_a_proj`` / ``q_b_proj``, one ``head_dim`` KV head, the grouped
    output projection ``o_a_proj`` of ``o_groups x o_lora_rank`` and ``o_b_proj``, per-head
    ``sinks``), a compressor on the compressed layers (KV and gate projections and a position
    bias of ``head_dim``, doubled on the overlapping ratio-4 ones) and on the ratio-4 layers the
    Lightning indexer (its own compressor of ``index_head_dim``, ``q_b_proj`` from the query
    latent and ``weights_proj``); routed experts, one shared expert of ``moe_intermediate_size``
    and the router (hash-routed layers too: their token-to-expert table is a buffer) on every
    layer; two hyper-connections a layer and the final hyper-head (``hc_mult`` streams). The MTP
    layers are not counted."""
    cfg = ConfigFields(config, "deepseek_v4")
    groups, n, hidden, vocab = _decoder(cfg)
    heads, head_dim = cfg.integer("num_attention_heads"), cfg.integer("head_dim", 512)
    q_rank = cfg.integer("q_lora_rank")
    o_groups, o_rank = cfg.integer("o_groups"), cfg.integer("o_lora_rank")
    attn = "model.layers.*.self_attn"
    groups.linear("attention", attn, hidden, q_rank, count=n)
    groups.linear("attention", attn, q_rank, heads * head_dim, count=n)
    groups.linear("attention", attn, hidden, head_dim, count=n)  # kv_proj
    groups.linear("attention", attn, heads * head_dim // o_groups, o_groups * o_rank, count=n)  # o_a_proj
    groups.linear("attention", attn, o_groups * o_rank, hidden, count=n)  # o_b_proj
    groups.vector("norms", attn, n * (q_rank + head_dim))  # q_a_norm, kv_norm
    groups.vector("attention", attn, n * heads)  # sinks
    compressor = f"{attn}.compressor"
    index_dim, index_heads = cfg.integer("index_head_dim", 128), cfg.integer("index_n_heads", 64)
    for ratio in layer_ratios(cfg, n):
        if not ratio:
            continue
        width = (2 if ratio == INDEXED_RATIO else 1) * head_dim
        groups.linear("compressor", compressor, hidden, width, count=2)  # kv_proj, gate_proj
        groups.vector("compressor", compressor, ratio * width + head_dim)  # position_bias, kv_norm
        if ratio == INDEXED_RATIO:
            indexer = f"{compressor}.indexer"
            groups.linear("indexer", indexer, hidden, 2 * index_dim, count=2)
            groups.vector("indexer", indexer, ratio * 2 * index_dim + index_dim)
            groups.linear("indexer", indexer, q_rank, index_heads * index_dim)
            groups.add("indexer", f"{indexer}.scorer.weights_proj", hidden * index_heads, quantizable=False)
    experts, inner = cfg.integer("n_routed_experts"), cfg.integer("moe_intermediate_size")
    mlp = "model.layers.*.mlp"
    groups.add("router", f"{mlp}.gate", hidden * experts * n, quantizable=False)
    bias = cfg.boolean("mlp_bias", False)
    gated_mlp(groups, "experts", f"{mlp}.experts", hidden, inner, count=experts * n)
    gated_mlp(groups, "shared experts", f"{mlp}.shared_experts", hidden, inner, count=n, bias=bias)
    streams = cfg.integer("hc_mult", 4)
    mixes = (2 + streams) * streams  # pre, post and comb weights of a hyper-connection
    groups.vector("hyper-connections", "model.layers.*", 2 * n * (mixes * (streams * hidden + 1) + 3))
    groups.vector("hyper-connections", "model.hc_head", streams * (streams * hidden + 1) + 1)
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    top_k = cfg.integer("num_experts_per_tok", 6)
    width = max(q_rank + heads * head_dim + head_dim, 3 * inner * (top_k + 1), index_heads * index_dim)
    mtp = cfg.integer("num_nextn_predict_layers", 0, minimum=0)
    notes = (
        (
            f"the {mtp} MTP layer(s) (num_nextn_predict_layers) are not counted: engines load them "
            "only for MTP speculative decoding",
        )
        if mtp
        else ()
    )
    return _count(groups, cfg.dtype(), hidden, vocab, width, notes)


def jamba(config: Mapping[str, Any]) -> ParameterCount:
    """Jamba: Mamba-1 mixers with attention every ``attn_layer_period`` layers, and a mixture of
    experts every ``expert_layer_period`` layers."""
    cfg = ConfigFields(config, "jamba")
    groups, n, hidden, vocab = _decoder(cfg)
    period, offset = cfg.integer("attn_layer_period", 8), cfg.integer("attn_layer_offset", 4, minimum=0)
    attention_layers = sum(1 for i in range(n) if i % period == offset)
    qkv = config_attention(groups, cfg, layers=attention_layers, bias=False)
    mamba_layers = n - attention_layers
    inner = cfg.integer("mamba_expand") * hidden
    state, conv = cfg.integer("mamba_d_state"), cfg.integer("mamba_d_conv")
    dt_rank_value = config.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank_value == "auto" else cfg.integer("mamba_dt_rank")
    module = "model.layers.*.mamba"
    proj_bias = cfg.boolean("mamba_proj_bias", False)
    groups.linear("mamba", module, hidden, 2 * inner, bias=proj_bias, count=mamba_layers)
    groups.vector(
        "mamba",
        module,
        mamba_layers * (inner * conv + (inner if cfg.boolean("mamba_conv_bias", True) else 0)),
    )
    groups.linear("mamba", module, inner, dt_rank + 2 * state, count=mamba_layers)
    groups.linear("mamba", module, dt_rank, inner, bias=True, count=mamba_layers)
    groups.vector("mamba", module, mamba_layers * (inner * state + inner))  # A_log, D
    groups.linear("mamba", module, inner, hidden, bias=proj_bias, count=mamba_layers)
    groups.vector("norms", module, mamba_layers * (dt_rank + 2 * state))
    e_period, e_offset = (
        cfg.integer("expert_layer_period", 2),
        cfg.integer("expert_layer_offset", 1, minimum=0),
    )
    experts = cfg.integer("num_experts", 1)
    moe = sum(1 for i in range(n) if experts > 1 and i % e_period == e_offset)
    mlp_inner = cfg.integer("intermediate_size")
    groups.linear("router", "model.layers.*.feed_forward.router", hidden, experts, count=moe)
    gated_mlp(
        groups, "experts", "model.layers.*.feed_forward.experts", hidden, mlp_inner, count=experts * moe
    )
    gated_mlp(groups, "mlp", "model.layers.*.feed_forward", hidden, mlp_inner, count=n - moe)
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    top_k = cfg.integer("num_experts_per_tok", 2)
    return _count(groups, cfg.dtype(), hidden, vocab, max(3 * mlp_inner * top_k, 2 * inner, qkv))


def nemotron_h(config: Mapping[str, Any]) -> ParameterCount:
    """Nemotron-H: Mamba-2, attention, plain squared-ReLU MLP and MoE layers as ``layer_types``
    (``layers_block_type``) or ``hybrid_override_pattern`` spell them
    (:func:`kvcore.plugins.models.nemotron_h.layer_types`), one norm each. A MoE layer
    (transformers' ``NemotronHMoE``): the router (``n_routed_experts x hidden_size``) and its
    ``e_score_correction_bias`` (a buffer in transformers, a parameter in vLLM 0.32's
    ``nemotron_h.py`` and in the checkpoint), ``n_routed_experts`` plain experts
    of ``moe_intermediate_size`` over ``moe_latent_size`` (else ``hidden_size``) with the two
    latent projections, and one plain shared expert of ``moe_shared_expert_intermediate_size``."""
    cfg = ConfigFields(config, "nemotron_h")
    hidden, vocab = cfg.integer("hidden_size"), cfg.integer("vocab_size")
    types = nemotron_h_layer_types(cfg)
    counts = {kind: types.count(kind) for kind in (LINEAR, FULL, "mlp", "moe")}
    groups = Groups()
    embeddings(groups, vocab, hidden, tied=_tied(cfg, False), embed="backbone.embeddings")
    module = "backbone.layers.*.mixer"
    qkv = 0
    if counts[FULL]:
        head_dim = head_size(cfg, keys=("attention_head_dim", "head_dim"))
        qkv = config_attention(groups, cfg, module, layers=counts[FULL], head_dim=head_dim)
    m = counts[LINEAR]
    mamba_width = 0
    if m:
        heads, head_dim = cfg.integer("mamba_num_heads"), cfg.integer("mamba_head_dim")
        n_groups, state = cfg.integer("n_groups"), cfg.integer("ssm_state_size")
        mamba_width = _mamba2_mixer(
            groups,
            module,
            hidden=hidden,
            heads=heads,
            inner=heads * head_dim,
            n_groups=n_groups,
            state=state,
            conv=cfg.integer("conv_kernel"),
            bias=cfg.boolean("use_bias", False),
            conv_bias=cfg.boolean("use_conv_bias", True),
            layers=m,
        )
    mlp_bias = cfg.boolean("mlp_bias", False)
    width = max(qkv, mamba_width)
    if counts["mlp"]:
        mlp_inner = cfg.integer("intermediate_size")
        groups.linear("mlp", module, hidden, mlp_inner, bias=mlp_bias, count=counts["mlp"])
        groups.linear("mlp", module, mlp_inner, hidden, bias=mlp_bias, count=counts["mlp"])
        width = max(width, 2 * mlp_inner)
    moe = counts["moe"]
    if moe:
        experts = cfg.integer("n_routed_experts", cfg.integer("num_local_experts", 0, minimum=0), minimum=0)
        inner = cfg.integer("moe_intermediate_size")
        latent = cfg.optional_integer("moe_latent_size")
        expert_in = latent or hidden
        shared = cfg.integer("moe_shared_expert_intermediate_size", 0, minimum=0)
        groups.add("router", f"{module}.gate", experts * hidden * moe, quantizable=False)
        groups.vector("router", f"{module}.gate", experts * moe)  # e_score_correction_bias
        groups.linear("experts", f"{module}.experts", expert_in, inner, count=2 * experts * moe)
        if latent:
            groups.linear("experts", module, hidden, latent, bias=mlp_bias, count=moe)
            groups.linear("experts", module, latent, hidden, bias=mlp_bias, count=moe)
        groups.linear("shared experts", f"{module}.shared_experts", hidden, shared, bias=mlp_bias, count=moe)
        groups.linear("shared experts", f"{module}.shared_experts", shared, hidden, bias=mlp_bias, count=moe)
        top_k = cfg.integer("num_experts_per_tok", 1)
        width = max(width, 2 * (inner * top_k + shared))
    groups.vector("norms", "backbone.layers.*", (len(types) + 1) * hidden)
    return _count(groups, cfg.dtype(), hidden, vocab, width)


def _mamba2_mixer(
    groups: Groups,
    module: str,
    *,
    hidden: int,
    heads: int,
    inner: int,
    n_groups: int,
    state: int,
    conv: int,
    bias: bool,
    conv_bias: bool,
    layers: int,
    norm: bool = True,
) -> int:
    """``layers`` Mamba-2 mixers (transformers' ``*Mamba2Mixer``, vLLM's ``MambaMixer2``): the
    input projection to ``inner`` (z), the convolution's channels (x, B, C: ``inner +
    2 * n_groups * state``) and ``heads`` (dt); the depthwise convolution of ``conv`` taps;
    ``dt_bias``, ``A_log`` and ``D`` per head; the gated norm over ``inner`` (unless ``norm`` is
    false); the output projection. Returns the input projection's width."""
    channels = inner + 2 * n_groups * state
    projected = inner + channels + heads
    groups.linear("mamba", module, hidden, projected, bias=bias, count=layers)
    groups.vector("mamba", module, layers * (channels * conv + (channels if conv_bias else 0)))
    groups.vector("mamba", module, layers * (3 * heads + (inner if norm else 0)))
    groups.linear("mamba", module, inner, hidden, bias=bias, count=layers)
    return projected


def mamba(config: Mapping[str, Any]) -> ParameterCount:
    """Mamba-1 / FalconMamba (transformers' ``MambaMixer``): per layer the input projection to
    ``2 x intermediate_size`` (``use_bias``), the depthwise convolution of ``conv_kernel`` taps
    (``use_conv_bias``), ``x_proj`` to ``time_step_rank + 2 x state_size``, ``dt_proj`` (with a
    bias), ``A_log`` (``intermediate_size x state_size``), ``D``, the output projection, one
    norm; embeddings tied by default."""
    model_type = str(config["model_type"])
    cfg = ConfigFields(config, model_type)
    groups = Groups()
    n, hidden, vocab = cfg.layer_count(), cfg.integer("hidden_size"), cfg.integer("vocab_size")
    embeddings(groups, vocab, hidden, tied=_tied(cfg, True), embed="backbone.embeddings")
    inner = (
        cfg.integer("intermediate_size") if cfg.has("intermediate_size") else cfg.integer("expand") * hidden
    )
    state, conv = cfg.integer("state_size"), cfg.integer("conv_kernel")
    rank_value = config.get("time_step_rank", "auto")
    rank = math.ceil(hidden / 16) if rank_value == "auto" else cfg.integer("time_step_rank")
    bias = cfg.boolean("use_bias", False)
    module = "backbone.layers.*.mixer"
    groups.linear("mamba", module, hidden, 2 * inner, bias=bias, count=n)
    groups.vector("mamba", module, n * (inner * conv + (inner if cfg.boolean("use_conv_bias", True) else 0)))
    groups.linear("mamba", module, inner, rank + 2 * state, count=n)
    groups.linear("mamba", module, rank, inner, bias=True, count=n)
    groups.vector("mamba", module, n * (inner * state + inner))  # A_log, D
    groups.linear("mamba", module, inner, hidden, bias=bias, count=n)
    groups.vector("norms", "backbone.layers.*", (n + 1) * hidden)
    return _count(groups, cfg.dtype(), hidden, vocab, 2 * inner)


def mamba2(config: Mapping[str, Any]) -> ParameterCount:
    """Mamba-2 (transformers' ``Mamba2Mixer``): a Mamba-2 mixer of ``expand x hidden_size``
    (:func:`_mamba2_mixer`: ``num_heads``, ``n_groups``, ``state_size``, ``conv_kernel``,
    ``use_bias``, ``use_conv_bias``) and one norm per layer."""
    cfg = ConfigFields(config, "mamba2")
    groups = Groups()
    n, hidden, vocab = cfg.layer_count(), cfg.integer("hidden_size"), cfg.integer("vocab_size")
    embeddings(groups, vocab, hidden, tied=_tied(cfg, False), embed="backbone.embeddings")
    width = _mamba2_mixer(
        groups,
        "backbone.layers.*.mixer",
        hidden=hidden,
        heads=cfg.integer("num_heads"),
        inner=cfg.integer("expand") * hidden,
        n_groups=cfg.integer("n_groups", 1),
        state=cfg.integer("state_size"),
        conv=cfg.integer("conv_kernel"),
        bias=cfg.boolean("use_bias", False),
        conv_bias=cfg.boolean("use_conv_bias", True),
        layers=n,
    )
    groups.vector("norms", "backbone.layers.*", (n + 1) * hidden)
    return _count(groups, cfg.dtype(), hidden, vocab, width)


def _hybrid_types(cfg: ConfigFields, n: int) -> list[str]:
    """A hybrid's ``layer_types`` (or the older ``layers_block_type``)."""
    types = cfg.layer_types(n) or cfg.layer_types(n, key="layers_block_type")
    if types is None:
        raise cfg.error(
            "layer_types", "is missing; kvcore counts the hybrid's Mamba and attention layers from it"
        )
    return types


def granitemoehybrid(config: Mapping[str, Any]) -> ParameterCount:
    """GraniteMoeHybrid (transformers' ``GraniteMoeHybridDecoderLayer``): Mamba-2 mixers
    (``mamba_expand x hidden_size``, ``mamba_n_heads``, ``mamba_n_groups``, ``mamba_d_state``,
    ``mamba_d_conv``, ``mamba_proj_bias``, ``mamba_conv_bias``) or attention
    (``attention_bias``) as ``layer_types`` says; on every layer Granite-MoE's experts
    (``num_local_experts`` of ``intermediate_size``, when positive) and the gated shared MLP of
    ``shared_intermediate_size``; two norms per layer."""
    cfg = ConfigFields(config, "granitemoehybrid")
    groups, n, hidden, vocab = _decoder(cfg)
    types = _hybrid_types(cfg, n)
    qkv = config_attention(groups, cfg, layers=types.count(FULL))
    width = _mamba2_mixer(
        groups,
        "model.layers.*.mamba",
        hidden=hidden,
        heads=cfg.integer("mamba_n_heads"),
        inner=cfg.integer("mamba_expand") * hidden,
        n_groups=cfg.integer("mamba_n_groups", 1),
        state=cfg.integer("mamba_d_state"),
        conv=cfg.integer("mamba_d_conv"),
        bias=cfg.boolean("mamba_proj_bias", False),
        conv_bias=cfg.boolean("mamba_conv_bias", True),
        layers=types.count(LINEAR),
    )
    experts = cfg.integer("num_local_experts", 0, minimum=0)
    shared = cfg.integer("shared_intermediate_size")
    mlp = "model.layers.*.block_sparse_moe"
    if experts:
        inner = cfg.integer("intermediate_size")
        groups.add("router", f"{mlp}.router", hidden * experts * n, quantizable=False)
        gated_mlp(groups, "experts", f"{mlp}.experts", hidden, inner, count=experts * n)
        width = max(width, 3 * inner * cfg.integer("num_experts_per_tok", 1))
    gated_mlp(groups, "shared experts", "model.layers.*.shared_mlp", hidden, shared, count=n)
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    return _count(groups, cfg.dtype(), hidden, vocab, max(width, qkv, 3 * shared))


def falcon_h1(config: Mapping[str, Any]) -> ParameterCount:
    """Falcon-H1 (transformers' ``FalconH1DecoderLayer``): on every layer attention
    (``attention_bias``) beside a Mamba-2 mixer of ``mamba_d_ssm`` (else ``mamba_expand x
    hidden_size``; ``mamba_proj_bias`` on the input projection, ``projectors_bias`` on the
    output, the gated norm only with ``mamba_rms_norm``), then a gated MLP of
    ``intermediate_size`` (``mlp_bias``); two norms per layer."""
    cfg = ConfigFields(config, "falcon_h1")
    groups, n, hidden, vocab = _decoder(cfg)
    qkv = config_attention(groups, cfg, layers=n)
    if cfg.data.get("mamba_d_ssm") is not None:
        inner = cfg.integer("mamba_d_ssm")
    else:
        inner = cfg.integer("mamba_expand") * hidden
    module = "model.layers.*.mamba"
    proj_bias, out_bias = cfg.boolean("mamba_proj_bias", False), cfg.boolean("projectors_bias", False)
    width = _mamba2_mixer(
        groups,
        module,
        hidden=hidden,
        heads=cfg.integer("mamba_n_heads"),
        inner=inner,
        n_groups=cfg.integer("mamba_n_groups", 1),
        state=cfg.integer("mamba_d_state"),
        conv=cfg.integer("mamba_d_conv"),
        bias=False,
        conv_bias=cfg.boolean("mamba_conv_bias", True),
        layers=n,
        norm=cfg.boolean("mamba_rms_norm", False),
    )
    # _mamba2_mixer's projections without biases: Falcon-H1's own
    projected = width
    if proj_bias:
        groups.vector("mamba", module, n * projected)
    if out_bias:
        groups.vector("mamba", module, n * hidden)
    mlp_inner = cfg.integer("intermediate_size")
    gated_mlp(
        groups,
        "mlp",
        "model.layers.*.feed_forward",
        hidden,
        mlp_inner,
        count=n,
        bias=cfg.boolean("mlp_bias", False),
    )
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    return _count(groups, cfg.dtype(), hidden, vocab, max(width, qkv, 3 * mlp_inner))


def zamba2(config: Mapping[str, Any]) -> ParameterCount:
    """Zamba2 (transformers' ``Zamba2Model``): a Mamba-2 mixer on every layer
    (``mamba_expand x hidden_size``, ``n_mamba_heads``, ``mamba_ngroups``, ``mamba_d_state``,
    ``mamba_d_conv``; the convolution always has a bias, the projections ``add_bias_linear``)
    with its norm; each ``hybrid`` layer of ``layers_block_type`` adds a ``hidden x hidden``
    linear and runs one of ``num_mem_blocks`` shared attention blocks, whose weights are counted
    once: attention from ``attention_hidden_size`` (``num_attention_heads``,
    ``num_key_value_heads`` of ``attention_head_dim``), two norms, a gated MLP of
    ``intermediate_size``; each hybrid layer owns the low-rank (``adapter_rank``) adapters of
    its block's MLP and, with ``use_shared_attention_adapter``, of Q, K and V."""
    cfg = ConfigFields(config, "zamba2")
    groups, n, hidden, vocab = _decoder(cfg, tied=True)
    types = cfg.layer_types(n, key="layers_block_type") or _hybrid_types(cfg, n)
    bias = cfg.boolean("add_bias_linear", False)
    width = _mamba2_mixer(
        groups,
        "model.layers.*.mamba",
        hidden=hidden,
        heads=cfg.integer("n_mamba_heads"),
        inner=cfg.integer("mamba_expand") * hidden,
        n_groups=cfg.integer("mamba_ngroups", 1),
        state=cfg.integer("mamba_d_state"),
        conv=cfg.integer("mamba_d_conv"),
        bias=bias,
        conv_bias=True,
        layers=n,
    )
    groups.vector("norms", "model.layers.*", (n + 1) * hidden)
    hybrid = types.count("hybrid")
    if hybrid:
        shared = "model.layers.*.shared_transformer"
        groups.linear("attention", "model.layers.*.linear", hidden, hidden, count=hybrid)
        blocks = min(hybrid, cfg.integer("num_mem_blocks", 1))
        attn_in = cfg.integer("attention_hidden_size", 2 * hidden)
        heads, head_dim = cfg.integer("num_attention_heads"), cfg.integer("attention_head_dim")
        kv = cfg.integer("num_key_value_heads", heads)
        groups.linear("attention", shared, attn_in, heads * head_dim, count=blocks)
        groups.linear("attention", shared, attn_in, kv * head_dim, count=2 * blocks)
        groups.linear("attention", shared, heads * head_dim, hidden, count=blocks)
        groups.vector("norms", shared, blocks * (attn_in + hidden))
        inner, rank = cfg.integer("intermediate_size"), cfg.integer("adapter_rank", 128)
        groups.linear("mlp", shared, hidden, 2 * inner, bias=bias, count=blocks)
        groups.linear("mlp", shared, inner, hidden, bias=bias, count=blocks)
        groups.linear("adapters", shared, hidden, rank, count=hybrid)
        groups.linear("adapters", shared, rank, 2 * inner, count=hybrid)
        if cfg.boolean("use_shared_attention_adapter", False):
            groups.linear("adapters", shared, attn_in, rank, count=3 * hybrid)
            groups.linear("adapters", shared, rank, attn_in, count=3 * hybrid)
        width = max(width, 3 * inner, (heads + 2 * kv) * head_dim)
    return _count(groups, cfg.dtype(), hidden, vocab, width)


def gemma3n(config: Mapping[str, Any]) -> ParameterCount:
    """Gemma 3n's language model (transformers' ``Gemma3nText*`` modules): attention with Q and K
    norms (the values' norm has no weight), no K / V projections on the last
    ``num_kv_shared_layers`` layers; a gated MLP of ``intermediate_size`` (one width, or one per
    layer); five norms a layer; AltUp (``altup_num_inputs`` streams: the coefficient matrices,
    the modality router and its norm, the output scale) and LAuReL (``laurel_rank``) on every
    layer; the per-layer inputs (``hidden_size_per_layer_input`` from an embedding table of
    ``vocab_size_per_layer_input`` rows, their projection, gate and norm); AltUp's projections in
    and out of the model. The ``gemma3n`` wrapper's audio and vision towers are not counted."""
    cfg, top, layers = gemma3n_text_fields(config)
    base = layers.removesuffix(".layers")
    groups, n, hidden, vocab = _decoder(cfg, top, tied=True, embed=f"{base}.embed_tokens")
    types = gemma3n_layer_types(cfg, n)
    own_kv = reuse_layers(cfg, types).start
    heads, kv, head_dim = cfg.integer("num_attention_heads"), kv_heads(cfg), head_size(cfg, derive=False)
    attn = f"{layers}.*.self_attn"
    groups.linear("attention", attn, hidden, heads * head_dim, count=n)
    groups.linear("attention", attn, heads * head_dim, hidden, count=n)
    groups.linear("attention", attn, hidden, kv * head_dim, count=2 * own_kv)
    groups.vector("norms", attn, head_dim * (n + own_kv))
    if isinstance(cfg.data.get("intermediate_size"), list):
        inners = cfg.integers("intermediate_size") or []
        if len(inners) != n:
            raise cfg.error("intermediate_size", f"lists {len(inners)} widths for {n} layers")
    else:
        inners = [cfg.integer("intermediate_size")] * n
    for inner in inners:
        gated_mlp(groups, "mlp", f"{layers}.*.mlp", hidden, inner, count=1)
    streams, rank = cfg.integer("altup_num_inputs", 4), cfg.integer("laurel_rank", 64)
    per_layer = cfg.integer("hidden_size_per_layer_input")
    module = f"{layers}.*"
    # correct_output_scale, correction_coefs (streams x streams), prediction_coefs (streams x streams^2)
    groups.vector("altup", f"{module}.altup", n * (hidden + streams * streams + streams**3))
    groups.linear("altup", f"{module}.altup", hidden, streams, count=n)  # modality router
    groups.linear("laurel", f"{module}.laurel", hidden, rank, count=n)
    groups.linear("laurel", f"{module}.laurel", rank, hidden, count=n)
    groups.linear("per-layer inputs", module, hidden, per_layer, count=n)  # input gate
    groups.linear("per-layer inputs", module, per_layer, hidden, count=n)  # projection
    # input, post-attention, pre- and post-feedforward, post-per-layer-input, AltUp's router and
    # LAuReL's norms on every layer; the final norm
    groups.vector("norms", module, (7 * n + 1) * hidden)
    table = cfg.integer("vocab_size_per_layer_input", vocab)
    groups.vector("embeddings", f"{base}.embed_tokens_per_layer", table * n * per_layer)
    groups.linear("per-layer inputs", f"{base}.per_layer_model_projection", hidden, n * per_layer)
    groups.vector("norms", f"{base}.per_layer_projection_norm", per_layer)
    groups.linear("altup", base, hidden, hidden, count=2 * (streams - 1))
    notes: tuple[str, ...] = ()
    towers = [key for key in ("vision_config", "audio_config") if top is not cfg and top.has(key)]
    if towers:
        notes = (
            f"the {' and '.join(towers)} towers are not counted: kvcore counts Gemma 3n's language "
            "model only",
        )
    width = max(3 * max(inners), (heads + 2 * kv) * head_dim)
    return _count(groups, cfg.dtype(top), hidden, vocab, width, notes)


def qwen3_next(config: Mapping[str, Any]) -> ParameterCount:
    """Qwen3-Next: gated attention every ``full_attention_interval`` layers (or where
    ``layer_types`` says), gated delta nets between, a mixture of experts with a gated shared
    expert on every layer."""
    cfg = ConfigFields(config, "qwen3_next")
    return _gated_delta_hybrid(cfg, cfg, "model.layers", moe=True)


def qwen3_5(config: Mapping[str, Any]) -> ParameterCount:
    """Qwen3.5 / Qwen3.5-MoE: Qwen3-Next's layers (transformers' ``Qwen3_5*`` modules), with a
    dense gated MLP of ``intermediate_size`` on ``qwen3_5`` and Qwen3-Next's experts on
    ``qwen3_5_moe``; the ``qwen3_5`` / ``qwen3_5_moe`` wrappers add the vision tower
    (:func:`qwen3_5_vision`)."""
    model_type = str(config["model_type"])
    top = ConfigFields(config, model_type)
    wrapped = model_type in ("qwen3_5", "qwen3_5_moe")
    cfg = top.section("text_config") if wrapped else top
    layers = "model.language_model.layers" if wrapped else "model.layers"
    count = _gated_delta_hybrid(cfg, top, layers, moe=model_type.startswith("qwen3_5_moe"))
    if not (wrapped and top.has("vision_config")):
        return count
    groups = Groups()
    qwen3_5_vision(groups, top.section("vision_config"), text_hidden=count.hidden_size)
    return attrs.evolve(count, groups=count.groups + groups.groups())


def qwen3_5_vision(groups: Groups, vision: ConfigFields, *, text_hidden: int) -> None:
    """Qwen3.5's vision tower (``model.visual``): a 3-D patch embedding, learned positions,
    ``depth`` blocks (LayerNorms with biases, fused QKV and projection with biases, an MLP with
    biases) and the merger of ``spatial_merge_size**2`` patches into the language model's width."""
    h, inner = vision.integer("hidden_size"), vision.integer("intermediate_size")
    patch, temporal = vision.integer("patch_size"), vision.integer("temporal_patch_size", 2)
    channels, depth = vision.integer("in_channels", 3), vision.layer_count("depth")
    merged = h * vision.integer("spatial_merge_size", 2) ** 2
    module = "model.visual"
    groups.vector("vision tower", module, channels * temporal * patch * patch * h + h)
    groups.vector("vision tower", module, vision.integer("num_position_embeddings") * h)
    groups.linear("vision tower", module, h, 3 * h, bias=True, count=depth)
    groups.linear("vision tower", module, h, h, bias=True, count=depth)
    groups.linear("vision tower", module, h, inner, bias=True, count=depth)
    groups.linear("vision tower", module, inner, h, bias=True, count=depth)
    groups.vector("vision tower", module, 4 * h * depth + 2 * h)  # two LayerNorms a block, the merger's
    groups.linear("vision tower", f"{module}.merger", merged, merged, bias=True)
    groups.linear(
        "vision tower", f"{module}.merger", merged, vision.integer("out_hidden_size", text_hidden), bias=True
    )


def _gated_delta_hybrid(cfg: ConfigFields, top: ConfigFields, layers: str, *, moe: bool) -> ParameterCount:
    """Qwen3-Next's and Qwen3.5's layers: gated attention (queries and their gate, QK norms),
    gated delta nets (q, k, v, z, b, a projections, a depthwise convolution, ``dt_bias``, ``A_log``,
    the gated norm) and an MLP or a mixture of experts with a gated shared expert."""
    groups, n, hidden, vocab = _decoder(cfg, top, embed=f"{layers.removesuffix('.layers')}.embed_tokens")
    types = cfg.layer_types(n)
    if types is None:
        interval = cfg.integer("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    full = types.count("full_attention")
    heads, kv, head_dim = cfg.integer("num_attention_heads"), kv_heads(cfg), head_size(cfg, derive=False)
    attn = f"{layers}.*.self_attn"
    groups.linear("attention", attn, hidden, 2 * heads * head_dim, count=full)  # queries and their gate
    groups.linear("attention", attn, hidden, kv * head_dim, count=2 * full)
    groups.linear("attention", attn, heads * head_dim, hidden, count=full)
    groups.vector("norms", attn, 2 * head_dim * full)
    kh, vh = cfg.integer("linear_num_key_heads"), cfg.integer("linear_num_value_heads")
    kd, vd = cfg.integer("linear_key_head_dim"), cfg.integer("linear_value_head_dim")
    linear = types.count("linear_attention")
    key, value = kh * kd, vh * vd
    module = f"{layers}.*.linear_attn"
    groups.linear("linear attention", module, hidden, 2 * key + 2 * value, count=linear)  # q, k, v, z
    groups.linear("linear attention", module, hidden, 2 * vh, count=linear)  # b, a
    conv = 2 * key + value
    groups.vector(
        "linear attention", module, linear * (conv * cfg.integer("linear_conv_kernel_dim") + 2 * vh + vd)
    )
    groups.linear("linear attention", module, value, hidden, count=linear)
    mlp = f"{layers}.*.mlp"
    if moe:
        experts, inner = cfg.integer("num_experts"), cfg.integer("moe_intermediate_size")
        shared = cfg.integer("shared_expert_intermediate_size", 0, minimum=0)
        groups.linear("router", f"{mlp}.gate", hidden, experts, count=n)
        gated_mlp(groups, "experts", f"{mlp}.experts", hidden, inner, count=experts * n)
        gated_mlp(groups, "shared experts", f"{mlp}.shared_expert", hidden, shared, count=n)
        groups.linear("router", f"{mlp}.shared_expert_gate", hidden, 1, count=n)
        width = 3 * (inner * cfg.integer("num_experts_per_tok", 10) + shared)
    else:
        inner = cfg.integer("intermediate_size")
        gated_mlp(groups, "mlp", mlp, hidden, inner, count=n)
        width = 3 * inner
    groups.vector("norms", f"{layers}.*", (2 * n + 1) * hidden)
    return _count(groups, cfg.dtype(top), hidden, vocab, max(width, conv, 3 * heads * head_dim))


def gemma4(config: Mapping[str, Any]) -> ParameterCount:
    """Gemma 4 (transformers' ``Gemma4Text*`` modules): per-layer head sizes and KV heads as the
    cache reads them (:mod:`kvcore.plugins.models.gemma4`); no ``v_proj`` on K = V full layers and
    no K / V projections or K norm on layers that reuse an earlier layer's cache; the MLP, twice
    as wide on those layers with ``use_double_wide_mlp``; a mixture of experts beside it with
    ``enable_moe_block``; the per-layer input embeddings (PLE: a table of
    ``vocab_size_per_layer_input x layers x hidden_size_per_layer_input``, its projection, and a
    gate and projection per layer; Gemma 4 Unified has neither). The wrappers' vision and audio
    towers are not counted (the notes say so)."""
    model_type = str(config["model_type"])
    top = ConfigFields(config, model_type)
    wrapped = model_type in ("gemma4", "gemma4_unified")
    cfg = top.section("text_config") if wrapped else top
    layers = "model.language_model.layers" if wrapped else "model.layers"
    n, hidden = cfg.layer_count(), cfg.integer("hidden_size")
    vocab = cfg.integer("vocab_size")
    groups = Groups()
    embeddings(
        groups,
        vocab,
        hidden,
        tied=_tied(cfg, True, top),
        embed=f"{layers.removesuffix('.layers')}.embed_tokens",
    )
    types = gemma4_layer_types(cfg, n)
    reuse = reuse_layers(cfg, types)
    overrides = per_layer_overrides(cfg, n)
    heads, bias = cfg.integer("num_attention_heads"), cfg.boolean("attention_bias", False)
    k_eq_v = cfg.boolean("attention_k_eq_v", False)
    attn = f"{layers}.*.self_attn"
    width = 0
    for index, layer_type in enumerate(types):
        head_dim, kv = layer_geometry(cfg, overrides, index, layer_type)
        groups.linear("attention", attn, hidden, heads * head_dim, bias=bias)
        groups.linear("attention", attn, heads * head_dim, hidden, bias=bias)
        groups.vector("norms", attn, head_dim)  # q_norm (v_norm has no weight)
        width = max(width, (heads + 2 * kv) * head_dim)
        if index in reuse:
            continue
        projections = 1 if k_eq_v and layer_type == "full_attention" else 2
        groups.linear("attention", attn, hidden, kv * head_dim, bias=bias, count=projections)
        groups.vector("norms", attn, head_dim)  # k_norm
    inner = cfg.integer("intermediate_size")
    wide = len(reuse) if cfg.boolean("use_double_wide_mlp", False) else 0
    gated_mlp(groups, "mlp", f"{layers}.*.mlp", hidden, inner, count=n - wide)
    gated_mlp(groups, "mlp", f"{layers}.*.mlp", hidden, 2 * inner, count=wide)
    width = max(width, 3 * inner * (2 if wide else 1))
    norms = 4
    # Gemma 4 Unified's decoder layers have neither the MoE block nor per-layer inputs
    # (transformers 5.24 models/gemma4_unified/modeling_gemma4_unified.py)
    unified = model_type.startswith("gemma4_unified")
    if not unified and cfg.boolean("enable_moe_block", False):
        experts, expert_inner = cfg.integer("num_experts"), cfg.integer("moe_intermediate_size")
        groups.linear("router", f"{layers}.*.router", hidden, experts, count=n)
        groups.vector("router", f"{layers}.*.router", n * (hidden + experts))  # scale, per_expert_scale
        gated_mlp(groups, "experts", f"{layers}.*.experts", hidden, expert_inner, count=experts * n)
        norms += 3
        width = max(width, 3 * inner + 3 * expert_inner * cfg.integer("top_k_experts", 1))
    per_layer = 0 if unified else cfg.integer("hidden_size_per_layer_input", 0, minimum=0)
    if per_layer:
        table = cfg.integer("vocab_size_per_layer_input", vocab)
        base = layers.removesuffix(".layers")
        groups.vector("embeddings", f"{base}.embed_tokens_per_layer", table * n * per_layer)
        groups.linear("per-layer inputs", f"{base}.per_layer_model_projection", hidden, n * per_layer)
        groups.vector("norms", f"{base}.per_layer_projection_norm", per_layer)
        groups.linear("per-layer inputs", f"{layers}.*", hidden, per_layer, count=n)  # input gate
        groups.linear("per-layer inputs", f"{layers}.*", per_layer, hidden, count=n)  # projection
        norms += 1
    groups.vector("norms", f"{layers}.*", (norms * n + 1) * hidden)
    towers = [key for key in ("vision_config", "audio_config") if wrapped and top.has(key)]
    notes = (
        (f"the {' and '.join(towers)} towers are not counted: kvcore counts Gemma 4's language model only",)
        if towers
        else ()
    )
    return _count(groups, cfg.dtype(top), hidden, vocab, width, notes)


def laguna(config: Mapping[str, Any]) -> ParameterCount:
    """Laguna (transformers' ``Laguna*`` modules): attention with QK norms and a softplus output
    gate (``g_proj``: one output per head, or per head channel when ``gating`` is
    ``"per-element"``), ``num_attention_heads_per_layer`` query heads per layer; dense MLPs where
    ``mlp_layer_types`` says ``dense`` (the first layer by default), else routed experts (router
    with a score-correction bias) and a shared expert of ``shared_expert_intermediate_size``."""
    cfg = ConfigFields(config, "laguna")
    groups, n, hidden, vocab = _decoder(cfg)
    heads_per_layer = (
        cfg.integers("num_attention_heads_per_layer") or [cfg.integer("num_attention_heads")] * n
    )
    if len(heads_per_layer) != n:
        raise cfg.error("num_attention_heads_per_layer", f"lists {len(heads_per_layer)} layers, not {n}")
    kv, head_dim, bias = kv_heads(cfg), head_size(cfg), cfg.boolean("attention_bias", False)
    gating = config.get("gating", True)
    per_head = gating is True or gating == "per-head"
    attn = "model.layers.*.self_attn"
    width = 0
    for heads in heads_per_layer:
        width = max(
            width,
            attention_projections(
                groups,
                attn,
                hidden=hidden,
                heads=heads,
                kv=kv,
                head_dim=head_dim,
                layers=1,
                qkv_bias=bias,
                o_bias=bias,
                qk_norm=True,
            ),
        )
        groups.linear("attention", attn, hidden, heads if per_head else heads * head_dim)
    mlp_types = cfg.data.get("mlp_layer_types")
    if isinstance(mlp_types, list) and len(mlp_types) == n:
        moe = sum(1 for t in mlp_types if t == "sparse")
    else:
        moe = n - 1
    dense_inner = cfg.integer("intermediate_size")
    mlp = "model.layers.*.mlp"
    gated_mlp(groups, "mlp", mlp, hidden, dense_inner, count=n - moe)
    width = max(width, 3 * dense_inner if moe < n else 0)
    if moe:
        experts, inner = cfg.integer("num_experts"), cfg.integer("moe_intermediate_size")
        shared = cfg.integer("shared_expert_intermediate_size", 0, minimum=0)
        groups.add("router", f"{mlp}.gate", hidden * experts * moe, quantizable=False)
        groups.vector("router", f"{mlp}.gate", experts * moe)  # e_score_correction_bias
        gated_mlp(groups, "experts", f"{mlp}.experts", hidden, inner, count=experts * moe)
        gated_mlp(groups, "shared experts", f"{mlp}.shared_experts", hidden, shared, count=moe)
        width = max(width, 3 * (inner * cfg.integer("num_experts_per_tok", 8) + shared))
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    return _count(groups, cfg.dtype(), hidden, vocab, width)


def kimi_linear(config: Mapping[str, Any]) -> ParameterCount:
    """Kimi-Linear (transformers' ``KimiLinear*`` modules): MLA on the full-attention layers (no
    query LoRA unless ``q_lora_rank``), Kimi delta attention on the others (q, k, v projections, a
    depthwise convolution over the three, the low-rank forget gate and output gate, ``b_proj``,
    ``A_log``, ``dt_bias``, the gated norm), dense MLPs where ``mlp_layer_types`` says ``dense``
    (the first ``first_k_dense_replace``, default 1), else routed and shared experts."""
    cfg = ConfigFields(config, "kimi_linear")
    groups, n, hidden, vocab = _decoder(cfg)
    linear_cfg = cfg.section("linear_attn_config") if cfg.has("linear_attn_config") else None
    types = kimi_layer_types(cfg, linear_cfg, n)

    def read(nested: str, flat: str) -> int:
        if linear_cfg is not None and linear_cfg.has(nested):
            return linear_cfg.integer(nested)
        return cfg.integer(flat)

    mla = _mla_attention(cfg, groups, hidden, count=types.count("full_attention"))
    attn = _ATTENTION
    linear = types.count("linear_attention")
    h, d = read("num_heads", "linear_num_heads"), read("head_dim", "linear_head_dim")
    kernel = read("short_conv_kernel_size", "linear_conv_kernel_dim")
    qkv = h * d
    groups.linear("linear attention", attn, hidden, qkv, count=3 * linear)  # q, k, v
    groups.vector(
        "linear attention", attn, linear * (3 * qkv * kernel + qkv + h + d)
    )  # conv, dt_bias, A_log, norm
    groups.linear("linear attention", attn, hidden, d, count=2 * linear)  # f_a, g_a
    groups.linear("linear attention", attn, d, qkv, count=2 * linear)  # f_b, g_b
    groups.linear("linear attention", attn, hidden, h, count=linear)  # b_proj
    groups.linear("linear attention", attn, qkv, hidden, count=linear)
    mlp_types = cfg.data.get("mlp_layer_types")
    if isinstance(mlp_types, list) and len(mlp_types) == n:
        moe = sum(1 for t in mlp_types if t == "sparse")
    else:
        moe = n - min(n, cfg.integer("first_k_dense_replace", 1, minimum=0))
    dense_inner = cfg.integer("intermediate_size")
    gated_mlp(groups, "mlp", "model.layers.*.mlp", hidden, dense_inner, count=n - moe)
    width = max(mla.width, 3 * qkv, 3 * dense_inner if moe < n else 0)
    if moe:
        experts, inner = cfg.integer("num_experts"), cfg.integer("moe_intermediate_size")
        shared = cfg.integer("num_shared_experts", 1, minimum=0)
        groups.add("router", "model.layers.*.mlp.gate", hidden * experts * moe, quantizable=False)
        gated_mlp(groups, "experts", "model.layers.*.mlp.experts", hidden, inner, count=experts * moe)
        gated_mlp(
            groups, "shared experts", "model.layers.*.mlp.shared_experts", hidden, shared * inner, count=moe
        )
        top_k = cfg.integer("num_experts_per_token", cfg.integer("num_experts_per_tok", 8))
        width = max(width, 3 * inner * (top_k + shared))
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    return _count(groups, cfg.dtype(), hidden, vocab, width)


# -- encoder-decoder and cross-attention models ------------------------------------------------


def whisper(config: Mapping[str, Any]) -> ParameterCount:
    """Whisper: the audio encoder (two convolutions, sinusoidal positions) and the decoder (self
    and cross attention, learned positions, tied output projection), LayerNorms with biases."""
    cfg = ConfigFields(config, "whisper")
    d, vocab, mels = cfg.integer("d_model"), cfg.integer("vocab_size"), cfg.integer("num_mel_bins")
    enc, dec = cfg.layer_count("encoder_layers"), cfg.layer_count("decoder_layers")
    enc_ffn, dec_ffn = cfg.integer("encoder_ffn_dim"), cfg.integer("decoder_ffn_dim")
    groups = Groups()
    encoder = "model.encoder"
    groups.vector("audio encoder", encoder, mels * d * 3 + d + d * d * 3 + d)  # two conv1d
    groups.vector("audio encoder", encoder, cfg.integer("max_source_positions") * d)
    # q, v, o with bias, k without (BART style); fc1, fc2 with bias; two LayerNorms per layer
    groups.linear("audio encoder", encoder, d, d, bias=True, count=3 * enc)
    groups.linear("audio encoder", encoder, d, d, count=enc)
    groups.linear("audio encoder", encoder, d, enc_ffn, bias=True, count=enc)
    groups.linear("audio encoder", encoder, enc_ffn, d, bias=True, count=enc)
    groups.vector("audio encoder", encoder, (4 * enc + 2) * d)
    decoder = "model.decoder"
    groups.vector("embeddings", f"{decoder}.embed_tokens", vocab * d)
    groups.vector("embeddings", f"{decoder}.embed_positions", cfg.integer("max_target_positions") * d)
    groups.linear("attention", f"{decoder}.layers.*", d, d, bias=True, count=2 * 3 * dec)
    groups.linear("attention", f"{decoder}.layers.*", d, d, count=2 * dec)
    groups.linear("mlp", f"{decoder}.layers.*", d, dec_ffn, bias=True, count=dec)
    groups.linear("mlp", f"{decoder}.layers.*", dec_ffn, d, bias=True, count=dec)
    groups.vector("norms", f"{decoder}.layers.*", (6 * dec + 2) * d)
    return _count(groups, cfg.dtype(), d, vocab, max(3 * dec_ffn, 3 * d))


def mllama(config: Mapping[str, Any]) -> ParameterCount:
    """Llama-3.2-Vision: a Llama text model whose ``cross_attention_layers`` attend to the image
    (gated, with QK norms), eight extra embedding rows, and the two-stage vision encoder."""
    top = ConfigFields(config, "mllama")
    cfg = top.section("text_config")
    n, hidden, vocab = cfg.layer_count(), cfg.integer("hidden_size"), cfg.integer("vocab_size")
    cross = len(cfg.integers("cross_attention_layers") or [])
    groups = Groups()
    layers = "language_model.model.layers"
    groups.vector("embeddings", "language_model.model.embed_tokens", (vocab + 8) * hidden)
    if not _tied(cfg, False, top):
        groups.vector("lm_head", "language_model.lm_head", vocab * hidden)
    qkv = config_attention(groups, cfg, f"{layers}.*.self_attn", layers=n - cross, bias=False)
    config_attention(groups, cfg, f"{layers}.*.cross_attn", layers=cross, bias=False, qk_norm=True)
    groups.vector("norms", f"{layers}.*.cross_attn", 2 * cross)  # the attention and MLP gates
    inner = cfg.integer("intermediate_size")
    gated_mlp(groups, "mlp", f"{layers}.*.mlp", hidden, inner, count=n)
    groups.vector("norms", f"{layers}.*", (2 * n + 1) * hidden)
    vision = top.section("vision_config")
    vh, v_inner = vision.integer("hidden_size"), vision.integer("intermediate_size")
    patch, image = vision.integer("patch_size"), vision.integer("image_size")
    tiles, channels = vision.integer("max_num_tiles"), vision.integer("num_channels", 3)
    ratios = len(vision.data.get("supported_aspect_ratios") or []) or 8
    positions = (image // patch) ** 2 + 1
    module = "vision_model"
    # patch conv, class embedding, gated positions (+ per-tile), pre/post tile position embeddings
    groups.vector("vision tower", module, channels * patch * patch * vh + vh + positions * vh + 1)
    groups.vector("vision tower", module, (ratios + 1) * tiles * positions * vh)
    groups.vector("vision tower", module, 2 * ((ratios + 1) * tiles * vh + 1))
    local, global_ = vision.layer_count(), vision.integer("num_global_layers")
    for count, gated in ((local, False), (global_, True)):
        groups.linear("vision tower", module, vh, vh, count=4 * count)
        groups.linear("vision tower", module, vh, v_inner, bias=True, count=count)
        groups.linear("vision tower", module, v_inner, vh, bias=True, count=count)
        groups.vector("vision tower", module, count * (4 * vh + (2 if gated else 0)))
    groups.vector("vision tower", module, 4 * vh)  # layernorm_pre, layernorm_post
    groups.linear(
        "vision tower", "multi_modal_projector", vision.integer("vision_output_dim"), hidden, bias=True
    )
    return _count(groups, cfg.dtype(top), hidden, vocab, max(3 * inner, qkv))


#: The decoders counted from data (:class:`Decoder`), by model type; the fields each reads are
#: those of the family's transformers config class (transformers 5.24,
#: ``models/<type>/modeling_<type>.py``; each count equals the parameters of the transformers
#: model and of vLLM 0.32's, ``tests/plugins/models/test_decoder_parameters.py`` and
#: ``docs/reference/models.md``'s architecture table).
DECODERS: dict[str, Decoder] = {
    # MixtralSparseMoeBlock: a router and num_local_experts gated experts of intermediate_size
    "mixtral": Decoder(experts=Experts(count=("num_local_experts",), inner="intermediate_size")),
    # OlmoeAttention: q_norm over num_heads x head_dim, k_norm over num_kv_heads x head_dim;
    # num_experts (num_local_experts its alias) gated experts of intermediate_size every layer
    "olmoe": Decoder(
        qk_norm="width",
        experts=Experts(count=("num_experts", "num_local_experts"), inner="intermediate_size"),
    ),
    # GraniteMoeMoE: router, num_local_experts experts (input_linear 2 x intermediate_size,
    # output_linear); GraniteMoeShared adds one gated shared_mlp of shared_intermediate_size;
    # GraniteMoeSWA an attention sink per head
    "granitemoe": Decoder(experts=Experts(count=("num_local_experts",), inner="intermediate_size")),
    "granitemoeshared": Decoder(
        experts=Experts(
            count=("num_local_experts",), inner="intermediate_size", shared_inner="shared_intermediate_size"
        )
    ),
    "granitemoe_swa": Decoder(
        sinks=True,
        experts=Experts(
            count=("num_local_experts",), inner="intermediate_size", shared_inner="shared_intermediate_size"
        ),
    ),
    "granite_swa": Decoder(tied=True, sinks=True),
    # Qwen2MoeSparseMoeBlock: num_experts experts of moe_intermediate_size, one shared expert of
    # shared_expert_intermediate_size scaled by shared_expert_gate (hidden -> 1); biases on Q,
    # K, V (qkv_bias, default true); dense MLPs of intermediate_size on mlp_only_layers and
    # off the decoder_sparse_step
    "qwen2_moe": Decoder(
        bias=None,
        qkv_bias="qkv_bias",
        qkv_bias_default=True,
        experts=Experts(
            count=("num_experts", "num_local_experts"),
            inner="moe_intermediate_size",
            layers=_sparse_step,
            shared_inner="shared_expert_intermediate_size",
            shared_gate=True,
        ),
    ),
    # Qwen3MoeSparseMoeBlock: Qwen3's QK norms, no shared expert
    "qwen3_moe": Decoder(
        qk_norm="head",
        experts=Experts(
            count=("num_experts", "num_local_experts"), inner="moe_intermediate_size", layers=_sparse_step
        ),
    ),
    # Ernie4_5_MoeSparseMoeBlock: moe_num_experts experts of moe_intermediate_size, a router
    # with a per-expert e_score_correction_bias (Ernie4_5_MoeStatics), moe_num_shared_experts
    # shared experts of moe_intermediate_size as one MLP; use_bias on every projection
    "ernie4_5_moe": Decoder(
        tied=True,
        bias="use_bias",
        mlp_bias="use_bias",
        head_bias="use_bias",
        experts=Experts(
            count=("moe_num_experts", "num_experts"),
            inner="moe_intermediate_size",
            layers=_ernie_interval,
            shared_count="moe_num_shared_experts",
            router_bias=True,
            top_k=("moe_k", "num_experts_per_tok"),
        ),
    ),
    # Cohere2MoeDecoderLayer: one norm per layer (parallel attention and MLP), tied embeddings;
    # num_experts experts of intermediate_size, num_shared_experts x intermediate_size shared;
    # dense MLPs of prefix_dense_intermediate_size where mlp_layer_types says dense
    "cohere2_moe": Decoder(
        tied=True,
        norms=1,
        experts=Experts(
            count=("num_experts",),
            inner="intermediate_size",
            layers=_mlp_layer_types,
            dense_inner="prefix_dense_intermediate_size",
            shared_count="num_shared_experts",
            shared_width="intermediate_size",
        ),
    ),
    # Command R (Cohere 1, 2): one LayerNorm (no bias) per layer, tied embeddings
    "cohere": Decoder(tied=True, norms=1),
    "cohere2": Decoder(tied=True, norms=1),
    # ApertusMLP: up and down only (xIELU, whose alpha_p and alpha_n are learned); QK norms
    "apertus": Decoder(qk_norm="head", gated=False, activation_params={"xielu": 2}),
    # NemotronMLP: up and down only (relu2); NemotronLayerNorm1P: LayerNorms with biases
    "nemotron": Decoder(gated=False, norm_bias=True),
    # Glm4DecoderLayer: four norms a layer (post_self_attn_layernorm, post_mlp_layernorm);
    # biases on Q, K, V (attention_bias, default true); gate and up fused, as counted
    "glm4": Decoder(norms=4, bias=None, qkv_bias="attention_bias", qkv_bias_default=True),
    # Exaone4Attention: Q and K norms of head_dim (post-norms replace the pre-norms: two a layer)
    "exaone4": Decoder(qk_norm="head"),
    # ExaoneMoeSparseMoEBlock: num_experts experts of moe_intermediate_size, num_shared_experts
    # shared ones as one MLP, the router's e_score_correction_bias (a buffer in transformers, a
    # parameter in vLLM 0.32's exaone_moe.py and in the checkpoint); dense MLPs of
    # intermediate_size where mlp_layer_types says dense (the first first_k_dense_replace)
    "exaone_moe": Decoder(
        qk_norm="head",
        experts=Experts(
            count=("num_experts",),
            inner="moe_intermediate_size",
            layers=_mlp_layer_types,
            shared_count="num_shared_experts",
            router_bias=True,
        ),
    ),
    # HyperCLOVAXDecoderLayer: two post-norms more with use_post_norm (default true)
    "hyperclovax": Decoder(optional_norms=("use_post_norm", True, 2)),
    # StableLmDecoderLayer: LayerNorms with biases, one a layer with use_parallel_residual;
    # Q, K, V biases with use_qkv_bias; per-head Q and K LayerNorms (no bias) with qk_layernorm
    "stablelm": Decoder(
        norm_bias=True,
        bias=None,
        qkv_bias="use_qkv_bias",
        qk_norm="width",
        qk_norm_key="qk_layernorm",
        optional_norms=("use_parallel_residual", False, -1),
    ),
}


# -- anything else ---------------------------------------------------------------------------


def llama_like(config: Mapping[str, Any]) -> ParameterCount | None:
    """A model type with no row, counted as a Llama decoder (gated MLP, untied lm_head unless
    the config ties it) when its config has the fields; ``None`` otherwise."""
    top = ConfigFields(config, str(config.get("model_type") or "unknown"))
    cfg = top.section("text_config") if isinstance(config.get("text_config"), Mapping) else top
    needed = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    if not all(cfg.has(key) for key in needed):
        return None
    groups, n, hidden, vocab = _decoder(cfg, top)
    qkv = config_attention(groups, cfg, layers=n, bias=False)
    inner = cfg.integer("intermediate_size")
    gated_mlp(groups, "mlp", "model.layers.*.mlp", hidden, inner, count=n)
    groups.vector("norms", "model.layers.*", (2 * n + 1) * hidden)
    note = (
        f"model type {top.model_type!r} has no parameter count of its own: counted as a Llama-like "
        "decoder (an estimate; a family plugin can count it exactly through kvcore_count_parameters)"
    )
    return _count(groups, cfg.dtype(top), hidden, vocab, max(3 * inner, qkv), (note,))


#: The built-in counts by model type.
COUNTERS: dict[str, Counter] = {
    **{model_type: dense_decoder for model_type in _DENSE},
    "gpt_oss": gpt_oss,
    **{model_type: functools.partial(decoder, shape=shape) for model_type, shape in DECODERS.items()},
    "llama4": llama4,
    "llama4_text": llama4,
    "deepseek_v2": deepseek,
    "deepseek_v3": deepseek,
    "deepseek_v32": deepseek,
    "deepseek_v4": deepseek_v4,
    "jamba": jamba,
    "nemotron_h": nemotron_h,
    "mamba": mamba,
    "falcon_mamba": mamba,
    "mamba2": mamba2,
    "granitemoehybrid": granitemoehybrid,
    "falcon_h1": falcon_h1,
    "zamba2": zamba2,
    "gemma3n": gemma3n,
    "gemma3n_text": gemma3n,
    "qwen3_next": qwen3_next,
    **{model_type: qwen3_5 for model_type in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")},
    **{
        model_type: gemma4
        for model_type in ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
    },
    "kimi_linear": kimi_linear,
    "laguna": laguna,
    "whisper": whisper,
    "mllama": mllama,
}


@hookimpl(trylast=True)
def kvcore_count_parameters(config: Mapping[str, Any]) -> ParameterCount | None:
    counter = COUNTERS.get(str(config.get("model_type")))
    if counter is not None:
        return counter(config)
    return llama_like(config)
