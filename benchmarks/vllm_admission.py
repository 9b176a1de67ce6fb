"""kvcore's plans inside vLLM: what vLLM's own KVCacheManager admits on them, beside vLLM's own plan.

Needs vLLM 0.33 (``pip install 'kvcore[vllm]'`` in an environment of its own; no GPU:
``VLLM_TARGET_DEVICE=cpu`` is set for you). Setting: 8 GiB, max_model_len 8192,
max_num_batched_tokens 2048, every bundled model and every policy that plans it.

For each, in synchronous and asynchronous scheduling (vLLM 0.33's default):

- kvcore promise: whole requests of max_model_len the plan made under vLLM's rules holds
  (``plan_for_vllm``: null block, tokens in flight, one block id per page);
- vLLM manager: the most requests of max_model_len vLLM's ``KVCacheManager`` runs at once on
  that plan converted to vLLM's ``KVCacheConfig`` (prompt of max_model_len - 1 tokens, chunked
  prefill through ``allocate_slots``, one decode token; however the chunks fall; a
  cross-attention model's requests each bring the model's longest encoder output);
- vLLM's own plan: the same count on the config vLLM's own planner makes for the same layers
  (``get_kv_cache_configs``), and the concurrency vLLM logs for it ("logs").

    python benchmarks/vllm_admission.py
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from kvcore import PolicyNotApplicableError, Registry, model_layer_specs
from kvcore.cli.table import render_table
from kvcore.frontends.hf_config import bundled_models
from kvcore.integrations.vllm import admission, convert
from kvcore.integrations.vllm.rules import VllmRules, encoder_tokens_of, plan_for_vllm
from kvcore.spec import KVCacheSpec

GIB = 2**30
BUDGET = 8 * GIB
LENGTH = 8192
POLICIES = ("uniform", "equal_groups", "shared_buffer")


def own_figures(specs: dict[str, KVCacheSpec], rules: VllmRules) -> tuple[int, float]:
    """Requests vLLM's manager runs on vLLM's own plan, and the concurrency vLLM logs."""
    config = admission.vllm_own_config(admission.vllm_layer_specs(specs, rules), BUDGET, rules)
    start = admission.promised(convert.plan_from_vllm_config(config, rules.context(), BUDGET))
    return admission.admitted(config, rules, start=start), admission.logged_concurrency(config, rules)


def kvcore_figures(
    specs: dict[str, KVCacheSpec], rules: VllmRules, policy: str, registry: Registry
) -> tuple[int, int]:
    """kvcore's promise and what vLLM's manager runs on the converted plan."""
    plan = plan_for_vllm(rules.request(specs, BUDGET, policy=policy), rules, registry=registry)
    promise = admission.promised(plan)
    return promise, admission.admitted(convert.plan_to_vllm_config(plan), rules, start=promise)


def main() -> int:
    registry = Registry.default()
    models = sys.argv[1:] or [m.name for m in bundled_models()]
    rows = []
    short = 0
    for model in models:
        specs = model_layer_specs(model, registry)
        encoder = encoder_tokens_of(specs)  # Whisper's 1500 audio frames, Llama-3.2-Vision's 6404
        modes = tuple(
            VllmRules(max_model_len=LENGTH, async_scheduling=mode, max_encoder_tokens=encoder)
            for mode in (False, True)
        )
        own = [own_figures(specs, rules) for rules in modes]
        for policy in POLICIES:
            try:
                figures = [kvcore_figures(specs, rules, policy, registry) for rules in modes]
            except PolicyNotApplicableError:
                continue
            promise = " / ".join(str(p) for p, _ in figures)
            manager = " / ".join(str(m) for _, m in figures)
            mark = "" if all(p == m for p, m in figures) else "  <- differs"
            if any(m < o for (_, m), (o, _) in zip(figures, own, strict=True)):
                mark += "  <- below vLLM's own"
                short += 1
            rows.append(
                [
                    model,
                    policy,
                    promise,
                    manager + mark,
                    " / ".join(str(o) for o, _ in own) + f" (logs {own[0][1]:.2f} / {own[1][1]:.2f})",
                ]
            )
    print(
        f"budget {BUDGET // GIB} GiB, max_model_len {LENGTH:,}, max_num_batched_tokens 2,048; "
        "requests of max_model_len held at once, sync / async scheduling"
    )
    print(
        render_table(
            ["model", "policy", "kvcore promise", "vLLM manager on the kvcore plan", "vLLM's own plan"],
            rows,
            align="lllll",
        )
    )
    return 1 if short else 0


if __name__ == "__main__":
    raise SystemExit(main())
