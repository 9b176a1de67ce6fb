"""Options shared by the commands that plan: where the specs come from, and sizing knobs."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs

from kvcore.cli import serving
from kvcore.cli.options import LoadedModel, PlanningArgs
from kvcore.cli.policy_defaults import default_policies
from kvcore.dtypes import to_dtype
from kvcore.error_messages import ParameterNames, render
from kvcore.errors import InvalidInputError, InvalidSpecError, KVCoreError
from kvcore.frontends.hf_config import config_layer_specs, find_model_config, model_length
from kvcore.frontends.specfile import read_spec_file
from kvcore.limits import MAX_TOKENS
from kvcore.model_options import ModelOptions
from kvcore.planning.ranks import Parallelism
from kvcore.planning.registry import Registry
from kvcore.planning.request import MaxModelLen, PlanRequest
from kvcore.policy import BLOCK_MULTIPLES, PlanOptions
from kvcore.spec import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    STATE_CACHE_MODES,
    KVCacheSpec,
    SizingContext,
    resize_blocks,
)
from kvcore.units import format_bytes, parse_size

if TYPE_CHECKING:  # the simulation layer loads only for the commands that simulate
    from kvcore.simulation.workload import LengthDist, Workload

T = TypeVar("T")

#: How error messages name the settings to change on the command line: the options below
#: (``lower --max-model-len to 8192``, ``--num-blocks 16 holds ...``) instead of the Python
#: parameters (:data:`~kvcore.error_messages.PYTHON_NAMES`). ``utilization`` stays a word: only
#: ``kvcore allocate`` has the option.
FLAG_NAMES = ParameterNames(
    max_model_len="--max-model-len",
    num_blocks="--num-blocks",
    memory="--memory",
    utilization="utilization",
    assign="{name} {value}",
    max_groups="--max-groups",
)


def _shown_text(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:37]!r}... ({len(text)} characters)"


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (of at most 30 digits: no count kvcore takes is longer)."""
    digits = text.strip().lstrip("+-").replace("_", "")
    if len(digits) > 30 and digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a number of at most 30 digits, got {_shown_text(text)}; "
            "no count kvcore takes is that large"
        )
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {_shown_text(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def comma_list(text: str, item: Callable[[str], T]) -> list[T]:
    """Values separated by commas (spaces around them ignored), each read by ``item``.

    Raises:
        argparse.ArgumentTypeError: a value is empty (``16,,32``), or as ``item`` raises.
    """
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(
            f"empty value in {_shown_text(text)}: give values separated by commas"
        )
    return [item(part) for part in parts]


def positive_ints(text: str) -> list[int]:
    """argparse type: whole numbers >= 1, comma-separated (``16,32``)."""
    return comma_list(text, positive_int)


def names(text: str) -> list[str]:
    """argparse type: names, comma-separated (``shared_buffer,uniform``); each is checked where
    it is used (a policy against the registry)."""
    return comma_list(text, str)


def _dtype(text: str) -> str:
    if text != "auto":
        try:
            to_dtype(text)
        except InvalidSpecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def dtype_names(text: str) -> list[str]:
    """argparse type: cache dtypes, comma-separated (``auto,fp8``); ``auto`` is the specs' own."""
    return comma_list(text, _dtype)


def _state_cache_mode(text: str) -> str:
    if text not in STATE_CACHE_MODES:
        raise argparse.ArgumentTypeError(
            f"expected a state cache mode ({', '.join(STATE_CACHE_MODES)}), got {_shown_text(text)}"
        )
    return text


def state_cache_modes(text: str) -> list[str]:
    """argparse type: state cache modes (:data:`~kvcore.spec.STATE_CACHE_MODES`), comma-separated."""
    return comma_list(text, _state_cache_mode)


def block_counts(text: str) -> int | tuple[int, ...]:
    """argparse type of ``--num-blocks``: one count (``1200``), or one per block pool of the
    policy, comma-separated (``1200,340``), each a :func:`positive_int`."""
    if "," not in text:
        return positive_int(text)
    return tuple(comma_list(text, positive_int))


def pool_fractions(text: str) -> tuple[float, ...]:
    """argparse type of ``--pool-split``: one fraction of the budget per block pool,
    comma-separated (``0.3,0.7``), checked as :attr:`PlanOptions.pool_split` checks them."""
    parts = [part.strip() for part in text.split(",")]
    try:
        fractions = tuple(float(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "expected one fraction of the budget per pool, comma-separated (0.3,0.7), "
            f"got {_shown_text(text)}"
        ) from None
    try:
        PlanOptions(pool_split=fractions)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("'pool_split'", "--pool-split")) from None
    return fractions


class Echoed(int):
    """A number read from text the command line says back (``32k`` is 32,000 tokens; ``80GB``
    is 74.51 GiB), so that a unit never changes a figure silently: :func:`echo_given` prints
    ``note`` for the option and puts the plain ``int`` back."""

    note: str

    def __new__(cls, value: int, note: str = "") -> Echoed:
        number = super().__new__(cls, value)
        number.note = note
        return number


def echo_given(args: argparse.Namespace) -> None:
    """For each option read through a unit or suffix (:class:`Echoed`), print one stderr line
    saying what it was read as (``kvcore: warning: --memory 80GB = 74.51 GiB ...``), and leave
    the plain number in ``args``."""
    for dest, value in vars(args).items():
        if isinstance(value, Echoed):
            print(f"kvcore: warning: --{dest.replace('_', '-')} {value.note}", file=sys.stderr)
            setattr(args, dest, int(value))


#: Suffixes of token counts, as vLLM 0.33 reads ``--max-model-len``: lowercase decimal
#: (``1k`` = 1,000, decimals allowed: ``25.6k``), uppercase binary (``1K`` = 1,024, whole
#: numbers only). Source: vLLM ``vllm/engine/arg_utils.py``, ``human_readable_int``.
_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SUFFIXED = re.compile(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)([kmgtKMGT])\s*")


def token_count(text: str) -> int:
    """A whole number >= 1, bare (:func:`positive_int`) or with vLLM's suffixes: ``32k`` =
    32,000 and ``32K`` = 32,768 (:data:`_DECIMAL_SUFFIXES`, :data:`_BINARY_SUFFIXES`).

    A count with a decimal suffix comes back :class:`Echoed`: ``32k`` is 32,000, where a
    context length is usually meant as a power of two, so the reading is said on stderr. A
    binary suffix is not said back (as ``80GiB`` is not): ``32K`` = 32,768 is how context lengths
    are quoted, and saying so on every run was noise (issue 38)."""
    match = _SUFFIXED.fullmatch(text)
    if match is None:
        return positive_int(text)
    number, suffix = match.groups()
    if suffix in _BINARY_SUFFIXES:
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"{_shown_text(text)}: {suffix} is binary (x {_BINARY_SUFFIXES[suffix]:,}) and takes a whole "
                f"number; decimals go with the decimal suffixes, e.g. {number}{suffix.lower()}"
            )
        value = int(number) * _BINARY_SUFFIXES[suffix]
    else:
        exact = Decimal(number) * _DECIMAL_SUFFIXES[suffix]
        if exact != exact.to_integral_value():
            raise argparse.ArgumentTypeError(
                f"{_shown_text(text)} is {exact.normalize():f} tokens, not a whole number"
            )
        value = int(exact)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {_shown_text(text)}")
    if suffix in _BINARY_SUFFIXES:  # 32K = 32,768: how context lengths are quoted; said back never
        return value
    return Echoed(
        value,
        f"{text.strip()} = {value:,} tokens ({suffix} is decimal: 1k = 1,000; 1K = 1,024, as vLLM reads it)",
    )


def tokens(text: str) -> int:
    """argparse type: a token count, an int in [1, :data:`~kvcore.limits.MAX_TOKENS`], bare or
    with a suffix (:func:`token_count`)."""
    value = token_count(text)
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_TOKENS:,} tokens (kvcore.limits.MAX_TOKENS), got {value:,}; "
            "no model serves requests that long"
        )
    return value


