"""Inline test plugins: a two-part per-request state kind, a cross-attention kind of a fixed
per-request size, and a toy attention module + its ``kvcore_spec_for_module`` hook (the model
side of an engine)."""

from __future__ import annotations

import attrs
import torch

from kvcore import Registry, get_plugin_manager, hookimpl
from kvcore.cache_layout import CacheLayout, PagePart
from kvcore.dtypes import DType, dtype_size, to_dtype
from kvcore.plugins.attention import AttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, positive_int


@attrs.frozen(kw_only=True)
class ToyStateSpec(KVCacheSpec):
    """A fixed per-request state of two parts (``conv`` then ``ssm``), like an SSM layer."""

    kind = "test.state"
    page_scales_with_block_size = False

    conv: int = attrs.field(validator=positive_int)
    ssm: int = attrs.field(validator=positive_int)
    dtype: DType = attrs.field(converter=to_dtype)

    @property
    def page_size_bytes(self) -> int:
        return (self.conv + self.ssm) * dtype_size(self.dtype)

    @property
    def tokens_per_page(self) -> int | None:
        return None

    @property
    def alignment_bytes(self) -> int:
        return dtype_size(self.dtype)

    def max_num_blocks(self, context: SizingContext) -> int:
        return 1


class ToyStatePlugin:
    @hookimpl
    def kvcore_register_spec_kinds(self, register):
        register(ToyStateSpec)

    @hookimpl
    def kvcore_cache_layout(self, spec):
        if not isinstance(spec, ToyStateSpec):
            return None
        return CacheLayout(
            parts=(
                PagePart(name="conv", shape=(spec.conv,), dtype=spec.dtype),
                PagePart(
                    name="ssm",
                    shape=(spec.ssm,),
                    dtype=spec.dtype,
                    offset_bytes=spec.conv * dtype_size(spec.dtype),
                ),
            )
        )


def toy_state_registry() -> Registry:
    """A registry of the built-ins (no entry points) and :class:`ToyStatePlugin`."""
    return Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=[ToyStatePlugin()]))


@attrs.frozen(kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """Cross attention over a fixed encoder output (Whisper's 1,500 frames): a request holds the
    K and V of all ``encoder_len`` encoder tokens from its first decoder token on, whatever its
    length. Only :meth:`live_pages` is overridden; ``max_num_blocks`` is the default, read off it.
    """

    kind = "test.cross_attention"

    encoder_len: int = attrs.field(validator=positive_int)

    def live_pages(self, num_tokens: int, num_computed_tokens: int = 0) -> range:
        return range(cdiv(self.encoder_len, self.block_size) if num_tokens > 0 else 0)


@attrs.frozen(kw_only=True)
class CappedCrossAttentionSpec(AttentionSpec):
    """A third party's fixed-size cross attention written the other way: only
    ``max_num_blocks`` says the request holds ``encoder_len`` tokens' pages; ``live_pages`` is
    the default (a page per ``block_size`` decoder tokens), so the block pool holds it to that
    cap (:func:`kvcore.runtime.one_pool.page_cap`)."""

    kind = "test.capped_cross_attention"

    encoder_len: int = attrs.field(validator=positive_int)

    def max_num_blocks(self, context: SizingContext) -> int:
        return cdiv(self.encoder_len, self.block_size)


class CrossAttentionPlugin:
    @hookimpl
    def kvcore_register_spec_kinds(self, register):
        register(CrossAttentionSpec)
        register(CappedCrossAttentionSpec)


class ToyAttention(torch.nn.Module):
    """A tiny attention-like layer: projects its input and writes it into page 0 of its cache."""

    def __init__(self, hidden: int, num_kv_heads: int, head_size: int, window: int | None = None) -> None:
        super().__init__()
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.window = window
        self.proj = torch.nn.Linear(hidden, num_kv_heads * head_size)
        self.out = torch.nn.Linear(num_kv_heads * head_size, hidden)
        self.kv_cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.proj(x)
        if self.kv_cache is not None:  # (2, pages, block, heads, head) as the layout says
            block = self.kv_cache.shape[2]
            tokens = kv[:block].reshape(-1, self.num_kv_heads, self.head_size)
            self.kv_cache[0, 0, : tokens.shape[0]] = tokens.to(self.kv_cache.dtype)
            self.kv_cache[1, 0, : tokens.shape[0]] = tokens.to(self.kv_cache.dtype)
        return x + self.out(kv)


class ToyModel(torch.nn.Module):
    """``model.layers.{i}.self_attn``: full attention on odd layers, sliding window on even ones."""

    def __init__(self, num_layers: int = 4, hidden: int = 32, window: int = 32) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList()
        for i in range(num_layers):
            block = torch.nn.Module()
            block.self_attn = ToyAttention(hidden, 2, 8, window=None if i % 2 else window)
            block.mlp = torch.nn.Linear(hidden, hidden)
            self.model.layers.append(block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.model.layers:
            x = block.mlp(block.self_attn(x))
        return x


class ToyAttentionPlugin:
    """Recognises :class:`ToyAttention` modules (the ``kvcore_spec_for_module`` side of a model)."""

    @hookimpl
    def kvcore_spec_for_module(self, module, name, options):
        if not isinstance(module, ToyAttention):
            return None
        fields = {
            "block_size": options.block_size,
            "num_kv_heads": module.num_kv_heads,
            "head_size": module.head_size,
            "dtype": options.kv_cache_dtype or "float32",
        }
        if module.window is None:
            return FullAttentionSpec(**fields)
        return SlidingWindowSpec(**fields, sliding_window=module.window)
