"""Layer mixes shared by the benchmarks: the seven target mixes of the core issue."""

from __future__ import annotations

from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.spec import KVCacheSpec

ATTN = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}


def full() -> KVCacheSpec:
    return FullAttentionSpec(**ATTN)


def sliding(window: int) -> KVCacheSpec:
    return SlidingWindowSpec(**ATTN, sliding_window=window)


def chunked(chunk: int) -> KVCacheSpec:
    return ChunkedLocalAttentionSpec(**ATTN, attention_chunk_size=chunk)


def interleave(*parts: tuple[int, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Spread each part's layers evenly over the model, like real hybrids interleave kinds."""
    total = sum(n for n, _ in parts)
    slots = sorted(
        ((k + 0.5) * total / n, i, spec) for i, (n, spec) in enumerate(parts) for k in range(n)
    )
    return {f"model.layers.{i}": spec for i, (_, _, spec) in enumerate(slots)}


TARGET_MIXES: dict[str, dict[str, KVCacheSpec]] = {
    "a 32 full": interleave((32, full())),
    "b 10 full + 52 sw(1024)": interleave((10, full()), (52, sliding(1024))),
    "c 12 full + 12 sw(128)": interleave((12, full()), (12, sliding(128))),
    "d 20 full + 30 sw(4096)": interleave((20, full()), (30, sliding(4096))),
    "e 19 full + 18 sw(128)": interleave((19, full()), (18, sliding(128))),
    "f 3 full + 7 sw(4096)": interleave((3, full()), (7, sliding(4096))),
    "g 12 full + 36 chunked(8192)": interleave((12, full()), (36, chunked(8192))),
}
