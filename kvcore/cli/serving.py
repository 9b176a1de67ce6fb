"""Serving options of the planning commands: speculative decoding, state cache modes, encoder
length. They join the sizing options (:func:`kvcore.cli.inputs.add_sizing_options`) and go
into the :class:`~kvcore.spec.SizingContext` (and, for ``--speculative``, the model options)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kvcore.limits import MAX_TOKENS
from kvcore.model_options import SPECULATIVE_METHODS
from kvcore.spec import STATE_CACHE_MODES

if TYPE_CHECKING:
    from kvcore.cli.options import PlanningArgs


def _count(text: str) -> int:
    """argparse type: a token count, an int in [0, :data:`~kvcore.limits.MAX_TOKENS`]."""
    shown = repr(text) if len(text) <= 40 else f"{text[:37]!r}... ({len(text)} characters)"
    try:
        value = int(text) if len(text.strip()) <= 30 else -1
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_TOKENS:,}, got {shown}")
    return value


def add_serving_options(parser: argparse.ArgumentParser) -> None:
    """``--num-speculative-tokens``, ``--speculative``, ``--state-cache-mode`` and
    ``--max-encoder-tokens``."""
    parser.add_argument(
        "--num-speculative-tokens",
        type=_count,
        default=0,
        metavar="N",
        help=(
            "draft tokens per step (speculative decoding): sliding-window and chunked layers keep N "
            "more tokens, state layers (SSM, linear attention) N more states per request (default 0)"
        ),
    )
    parser.add_argument(
        "--speculative",
        choices=SPECULATIVE_METHODS,
        help=(
            "with --model: plan the draft model's layers with the target's: mtp = the model's "
            "num_nextn_predict_layers MTP layers, eagle = one full-attention layer"
        ),
    )
    parser.add_argument(
        "--state-cache-mode",
        choices=STATE_CACHE_MODES,
        help=(
            "states kept per request for prefix caching: none = 1 (+N), align = 2 (+N), all = one per "
            "block (+N) (default: as the specs say, none)"
        ),
    )
    parser.add_argument(
        "--max-encoder-tokens",
        type=_count,
        default=0,
        metavar="N",
        help=(
            "longest encoder output (audio frames, image tokens) cross-attention layers cache per "
            "request (default 0: the model's, e.g. 1500 for Whisper)"
        ),
    )


def context_fields(args: PlanningArgs) -> dict[str, Any]:
    """The :class:`~kvcore.spec.SizingContext` fields the serving options set."""
    return {
        "num_speculative_tokens": args.num_speculative_tokens,
        "state_cache_mode": args.state_cache_mode,
        "max_encoder_tokens": args.max_encoder_tokens,
    }
