"""The module front end for Hugging Face transformers: attention and state modules to specs.

:func:`kvcore.frontends.module_scan.scan_module` offers every submodule of a model to the
``kvcore_spec_for_module`` hook. This plugin answers for modules defined by transformers
(``type(module).__module__`` starts with ``transformers.``) that carry an int ``layer_idx``,
reading sizes from the module's own weights and attributes, not from a config:

- MLA (DeepSeek V2/V3): latent = ``kv_a_proj_with_mqa.out_features``
  (``kv_lora_rank + qk_rope_head_dim``);
- Mamba-1 (Jamba): ``A_log`` is ``(d_inner, d_state)``, the conv kernel is ``conv1d``'s;
- Mamba-2 (Nemotron-H): ``A_log`` is ``(heads,)``, with ``head_dim``, ``n_groups`` and
  ``ssm_state_size``;
- gated delta net (Qwen3-Next, Qwen3.5): ``A_log`` is ``(value heads,)``, with ``num_k_heads``,
  ``head_k_dim`` and ``head_v_dim``;
- Kimi delta attention (Kimi-Linear): a ``conv1d`` over ``3 x num_heads x head_dim`` channels
  (queries, keys and values) with ``num_heads``, ``head_dim`` and no ``A_log`` of its own (its
  forget gate holds it); the recurrent state is float32 unless ``state_dtype`` says otherwise;
- attention: KV heads = ``k_proj.out_features // head_dim`` (Phi-3's fused ``qkv_proj``: the
  module's ``num_key_value_heads``); a ``v_proj`` wider or narrower than ``k_proj`` (values of
  another head size, as MiMo-V2-Flash's) is refused; sliding window or chunk from the module's ``layer_type``
  and ``sliding_window``, else from its config's ``layer_types``, else the config's uniform
  ``sliding_window``. Non-causal modules (encoders, vision towers) are skipped, except a
  decoder's attention over an encoder's output: Whisper's ``encoder_attn`` (``is_decoder``, not
  causal) is cross attention over the config's ``max_source_positions``.

State shapes and tensor parallelism follow the config families (the family kit,
:mod:`kvcore.plugins.models.kit`), so a scan of a model equals ``layer_specs_from_config`` of its
config. With ``kv_cache_dtype`` / ``state_dtype`` ``"auto"`` the dtype is that of the module's
weights. transformers itself is never imported here: the plugin loads, and answers ``None``,
where it is not installed (``pip install kvcore[transformers]`` to scan transformers models).
torch is imported only when a transformers module is offered, so loading the plugin (every
registry does) costs no torch import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcore.dtypes import float32
from kvcore.errors import ModelConfigError
from kvcore.hookspecs import hookimpl
from kvcore.model_options import ModelOptions
from kvcore.plugins.dsa_indexer import INDEXER_DTYPE, DSAIndexerSpec, dsa_latent
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.models.kit import (
    CHUNKED,
    FULL,
    LEGACY_LAYER_TYPES,
    SLIDING,
    Attention,
    ConfigFields,
    gated_delta_net_state,
    kda_state,
    mamba1_state,
    mamba2_state,
)
from kvcore.spec import KVCacheSpec

if TYPE_CHECKING:
    import torch


def _is_transformers_module(module: object) -> bool:
    return type(module).__module__.startswith("transformers.")


def _linear(module: torch.nn.Module, attribute: str) -> torch.nn.Linear | None:
    import torch

    child = getattr(module, attribute, None)
    return child if isinstance(child, torch.nn.Linear) else None


def _weight_dtype(module: torch.nn.Module, *attributes: str) -> torch.dtype:
    """The dtype of the first named child's weight (else of the module's first parameter)."""
    import torch

    for attribute in attributes:
        child = getattr(module, attribute, None)
        weight = getattr(child, "weight", None)
        if isinstance(weight, torch.Tensor):
            return weight.dtype
    for parameter in module.parameters():
        return parameter.dtype
    return torch.get_default_dtype()


def _fields(module: torch.nn.Module, name: str) -> ConfigFields:
    """Reads of the module's int attributes, with errors naming the module."""
    values = {key: value for key, value in vars(module).items() if not key.startswith("_")}
    return ConfigFields(values, type(module).__name__, label=f"module {name!r} ({type(module).__name__})")


