"""What ``kvcore tune`` buys over the engines' defaults, simulated on the bundled traces.

For Gemma-3-27B, gpt-oss-20b, Llama-4-Scout and Jamba-1.5-Mini on samples of the chat and
long-document traces (``examples/traces``: the first CHAT_REQUESTS chat requests and the first
DOC_REQUESTS documents), each with a KV budget of BUDGET and max_model_len MAX_LEN, steps timed
by the H100 roofline at tp 1 (a lower bound; Llama-4-Scout's and Jamba's bf16 weights would not
fit one H100, and their bytes are still what each step reads):

- **vLLM defaults**: vLLM's own grouping (``equal_groups``, one page size per group, planned
  under vLLM's rules by ``plan_for_vllm``; for a Mamba hybrid, whose pages vLLM pads to one size
  and no kvcore policy does, kvcore's ``shared_buffer`` stands in, which holds at least as much,
  so that row's ratio is a lower bound), the specs' block size, ``max_num_seqs`` 128,
  ``max_num_batched_tokens`` 2048, async scheduling; replayed by the ``vllm`` profile;
- **SGLang defaults**: SGLang's own configurator (``swa_full_tokens_ratio`` 0.8, page 1,
  ``chunked_prefill_size`` 2048, ``max_running_requests`` 128) as a ``kind_pools`` plan of the
  same pools; replayed by the ``sglang`` profile when one is registered (else its KV tokens
  only, and the row says so: no other profile stands in);
- **tuned**: :func:`kvcore.tuning.search.tune` over every policy, the pool split,
  ``max_num_seqs`` 128/256/512 and ``max_num_batched_tokens`` 2048/4096/8192 (KV dtype as the
  model's: fp8 changes the model's numbers, so it is not assumed allowed), planned under vLLM's
  rules and replayed by the ``vllm`` profile, maximising output tokens per second.

Then, on the long-document sample, the pools sized by the workload beside ``shared_buffer``,
every other setting the vLLM defaults': ``kind_pools`` with the worst-case split and with the
best split of the split knob (a split fixed when the plan is made), and ``unified_pool``, whose
kinds lend each other the rows of one pool (the split follows the workload step by step).
Target: the better of the two >= ``shared_buffer``.

Target: tuned >= 1.3x vLLM's defaults on the hybrids (every model here is one). The ratio is
printed whatever it is.

    python benchmarks/tune.py [--budget-gib 8]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from kvcore import PlanRequest, Registry, model_layer_specs
from kvcore.cli.table import render_table
from kvcore.errors import KVCoreError, PolicyNotApplicableError
from kvcore.frontends.hf_config import load_model_config
from kvcore.integrations.sglang.model import sglang_model
from kvcore.integrations.sglang.rules import (
    SglangRules,
    cell_bytes,
    check_specs,
    own_pool_sizes,
    plan_for_sglang,
    sglang_specs,
)
from kvcore.integrations.tuned import VLLM_OWN_POLICY, sglang_profile, vllm_planner
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.plan import KVCachePlan
from kvcore.policy import PlanOptions
from kvcore.simulation.gpus import find_gpu
from kvcore.simulation.profiles.vllm import VllmProfile
from kvcore.simulation.simulator import SimulationResult, simulate
from kvcore.simulation.timing import latency_report, roofline
from kvcore.simulation.workload import Request, Workload, read_trace
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.tuning.search import SearchSpace, Trial, tune

GIB = 2**30
#: The KV budget (``--budget-gib N`` on the command line changes it).
BUDGET = 8 * GIB
MAX_LEN = 32768
BATCH = 2048
CHAT_REQUESTS = 300
DOC_REQUESTS = 60
TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"
MODELS = [
    "google/gemma-3-27b-it",
    "openai/gpt-oss-20b",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "ai21labs/AI21-Jamba-1.5-Mini",
]
TARGET = 1.3


def _tokens_per_second(result: SimulationResult, workload: Workload) -> float:
    if result.timeline is None:
        return 0.0
    return latency_report(
        result.timeline, [r.output_tokens for r in workload.requests]
    ).output_tokens_per_second


def saturated(requests: Sequence[Request], name: str) -> Workload:
    """The requests all arriving at step 0: the engine is never idle, so tokens per second measure
    what the settings serve, not the trace's arrival rate."""
    return Workload(tuple(attrs.evolve(r, arrival_step=0) for r in requests), name=name)