def token_counts(text: str) -> list[int]:
    """argparse type: token counts, comma-separated (``2048,4096``), each as :func:`tokens`."""
    return [int(value) for value in comma_list(text, tokens)]


def max_model_len(text: str) -> int | Literal["auto"]:
    """argparse type: ``auto`` or a token count (:func:`tokens`)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return tokens(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or auto)") from None


def size(text: str) -> int:
    """argparse type: a byte size such as ``24GiB``; one given in decimal units (``80GB``) comes
    back :class:`Echoed` (``80GB = 74.51 GiB``). A bare ``G`` is binary, as documented, and
    GPU memory is quoted that way: it is not echoed."""
    try:
        value = parse_size(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    unit = text.strip().lstrip("0123456789_.eE+-").strip()
    if unit.lower() in ("kb", "mb", "gb", "tb"):
        return Echoed(
            value,
            f"{text.strip()} = {format_bytes(value)} ({unit} is decimal, 1000-based; "
            f"write {unit[0].upper()}iB for 1024-based)",
        )
    return value


def number(text: str, fits: Callable[[float], bool], expected: str) -> float:
    """A number read for an option: a float that ``fits``; else an error saying what was expected
    (``expected a number in [0, 1), got 1.5``) for argparse to print.

    Args:
        text: the option's value.
        fits: whether a number is in the option's range (``nan`` never is: it fails every comparison).
        expected: the range in words, after "expected" (``'a number in (0, 1]'``).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {_shown_text(text)}") from None
    if not fits(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text.strip()}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1)."""
    return number(text, lambda value: 0 <= value < 1, "a number in [0, 1)")


def add_spec_source(parser: argparse.ArgumentParser, *, plan_file: bool = False) -> None:
    """Where the layer specs come from: ``--specs FILE`` or ``--model NAME|PATH`` (one of
    them; with ``plan_file``, ``--plan FILE``, a saved plan, is the third choice), and the
    model options ``--tp``, ``--kv-cache-dtype``, ``--state-dtype``."""
    source = parser.add_mutually_exclusive_group(required=True)
    if plan_file:
        source.add_argument(
            "--plan", metavar="FILE", help="a saved plan (`kvcore plan --json` output), checked before use"
        )
    source.add_argument(
        "--specs",
        metavar="FILE",
        help='spec file: {"layers": {"<layer>": {"kind": ..., ...}}} (docs/reference/json-formats.md)',
    )
    source.add_argument(
        "--model",
        metavar="NAME|PATH",
        help=(
            "a Hugging Face config.json, a folder holding one, a bundled model (see `kvcore models`), "
            "or org/name: from the local Hugging Face cache (HF_HUB_CACHE, HF_HOME), else from the Hub "
            "(with kvcore[hub]: config.json and safetensors headers only; HF_TOKEN, HF_ENDPOINT, "
            "HF_HUB_OFFLINE honoured)"
        ),
    )
    add_revision_option(parser)
    parser.add_argument(
        "--tp",
        type=positive_int,
        metavar="N",
        help=(
            "with --model: tensor-parallel size; it must divide the attention heads, and divide the KV "
            "heads or be a multiple of them (KV heads per rank = max(1, kv_heads // N)) (default 1)"
        ),
    )
    parser.add_argument(
        "--kv-cache-dtype",
        metavar="DTYPE",
        help="with --model: attention cache dtype, auto (the model's), bfloat16, fp8, fp8_e5m2, ...",
    )
    parser.add_argument(
        "--state-dtype",
        metavar="DTYPE",
        help="with --model: SSM / linear-attention state dtype, auto (the model's), float32, ...",
    )


def add_revision_option(parser: argparse.ArgumentParser) -> None:
    """``--revision REV``: the branch, tag or commit of a Hub model ``--model org/name`` names."""
    parser.add_argument(
        "--revision",
        type=revision,
        metavar="REV",
        help=(
            "with --model org/name: a branch, tag or commit of the Hugging Face repository, read from "
            "the cache or the Hub (the bundled configs are passed over) (default: the cached snapshot, "
            "else the default branch)"
        ),
    )


def revision(text: str) -> str:
    """argparse type: a Hub revision, a branch, tag or commit (no spaces, at most 200 characters)."""
    value = text.strip()
    if not value or len(value) > 200 or any(c.isspace() for c in value) or ".." in value:
        raise argparse.ArgumentTypeError(
            f"expected a branch, tag or commit of a Hugging Face repository, got {_shown_text(text)}"
        )
    return value


def add_pipeline_option(parser: argparse.ArgumentParser) -> None:
    """``--pp N``: plan every rank of a ``--tp`` x ``--pp`` layout (simulated, no GPU)."""
    parser.add_argument(
        "--pp",
        type=positive_int,
        default=1,
        metavar="N",
        help=(
            "pipeline-parallel stages: the layers are cut, in model order, into N contiguous stages of "
            "about equal layer counts, and every rank of --tp x --pp is planned; --memory is each "
            "rank's budget (default 1)"
        ),
    )


def parallelism(args: PlanningArgs) -> Parallelism:
    """The :class:`~kvcore.planning.ranks.Parallelism` of ``--tp`` and ``--pp`` (1 where not given)."""
    return Parallelism(tp_size=args.tp_size, pp_size=args.pp_size)


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


def utilization(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    return number(text, lambda value: 0 < value <= 1, "a number in (0, 1]")


def load_model(args: PlanningArgs, registry: Registry) -> PlanningArgs:
    """``args`` with the config ``--model`` names loaded, once for the whole command
    (:attr:`PlanningArgs.model_config`); ``args`` itself for a spec file or a config already loaded.

    Raises:
        UnknownModelError, InvalidInputError, ModelConfigError: as
            :func:`~kvcore.frontends.hf_config.find_model_config`, and ModelAccessError,
            HubUnavailableError, MissingDependencyError for a model read from the Hub.
    """
    if args.model is None or args.model_config is not None:
        if args.revision is not None and args.model is None:
            raise InvalidInputError("--revision applies to --model org/name only")
        return args
    found = find_model_config(args.model, revision=args.revision)
    loaded = LoadedModel(
        name=args.model,
        config=found.config,
        source=found.source,
        length=model_length(found.config, registry),
        found=found,
    )
    return attrs.evolve(args, model_config=loaded)


def settle_max_model_len(args: PlanningArgs, registry: Registry) -> PlanningArgs:
    """``args`` with ``--max-model-len`` defaulted to ``--model``'s length (its
    ``max_position_embeddings``, or its config class's default where the config omits it:
    :func:`model_length`), the model loaded (:func:`load_model`); warns (on stderr) when a
    length given is longer than the model's.

    Raises:
        InvalidInputError: no ``--max-model-len`` and nothing to default it to (a spec file,
            or a config whose family knows no length).
    """
    given = args.max_model_len
    args = load_model(args, registry)
    if args.model is None:
        if given is None:
            raise InvalidInputError("give --max-model-len N (or auto): a spec file states no model length")
        return args
    length = args.model_length
    if given is None:
        if length is None:
            raise InvalidInputError(
                f"{args.model}: the config states no max_position_embeddings and its model family gives "
                "no default to default to; give --max-model-len N"
            )
        return attrs.evolve(args, max_model_len=length.value)
    if given != "auto" and length is not None and given > length.value:
        print(
            f"kvcore: warning: --max-model-len {given:,} is longer than {args.model}'s "
            f"{length.describe()} ({length.value:,}); the model was not trained for such requests",
            file=sys.stderr,
        )
    return args


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


def model_options(args: PlanningArgs) -> ModelOptions:
    """The :class:`~kvcore.model_options.ModelOptions` of ``--tp``, ``--kv-cache-dtype``,
    ``--state-dtype`` and ``--block-size``.

    Raises:
        InvalidInputError: a model option without ``--model``, or a bad dtype.
    """
    given: dict[str, Any] = {
        "tp": args.tp,
        "kv_cache_dtype": args.kv_cache_dtype,
        "state_dtype": args.state_dtype,
        "speculative": args.speculative,
    }
    if args.model is None:
        named = [f"--{key.replace('_', '-')}" for key, value in given.items() if value is not None]
        if named:
            raise InvalidInputError(
                f"{', '.join(named)} {'applies' if len(named) == 1 else 'apply'} to --model only; "
                "a spec file states its own sizes"
            )
    values = {
        key: value for key, value in {**given, "block_size": args.block_size}.items() if value is not None
    }
    return ModelOptions(**values)


def load_layer_specs(args: PlanningArgs, registry: Registry) -> tuple[PlanningArgs, dict[str, KVCacheSpec]]:
    """The specs of ``--model`` (with the model options) or of ``--specs`` (with ``--block-size``),
    and ``args`` settled: the model loaded once and ``--max-model-len`` defaulted
    (:func:`settle_max_model_len`)."""
    options = model_options(args)
    args = settle_max_model_len(args, registry)
    if args.model_config is not None:
        loaded = args.model_config
        return args, config_layer_specs(loaded.config, loaded.source, registry, options)
    assert args.specs is not None  # argparse requires --model or --specs
    specs = read_spec_file(args.specs, registry)
    block_size = args.block_size
    return args, specs if block_size is None else resize_blocks(specs, block_size)


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


def request_length(args: PlanningArgs) -> MaxModelLen:
    """``--max-model-len`` as the planner takes it: the number, or ``auto`` up to the model's
    length (:func:`length_cap`; no cap for a spec file)."""
    context = sizing_context(args, auto=True)
    return MaxModelLen(context.max_model_len, auto=args.max_model_len == "auto")


def plan_request(
    args: PlanningArgs,
    specs: Mapping[str, KVCacheSpec],
    *,
    rank_layers: Sequence[Collection[str]] | None = None,
    rank_names: Sequence[str] | None = None,
) -> PlanRequest:
    """The :class:`~kvcore.planning.request.PlanRequest` of ``kvcore plan``: the settled
    options' budget (``--memory`` for each rank), length, policy, options and forced block count.

    Args:
        args: the settled options (:func:`load_layer_specs`; the budget settled too).
        specs: the layer specs (of the whole model).
        rank_layers: the layers of each simulated rank; ``None`` for one rank.
        rank_names: how messages name the ranks.
    """
    return PlanRequest(
        specs=specs,
        budgets=[args.kv_budget] * (len(rank_layers) if rank_layers is not None else 1),
        max_model_len=request_length(args),
        context=sizing_context(args, auto=True),
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


def length_dist(text: str) -> LengthDist:
    """argparse type: a request length distribution (:func:`kvcore.simulation.workload.parse_length`):
    ``512``, ``uniform:LO:HI`` or ``lognormal:MEAN:SIGMA``."""
    from kvcore.simulation.workload import parse_length

    try:
        return parse_length(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate(text: str) -> float:
    """argparse type: a number of requests per step, > 0."""
    return number(text, lambda value: value > 0 and math.isfinite(value), "a number > 0")


def share(text: str) -> float:
    """argparse type: a share of requests, a number from 0 to 1."""
    return number(text, lambda value: 0 <= value <= 1, "a number from 0 to 1")


def seed(text: str) -> int:
    """argparse type: a random seed, an int >= 0."""
    try:
        value = int(text) if len(text.strip()) <= 30 else -1
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {_shown_text(text)}")
    return value


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
