"""The cases on which the ``vllm`` scheduler profile meets vLLM 0.33's real v1 ``Scheduler``.

Shared by ``tests/integrations/vllm/test_scheduler_profile.py`` (every figure must agree) and
``benchmarks/scheduler_agreement.py`` (the agreement table), so that the table shows the cases
the tests check. Imports no vLLM: the plan is made under kvcore's model of vLLM's rules.
"""

from __future__ import annotations

from pathlib import Path

from kvcore import Registry, model_layer_specs
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.plan import KVCachePlan
from kvcore.simulation.workload import Workload, read_trace

GIB = 2**30
#: vLLM's max_num_batched_tokens in every case.
BATCH = 2048
TRACES = Path(__file__).resolve().parents[3] / "examples" / "traces"

#: (model, budget, trace, requests, max_model_len): one full-attention model, one sliding
#: hybrid (Gemma-3: five sliding layers to one full, groups of 16-, 32- and 64-token blocks), one
#: MoE with sliding layers and one with chunked local layers (Llama 4 Scout: three chunked layers
#: to one full, chunks of 8,192 tokens). The budgets are small so that preemption happens (the chat
#: cases preempt 70 to 120 times); the traces are cut to their first requests so that each case
#: takes seconds.
CASES = [
    ("meta-llama/Llama-3.1-8B", GIB // 2, "chat", 80, 2048),
    ("meta-llama/Llama-3.1-8B", 3 * GIB, "long-documents", 12, 20480),
    ("google/gemma-3-27b-it", GIB, "chat", 80, 2048),
    ("google/gemma-3-27b-it", 4 * GIB, "long-documents", 12, 20480),
    ("openai/gpt-oss-20b", GIB // 4, "chat", 80, 2048),
    ("openai/gpt-oss-20b", GIB, "long-documents", 12, 20480),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 2 * GIB, "chat", 80, 2048),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 8 * GIB, "long-documents", 12, 20480),
]


def workload(trace: str, count: int) -> Workload:
    """The first ``count`` requests of ``examples/traces/<trace>.jsonl``."""
    whole = read_trace(TRACES / f"{trace}.jsonl")
    return Workload(whole.requests[:count], name=f"{trace} (first {count})")


def vllm_plan(model: str, budget: int, length: int, *, asynchronous: bool, registry: Registry) -> KVCachePlan:
    """The plan ``plan_for_vllm`` makes for a bundled ``model`` in ``budget`` bytes, as vLLM would
    be configured for the case (``max_model_len`` = ``length``, ``BATCH`` tokens a step)."""
    rules = VllmRules(max_model_len=length, max_num_batched_tokens=BATCH, async_scheduling=asynchronous)
    return plan_for_vllm(rules.request(model_layer_specs(model, registry), budget), rules, registry=registry)


def align_mode_differs() -> str | None:
    """Why the installed vLLM caches Mamba states otherwise than the ``vllm`` profile models
    (vLLM 0.33's ``mamba_cache_mode='align'``: ``MambaManager``, ``_mamba_block_aligned_split``),
    or ``None`` where it does: vLLM 0.32 (the CPU build) runs state layers under prefix caching
    to other figures (its differential seeds 17 and 46 and the Jamba case differ there; 0.33 and
    0.34 agree), which the profile does not model."""
    import vllm

    release = tuple(int(part) for part in vllm.__version__.split("+")[0].split(".")[:2])
    if release < (0, 33):
        return (
            f"vLLM {vllm.__version__} caches Mamba states otherwise than 0.33's align mode, "
            "which the profile models"
        )
    return None