def vllm_default_plan(specs: Mapping[str, KVCacheSpec], registry: Registry) -> tuple[KVCachePlan, str]:
    """vLLM's own grouping under its rules at its default settings, and what stood in for it."""
    rules = VllmRules(max_model_len=MAX_LEN, max_num_batched_tokens=BATCH)
    try:
        plan = plan_for_vllm(
            rules.request(specs, BUDGET, policy=VLLM_OWN_POLICY, options=PlanOptions(mixed_pages=False)),
            rules,
            registry=registry,
        )
        return plan, VLLM_OWN_POLICY
    except PolicyNotApplicableError:
        # pages of several sizes (a Mamba hybrid): vLLM pads them to the largest, which no kvcore
        # policy plans; kvcore's shared_buffer stands in, which holds at least what vLLM does
        plan = plan_for_vllm(rules.request(specs, BUDGET, policy="shared_buffer"), rules, registry=registry)
        return plan, "shared_buffer (stands in: vLLM pads pages, kvcore does not)"


def _at_defaults(trials: Sequence[Trial], policy: str) -> list[Trial]:
    """The trials of ``policy`` that ran at vLLM's default scheduler settings."""
    return [
        t
        for t in trials
        if t.ok
        and t.knobs.policy == policy
        and (t.knobs.max_num_seqs, t.knobs.max_num_batched_tokens) == (128, BATCH)
    ]


def split_row(model: str, trials: Sequence[Trial]) -> list[str]:
    """The long-document row of the split table: ``kind_pools`` with the worst-case split and with
    the best workload-sized split the search tried, ``unified_pool`` (whose kinds lend each other
    one pool's rows: the split follows the workload step by step), ``shared_buffer``, and the
    better workload-sized candidate over ``shared_buffer``."""
    pooled = [t for t in _at_defaults(trials, "kind_pools") if t.knobs.split_shift is not None]
    worst = [t for t in _at_defaults(trials, "kind_pools") if t.knobs.split_shift is None]
    unified = _at_defaults(trials, "unified_pool")
    shared = _at_defaults(trials, "shared_buffer")
    if not shared:
        return [model.split("/")[-1], "-", "-", "-", "no shared_buffer run", "-"]
    top = max(pooled, key=lambda t: t.score) if pooled else None
    sized = [t.score for t in (top, *unified[:1]) if t is not None]
    return [
        model.split("/")[-1],
        f"{worst[0].score:,.0f}" if worst else "-",
        f"{top.score:,.0f} ({top.knobs.describe('split_shift')})" if top else "no kind_pools plan",
        f"{unified[0].score:,.0f}" if unified else "-",
        f"{shared[0].score:,.0f}",
        f"{max(sized) / shared[0].score:.3f}" if sized else "-",
    ]


