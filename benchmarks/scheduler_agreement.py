"""The ``vllm`` scheduler profile beside vLLM 0.33's real v1 ``Scheduler``: the agreement table.

Needs vLLM 0.33 (``pip install 'kvcore[vllm]'`` in an environment of its own; no GPU:
``VLLM_TARGET_DEVICE=cpu`` is set for you). For three bundled models (Llama-3.1-8B: full
attention; Gemma-3-27B: sliding hybrid; gpt-oss-20b: MoE with sliding layers), the first
requests of ``examples/traces/chat.jsonl`` and ``long-documents.jsonl``, prefix caching off and
on, synchronous and asynchronous scheduling: the plan ``plan_for_vllm`` makes is replayed by
the profile (``kvcore.simulation.simulate``) and by vLLM's scheduler with a fake model runner
(``kvcore.integrations.vllm.scheduler.run_vllm_scheduler``). Each row prints the profile's
figures, then ``=`` when vLLM's are the same at every step (running requests and pool usage per
step, steps, tokens, preemptions, queue delay, cached tokens) or vLLM's figure where one differs.

    python benchmarks/scheduler_agreement.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from kvcore import Registry, model_layer_specs
from kvcore.cli.table import render_table
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.integrations.vllm.scheduler import run_vllm_scheduler
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.simulator import simulate
from kvcore.simulation.workload import Workload, read_trace

GIB = 2**30
BATCH = 2048
TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"

#: (model, budget, trace, requests, max_model_len), as tests/integrations/vllm/test_scheduler_profile.py.
CASES = [
    ("meta-llama/Llama-3.1-8B", GIB // 2, "chat", 80, 2048),
    ("meta-llama/Llama-3.1-8B", 3 * GIB, "long-documents", 12, 20480),
    ("google/gemma-3-27b-it", GIB, "chat", 80, 2048),
    ("google/gemma-3-27b-it", 4 * GIB, "long-documents", 12, 20480),
    ("openai/gpt-oss-20b", GIB // 4, "chat", 80, 2048),
    ("openai/gpt-oss-20b", GIB, "long-documents", 12, 20480),
]


def main() -> int:
    registry = Registry.default()
    rows = []
    disagreements = 0
    for model, budget, trace, count, length in CASES:
        workload = Workload(read_trace(TRACES / f"{trace}.jsonl").requests[:count], name=trace)
        for mode in ("sync", "async"):
            asynchronous = mode == "async"
            rules = VllmRules(
                max_model_len=length, max_num_batched_tokens=BATCH, async_scheduling=asynchronous
            )
            plan = plan_for_vllm(
                rules.request(model_layer_specs(model, registry), budget), rules, registry=registry
            )
            profile = VllmProfile(async_scheduling=asynchronous)
            for caching in (False, True):
                start = time.perf_counter()
                ours = simulate(
                    plan, workload, scheduler=profile, prefix_caching=caching, max_num_batched_tokens=BATCH
                )
                middle = time.perf_counter()
                theirs = run_vllm_scheduler(
                    plan, workload, profile, max_num_batched_tokens=BATCH, prefix_caching=caching
                )
                end = time.perf_counter()

                def cell(mine: object, vllm: object) -> str:
                    return "=" if mine == vllm else f"(vLLM {vllm:,})"

                same_series = ours.running == theirs.running and all(
                    abs(a - b) < 1e-12 for a, b in zip(ours.pool_usage, theirs.pool_usage, strict=True)
                )
                figures = [
                    (ours.steps, theirs.steps),
                    (ours.preemptions, theirs.preemptions),
                    (ours.total_tokens, theirs.total_tokens),
                    (round(ours.mean_queue_delay, 1), round(theirs.mean_queue_delay, 1)),
                    (ours.cached_tokens, theirs.cached_tokens),
                ]
                disagreements += (not same_series) + sum(a != b for a, b in figures)
                rows.append(
                    [
                        model.split("/")[-1],
                        f"{trace} ({count})",
                        mode,
                        "on" if caching else "off",
                        f"{ours.steps:,} {cell(*figures[0])}",
                        f"{ours.preemptions:,} {cell(*figures[1])}",
                        f"{ours.total_tokens:,} {cell(*figures[2])}",
                        f"{ours.mean_queue_delay:,.1f} {cell(*figures[3])}",
                        f"{ours.cached_tokens:,} {cell(*figures[4])}",
                        "=" if same_series else "differ",
                        f"{middle - start:.2f} / {end - middle:.2f}",
                    ]
                )
    print(
        "the vllm profile beside vLLM 0.33's Scheduler (fake model runner), max_num_batched_tokens "
        f"{BATCH:,}; '=': vLLM's figure is the same"
    )
    headers = [
        "model",
        "trace (requests)",
        "scheduling",
        "prefix cache",
        "steps",
        "preemptions",
        "tokens",
        "queue delay",
        "cached tokens",
        "running, pool per step",
        "seconds (profile / vLLM)",
    ]
    print(render_table(headers, rows, align="llll" + "r" * (len(headers) - 4)))
    print(f"{disagreements} figure(s) differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
