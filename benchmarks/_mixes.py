"""Layer mixes shared by the benchmarks: the seven target mixes of the core issue, and the
cases of issue 13 (:data:`ISSUE_MIXES`)."""

from __future__ import annotations

from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.spec import KVCacheSpec, SizingContext

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
    slots = sorted(((k + 0.5) * total / n, i, spec) for i, (n, spec) in enumerate(parts) for k in range(n))
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


# The cases of issue 13 (several pools, mixed pages, any block multiple): name -> (specs,
# budget, context). The specs are also in tests/policies/issue_cases.py (tests do not import
# benchmarks/).
GIB = 2**30
ISSUE_CONTEXT = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)
#: 66 KV heads in all: the issue's figures (kvcore 29.79 with 4 groups before, vLLM 31.02)
OPENELM_HEADS = (3,) * 4 + (4,) * 6 + (5,) * 6


def openelm_like() -> dict[str, KVCacheSpec]:
    """16 full-attention layers of 3, 4 or 5 KV heads of 64, bf16: one retention, three pages."""
    return {
        f"model.layers.{i}": FullAttentionSpec(block_size=16, num_kv_heads=h, head_size=64, dtype="bfloat16")
        for i, h in enumerate(OPENELM_HEADS)
    }


def deepseek_v32_like() -> dict[str, KVCacheSpec]:
    """61 MLA layers (kv_lora_rank 512 + rope 64 = 576 x bf16, block 64) and 61 indexer key
    caches of 132 bytes per token (128 fp8 + a float32 scale). kvcore has no indexer spec: the
    indexer is modelled as an MLA-like spec of 132 fp8 bytes per token (kv_lora_rank 128 +
    rope 4), which keeps every token like MLA and has exactly the indexer's page bytes."""
    specs: dict[str, KVCacheSpec] = {}
    for i in range(61):
        specs[f"model.layers.{i}.self_attn"] = MLAAttentionSpec(
            block_size=64, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16"
        )
        specs[f"model.layers.{i}.indexer"] = MLAAttentionSpec(
            block_size=64, kv_lora_rank=128, qk_rope_head_dim=4, dtype="fp8"
        )
    return specs


def three_to_two() -> dict[str, KVCacheSpec]:
    """Pages in a 3:2 ratio on two retention kinds that doubling blocks cannot even out: 10
    sliding(1024) layers of 3 KV heads and 2 full-attention layers of 2."""
    return interleave(
        (10, SlidingWindowSpec(**{**ATTN, "num_kv_heads": 3}, sliding_window=1024)),
        (2, FullAttentionSpec(**{**ATTN, "num_kv_heads": 2})),
    )


ISSUE_MIXES: dict[str, tuple[dict[str, KVCacheSpec], int, SizingContext]] = {
    "7 full + 5 sw(2048) + 11 sw(512)": (
        interleave((7, full()), (5, sliding(2048)), (11, sliding(512))),
        40 * GIB,
        ISSUE_CONTEXT,
    ),
    "OpenELM-like (1 GiB, 2048)": (openelm_like(), GIB, SizingContext(max_model_len=2048)),
    "DeepSeek-V3.2-like": (deepseek_v32_like(), 40 * GIB, ISSUE_CONTEXT),
    "Gemma pattern x 32": (
        {f"model.layers.{i}": full() if i % 6 == 5 else sliding(1024) for i in range(32)},
        40 * GIB,
        ISSUE_CONTEXT,
    ),
    "3:2 pages: 10 sw(1024) x3 + 2 full x2": (three_to_two(), 40 * GIB, ISSUE_CONTEXT),
}
