"""The scheduler a simulation replays (``--scheduler`` and vLLM's settings), shared by
``kvcore simulate`` and ``kvcore compare --trace``."""

from __future__ import annotations

import argparse
from typing import Any

import attrs

from kvcore.cli.inputs import positive_int, retention_interval
from kvcore.cli.options import PlanningArgs
from kvcore.errors import InvalidInputError
from kvcore.planning.registry import Registry
from kvcore.simulation.profile import DEFAULT_SCHEDULER

#: vLLM 0.33's max_num_seqs default (``kvcore.simulation.profiles.vllm.VLLM_MAX_NUM_SEQS``; not
#: imported here, so that building the parser does not load the simulator).
VLLM_MAX_NUM_SEQS = 128

#: vLLM's settings, each with the value vLLM 0.33 has by default.
VLLM_DEFAULTS: dict[str, Any] = {
    "async_scheduling": True,
    "max_num_seqs": VLLM_MAX_NUM_SEQS,
    "reserve_full_isl": True,
    "long_prefill_token_threshold": 0,
    "prefix_cache_retention_interval": 0,
}


def add_scheduler_options(parser: argparse.ArgumentParser) -> None:
    """``--scheduler NAME`` and the ``vllm`` profile's settings."""
    parser.add_argument(
        "--scheduler",
        default=DEFAULT_SCHEDULER,
        metavar="NAME",
        help="the scheduler to replay the workload as: vllm (default: vLLM 0.33's v1 scheduler), "
        "vllm-reference (the same written plainly, no speed path: same figures, slower), "
        "kvcore (kvcore's own rules), sglang (SGLang 0.5.23's scheduler), or one a plugin registers "
        "(`kvcore plugins` lists them)",
    )
    vllm = parser.add_argument_group("vLLM's scheduler settings (with --scheduler vllm or vllm-reference)")
    vllm.add_argument(
        "--sync-scheduling",
        dest="async_scheduling",
        action="store_false",
        default=None,
        help="without vLLM's async scheduling (on by default in vLLM 0.33): a step's output returns "
        "before the next step",
    )
    vllm.add_argument(
        "--max-num-seqs",
        type=positive_int,
        metavar="N",
        help=f"vLLM's max_num_seqs: the most requests running at once (default {VLLM_MAX_NUM_SEQS})",
    )
    vllm.add_argument(
        "--no-reserve-full-isl",
        dest="reserve_full_isl",
        action="store_false",
        default=None,
        help="turn off vLLM's scheduler_reserve_full_isl: admit a request when its first chunk fits, "
        "not only when its whole prompt does",
    )
    vllm.add_argument(
        "--long-prefill-token-threshold",
        type=positive_int,
        metavar="N",
        help="vLLM's long_prefill_token_threshold: the most tokens one request computes in a step "
        "while others wait (default: off)",
    )
    vllm.add_argument(
        "--prefix-cache-retention-interval",
        type=retention_interval,
        metavar="N|dense",
        help="vLLM's prefix_cache_retention_interval: with prefix caching, which blocks of a sliding "
        "window and which Mamba states are cached: 0 (vLLM's default) only where a later request can "
        "resume, N (a multiple of the scheduler's block) those and a window's worth (a state) before "
        "every N tokens, dense all",
    )


def scheduler_profile(args: PlanningArgs, registry: Registry) -> Any:
    """The profile the options name, with vLLM's settings when it is ``vllm`` (or
    ``vllm-reference``, any :class:`~kvcore.simulation.profiles.vllm.VllmProfile`).

    Raises:
        UnknownSchedulerError: no registered profile has the name.
        InvalidInputError: a vLLM setting given with another scheduler.
    """
    from kvcore.simulation.profiles.vllm import VllmProfile

    name = args.scheduler or DEFAULT_SCHEDULER
    options = attrs.asdict(args, recurse=False)
    given = {key: options[key] for key in VLLM_DEFAULTS if options[key] is not None}
    profile = registry.scheduler_profile(name)
    if not isinstance(profile, VllmProfile):
        if given:
            flags = ", ".join("--" + key.replace("_", "-") for key in given)
            raise InvalidInputError(
                f"{flags}: vLLM's settings, for --scheduler vllm only (or vllm-reference; "
                f"got --scheduler {name})"
            )
        return profile
    settings: dict[str, Any] = {**VLLM_DEFAULTS, **given}
    if settings["prefix_cache_retention_interval"] == "dense":
        settings["prefix_cache_retention_interval"] = None
    return attrs.evolve(profile, **settings)  # vllm-reference keeps its name and reference=True


def scheduler_row(profile: Any) -> dict[str, Any]:
    """The profile as JSON: its name and settings (``settings()``, when it has them)."""
    settings = profile.settings() if callable(getattr(profile, "settings", None)) else ()
    return {"name": profile.name, "settings": dict(settings)}


def describe_scheduler(profile: Any) -> str:
    """``vllm (async_scheduling True, max_num_seqs 128, ...)``: the name and its settings."""
    settings = scheduler_row(profile)["settings"]
    if not settings:
        return str(profile.name)
    return f"{profile.name} ({', '.join(f'{k} {v}' for k, v in settings.items())})"