def _layer_type(module: torch.nn.Module) -> str | None:
    layer_type = getattr(module, "layer_type", None)
    if not isinstance(layer_type, str):
        types = getattr(getattr(module, "config", None), "layer_types", None)
        index = getattr(module, "layer_idx", None)
        layer_type = types[index] if isinstance(types, (list, tuple)) and isinstance(index, int) else None
        layer_type = layer_type if isinstance(layer_type, str) else None
    return LEGACY_LAYER_TYPES.get(layer_type, layer_type) if layer_type is not None else None


def _encoder_tokens(module: torch.nn.Module) -> int | None:
    """The encoder output a decoder's non-causal attention module attends to, or ``None`` when
    the module is not one: Whisper's ``encoder_attn`` (``is_decoder``) over ``max_source_positions``."""
    if getattr(module, "is_decoder", False) is not True:
        return None
    frames = getattr(getattr(module, "config", None), "max_source_positions", None)
    return frames if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0 else None


def attention_spec(module: torch.nn.Module, name: str, options: ModelOptions) -> KVCacheSpec | None:
    """The spec of a transformers attention module, or ``None`` if it holds no KV cache."""
    head_dim = getattr(module, "head_dim", None)
    if not isinstance(head_dim, int):
        return None
    encoder_tokens = None
    if getattr(module, "is_causal", True) is False:
        encoder_tokens = _encoder_tokens(module)
        if encoder_tokens is None:
            return None
    fields = _fields(module, name)
    k_proj = _linear(module, "k_proj")
    v_proj = _linear(module, "v_proj")
    if k_proj is not None and v_proj is not None and v_proj.out_features != k_proj.out_features:
        raise ModelConfigError(
            f"module {name!r} ({type(module).__name__}) projects keys to {k_proj.out_features} and values to "
            f"{v_proj.out_features} features: its keys and values have different head sizes (MiMo-V2-Flash's "
            "v_head_dim), which kvcore's attention specs cannot hold (one head size for both); register a "
            "kvcore_spec_for_module plugin for it"
        )
    if k_proj is not None:
        kv_heads = k_proj.out_features // head_dim
    elif _linear(module, "qkv_proj") is not None:
        kv_heads = fields.integer("num_key_value_heads")
    else:
        return None
    geometry = Attention(
        num_kv_heads=options.kv_heads_per_rank(kv_heads),
        head_size=head_dim,
        dtype=options.cache_dtype(_weight_dtype(module, "k_proj", "qkv_proj")),
        block_size=options.block_size,
    )
    if encoder_tokens is not None:
        return geometry.cross(encoder_tokens)
    config = getattr(module, "config", None)
    layer_type = _layer_type(module)
    window = getattr(module, "sliding_window", None)
    if window is None:
        window = getattr(config, "sliding_window", None)
    if layer_type is None:
        return geometry.sliding(window) if isinstance(window, int) else geometry.full()
    if layer_type == FULL:
        return geometry.full()
    if layer_type == SLIDING and isinstance(window, int):
        return geometry.sliding(window)
    chunk = getattr(config, "attention_chunk_size", None)
    if layer_type == CHUNKED and isinstance(chunk, int):
        return geometry.chunked(chunk)
    raise ModelConfigError(
        f"module {name!r} ({type(module).__name__}) is a {layer_type!r} layer without a usable window or "
        f"chunk size (sliding_window={window!r}, attention_chunk_size={chunk!r}); register a "
        "kvcore_spec_for_module plugin for it"
    )


def mla_spec(module: torch.nn.Module, name: str, options: ModelOptions) -> KVCacheSpec | None:
    """The spec of a DeepSeek-style MLA module (latent from ``kv_a_proj_with_mqa``)."""
    proj = _linear(module, "kv_a_proj_with_mqa")
    rope = getattr(module, "qk_rope_head_dim", None)
    if proj is None or not isinstance(rope, int):
        return None
    spec = MLAAttentionSpec(
        block_size=options.block_size,
        kv_lora_rank=proj.out_features - rope,
        qk_rope_head_dim=rope,
        dtype=options.cache_dtype(_weight_dtype(module, "kv_a_proj_with_mqa")),
    )
    # beside a sparse-attention indexer the latent is stored as the sparse kernels read it
    return dsa_latent(spec) if getattr(module, "indexer", None) is not None else spec


