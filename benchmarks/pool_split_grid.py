"""How far a fixed pool split gets on long documents: every split of ``kind_pools``' two pools in
steps of STEP of the budget, against ``shared_buffer`` and ``unified_pool``.

The sample and settings are ``benchmarks/tune.py``'s long-document ones (its first DOC_REQUESTS
documents all arriving at once, a KV budget of BUDGET, max_model_len MAX_LEN, vLLM's rules and
its scheduler profile at ``max_num_seqs`` 128 and 2,048 tokens a step, steps timed by the H100
roofline): output tokens per second of each split, the best of them, the split
:func:`kvcore.tuning.split.workload_split` derives (as ``kvcore tune`` does: prompt chunks of the
plan's context, which under vLLM's rules counts two batches in flight), and the two one-pool
layouts. A split whose
plan holds no request of MAX_LEN, or whose run stalls, is left out.

    python benchmarks/pool_split_grid.py [MODEL ...]   (default: Gemma-3-27B and Llama-4-Scout)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tune import BATCH, BUDGET, DOC_REQUESTS, MAX_LEN, TRACES, _tokens_per_second, saturated

from kvcore import Registry, model_layer_specs
from kvcore.cli.table import render_table
from kvcore.errors import KVCoreError
from kvcore.frontends.hf_config import load_model_config
from kvcore.integrations.tuned import vllm_planner
from kvcore.plan import KVCachePlan
from kvcore.policy import PlanOptions
from kvcore.simulation.gpus import find_gpu
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.simulator import simulate
from kvcore.simulation.timing import roofline
from kvcore.simulation.workload import read_trace
from kvcore.spec import SizingContext
from kvcore.tuning.split import workload_split

#: The grid: pool 0's share of the budget from STEP to 1 - STEP.
STEP = 0.02
MODELS = ["google/gemma-3-27b-it", "meta-llama/Llama-4-Scout-17B-16E-Instruct"]


def main(models: list[str]) -> int:
    registry = Registry.default()
    gpu = find_gpu("H100")
    documents = read_trace(TRACES / "long-documents.jsonl").requests[:DOC_REQUESTS]
    workload = saturated(documents, "long-documents")
    planner = vllm_planner(registry)
    context = SizingContext(max_model_len=MAX_LEN, max_num_batched_tokens=BATCH)
    rows = []
    for model in models:
        config, source = load_model_config(model)
        specs = model_layer_specs(model, registry)

        def served(plan: KVCachePlan) -> float:
            timer = roofline(config, registry, plan, gpu, source=source)  # noqa: B023
            run = simulate(
                plan, workload, max_num_batched_tokens=BATCH, step_time=timer, scheduler=VllmProfile()
            )
            return _tokens_per_second(run, workload)

        def split_plan(split: tuple[float, ...]) -> KVCachePlan:
            return planner(specs, BUDGET, context, "kind_pools", PlanOptions(pool_split=split))  # noqa: B023

        shared = served(planner(specs, BUDGET, context, "shared_buffer", PlanOptions()))
        unified = served(planner(specs, BUDGET, context, "unified_pool", PlanOptions()))
        pooled = planner(specs, BUDGET, context, "kind_pools", PlanOptions())
        if len(pooled.pools) != 2:
            rows.append([model.split("/")[-1], "-", "-", "-", f"{shared:,.0f}", f"{unified:,.0f}"])
            continue
        grid: list[tuple[float, float]] = []
        for k in range(1, round(1 / STEP)):
            share = k * STEP
            try:
                grid.append((served(split_plan((share, 1 - share))), share))
            except KVCoreError:  # holds no request of MAX_LEN, or the run cannot admit one
                continue
        best, at = max(grid)
        derived = workload_split(pooled, workload)  # as kvcore tune derives it (the plan's context)
        sized = served(split_plan(derived))
        rows.append(
            [
                model.split("/")[-1],
                f"{best:,.0f} ({100 * at:.0f}% to pool 0; {best / shared:.3f})",
                f"{sized:,.0f} ({100 * derived[0]:.1f}%; {sized / shared:.3f})",
                f"{len(grid)}",
                f"{shared:,.0f}",
                f"{unified:,.0f} ({unified / shared:.3f})",
            ]
        )
        print("  " + " | ".join(rows[-1]), file=sys.stderr)
    print(
        f"long documents (first {DOC_REQUESTS}), {BUDGET >> 30} GiB, max_model_len {MAX_LEN:,}, vLLM "
        "profile, H100 roofline; output tokens per second (and over shared_buffer)"
    )
    print(
        render_table(
            ["model", "best fixed split", "workload_split", "splits run", "shared_buffer", "unified_pool"],
            rows,
            align="lrrrrr",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or MODELS))
