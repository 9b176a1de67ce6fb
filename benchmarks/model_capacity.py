"""Capacity of kvcore's default plan for every bundled model, against the ideal bound.

Setting: 80 GiB of KV cache, max_model_len = min(max_position_embeddings, 131072) (131072 when
the config states none, as gemma-3's text_config relies on transformers' default), default model
options (tp 1, the model's dtype, block 16), max_num_batched_tokens 2048. For each model: the
ideal concurrency (no layout can hold more requests of that length), the planned concurrency,
their ratio (target >= 0.99), the policy and group count, the largest block size a group got,
and the padding per request (bytes the plan allocates for one request minus what its layers
need). The two synthetic hybrids from tests/configs (not published models) follow.

    python benchmarks/model_capacity.py
"""

from __future__ import annotations

from pathlib import Path

from kvcore import Registry, SizingContext, ideal_concurrency, plan_kv_cache, request_bytes
from kvcore.cli.table import render_table
from kvcore.frontends.hf_config import (
    bundled_models,
    layer_specs_from_config,
    max_position_embeddings,
    read_config_file,
)
from kvcore.units import format_bytes

GIB = 2**30
BUDGET = 80 * GIB
LONGEST = 131072
SYNTHETIC = Path(__file__).parents[1] / "tests" / "configs"


def models() -> list[tuple[str, dict[str, object]]]:
    """``(name, config)``: the bundled models, then the synthetic hybrids."""
    found: list[tuple[str, dict[str, object]]] = [(m.name, m.config()) for m in bundled_models()]
    for path in sorted(SYNTHETIC.glob("synthetic__*.json")):
        found.append((f"{path.stem.removeprefix('synthetic__')} (synthetic)", read_config_file(path)))
    return found


def main() -> None:
    registry = Registry.default(autoload=False)
    rows = []
    worst = (2.0, "")
    for name, config in models():
        specs = layer_specs_from_config(config, registry)
        length = min(max_position_embeddings(config) or LONGEST, LONGEST)
        context = SizingContext(max_model_len=length)
        plan = plan_kv_cache(specs, BUDGET, context, registry=registry)
        ideal = ideal_concurrency(specs, BUDGET, context)
        ratio = plan.max_concurrency() / ideal
        padding = plan.blocks_per_request() * plan.bytes_per_block - request_bytes(specs, context)
        worst = min(worst, (ratio, name))
        rows.append(
            [
                name,
                f"{length:,}",
                f"{ideal:.2f}",
                f"{plan.max_concurrency():.2f}",
                f"{ratio:.4f}",
                plan.policy,
                len(plan.groups),
                max(g.spec.block_size for g in plan.groups if g.spec.tokens_per_page is not None),
                format_bytes(padding),
            ]
        )
    print(f"{format_bytes(BUDGET)}, max_model_len = min(max_position_embeddings, {LONGEST}), tp 1, block 16")
    print(
        render_table(
            [
                "model",
                "max_model_len",
                "ideal",
                "planned",
                "ratio",
                "policy",
                "groups",
                "max block",
                "padding/req",
            ],
            rows,
            align="lrrrrlrrr",
        )
    )
    print(f"\nworst ratio: {worst[0]:.4f} ({worst[1]}); target >= 0.99")


if __name__ == "__main__":
    main()
