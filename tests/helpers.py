"""Small builders shared by tests (not fixtures: plain functions are easier to read inline)."""

from __future__ import annotations

import json
from pathlib import Path

from kvcore import hookimpl
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec

#: The built-in spec kinds, in the order the built-in plugins register them.
BUILTIN_KINDS = (
    "full_attention",
    "sliding_window",
    "chunked_local_attention",
    "mla",
    "dsa_indexer",
    "compressed_mla",
    "compressed_indexer",
    "sliding_window_mla",
    "state",
    "cross_attention",
)


def registering(hook, *objects):
    """A plugin whose ``hook`` (``"kvcore_register_policies"``, ``"kvcore_register_spec_kinds"``,
    ...) registers each of ``objects``, in order."""

    def register_all(self, register):
        for obj in objects:
            register(obj)

    return type("Registering", (), {hook: hookimpl(register_all)})()


def full(block_size=16, heads=8, head_size=128, dtype="bfloat16"):
    return FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype)


def sliding(window, block_size=16, heads=8, head_size=128, dtype="bfloat16"):
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype, sliding_window=window
    )


def chunked(chunk, block_size=16, heads=8, head_size=128, dtype="bfloat16"):
    return ChunkedLocalAttentionSpec(
        block_size=block_size,
        num_kv_heads=heads,
        head_size=head_size,
        dtype=dtype,
        attention_chunk_size=chunk,
    )


def mla(block_size=16, rank=512, rope=64, dtype="bfloat16"):
    return MLAAttentionSpec(block_size=block_size, kv_lora_rank=rank, qk_rope_head_dim=rope, dtype=dtype)


def mix(*parts):
    """``mix((10, full()), (52, sliding(1024)))`` -> layer map; kinds interleave like real models.

    Layers are spread evenly: each part's layers are placed at evenly spaced positions.
    """
    total = sum(n for n, _ in parts)
    slots = []
    for index, (n, spec) in enumerate(parts):
        slots.extend(((k + 0.5) * total / n, index, spec) for k in range(n))
    slots.sort(key=lambda s: (s[0], s[1]))
    return {f"model.layers.{i}": spec for i, (_, _, spec) in enumerate(slots)}


class RecordingExecutor:
    """The smallest executor (:class:`kvcore.Executor`): fixed specs and memory; records the
    order of calls and keeps the plan it was initialized with."""

    def __init__(self, specs, memory):
        self.specs, self.memory, self.calls, self.plan = specs, memory, [], None

    def get_kv_cache_spec(self):
        self.calls.append("specs")
        return self.specs

    def determine_available_memory(self):
        self.calls.append("memory")
        return self.memory

    def initialize(self, plan):
        self.calls.append(("initialize", plan.num_blocks))
        self.plan = plan


def write_step_profile(
    path: Path, prefill=(0, 512, 2048), decode=(1, 32, 128), context=(1000, 100_000)
) -> Path:
    """A ``--step-profile`` file of steps on a known line, one per combination of the values."""
    rows = [
        {
            "prefill_tokens": p,
            "decode_requests": d,
            "context_tokens": c,
            "seconds": 0.005 + 2e-5 * p + 1e-4 * d + 2e-8 * c,
        }
        for p in prefill
        for d in decode
        for c in context
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
