"""Named layer mixes kvcore's policies are measured on, for tests and benchmarks alike.

Two sets, each written once so that the tests check the very specs the benchmarks report on:

- :data:`TARGET_MIXES`: seven full/sliding/chunked mixes (the core capacity targets: every
  policy is scored against the ideal bound on them at 40 GiB and :data:`ISSUE_CONTEXT`).
- :data:`ISSUE_CASES`: the cases that several pools, mixed-page groups and any block multiple
  were built for, each with its budget and sizing context.

A plugin author can run a new policy over the same mixes to compare it with the built-ins.
Nothing here imports hypothesis or torch.
"""

from __future__ import annotations

from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.spec import KVCacheSpec, SizingContext

__all__ = [
    "ISSUE_CASES",
    "ISSUE_CONTEXT",
    "OPENELM_HEADS",
    "TARGET_MIXES",
    "chunked",
    "deepseek_v32_like",
    "full",
    "gemma_pattern",
    "interleave",
    "openelm_like",
    "sliding",
    "state",
    "state_hybrid",
    "three_to_two",
]

GIB = 2**30
#: The serving setting of the 40 GiB cases: 32k tokens per request, 2,048-token prefill chunks.
ISSUE_CONTEXT = SizingContext(max_model_len=32768, max_num_batched_tokens=2048)


def full(heads: int = 8) -> KVCacheSpec:
    """A full-attention spec of ``heads`` KV heads of 128, bf16, block 16."""
    return FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=128, dtype="bfloat16")


def sliding(window: int, heads: int = 8) -> KVCacheSpec:
    """A sliding-window spec like :func:`full` with a window of ``window`` tokens."""
    return SlidingWindowSpec(
        block_size=16, num_kv_heads=heads, head_size=128, dtype="bfloat16", sliding_window=window
    )


def chunked(chunk: int) -> KVCacheSpec:
    """A chunked-local spec like :func:`full` with chunks of ``chunk`` tokens."""
    return ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", attention_chunk_size=chunk
    )


def state(hidden: int = 8192) -> KVCacheSpec:
    """A Mamba-1-like state of a model of hidden size ``hidden`` (expand 1): a conv window of 3
    x ``hidden`` and an SSM state of ``hidden`` x 16, bf16 (311,296 bytes at 8,192)."""
    return StateSpec(
        block_size=16,
        parts=(
            StatePart(name="conv", shape=(3, hidden), dtype="bfloat16"),
            StatePart(name="ssm", shape=(hidden, 16), dtype="bfloat16"),
        ),
    )


def state_hybrid(layers: int, every: int = 8, hidden: int = 8192) -> dict[str, KVCacheSpec]:
    """A Mamba-like hybrid of ``layers`` layers: one full-attention layer in ``every`` (the
    last of each run), the rest :func:`state` layers."""
    states, attention = state(hidden), full()
    return {f"model.layers.{i}": attention if i % every == every - 1 else states for i in range(layers)}


def interleave(*parts: tuple[int, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """A layer map of ``(count, spec)`` parts, each part's layers spread evenly over the model
    (real hybrids interleave their kinds), named ``model.layers.{i}``."""
    total = sum(n for n, _ in parts)
    slots = sorted(((k + 0.5) * total / n, i, spec) for i, (n, spec) in enumerate(parts) for k in range(n))
    return {f"model.layers.{i}": spec for i, (_, _, spec) in enumerate(slots)}


#: KV heads per layer of the OpenELM-like case (66 in all).
OPENELM_HEADS = (3,) * 4 + (4,) * 6 + (5,) * 6


def openelm_like() -> dict[str, KVCacheSpec]:
    """16 full-attention layers of 3, 4 or 5 KV heads of 64, bf16: one retention kind, three
    page sizes (vLLM groups them as one; one spec per group needs three)."""
    return {
        f"model.layers.{i}": FullAttentionSpec(block_size=16, num_kv_heads=h, head_size=64, dtype="bfloat16")
        for i, h in enumerate(OPENELM_HEADS)
    }


def deepseek_v32_like() -> dict[str, KVCacheSpec]:
    """61 MLA layers (kv_lora_rank 512 + rope 64 = 576 x bf16, block 64) and 61 indexer key
    caches of 132 bytes per token (128 fp8 + a float32 scale).

    kvcore has no indexer spec: the indexer is modelled as an MLA-like spec of 132 fp8 bytes per
    token (kv_lora_rank 128 + rope 4), which keeps every token like MLA and has exactly the
    indexer's page bytes.
    """
    specs: dict[str, KVCacheSpec] = {}
    for i in range(61):
        specs[f"model.layers.{i}.self_attn"] = MLAAttentionSpec(
            block_size=64, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16"
        )
        specs[f"model.layers.{i}.indexer"] = MLAAttentionSpec(
            block_size=64, kv_lora_rank=128, qk_rope_head_dim=4, dtype="fp8"
        )
    return specs


def gemma_pattern(layers: int = 32) -> dict[str, KVCacheSpec]:
    """``layers`` layers of the Gemma-3 pattern: five sliding(1024) layers, then one full."""
    return {f"model.layers.{i}": full() if i % 6 == 5 else sliding(1024) for i in range(layers)}


def three_to_two() -> dict[str, KVCacheSpec]:
    """Pages in a 3:2 ratio on two retention kinds, which doubling blocks cannot even out: 10
    sliding(1024) layers of 3 KV heads and 2 full-attention layers of 2."""
    return interleave((10, sliding(1024, heads=3)), (2, full(heads=2)))


#: name -> layers of the seven target mixes.
TARGET_MIXES: dict[str, dict[str, KVCacheSpec]] = {
    "a 32 full": interleave((32, full())),
    "b 10 full + 52 sw(1024)": interleave((10, full()), (52, sliding(1024))),
    "c 12 full + 12 sw(128)": interleave((12, full()), (12, sliding(128))),
    "d 20 full + 30 sw(4096)": interleave((20, full()), (30, sliding(4096))),
    "e 19 full + 18 sw(128)": interleave((19, full()), (18, sliding(128))),
    "f 3 full + 7 sw(4096)": interleave((3, full()), (7, sliding(4096))),
    "g 12 full + 36 chunked(8192)": interleave((12, full()), (36, chunked(8192))),
}

#: name -> (layers, budget in bytes, sizing context) of the pool, mixed-page and block-multiple
#: cases: per-kind pools beat one block table (7+5+11, Gemma x 32), one group holds pages of
#: several sizes (OpenELM-like, DeepSeek-V3.2-like), and blocks of any multiple even out pages
#: that doubling cannot (3:2 pages).
ISSUE_CASES: dict[str, tuple[dict[str, KVCacheSpec], int, SizingContext]] = {
    "7 full + 5 sw(2048) + 11 sw(512)": (
        interleave((7, full()), (5, sliding(2048)), (11, sliding(512))),
        40 * GIB,
        ISSUE_CONTEXT,
    ),
    "OpenELM-like": (openelm_like(), GIB, SizingContext(max_model_len=2048)),
    "DeepSeek-V3.2-like": (deepseek_v32_like(), 40 * GIB, ISSUE_CONTEXT),
    "Gemma pattern x 32": (gemma_pattern(32), 40 * GIB, ISSUE_CONTEXT),
    "3:2 pages": (three_to_two(), 40 * GIB, ISSUE_CONTEXT),
}
