"""Plans as users saw them before the package was reshaped, kept as JSON fixtures.

Every bundled model and every synthetic mix of :mod:`kvcore.testing.mixes` is planned with each
built-in policy that can plan it (and ``auto``), at two request lengths, and a few models across
tensor/pipeline-parallel ranks. ``test_snapshots.py`` replans them and compares the JSON: a
restructuring must not change a single figure. Regenerate only when a change of figures is
intended, and say why in the commit: ``python tests/snapshots/snapshots.py --write``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
FIXTURE = HERE / "plans.json"

BUDGET = 24 * 2**30
LENGTHS = (8192, 32768)
POLICIES = ("auto", "uniform", "shared_buffer", "equal_groups", "kind_pools")
#: Command lines whose printed output is kept too (the text a capacity planner reads).
COMMANDS = (
    "plan --model google/gemma-3-27b-it --memory 80GiB --max-model-len 32768",
    "plan --model openai/gpt-oss-20b --memory 24GiB --max-model-len 32768 --json",
    "plan --model ai21labs/AI21-Jamba-1.5-Mini --memory 24GiB --max-model-len 65536",
    "plan --model meta-llama/Llama-3.1-8B --memory 40GiB --max-model-len 8192 --tp 2 --pp 2",
    "compare --model google/gemma-3-27b-it --memory 80GiB --max-model-len 32768",
    "compare --model openai/gpt-oss-20b --memory 24GiB --max-model-len 32768 --block-sizes 16,32",
    "plan --model meta-llama/Llama-3.1-8B --memory 1GiB --max-model-len 131072",
)
#: The bundled models the fixture was taken with; models bundled later are pinned by their own
#: tests (tests/plugins/models/test_encoder_decoder.py), so adding one leaves the fixture as it is.
MODELS = (
    "ai21labs/AI21-Jamba-1.5-Mini",
    "deepseek-ai/DeepSeek-V3",
    "google/gemma-2-9b-it",
    "google/gemma-3-27b-it",
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "microsoft/Phi-3-mini-4k-instruct",
    "mistralai/Mistral-7B-v0.1",
    "openai/gpt-oss-20b",
    "Qwen/Qwen3-8B",
)
RANKED = (("meta-llama/Llama-3.1-8B", 2, 2), ("google/gemma-3-27b-it", 4, 1), ("openai/gpt-oss-20b", 2, 2))


def cases() -> Iterator[tuple[str, dict[str, Any]]]:
    """``(case name, plan JSON or {"error": class name})`` for every snapshot case."""
    import kvcore
    from kvcore.frontends.hf_config import bundled_models
    from kvcore.planning.ranks import simulate_rank_specs
    from kvcore.planning.serialization import plan_to_dict
    from kvcore.testing.mixes import TARGET_MIXES

    registry = kvcore.Registry.default()
    bundled = [m.name for m in bundled_models() if m.name in MODELS]
    models = {name: kvcore.model_layer_specs(name, registry) for name in bundled}
    inputs = {f"model {k}": v for k, v in models.items()}
    inputs.update({f"mix {k}": v for k, v in TARGET_MIXES.items()})
    for label, specs in inputs.items():
        for length in LENGTHS:
            context = kvcore.SizingContext(max_model_len=length)
            for policy in POLICIES:
                name = f"{label} | {policy} | {length}"
                try:
                    plan = kvcore.plan_kv_cache(specs, BUDGET, context, policy=policy, registry=registry)
                except kvcore.KVCoreError as exc:
                    yield name, {"error": type(exc).__name__}
                    continue
                yield name, plan_to_dict(plan, registry)
    for model, tp, pp in RANKED:
        context = kvcore.SizingContext(max_model_len=8192)
        ranks = kvcore.Parallelism(tp_size=tp, pp_size=pp)
        plans = kvcore.plan_for_ranks(
            simulate_rank_specs(models[model], ranks),
            [BUDGET] * ranks.world_size,
            context,
            registry=registry,
            tp_size=tp,
        )
        yield f"ranks {model} | tp{tp} pp{pp}", {"ranks": [plan_to_dict(p, registry) for p in plans]}
    for line in COMMANDS:
        yield f"cli {line}", run_command(line)


def run_command(line: str) -> dict[str, Any]:
    """The exit status, standard output and standard error of ``kvcore LINE``."""
    import contextlib
    import io

    from kvcore.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["--no-plugin-autoload", *line.split()])
    return {"status": status, "stdout": out.getvalue().splitlines(), "stderr": err.getvalue().splitlines()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the fixture")
    args = parser.parse_args()
    data = dict(cases())
    if args.write:
        FIXTURE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(data)} cases to {FIXTURE}")
    else:
        old = json.loads(FIXTURE.read_text())
        changed = sorted(k for k in old.keys() | data.keys() if old.get(k) != data.get(k))
        print(f"{len(data)} cases, {len(changed)} changed")
        for key in changed:
            print("  ", key)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
