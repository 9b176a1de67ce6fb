"""transformers' continuous batching on kvcore's cache: requests held at once, beside its own sizing.

The tiny random-weight models of the end-to-end tests (``tests/engine/decode/_tiny.py``: Llama, Gemma-3
with three sliding layers to one full, gpt-oss with sliding and full alternating), on the CPU.
Twelve requests of 12 prompt + 12 new tokens go through ``generate_batch`` (greedy, no safety
margin, 256 tokens a batch) at each KV budget, three times:

- kvcore: the cache :func:`~kvcore.integrations.transformers.rules.plan_for_transformers`
  lays out in the budget (its page size, its sectors; the tensor, trash included, within the
  budget);
- own @256: transformers' own sizing of the budget, ``num_blocks = budget // whole-model
  block`` at its default page size of 256 tokens (its memory handler rounds the blocks up to
  sectors and adds two trash sectors beyond them);
- own @kvcore's page: the same, at the page size kvcore chose.

For each: page size, sectors, the cache tensor's bytes, the requests of 24 tokens the layout
holds ("counted") and the most requests that held cache blocks at once in the run ("held";
transformers admits a request once its prompt fits and preempts when decoding runs out, so
this can exceed the count). "-": the cache cannot hold one request, and transformers fails
every request.

Then, by the layout's arithmetic alone (what the runs above check against transformers' real
cache), every bundled model at 8 GiB and max_model_len 8,192: kvcore's page and the requests of
8,192 tokens its cache holds, beside transformers' own sizing at page 256, whose tensor is
larger than the budget by the bytes shown; a model transformers cannot run says why.

    python benchmarks/transformers_held.py
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcore import Registry, get_plugin_manager, model_layer_specs
from kvcore.cli.table import render_table
from kvcore.errors import KVCoreError
from kvcore.frontends.hf_config import bundled_models
from kvcore.integrations.transformers.convert import (
    continuous_batching_config,
    model_specs,
    plan_for_model,
)
from kvcore.integrations.transformers.measure import generate_and_watch
from kvcore.integrations.transformers.rules import (
    ALLOCATOR_OF_KIND,
    PagedCacheLayout,
    TransformersRules,
    own_layout,
    plan_for_transformers,
)
from kvcore.units import format_bytes
from tests.engine.decode._tiny import MODELS

NAMES = ("llama", "gemma3", "gpt_oss")
BUDGETS = (1 << 15, 1 << 16, 1 << 18)
REQUESTS, PROMPT, NEW = 12, 12, 12
CPU = {"auto_switch_to_flash": False, "use_cuda_graph": False, "safety_margin": 0.0}


def held(model, config) -> str:
    """The most requests holding cache at once in one generate_batch run, or '-' if it failed."""
    import transformers

    prompts = torch.randint(3, 128, (REQUESTS, PROMPT), generator=torch.Generator().manual_seed(7))
    try:
        run = generate_and_watch(
            model,
            prompts.tolist(),
            max_new_tokens=NEW,
            generation_config=transformers.GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0),
            continuous_batching_config=config,
        )
    except KVCoreError:
        return "-"
    return str(run.peak_held)


def own_row(model, layout: PagedCacheLayout, budget: int) -> list[str]:
    import transformers

    config = transformers.ContinuousBatchingConfig(
        page_size=layout.page_size,
        num_blocks=budget // layout.bytes_per_model_block,
        max_batch_tokens=256,
        **CPU,
    )
    counted = layout.sequences_held(PROMPT + NEW)
    return [
        str(layout.page_size),
        str(layout.num_sectors),
        str(layout.cache_bytes),
        str(counted),
        held(model, config) if counted else "-",
    ]


def main() -> None:
    torch.set_num_threads(1)
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
    rules = TransformersRules(max_model_len=PROMPT + NEW, max_batch_tokens=256)
    rows = []
    for name in NAMES:
        model = MODELS[name].build()
        model.set_attn_implementation("eager")
        specs = model_specs(model, registry)
        for budget in BUDGETS:
            plan = plan_for_model(model, budget, rules, registry=registry)
            layout = plan.layout
            ours = held(model, continuous_batching_config(plan, **CPU))
            rows.append(
                [
                    name,
                    str(budget),
                    plan.plan.policy,
                    str(layout.page_size),
                    str(layout.num_sectors),
                    str(layout.cache_bytes),
                    str(plan.sequences_held),
                    ours,
                    *own_row(model, own_layout(specs, budget), budget)[1:],
                    *own_row(model, own_layout(specs, budget, layout.page_size), budget)[1:],
                ]
            )
    header = [
        "model",
        "budget B",
        "policy",
        "page",
        "sectors",
        "tensor B",
        "counted",
        "held",
        "own@256 sectors",
        "tensor B",
        "counted",
        "held",
        "own@page sectors",
        "tensor B",
        "counted",
        "held",
    ]
    print(render_table(header, rows))
    print()
    print(zoo_table(registry))


def zoo_table(registry: Registry) -> str:
    """Bundled models at 8 GiB, max_model_len 8192: kvcore's cache beside transformers' own sizing."""
    budget, length = 8 << 30, 8192
    rules = TransformersRules(max_model_len=length, max_batch_tokens=256)
    rows = []
    for model in bundled_models():
        specs = model_layer_specs(model.name, registry)
        try:
            plan = plan_for_transformers(rules.request(specs, budget), rules, registry=registry)
        except KVCoreError as exc:
            other = sorted({spec.kind for spec in specs.values()} - set(ALLOCATOR_OF_KIND))
            rows.append([model.name, "-", "-", "-", "-", "-", ", ".join(other) or str(exc)])
            continue
        own = own_layout(specs, budget)
        rows.append(
            [
                model.name,
                plan.plan.policy,
                str(plan.layout.page_size),
                str(plan.sequences_held),
                str(own.sequences_held(length)),
                format_bytes(own.cache_bytes - budget),
                "",
            ]
        )
    header = [
        "model (8 GiB, 8,192 tokens)",
        "policy",
        "page",
        "kvcore",
        "own@256",
        "own over budget",
        "refused: layers of kind",
    ]
    return render_table(header, rows)


if __name__ == "__main__":
    main()
