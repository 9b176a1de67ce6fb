"""``kvcore models``: the bundled models with their layer counts and kinds, or one model's layers."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kvcore.cli import inputs
from kvcore.cli.command import Command
from kvcore.cli.table import add_output_options, render_table, wants_csv, write_csv
from kvcore.errors import InvalidInputError
from kvcore.frontends.hf_config import (
    bundled_models,
    config_layer_specs,
    find_model_config,
    layer_specs_from_config,
    max_position_embeddings,
)
from kvcore.frontends.specfile import specs_to_dict
from kvcore.model_options import ModelOptions
from kvcore.planning.registry import Registry
from kvcore.spec import KVCacheSpec, describe_spec
from kvcore.units import format_bytes

COMMAND = Command(
    help="list the bundled models (layer counts and kinds), or show one model's layers",
    description="""
        Without MODEL: every model whose config.json ships with kvcore (the zoo, kvcore/data/zoo), with its
        cache-holding layers by kind. With MODEL (a bundled name, a config.json path, or org/name from the
        local Hugging Face cache or the Hub): where its config came from, and its layers one by one.
    """,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="a bundled name, a config.json or its folder, or org/name (the Hugging Face cache, else Hub)",
    )
    inputs.add_revision_option(parser)
    parser.add_argument("--tp", type=inputs.positive_int, default=1, metavar="N", help="tensor-parallel size")
    parser.add_argument("--kv-cache-dtype", default="auto", metavar="DTYPE", help="attention cache dtype")
    parser.add_argument(
        "--state-dtype", default="auto", metavar="DTYPE", help="SSM / linear-attention state dtype"
    )
    parser.add_argument(
        "--block-size", type=inputs.positive_int, default=16, metavar="N", help="tokens per block"
    )
    add_output_options(parser, "the listing (or a model's layers)")


def kind_label(spec: KVCacheSpec) -> str:
    """The kind with the field that tells specs of one kind apart in a listing, e.g.
    ``sliding_window(1024)``; other kinds by name only."""
    for field in ("sliding_window", "attention_chunk_size"):
        value = getattr(spec, field, None)
        if isinstance(value, int):
            return f"{spec.kind}({value})"
    return spec.kind


def summarize(specs: Mapping[str, KVCacheSpec]) -> dict[str, Any]:
    """Layer count, layers per kind label, KV bytes per token and state bytes per request."""
    kinds = Counter(kind_label(spec) for spec in specs.values())
    per_token = sum(
        spec.page_size_bytes // spec.block_size for spec in specs.values() if spec.tokens_per_page is not None
    )
    state = sum(spec.page_size_bytes for spec in specs.values() if spec.tokens_per_page is None)
    return {
        "layers": len(specs),
        "kinds": dict(kinds.most_common()),
        "kv_bytes_per_token": per_token,
        "state_bytes_per_request": state,
    }


def model_listing(registry: Registry, options: ModelOptions) -> list[dict[str, Any]]:
    """What ``kvcore models --json`` prints: one entry per bundled model."""
    rows = []
    for model in bundled_models():
        config = model.config()
        specs = layer_specs_from_config(config, registry, options)
        rows.append(
            {
                "name": model.name,
                "source": "zoo",
                "model_type": config.get("model_type"),
                "max_position_embeddings": max_position_embeddings(config, registry),
                **summarize(specs),
            }
        )
    return rows


def _options(args: argparse.Namespace) -> ModelOptions:
    return ModelOptions(
        tp=args.tp,
        kv_cache_dtype=args.kv_cache_dtype,
        state_dtype=args.state_dtype,
        block_size=args.block_size,
    )


def _show_model(args: argparse.Namespace, registry: Registry, options: ModelOptions) -> int:
    found = find_model_config(args.model, revision=args.revision)  # once: the specs and the header read it
    config, source = found.config, found.source
    specs = config_layer_specs(config, source, registry, options)
    if wants_csv(args):
        write_csv(
            [
                {
                    "layer": name,
                    "kind": spec.kind,
                    "page_bytes": spec.page_size_bytes,
                    "spec": describe_spec(spec),
                }
                for name, spec in specs.items()
            ]
        )
        return 0
    if args.json:
        print(json.dumps(specs_to_dict(specs, registry), indent=2))  # a spec file: --specs reads it back
        return 0
    summary = summarize(specs)
    kinds = ", ".join(f"{n} {k}" for k, n in summary["kinds"].items())
    print(f"{source} ({config.get('model_type')}): {summary['layers']} layers with a cache: {kinds}")
    print(
        render_table(
            ["layer", "page", "spec"],
            [[name, format_bytes(spec.page_size_bytes), describe_spec(spec)] for name, spec in specs.items()],
            align="lrl",
        )
    )
    return 0


def run(args: argparse.Namespace, registry: Registry) -> int:
    options = _options(args)
    if args.model is not None:
        return _show_model(args, registry, options)
    if args.revision is not None:
        raise InvalidInputError("--revision applies to a MODEL named org/name; the listing is the zoo")
    listing = model_listing(registry, options)
    if wants_csv(args):
        write_csv(listing)
        return 0
    if args.json:
        print(json.dumps({"models": listing}, indent=2))
        return 0
    print(
        render_table(
            ["model", "type", "layers", "kinds", "KV/token", "state/request", "context"],
            [
                [
                    row["name"],
                    row["model_type"],
                    row["layers"],
                    ", ".join(f"{n} {k}" for k, n in row["kinds"].items()),
                    format_bytes(row["kv_bytes_per_token"]),
                    format_bytes(row["state_bytes_per_request"]) if row["state_bytes_per_request"] else "-",
                    f"{row['max_position_embeddings']:,}" if row["max_position_embeddings"] else "-",
                ]
                for row in listing
            ],
            align="llrlrrr",
        )
    )
    print(
        f"\nKV/token and state/request are per tensor-parallel rank (tp {options.tp}); "
        "plan one with `kvcore plan --model NAME --memory SIZE --max-model-len N`"
    )
    print(
        "These are bundled (kvcore/data/zoo, read without the network); any other org/name is read from "
        "the Hugging Face cache, else the Hub (kvcore[hub]): `kvcore models org/name` says which"
    )
    return 0