def main() -> int:
    registry = Registry.default()
    gpu = find_gpu("H100")
    sglang = sglang_profile(registry)
    traces = {
        "chat": saturated(read_trace(TRACES / "chat.jsonl").requests[:CHAT_REQUESTS], "chat"),
        "long-documents": saturated(
            read_trace(TRACES / "long-documents.jsonl").requests[:DOC_REQUESTS], "long-documents"
        ),
    }
    space = SearchSpace(
        policies=tuple(registry.policies),
        max_num_seqs=(128, 256, 512),
        max_num_batched_tokens=(BATCH, 2 * BATCH, 4 * BATCH),
    )
    rows = []
    splits = []
    short = 0
    started = time.perf_counter()
    for model in MODELS:
        config, source = load_model_config(model)
        specs = model_layer_specs(model, registry)

        def timer(plan, config=config, source=source):  # type: ignore[no-untyped-def]
            return roofline(config, registry, plan, gpu, source=source)

        for trace, workload in traces.items():
            context = SizingContext(max_model_len=MAX_LEN, max_num_batched_tokens=BATCH)
            clock = time.perf_counter()
            # vLLM's defaults
            own, stand_in = vllm_default_plan(specs, registry)
            vllm_run = simulate(
                own, workload, max_num_batched_tokens=BATCH, step_time=timer(own), scheduler=VllmProfile()
            )
            vllm_tps = _tokens_per_second(vllm_run, workload)
            # SGLang's defaults
            sg_specs = sglang_model(specs, config, fix="").specs
            sg_rules = SglangRules(context_len=MAX_LEN, chunked_prefill_size=BATCH)
            try:
                sizes = own_pool_sizes(sglang_specs(sg_specs, sg_rules), BUDGET, sg_rules)
            except KVCoreError as exc:
                sizes, sglang_cell = None, f"not sized: {str(exc).split(':')[-1].strip()}"
            if sizes is not None:
                sglang_cell = (
                    f"{sizes.full_tokens + sizes.swa_tokens:,} tokens, not simulated (no sglang profile)"
                )
            if sizes is not None and sglang is not None:
                paged = sglang_specs(sg_specs, sg_rules)
                pools = check_specs(paged)
                by_pool = {"full": sizes.full_tokens, "swa": sizes.swa_tokens, "mamba": sizes.mamba_states}
                weights = [by_pool[p] * cell_bytes(paged, names) for p, names in pools.items()]
                options = (
                    PlanOptions(pool_split=tuple(w / sum(weights) for w in weights))
                    if len(weights) > 1
                    else None
                )
                try:
                    plan = plan_for_sglang(
                        sg_rules.request(sg_specs, BUDGET, options=options), sg_rules, registry=registry
                    )
                except KVCoreError as exc:  # SGLang's pools hold no request of MAX_LEN here
                    plan, sglang_cell = None, f"holds no request: {str(exc).split(';')[0]}"
                if plan is not None:
                    try:  # in seconds when the profile times its steps
                        sg_run = simulate(plan, workload, step_time=timer(plan), scheduler=sglang)
                        sglang_cell = f"{_tokens_per_second(sg_run, workload):,.0f}"
                    except KVCoreError:
                        try:
                            sg_run = simulate(plan, workload, scheduler=sglang)
                            sglang_cell = f"{sg_run.served_tokens_per_step:,.1f} tok/step (untimed profile)"
                        except KVCoreError as exc:  # a layout the profile does not model
                            sglang_cell = f"not simulated: {str(exc).split(':')[-1].strip()}"
            # tuned
            result = tune(
                PlanRequest.for_context(specs, BUDGET, context),
                workload,
                space,
                registry=registry,
                objective="throughput",
                scheduler=VllmProfile(),
                step_time=timer,
                planner=vllm_planner(registry),
            )
            best = result.best
            ratio = best.score / vllm_tps if vllm_tps else float("inf")
            short += ratio < TARGET
            knobs = best.knobs
            rows.append(
                [
                    model.split("/")[-1],
                    trace,
                    f"{vllm_tps:,.0f}" + ("" if stand_in == VLLM_OWN_POLICY else f" ({stand_in})"),
                    sglang_cell,
                    f"{best.score:,.0f}",
                    f"{ratio:.2f}x",
                    f"{knobs.policy} {knobs.describe('split_shift') if best.pool_split else ''}".strip()
                    + f", seqs {knobs.max_num_seqs}, batch {knobs.max_num_batched_tokens}",
                    f"{result.simulations}/{len(result.trials)}",
                    f"{time.perf_counter() - clock:.0f} s",
                ]
            )
            if trace == "long-documents":
                splits.append(split_row(model, result.trials))
            print("  " + " | ".join(rows[-1]), file=sys.stderr)
    print(
        f"KV budget {BUDGET // GIB} GiB, max_model_len {MAX_LEN:,}, H100 roofline (tp 1); chat: first "
        f"{CHAT_REQUESTS} requests, long documents: first {DOC_REQUESTS}; output tokens per second"
    )
    print(
        render_table(
            [
                "model",
                "trace",
                "vLLM defaults",
                "SGLang defaults",
                "tuned",
                "tuned/vLLM",
                "tuned candidate",
                "simulated/tried",
                "time",
            ],
            rows,
            align="llrrrrlrr",
        )
    )
    print()
    print(
        "long documents: the pools sized by the workload against shared_buffer (max_num_seqs 128, "
        "batch 2048; tok/s)"
    )
    print(
        render_table(
            [
                "model",
                "kind_pools worst-case split",
                "kind_pools workload split",
                "unified_pool",
                "shared_buffer",
                "best sized/shared",
            ],
            splits,
            align="lrrrrr",
        )
    )
    print(f"\n{short} of {len(rows)} rows below {TARGET}x; total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if "--budget-gib" in sys.argv:
        BUDGET = int(float(sys.argv[sys.argv.index("--budget-gib") + 1]) * GIB)
    sys.exit(main())
