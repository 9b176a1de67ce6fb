"""The workload a simulating command replays: a trace file or synthetic requests."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.cli.options import PlanningArgs
from kvcore.errors import InvalidInputError

if TYPE_CHECKING:  # the simulation layer loads only for the commands that simulate
    from kvcore.simulation.workload import Workload
from kvcore.cli.inputs.values import length_dist, positive_int, rate, seed, share, tokens

#: The options that describe a synthetic workload, and their Python names.
SYNTHETIC_OPTIONS = {
    "--prompt-len": "prompt_len",
    "--output-len": "output_len",
    "--rate": "rate",
    "--seed": "seed",
    "--prefix-share": "prefix_share",
    "--prefix-len": "prefix_len",
}


def synthetic_options(args: PlanningArgs) -> dict[str, Any]:
    """``{flag: value}`` of the synthetic-workload options (:data:`SYNTHETIC_OPTIONS`); ``None``
    where not given."""
    values = attrs.asdict(args, recurse=False)
    return {flag: values[name] for flag, name in SYNTHETIC_OPTIONS.items()}


def add_workload_options(
    parser: argparse.ArgumentParser, *, required: bool, old_flag: str | None = None
) -> None:
    """The workload to simulate: a JSON-lines trace (``--trace FILE``) or a synthetic one
    (``--requests N --prompt-len DIST --output-len DIST [--rate R] [--seed S]``).

    Args:
        parser: the command's parser.
        required: the command needs a workload (else without one it does not simulate).
        old_flag: an old spelling of ``--trace``, removed in 0.3, that the command refuses
            naming ``--trace`` (``--workload`` in ``kvcore compare``;
            :class:`~kvcore.cli.aliases.RemovedOption`).
    """
    source = parser.add_mutually_exclusive_group(required=required)
    if old_flag is not None:
        from kvcore.cli.aliases import RemovedOption

        source.add_argument(old_flag, dest="trace", action=RemovedOption, new="--trace", metavar="FILE.jsonl")
    source.add_argument(
        "--trace",
        dest="trace",
        metavar="FILE.jsonl",
        help=(
            'a trace: one request a line, {"prompt_tokens": N, "output_tokens": M, "arrival_step": S} '
            "(arrival_step optional, default 0; or arrival_time in seconds with --gpu or --step-profile; "
            "docs/reference/json-formats.md)"
        ),
    )
    source.add_argument(
        "--requests",
        type=positive_int,
        metavar="N",
        help="a synthetic workload of N requests (with --prompt-len and --output-len)",
    )
    lengths = "512 (fixed), uniform:LO:HI, or lognormal:MEAN:SIGMA (MEAN tokens, SIGMA the spread of the log)"
    parser.add_argument(
        "--prompt-len", type=length_dist, metavar="DIST", help=f"with --requests: prompt lengths, {lengths}"
    )
    parser.add_argument(
        "--output-len",
        type=length_dist,
        metavar="DIST",
        help="with --requests: output lengths, as --prompt-len",
    )
    parser.add_argument(
        "--rate",
        type=rate,
        metavar="R",
        help=(
            "with --requests: Poisson arrivals, R requests per step on average, or per second with a "
            "step-time model (--gpu, --step-profile) (default: all at once)"
        ),
    )
    parser.add_argument("--seed", type=seed, metavar="S", help="with --requests: the random seed (default 0)")
    parser.add_argument(
        "--prefix-share",
        type=share,
        metavar="P",
        help="with --requests and --prefix-len: the share of requests (0 to 1) whose prompt starts with "
        "one shared prefix",
    )
    parser.add_argument(
        "--prefix-len",
        type=tokens,
        metavar="N",
        help="with --requests and --prefix-share: the shared prefix's tokens, added before the drawn prompt",
    )
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="simulate with prefix caching: requests with one prefix_id share their cached prefix blocks",
    )


def wants_workload(args: PlanningArgs) -> bool:
    """Whether the options name a workload (a trace or ``--requests``)."""
    return args.trace is not None or args.requests is not None


def refuse_engine_options(args: PlanningArgs, engine: str, runs_as: str) -> None:
    """Refuse the ``compare`` options an ``--engine`` comparison does not take.

    Args:
        engine: the ``--engine`` value (``vllm``, ``sglang``).
        runs_as: how the engine names itself in the message (``vLLM``, ``SGLang``).

    Raises:
        InvalidInputError: naming every such option given.
    """
    unsupported = [
        flag
        for flag, given in (
            ("--trace/--requests", wants_workload(args)),
            ("--block-sizes", bool(args.block_sizes)),
            ("--kv-cache-dtypes", bool(args.kv_cache_dtypes)),
            ("--frontier", args.frontier),
        )
        if given
    ]
    if unsupported:
        raise InvalidInputError(
            f"--engine {engine} compares the policies as {runs_as} runs them and does not take "
            f"{', '.join(unsupported)}; drop it, or leave out --engine {engine}"
        )


def load_workload(args: PlanningArgs, max_model_len: int, *, per_second: bool = False) -> Workload:
    """The workload the options describe: ``--trace FILE`` read, or
    ``--requests N`` drawn (lengths clipped to ``max_model_len``). A trace's requests longer
    than ``max_model_len`` are set aside as rejected (:meth:`Workload.admit`), as vLLM refuses
    them and serves the rest.

    Raises:
        InvalidInputError: a synthetic option without ``--requests``, ``--requests`` without
            both lengths, a bad trace file (naming the file and line), or a trace whose every
            request is longer than ``max_model_len``.
    """
    from kvcore.simulation.workload import read_trace, synthetic

    given = [flag for flag, value in synthetic_options(args).items() if value is not None]
    if args.requests is None:
        if given:
            raise InvalidInputError(
                f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --requests only; "
                "a trace states its own lengths and arrival steps"
            )
        assert args.trace is not None  # a trace, or --requests: argparse requires one
        workload = read_trace(args.trace)
        if not per_second and workload.requests[0].arrival_time is not None:
            raise InvalidInputError(
                f"{args.trace}: the trace gives arrival_time in seconds: time the steps with --gpu NAME "
                "(with --model) or --step-profile FILE"
            )
        # a request longer than max_model_len is refused alone, as vLLM refuses it, not the run
        return workload.admit(max_model_len)
    prompt_len, output_len = args.prompt_len, args.output_len
    if prompt_len is None or output_len is None:
        lengths = {"--prompt-len": prompt_len, "--output-len": output_len}
        missing = [flag for flag, value in lengths.items() if value is None]
        raise InvalidInputError(
            f"--requests {args.requests} needs {' and '.join(missing)}: e.g. --prompt-len lognormal:512:1 "
            "--output-len lognormal:256:1"
        )
    if (args.prefix_share is None) != (args.prefix_len is None):
        raise InvalidInputError(
            "--prefix-share and --prefix-len go together: e.g. --prefix-share 0.8 --prefix-len 1024"
        )
    return synthetic(
        args.requests,
        prompt_len,
        output_len,
        rate=args.rate,
        seed=args.seed or 0,
        max_model_len=max_model_len,
        prefix_share=args.prefix_share or 0.0,
        prefix_tokens=args.prefix_len or 0,
        per_second=per_second,
    )