def dsa_indexer_spec(module: torch.nn.Module, name: str, options: ModelOptions) -> KVCacheSpec | None:
    """The key cache of a DeepSeek sparse-attention indexer (transformers' ``DeepseekV32Indexer``:
    ``index_topk``, a ``wk`` key projection of ``head_dim`` outputs), fp8 with scales as engines
    keep it (:mod:`kvcore.plugins.dsa_indexer`)."""
    wk = _linear(module, "wk")
    if wk is None or not isinstance(getattr(module, "index_topk", None), int):
        return None
    return DSAIndexerSpec(block_size=options.block_size, index_head_dim=wk.out_features, dtype=INDEXER_DTYPE)


def state_spec(module: torch.nn.Module, name: str, options: ModelOptions) -> KVCacheSpec | None:
    """The spec of a Mamba-1, Mamba-2 or gated-delta-net module (found by ``A_log``)."""
    import torch

    a_log = getattr(module, "A_log", None)
    conv = getattr(module, "conv1d", None)
    if not isinstance(a_log, torch.Tensor) or not isinstance(conv, torch.nn.Conv1d):
        return None
    fields = _fields(module, name)
    dtype = options.state_cache_dtype(_weight_dtype(module, "out_proj", "in_proj"))
    kernel = int(conv.kernel_size[0])
    if a_log.dim() == 2:  # Mamba-1: A is (d_inner, d_state)
        inner, state_size = (int(d) for d in a_log.shape)
        return mamba1_state(
            fields, options, dtype, inner=("A_log.shape[0]", inner), state_size=state_size, conv_kernel=kernel
        )
    heads = int(a_log.shape[0])
    if hasattr(module, "head_k_dim"):  # gated delta net: A is (value heads,)
        return gated_delta_net_state(
            fields,
            options,
            dtype,
            key_heads=("num_k_heads", fields.integer("num_k_heads")),
            value_heads=("A_log.shape[0]", heads),
            key_head_dim=fields.integer("head_k_dim"),
            value_head_dim=fields.integer("head_v_dim"),
            conv_kernel=kernel,
        )
    return mamba2_state(  # Mamba-2: A is (heads,)
        fields,
        options,
        dtype,
        heads=("A_log.shape[0]", heads),
        head_dim=fields.integer("head_dim"),
        n_groups=("n_groups", fields.integer("n_groups")),
        state_size=fields.integer("ssm_state_size"),
        conv_kernel=kernel,
    )


def kda_spec(module: torch.nn.Module, name: str, options: ModelOptions) -> KVCacheSpec | None:
    """The state of a Kimi delta attention module (transformers' ``KimiLinearDeltaAttention``):
    a ``conv1d`` over queries, keys and values of ``num_heads x head_dim`` each."""
    import torch

    conv = getattr(module, "conv1d", None)
    heads, head_dim = getattr(module, "num_heads", None), getattr(module, "head_dim", None)
    if (
        not isinstance(conv, torch.nn.Conv1d)
        or not isinstance(heads, int)
        or not isinstance(head_dim, int)
        or isinstance(getattr(module, "A_log", None), torch.Tensor)
        or conv.in_channels != 3 * heads * head_dim
    ):
        return None
    return kda_state(
        _fields(module, name),
        options,
        options.state_cache_dtype(_weight_dtype(module, "o_proj", "q_proj")),
        heads=("num_heads", heads),
        head_dim=head_dim,
        conv_kernel=int(conv.kernel_size[0]),
        recurrent_dtype=options.state_dtype or float32,
    )


@hookimpl(trylast=True)
def kvcore_spec_for_module(module: torch.nn.Module, name: str, options: ModelOptions) -> KVCacheSpec | None:
    if not _is_transformers_module(module) or not isinstance(getattr(module, "layer_idx", None), int):
        return None
    for recognise in (mla_spec, dsa_indexer_spec, state_spec, kda_spec, attention_spec):
        spec = recognise(module, name, options)
        if spec is not None:
            return spec
    return None
