"""``kvcore compare --engine sglang``: every policy's plan as SGLang 0.5 would run it, beside SGLang's own.

Each candidate is planned under SGLang's rules (:func:`kvcore.integrations.sglang.rules.plan_for_sglang`:
SGLang's page as the block size, one token pool per attention kind, block 0 of each pool as
SGLang's padded page, sliding layers sized for the overlap scheduler's two prefill chunks in
flight); the tokens of each pool are what SGLang's ``MemoryPoolConfig`` would take. SGLang's
own sizing of the same budget (``DefaultPoolConfigurator`` / ``HybridSWAPoolConfigurator`` with
its ``swa_full_tokens_ratio``) is the last row. Neither needs SGLang installed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from kvcore.cli import inputs
from kvcore.cli.engine_rows import EngineRows
from kvcore.cli.inputs import FLAG_NAMES
from kvcore.cli.options import PlanningArgs
from kvcore.cli.table import render_table
from kvcore.error_messages import render
from kvcore.errors import KVCoreError
from kvcore.integrations.sglang.model import SglangModel, sglang_model
from kvcore.integrations.sglang.rules import (
    SglangPoolSizes,
    SglangRules,
    check_specs,
    default_page_size,
    kv_budget,
    own_pool_sizes,
    paged_specs,
    plan_for_sglang,
    pool_bytes,
    pool_sizes,
    sglang_specs,
)
from kvcore.planning.gpu_budget import GpuBudget
from kvcore.planning.registry import Registry
from kvcore.spec import KVCacheSpec
from kvcore.units import format_bytes

#: The name of SGLang's own sizing in the table.
OWN = "sglang (own sizing)"


def requests_held(sizes: SglangPoolSizes, specs: Mapping[str, KVCacheSpec], rules: SglangRules) -> int:
    """Requests of ``context_len`` tokens every pool of ``sizes`` holds at once, counted as kvcore
    counts a request's pages and SGLang its state slots (the same count for every row, so the
    rows compare)."""
    paged = sglang_specs(specs, rules)
    context = rules.context()
    have = {
        "full": sizes.full_tokens // sizes.page_size,
        "swa": sizes.swa_tokens // sizes.page_size,
        "mamba": sizes.mamba_states,
    }
    held = [
        have[pool] // paged[names[0]].max_num_blocks(context) for pool, names in check_specs(paged).items()
    ]
    return min(held, default=0)


def _row(
    name: str, sizes: SglangPoolSizes, specs: Mapping[str, KVCacheSpec], rules: SglangRules
) -> dict[str, Any]:
    return {
        "policy": name,
        "page_size": sizes.page_size,
        "full_tokens": sizes.full_tokens,
        "swa_tokens": sizes.swa_tokens,
        "max_total_num_tokens": sizes.max_total_num_tokens,
        "mamba_states": sizes.mamba_states,
        "requests": requests_held(sizes, specs, rules),
        "pool_bytes": pool_bytes(sizes, paged_specs(specs, sizes.page_size)),
    }


def model_of(args: PlanningArgs, specs: Mapping[str, KVCacheSpec], fix: str) -> SglangModel:
    """What SGLang runs for ``--model`` (loaded) or a ``--specs`` file (taken as a model SGLang
    gives its sliding pool): :func:`~kvcore.integrations.sglang.model.sglang_model`, the one
    answer ``compare --engine sglang``, ``tune``'s SGLang flags and the plugin read."""
    loaded = args.model_config  # loaded once, with the specs
    return sglang_model(specs, loaded.config if loaded is not None else None, fix=fix)


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate SGLang serves most with: the most requests of ``context_len`` held, then the
    most KV tokens (full and sliding pools together); ties go to the first listed."""
    return max(rows, key=lambda r: (r["requests"], r["full_tokens"] + r["swa_tokens"]), default=None)


def run(
    args: PlanningArgs,
    registry: Registry,
    specs: Mapping[str, KVCacheSpec],
    gpu_budget: GpuBudget | None = None,
) -> int:
    """Print the comparison (a table, or ``--json``); 0 when some policy planned, else 1.

    With ``--gpu-memory`` (``gpu_budget``), the budget is SGLang's: ``--utilization`` is its
    ``mem_fraction_static`` and the weights come out of it (:func:`~.rules.kv_budget`; SGLang's
    slack of ``1 - mem_fraction_static`` holds the activations kvcore's own budget counts).

    Raises:
        InvalidInputError: options the SGLang comparison does not take.
        SglangIntegrationError: a model SGLang runs with a DSA pool kvcore does not plan
            (:func:`~kvcore.integrations.sglang.rules.dsa_gaps`).
    """
    # one --block-sizes value is SGLang's --page-size (a list is for kvcore's own comparison)
    block = args.block_sizes[0] if args.block_sizes and len(args.block_sizes) == 1 else args.block_size
    inputs.refuse_engine_options(attrs.evolve(args, block_sizes=None) if block else args, "sglang", "SGLang")
    rules = SglangRules(
        context_len=inputs.sizing_context(args).max_model_len,
        chunked_prefill_size=args.max_num_batched_tokens,
        page_size=block or default_page_size(specs),  # SGLang's own choice when none is given
    )
    if gpu_budget is not None:
        args = attrs.evolve(
            args, memory=kv_budget(gpu_budget.gpu_memory, gpu_budget.weights, gpu_budget.utilization)
        )
    model = model_of(args, specs, "leave out --engine sglang to see kvcore's own plans")
    has_states = any(s.kind == "state" for s in specs.values())
    specs = model.specs

    def row(name: str) -> dict[str, Any]:
        options = inputs.plan_options(args)
        plan = plan_for_sglang(
            rules.request(specs, args.kv_budget, policy=name, options=options), rules, registry=registry
        )
        return _row(name, pool_sizes(plan, sglang_specs(specs, rules)), specs, rules)

    rows, failures = inputs.policy_rows(args, registry, row)
    try:
        own_row: dict[str, Any] | None = _row(OWN, own_pool_sizes(specs, args.kv_budget, rules), specs, rules)
        why = ""
    except KVCoreError as exc:
        own_row, why = None, render(exc, FLAG_NAMES)
    found = EngineRows(rows=rows, failures=failures, best=best_row(rows), own=own_row, own_name=OWN, why=why)
    if args.json:
        payload = {
            "engine": "sglang",
            "available_memory_bytes": args.kv_budget,
            **({"mem_fraction_static": gpu_budget.utilization} if gpu_budget is not None else {}),
            "context_len": rules.context_len,
            "page_size": rules.page_size,
            "swa_full_tokens_ratio": rules.swa_full_tokens_ratio,
            "hybrid_swa": model.hybrid_swa,
            **(
                {
                    "mamba_full_memory_ratio": rules.mamba_full_memory_ratio,
                    "mamba_slots_per_request": rules.mamba_slots_per_request,
                }
                if has_states
                else {}
            ),
            "best": found.best_policy,
            "candidates": found.candidates_json(),
            "sglang_own": found.own_json(),
        }
        print(json.dumps(payload, indent=2))
    else:
        print_table(args, gpu_budget, rules, model, found, has_states=has_states)
    return found.status


def print_table(
    args: PlanningArgs,
    gpu_budget: GpuBudget | None,
    rules: SglangRules,
    model: SglangModel,
    found: EngineRows,
    *,
    has_states: bool,
) -> None:
    where = (
        f"{format_bytes(gpu_budget.gpu_memory)} x mem_fraction_static {gpu_budget.utilization} - weights "
        f"{format_bytes(gpu_budget.weights)}"
        if gpu_budget is not None
        else "SGLang's: gpu x mem_fraction_static - weights"
    )
    print(
        f"budget {format_bytes(args.kv_budget)} ({where}), context_len "
        f"{rules.context_len:,}, page_size {rules.page_size}; as SGLang 0.5 runs it: one token pool per "
        f"kind, first page padded, {rules.tokens_in_flight:,} prefill tokens in flight; own sizing with "
        f"swa_full_tokens_ratio {rules.swa_full_tokens_ratio}"
        + (f"; {model.note()}" if model.note() else "")
        + (
            f"; Mamba pool first: mamba_full_memory_ratio {rules.mamba_full_memory_ratio}, "
            f"{rules.mamba_slots_per_request} state slots a request, SSM state in {rules.mamba_ssm_dtype}"
            if has_states
            else ""
        )
    )
    if not model.has_model_class:
        print(
            "  SGLang 0.5 has no model for this architecture: the rows are its sizing rules applied to "
            "kvcore's layers"
        )
    table = found.table(
        lambda r: [
            f"{r['full_tokens']:,}",
            f"{r['swa_tokens']:,}",
            *([f"{r['mamba_states']:,}"] if has_states else []),
            f"{r['requests']:,}",
            format_bytes(r["pool_bytes"]),
        ]
    )
    headers = ["policy", "full tokens", "swa tokens", *(["mamba states"] if has_states else []), "requests"]
    print(render_table([*headers, "pool bytes"], table, align="l" + "r" * len(headers)))
    best = found.best
    if best is not None:
        tied = sum(
            (r["requests"], r["full_tokens"] + r["swa_tokens"])
            == (best["requests"], best["full_tokens"] + best["swa_tokens"])
            for r in found.rows
        )
        print(
            f"  * best SGLang 0.5 runs: {best['policy']}: the most requests of {rules.context_len:,} tokens "
            f"held at once ({best['requests']:,}; {best['full_tokens'] + best['swa_tokens']:,} KV tokens)"
            + (f"; {tied} candidates tie: the first listed" if tied > 1 else "")
        )
    found.print_notes()
