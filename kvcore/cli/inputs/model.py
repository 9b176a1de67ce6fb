"""Where the layers come from: a model (bundled, cached, a config path or a Hub name) or a spec
file, its revision and its ranks."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import attrs

from kvcore.cli.inputs.values import positive_int, revision
from kvcore.cli.options import LoadedModel, PlanningArgs
from kvcore.errors import InvalidInputError
from kvcore.frontends.hf_config import config_layer_specs, find_model_config, model_length
from kvcore.frontends.specfile import read_spec_file
from kvcore.model_options import ModelOptions
from kvcore.planning.ranks import Parallelism
from kvcore.planning.registry import Registry
from kvcore.spec import (
    KVCacheSpec,
    resize_blocks,
)


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
