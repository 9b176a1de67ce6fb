"""``--gpu-memory``: the KV budget of ``kvcore plan`` / ``compare`` / ``simulate`` worked out from
a GPU (:func:`kvcore.planning.gpu_budget.gpu_budget`), and the lines that show it."""

from __future__ import annotations

import attrs

from kvcore.cli.inputs import load_model
from kvcore.cli.options import PlanningArgs
from kvcore.errors import InvalidInputError, ModelConfigError, UnknownModelError
from kvcore.plan import KVCachePlan
from kvcore.planning.capacity import Capacity, format_figure
from kvcore.planning.gpu_budget import DEFAULT_UTILIZATION, GpuBudget, gpu_budget
from kvcore.planning.registry import Registry
from kvcore.units import format_bytes


def settle_budget(args: PlanningArgs, registry: Registry) -> tuple[PlanningArgs, GpuBudget | None]:
    """With ``--gpu-memory``, work out the KV budget: ``args.memory`` becomes it.

    Args:
        args: the options (``--gpu-memory``, ``--utilization``, ``--model`` loaded, ``--tp``,
            ``--pp``, ``--max-num-batched-tokens``).
        registry: whose plugins count the weights.

    Returns:
        ``args`` with the budget in ``memory``, and the budget and its terms (``None`` when
        the budget was given as ``--memory``: ``args`` unchanged).

    With ``--gpu NAME`` (``plan``, ``compare``, ``simulate``, ``tune``) and neither ``--memory`` nor
    ``--gpu-memory``, the GPU's memory is ``--gpu-memory``; a budget larger than that GPU's
    memory is refused.

    Raises:
        InvalidInputError: ``--utilization`` without ``--gpu-memory``, ``--gpu-memory`` with a
            spec file, nothing left for the KV cache, no budget at all, or one over ``--gpu``'s
            memory.
        UnknownModelError, ModelConfigError: the weights cannot be counted.
    """
    args = _gpu_name_budget(args)
    gpu = args.gpu_memory
    if gpu is None:
        if args.utilization is not None:
            raise InvalidInputError(
                "--utilization applies to --gpu-memory only; --memory is the KV budget itself"
            )
        return args, None
    if args.model is None:
        raise InvalidInputError(
            "--gpu-memory needs --model: the weights are counted from the model's config; with a spec "
            "file give the KV budget as --memory SIZE"
        )
    loaded = load_model(args, registry).model_config  # loaded once: by load_layer_specs, before this
    assert loaded is not None  # --model is given
    config, source = loaded.config, loaded.source
    checkpoint, note = loaded.found.checkpoint_weights() if loaded.found is not None else (None, "")
    try:
        budget = gpu_budget(
            config,
            registry,
            gpu,
            utilization=args.utilization if args.utilization is not None else DEFAULT_UTILIZATION,
            max_num_batched_tokens=args.max_num_batched_tokens,
            tp=args.tp_size,
            pp=args.pp_size,
            source=source.removeprefix("bundled "),
            checkpoint=checkpoint,
        )
    except (UnknownModelError, ModelConfigError, InvalidInputError) as exc:
        raise type(exc)(_flags(str(exc))) from None
    if note:
        budget = attrs.evolve(budget, notes=(*budget.notes, note))
    return attrs.evolve(args, memory=budget.kv_cache), budget


def _gpu_name_budget(args: PlanningArgs) -> PlanningArgs:
    """``--gpu NAME`` and the budget: the GPU's memory stands in for ``--gpu-memory`` when
    neither ``--memory`` nor ``--gpu-memory`` is given, and bounds either when one is.

    Raises:
        InvalidInputError: no budget at all, a budget larger than the named GPU's memory, or
            ``--gpu`` as the budget of a spec file.
        UnknownGpuError: ``--gpu`` names no GPU of the catalogue.
    """
    if args.gpu is None:
        if args.memory is None and args.gpu_memory is None and args.command in _GPU_NAME_COMMANDS:
            raise InvalidInputError(
                "give the KV budget: --memory SIZE (the KV cache itself), --gpu-memory SIZE (one GPU, "
                "the weights counted off), or --gpu NAME (that GPU's memory)"
            )
        return args
    from kvcore.simulation.gpus import find_gpu

    card = find_gpu(args.gpu)
    limit = card.memory_bytes
    for flag, given in (("--gpu-memory", args.gpu_memory), ("--memory", args.memory)):
        if given is not None and given > limit:
            raise InvalidInputError(
                f"{flag} {format_bytes(given)} is more than --gpu {args.gpu}'s memory "
                f"({card.name}: {format_bytes(limit)}); give at most {format_bytes(limit)}, "
                "or leave out --gpu-memory to size the budget from the GPU"
            )
    if args.memory is not None or args.gpu_memory is not None:
        return args
    if args.model is None:
        raise InvalidInputError(
            "--gpu sizes the KV budget from the GPU's memory with --model only (the weights are "
            "counted from its config); with a spec file give the KV budget as --memory SIZE"
        )
    return attrs.evolve(args, gpu_memory=limit)


#: The commands whose budget ``--gpu NAME`` may give (those taking ``--gpu``: argparse requires
#: no budget of them, :func:`_gpu_name_budget` does).
_GPU_NAME_COMMANDS = frozenset({"plan", "compare", "simulate", "tune"})


#: How the planning layer's messages name what the command line spells as flags.
_FLAG_WORDS = (
    (
        "give the KV cache a byte budget of its own instead",
        "give the KV budget as --memory SIZE instead of --gpu-memory",
    ),
    ("more tensor-parallel ranks (tp)", "more --tp ranks"),
    ("a higher utilization", "a higher --utilization"),
    ("a smaller max_num_batched_tokens", "a smaller --max-num-batched-tokens"),
)


def _flags(message: str) -> str:
    for words, flags in _FLAG_WORDS:
        message = message.replace(words, flags)
    return message


def answer_line(plan: KVCachePlan, budget: GpuBudget) -> str:
    """How long and how many on this GPU, in one line."""
    capacity = Capacity.of(plan)
    return (
        f"on this {format_bytes(budget.gpu_memory)} GPU: requests of up to {capacity.max_model_len:,} "
        "tokens, "
        f"{format_figure(capacity.max_concurrency)} of them at once "
        f"({format_figure(capacity.kv_cache_tokens, ',')} tokens of KV cache)"
    )


def print_budget(budget: GpuBudget | None) -> None:
    """Print the breakdown and a blank line (nothing without ``--gpu-memory``)."""
    if budget is not None:
        print("\n".join(budget.lines()))
