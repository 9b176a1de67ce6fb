"""The budget, the request length and the grouping knobs every planning command takes, and the
:class:`~kvcore.planning.request.PlanRequest` a command makes of them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

import attrs

from kvcore.cli import serving
from kvcore.cli.inputs.flag_names import FLAG_NAMES
from kvcore.cli.inputs.values import (
    block_counts,
    fraction,
    max_model_len,
    pool_fractions,
    positive_int,
    size,
    token_counts,
    tokens,
    utilization,
)
from kvcore.cli.options import PlanningArgs
from kvcore.cli.policy_defaults import default_policies
from kvcore.error_messages import render
from kvcore.errors import InvalidInputError, KVCoreError
from kvcore.limits import MAX_TOKENS
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest
from kvcore.policy import BLOCK_MULTIPLES, PlanOptions
from kvcore.spec import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KVCacheSpec,
    SizingContext,
)
from kvcore.units import format_bytes


def add_sizing_options(
    parser: argparse.ArgumentParser,
    *,
    memory_required: bool = True,
    length_required: bool = True,
    auto_length: Literal["plan", "candidates", "refused"] = "plan",
    gpu_name: bool = False,
) -> None:
    """Budget, request length and grouping knobs: what every planning command takes.

    ``auto_length`` says what ``--max-model-len auto`` means: ``"plan"``, the longest one plan
    admits; ``"candidates"`` for a command that compares plans at one length (``compare``,
    ``simulate``), one length for every candidate, the one the ``auto`` policy's plan chooses
    (:func:`settle_auto_length`); ``"refused"`` for ``tune``, whose candidates differ in what
    one length costs (refused with the reason, :func:`sizing_context`); tune's
    ``--max-num-batched-tokens`` is then a list, the values its search tries.

    ``gpu_name=True`` for a command that also takes ``--gpu NAME``
    (:func:`kvcore.cli.timing.add_timing_options`): the GPU's memory then stands in for
    ``--gpu-memory`` when no budget is given, so argparse requires none
    (:func:`kvcore.cli.gpu.settle_budget` does)."""
    budget: argparse._ActionsContainer = (
        parser.add_mutually_exclusive_group(required=not gpu_name) if memory_required else parser
    )
    budget.add_argument(
        "--memory",
        type=size,
        metavar="SIZE",
        help="KV-cache byte budget: bytes or a unit, e.g. 24GiB, 500MB",
    )
    if memory_required:
        add_gpu_options(parser, budget, gpu_name=gpu_name)
    auto = {
        "plan": "; auto: the longest the memory admits, at most the model's max_position_embeddings",
        "candidates": "; auto: the longest the auto policy's plan admits in the budget, at most the "
        "model's max_position_embeddings, and every candidate at that length",
        "refused": "",
    }[auto_length]
    parser.add_argument(
        "--max-model-len",
        type=max_model_len,
        required=False,
        metavar="N" if auto_length == "refused" else "N|auto",
        help=(
            "longest request (prompt + output) in tokens, e.g. 8192, 32k (32,000) or 32K (32,768); "
            f"one such request must fit{auto} (default with --model: the model's "
            "max_position_embeddings; required with --specs)"
        ),
    )
    if auto_length == "refused":  # tune: the values its search tries
        parser.add_argument(
            "--max-num-batched-tokens",
            type=token_counts,
            metavar="N[,M...]",
            help=(
                "max_num_batched_tokens values to search, as vLLM spells it (SGLang's "
                "--chunked-prefill-size); the first is the default candidate's (default "
                f"{DEFAULT_MAX_NUM_BATCHED_TOKENS},{2 * DEFAULT_MAX_NUM_BATCHED_TOKENS})"
            ),
        )
    else:
        parser.add_argument(
            "--max-num-batched-tokens",
            type=tokens,
            default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
            metavar="N",
            help=(
                "tokens scheduled per engine step; a sliding window keeps window-1 earlier tokens for "
                f"each, so its worst case grows with this (default {DEFAULT_MAX_NUM_BATCHED_TOKENS})"
            ),
        )
    add_grouping_options(parser)
    serving.add_serving_options(parser)


def add_grouping_options(parser: argparse.ArgumentParser) -> None:
    """How a policy may group layers and size their blocks (:class:`~kvcore.policy.PlanOptions`)."""
    parser.add_argument(
        "--grouping-tolerance",
        type=fraction,
        default=PlanOptions().grouping_tolerance,
        metavar="F",
        help=(
            "capacity the planner may give up, relative to its best layout, to use fewer groups "
            "(block tables); 0 = highest capacity whatever the group count (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--max-block-size",
        type=positive_int,
        default=PlanOptions().max_block_size,
        metavar="N",
        help="largest block size a policy may give a group to even out pages (default %(default)s)",
    )
    parser.add_argument(
        "--reserve-null-block",
        action="store_true",
        help=(
            "keep block id 0 out of the pool as the null block that pads block tables (vLLM's "
            "convention); capacity counts one block fewer (default: off)"
        ),
    )
    parser.add_argument(
        "--uniform-block-size",
        action="store_true",
        help=(
            "one block size for every attention-like group (kernels compiled for one size): no "
            "group's blocks are enlarged to fill rows"
        ),
    )
    parser.add_argument(
        "--max-groups",
        type=positive_int,
        metavar="N",
        help="at most N groups (block tables): the best layout within it, or an error naming the fewest",
    )
    parser.add_argument(
        "--block-multiples",
        choices=BLOCK_MULTIPLES,
        default=PlanOptions().block_multiples,
        help=(
            "factors a policy may enlarge a block size by, up to --max-block-size: powers of two, "
            "or any integer (evens out page ratios such as 3:2) (default %(default)s)"
        ),
    )


def add_gpu_options(
    parser: argparse.ArgumentParser, budget: argparse._ActionsContainer, *, gpu_name: bool = False
) -> None:
    """``--gpu-memory SIZE`` (beside ``--memory`` in ``budget``) and ``--utilization F``: the KV
    budget worked out from a GPU (:mod:`kvcore.planning.gpu_budget`, :mod:`kvcore.cli.gpu`)."""
    from kvcore.planning.gpu_budget import DEFAULT_UTILIZATION

    budget.add_argument(
        "--gpu-memory",
        type=size,
        metavar="SIZE",
        help=(
            "with --model: size the KV cache from one GPU of SIZE (e.g. 80GiB): GPU x --utilization "
            "- weights (counted from the config, quantization_config honoured) - activation peak "
            "(estimated from --max-num-batched-tokens) - a fixed reserve, each printed"
            + (
                "; with --gpu NAME and no budget given, the GPU's memory (at most that with --gpu)"
                if gpu_name
                else ""
            )
        ),
    )
    parser.add_argument(
        "--utilization",
        type=utilization,
        metavar="F",
        help=(
            "with --gpu-memory: the share of the GPU the engine may use, in (0, 1] "
            f"(default {DEFAULT_UTILIZATION})"
        ),
    )


def add_planning_options(
    parser: argparse.ArgumentParser,
    *,
    memory_required: bool = True,
    length_required: bool = True,
    gpu_name: bool = False,
) -> None:
    """The sizing options plus the choices of one plan: policy, block size, forced block count
    (``gpu_name``: as :func:`add_sizing_options`')."""
    add_sizing_options(
        parser, memory_required=memory_required, length_required=length_required, gpu_name=gpu_name
    )
    from kvcore.cli.help_text import policy_help

    parser.add_argument("--policy", default="auto", metavar="NAME", help=policy_help())
    parser.add_argument(
        "--block-size",
        type=positive_int,
        metavar="N",
        help="tokens per block for every attention-like layer (default: as the specs say; 16 for --model)",
    )
    parser.add_argument(
        "--num-blocks",
        type=block_counts,
        metavar="N[,N...]",
        help="force this many blocks instead of filling the budget (checked against max-model-len); "
        "a policy of several block pools takes one count per pool: 1200,340",
    )
    parser.add_argument(
        "--pool-split",
        type=pool_fractions,
        metavar="F,F[,F...]",
        help=(
            "for a policy of several block pools (kind_pools), the share of the budget each pool "
            "gets, summing to 1: 0.3,0.7 (default: by what one request of max-model-len needs of each)"
        ),
    )


def sizing_context(args: PlanningArgs, *, auto: bool = False) -> SizingContext:
    """The :class:`SizingContext` the options describe.

    Args:
        args: the settled options (:func:`load_layer_specs`).
        auto: the command chooses the length for ``--max-model-len auto``; the context then
            holds the cap (:func:`length_cap`, or :data:`~kvcore.limits.MAX_TOKENS` for none).

    Raises:
        InvalidInputError: ``--max-model-len auto`` where the command takes a number.
    """
    length = args.max_model_len
    if length == "auto":
        if not auto:
            raise InvalidInputError(
                f"--max-model-len auto chooses one length per plan, and `kvcore {args.command}` plans each "
                "candidate under vLLM's rules at its own max_num_batched_tokens (a sliding window's worst "
                "case grows with it), so no one length fits them all: give a number (`kvcore plan "
                "--max-model-len auto` says the longest for one setting)"
            )
        length = min(length_cap(args) or MAX_TOKENS, MAX_TOKENS)
    assert length is not None  # settled by settle_max_model_len
    steps = args.max_num_batched_tokens
    return SizingContext(max_model_len=length, max_num_batched_tokens=steps, **serving.context_fields(args))


def settle_auto_length(
    args: PlanningArgs, registry: Registry, specs: Mapping[str, KVCacheSpec]
) -> PlanningArgs:
    """``args`` with ``--max-model-len auto`` made one number, for a command that sets every
    candidate at one length (``compare``, ``simulate``, ``tune``): the longest request the
    ``auto`` policy's plan admits in the budget, at most the model's length (what ``kvcore plan
    --max-model-len auto`` answers). Said on stderr; a length given as a number is kept.

    Raises:
        KVCoreError: as :func:`kvcore.planning.planner.plan` (not one request fits the budget).
    """
    if args.max_model_len != "auto":
        return args
    from kvcore.planning import planner

    one = attrs.evolve(args, policy="auto", num_blocks=None, tp=None, pp=None)
    result = planner.plan(plan_request(one, specs), registry=registry)
    (plan,) = result.plans
    length = plan.context.max_model_len
    cap = length_cap(args)
    limit = f", at most {length_cap_name(args)} ({cap:,})" if cap is not None else ""
    print(
        f"kvcore: note: --max-model-len auto = {length:,} tokens: the longest request the auto policy's "
        f"plan ({plan.policy}) admits in {format_bytes(args.kv_budget)}{limit}; every candidate is set at it",
        file=sys.stderr,
    )
    return attrs.evolve(args, max_model_len=length)


def plan_request(
    args: PlanningArgs,
    specs: Mapping[str, KVCacheSpec],
    *,
    rank_layers: Sequence[Collection[str]] | None = None,
    rank_names: Sequence[str] | None = None,
    auto: bool = True,
) -> PlanRequest:
    """The :class:`~kvcore.planning.request.PlanRequest` of ``kvcore plan``: the settled
    options' budget (``--memory`` for each rank), length, policy, options and forced block count.

    Args:
        args: the settled options (:func:`load_layer_specs`; the budget settled too).
        specs: the layer specs (of the whole model).
        rank_layers: the layers of each simulated rank; ``None`` for one rank.
        rank_names: how messages name the ranks.
        auto: the planner chooses the length for ``--max-model-len auto`` (as
            :func:`sizing_context`; ``False``: refused).
    """
    return PlanRequest.for_context(
        specs,
        [args.kv_budget] * (len(rank_layers) if rank_layers is not None else 1),
        sizing_context(args, auto=auto),
        auto_length=args.max_model_len == "auto",
        policy=args.policy,
        options=plan_options(args),
        num_blocks=args.num_blocks,
        rank_layers=rank_layers,
        rank_names=rank_names,
    )


def length_cap(args: PlanningArgs) -> int | None:
    """The longest request ``--max-model-len auto`` may choose: ``--model``'s length as
    :func:`settle_max_model_len` found it; ``None`` for a spec file or a model without one."""
    length = args.model_length
    return length.value if length is not None else None


def length_cap_name(args: PlanningArgs) -> str:
    """What the cap of :func:`length_cap` is, for messages (``'max_position_embeddings'``)."""
    length = args.model_length
    return length.describe() if length is not None else "max_position_embeddings"


def plan_options(args: PlanningArgs) -> PlanOptions:
    """The :class:`PlanOptions` the options describe: each field of it that is an option too
    (``--grouping-tolerance``, ``--max-groups`` ...), the same name in :class:`PlanningArgs`;
    the others (``mixed_pages``) keep their defaults."""
    given = attrs.asdict(args, recurse=False)
    return PlanOptions(**{f.name: given[f.name] for f in attrs.fields(PlanOptions) if f.name in given})


def options_report(args: PlanningArgs) -> dict[str, Any]:
    """``{"options": {...}}``, the :class:`PlanOptions` for a JSON report, when any differs from
    its default (``--uniform-block-size``, ``--max-groups`` ...); ``{}`` otherwise, so that a
    plan made with the defaults reads as it always has."""
    options = plan_options(args)
    return {} if options == PlanOptions() else {"options": attrs.asdict(options)}


def policy_rows(
    args: PlanningArgs, registry: Registry, row: Callable[[str], dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """``row(policy)`` for each policy ``--policies`` names (every registered one when none is),
    as an engine comparison tabulates them.

    Returns:
        The rows of the policies that planned, and ``{policy: error}`` for those that did not
        (each error worded for the command line).
    """
    names = args.policies or default_policies(registry)
    rows: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    for name in names:
        try:
            rows.append(row(name))
        except KVCoreError as exc:
            failures[name] = render(exc, FLAG_NAMES)
    return rows, failures
