"""How long planning for vLLM takes (:func:`kvcore.integrations.vllm.rules.plan_for_vllm`; no
vLLM needed): every bundled model, the two synthetic hybrids of ``tests/configs``
(Nemotron-H-like: 54 Mamba-2 + 10 attention layers; Qwen3-Next-like) and Mamba-like hybrids
of 72 and 128 layers (one full-attention layer in eight, the rest states of hidden size 4,096
or 8,192: :func:`kvcore.testing.mixes.state_hybrid`), with ``shared_buffer`` (whose state
groups span several block ids, so the plan is re-made with larger attention blocks until every
page takes one), at 8 GiB / max_model_len 8,192 and 24 GiB / 32,768, async scheduling.

Each row: the seconds of one ``plan_for_vllm`` call, the plans it made, and the concurrency of
the plan it kept. Target: every call < 1 s, e.g.

    taskset -c 0 python benchmarks/vllm_planning_speed.py
"""

from __future__ import annotations

import time
from pathlib import Path

from kvcore import Registry
from kvcore.cli.table import render_table
from kvcore.errors import KVCoreError
from kvcore.frontends.hf_config import bundled_models, layer_specs_from_config, read_config_file
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.planning import planner as planner_module
from kvcore.spec import KVCacheSpec
from kvcore.testing.mixes import state_hybrid

GiB = 2**30
SETTINGS = ((8 * GiB, 8192), (24 * GiB, 32768))
TARGET_S = 1.0
SYNTHETIC = Path(__file__).resolve().parent.parent / "tests" / "configs"


def models(registry: Registry) -> list[tuple[str, dict[str, KVCacheSpec]]]:
    """``(name, layers)``: the bundled models, the synthetic configs, the Mamba-like hybrids."""
    out = [(m.name, layer_specs_from_config(m.config(), registry)) for m in bundled_models()]
    for path in sorted(SYNTHETIC.glob("*.json")):
        out.append((path.stem, layer_specs_from_config(read_config_file(path), registry)))
    out.append(("mamba-like 72 (63 state h4096 + 9 full)", state_hybrid(72, hidden=4096)))
    out.append(("mamba-like 128 (112 state h8192 + 16 full)", state_hybrid(128)))
    return out


def main() -> None:
    registry = Registry.default(autoload=False)
    real = planner_module.plan
    calls = 0

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    rows = []
    worst = 0.0
    planner_module.plan = counting  # type: ignore[assignment]
    try:
        for name, specs in models(registry):
            for memory, length in SETTINGS:
                calls = 0
                start = time.perf_counter()
                try:
                    rules = VllmRules(max_model_len=length)
                    plan = plan_for_vllm(
                        rules.request(specs, memory, policy="shared_buffer"), rules, registry=registry
                    )
                    outcome = f"{plan.max_concurrency():.2f}"
                except KVCoreError as exc:
                    outcome = f"no plan: {type(exc).__name__}"
                took = time.perf_counter() - start
                worst = max(worst, took)
                rows.append(
                    [
                        name,
                        len(specs),
                        f"{memory // GiB} GiB / {length:,}",
                        f"{took * 1e3:.1f}",
                        calls,
                        outcome,
                    ]
                )
    finally:
        planner_module.plan = real
    print(
        render_table(
            ["model", "layers", "budget / max_model_len", "ms", "plans", "concurrency"],
            rows,
            align="lrlrrr",
        )
    )
    print(f"\nslowest call {worst:.3f} s (target < {TARGET_S:.0f} s): {'yes' if worst < TARGET_S else 'NO'}")


if __name__ == "__main__":
    main()
