"""Plans for several ranks at once: how tensor x pipeline ranks are numbered, and one plan per rank.

Pure planning, no ``torch.distributed``: :mod:`kvcore.engine.distributed` gathers what every rank
reports and calls :func:`plan_for_ranks`; ``kvcore plan --tp N --pp M`` calls it on simulated
ranks (:func:`simulate_rank_specs`).

The rules:

- *Rank numbering.* ``world = tp x pp`` and ``rank = pp_rank * tp + tp_rank``: the tensor-parallel
  ranks of one pipeline stage are consecutive (Megatron style).
- *Stages.* Pipeline stages own disjoint layers. Tensor-parallel ranks of one stage hold the
  same layers and must report equal specs for them (``spec.merge`` decides).
- *Grouping.* The stages' specs are merged, in stage order, into the whole model, and the
  policy groups the whole model, so the groups (and a request's block count) are the same on
  every rank.
- *Per-rank plans.* Each rank's plan keeps every group, projected onto its own layers (a
  group may be empty there), and only its own tensors; its bytes per block are what its
  layers take (one ``policy.layout(projected groups)`` call per rank).
- *One block count.* Every rank gets ``num_blocks = min over ranks of memory // bytes per
  block``, so one scheduler drives one block pool for all of them; a forced count is checked
  against every rank's memory. A policy of several pools splits each rank's budget by each
  pool's worst-case need (:func:`~kvcore.planning.capacity.split_budget`), and every pool gets
  the minimum over ranks of its own count.

:func:`plan_for_ranks` checks and merges what the ranks report (:func:`ranks_request`: a
request made for every rank), then plans that :class:`~kvcore.planning.request.PlanRequest` with
:func:`kvcore.planning.planner.plan`, the planning implementation :func:`~kvcore.plan_kv_cache`
uses too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from kvcore.errors import InvalidInputError, InvalidSpecError, SpecMismatchError
from kvcore.plan import KVCachePlan
from kvcore.planning.planner import (
    plan,
    project_groups as project_groups,
    tightest_rank as tightest_rank,
)
from kvcore.planning.registry import Registry
from kvcore.planning.request import KeywordFields, PlanRequest, request_from_keywords
from kvcore.removed import names_removed_from
from kvcore.spec import KVCacheSpec, SizingContext, check_layer_specs, describe_spec, spec_differences
from kvcore.validators import check_int, int_at_least

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

#: attrs validator of a parallel size: an int >= 1.
_parallel_size = int_at_least(1)


@attrs.frozen(kw_only=True)
class Parallelism:
    """How ``tp_size x pp_size`` ranks are numbered: ``rank = pp_rank * tp_size + tp_rank``.

    Attributes:
        tp_size: tensor-parallel ranks per pipeline stage.
        pp_size: pipeline stages.
    """

    tp_size: int = attrs.field(default=1, validator=_parallel_size)
    pp_size: int = attrs.field(default=1, validator=_parallel_size)

    @classmethod
    def for_world(cls, world_size: int, tp_size: int = 1) -> Parallelism:
        """The ranks of a job of ``world_size`` ranks in stages of ``tp_size``.

        Raises:
            InvalidInputError: ``world_size`` is not a positive multiple of ``tp_size``.
        """
        check_int(world_size, "the world size", minimum=1)
        check_int(tp_size, "'tp_size'", minimum=1)
        if world_size % tp_size:
            raise InvalidInputError(
                f"{world_size} ranks cannot form pipeline stages of tp_size={tp_size} ranks each; "
                "launch tp_size x pp_size ranks"
            )
        return cls(tp_size=tp_size, pp_size=world_size // tp_size)

    @property
    def world_size(self) -> int:
        """Ranks in all: ``tp_size * pp_size``."""
        return self.tp_size * self.pp_size

    def tp_rank(self, rank: int) -> int:
        """The rank's position within its stage."""
        return rank % self.tp_size

    def pp_rank(self, rank: int) -> int:
        """The rank's pipeline stage."""
        return rank // self.tp_size

    def stage_ranks(self, pp_rank: int) -> range:
        """The ranks of pipeline stage ``pp_rank``."""
        return range(pp_rank * self.tp_size, (pp_rank + 1) * self.tp_size)

    def describe(self, rank: int) -> str:
        """``'rank 3 (pp stage 1, tp rank 1)'``, or ``'rank 3'`` when there is one kind of parallelism."""
        parts = []
        if self.pp_size > 1:
            parts.append(f"pp stage {self.pp_rank(rank)}")
        if self.tp_size > 1 and self.pp_size > 1:
            parts.append(f"tp rank {self.tp_rank(rank)}")
        return f"rank {rank}" + (f" ({', '.join(parts)})" if parts else "")


def partition_layers(layer_names: Sequence[str], pp_size: int) -> tuple[tuple[str, ...], ...]:
    """Cut layers, in model order, into ``pp_size`` contiguous stages balanced by layer count.

    Stage ``s`` gets ``n // pp_size`` layers, and the first ``n % pp_size`` stages one more
    (``torch.tensor_split``'s rule): 10 layers in 4 stages are 3, 3, 2, 2.

    Args:
        layer_names: the cache-holding layers in model order.
        pp_size: the number of stages.

    Returns:
        One tuple of layer names per stage.

    Raises:
        InvalidInputError: fewer layers than stages.
    """
    _parallel_size(None, attrs.fields(Parallelism).pp_size, pp_size)
    names = list(layer_names)
    if len(names) < pp_size:
        raise InvalidInputError(
            f"{len(names)} layer(s) cannot fill {pp_size} pipeline stages; every stage needs a layer "
            f"with a cache: use at most {len(names)} stages"
        )
    base, extra = divmod(len(names), pp_size)
    stages = []
    start = 0
    for stage in range(pp_size):
        end = start + base + (1 if stage < extra else 0)
        stages.append(tuple(names[start:end]))
        start = end
    return tuple(stages)


def simulate_rank_specs(
    specs: Mapping[str, KVCacheSpec], parallelism: Parallelism
) -> list[dict[str, KVCacheSpec]]:
    """What each rank would report for a model whose per-rank specs are ``specs``.

    Every tensor-parallel rank reports the same specs (``specs`` are already per rank, e.g.
    from a config with ``ModelOptions(tp=...)``); stage ``s`` holds the layers
    :func:`partition_layers` gives it.

    Returns:
        One ``{layer: spec}`` per rank, in rank order.

    Raises:
        InvalidInputError: fewer layers than stages.
    """
    stages = partition_layers(list(specs), parallelism.pp_size)
    return [
        {name: specs[name] for name in stages[parallelism.pp_rank(rank)]}
        for rank in range(parallelism.world_size)
    ]


def merge_worker_specs(
    worker_specs: Sequence[Mapping[str, KVCacheSpec]], ranks: Sequence[int] | None = None
) -> dict[str, KVCacheSpec]:
    """Merge what several workers report into one ``{layer: spec}``.

    A layer reported by several workers (tensor-parallel ranks) must have specs that merge
    (``spec.merge``, equal by default); a layer reported by one worker only (a pipeline
    stage's own layers) is kept as is. Order: first appearance.

    Args:
        worker_specs: one mapping per worker.
        ranks: the workers' rank numbers, for messages (default: their positions, called
            "workers").

    Returns:
        The merged specs.

    Raises:
        InvalidInputError: no workers.
        InvalidSpecError: a worker's mapping is malformed.
        SpecMismatchError: workers disagree on a layer; names the layer, the ranks that
            differ and the fields.
    """
    if not worker_specs:
        raise InvalidInputError("no workers reported layer specs (got an empty list)")
    label = "worker" if ranks is None else "rank"
    numbers = list(range(len(worker_specs)) if ranks is None else ranks)
    reported: dict[str, list[tuple[int, KVCacheSpec]]] = {}
    for rank, specs in zip(numbers, worker_specs, strict=True):
        check_layer_specs(specs)
        for name, spec in specs.items():
            reported.setdefault(name, []).append((rank, spec))
    merged: dict[str, KVCacheSpec] = {}
    for name, entries in reported.items():
        first_rank, first = entries[0]
        try:
            merged[name] = type(first).merge([spec for _, spec in entries])
        except SpecMismatchError as exc:
            reporters = ", ".join(str(rank) for rank, _ in entries)
            differ = [(rank, spec) for rank, spec in entries if spec.group_key != first.group_key]
            if not differ:  # a plugin's merge refused equal keys: its own message says why
                raise SpecMismatchError(f"layer {name!r} (reported by {label}s {reporters}): {exc}") from None
            other = differ[0][1]
            same = [rank for rank, spec in differ if spec.group_key == other.group_key]
            listed = ", ".join(map(str, same))
            they = f"{label}s {listed} report" if len(same) > 1 else f"{label} {listed} reports"
            raise SpecMismatchError(
                f"layer {name!r} (reported by {label}s {reporters}): {they} {describe_spec(other)} but "
                f"{label} {first_rank} reports "
                f"{describe_spec(first)} (they differ in {', '.join(spec_differences(first, other))}); "
                f"every {label} holding a layer must report an equal spec for it (same model options, "
                "e.g. the same tp on every rank)"
            ) from None
    return merged


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def merge_rank_specs(
    rank_specs: Sequence[Mapping[str, KVCacheSpec]], parallelism: Parallelism
) -> dict[str, KVCacheSpec]:
    """The whole model's ``{layer: spec}``: each stage's specs merged, stages in order.

    Args:
        rank_specs: one ``{layer: spec}`` per rank, in rank order.
        parallelism: how the ranks form stages.

    Returns:
        The whole model's specs, stage 0's layers first.

    Raises:
        InvalidInputError: not one mapping per rank of ``parallelism``.
        InvalidSpecError: a rank's mapping is malformed (names the rank).
        SpecMismatchError: tensor-parallel ranks of a stage hold different layers or report
            different specs for a layer, or two stages hold one layer; names the layer and the
            ranks.
    """
    if len(rank_specs) != parallelism.world_size:
        raise InvalidInputError(
            f"got specs from {len(rank_specs)} rank(s) but tp_size={parallelism.tp_size} x "
            f"pp_size={parallelism.pp_size} is {parallelism.world_size}; every rank must report its specs"
        )
    for rank, specs in enumerate(rank_specs):
        try:
            check_layer_specs(specs)
        except InvalidSpecError as exc:
            if parallelism.world_size == 1:
                raise
            raise InvalidSpecError(f"{parallelism.describe(rank)}: {exc}") from None
    merged: dict[str, KVCacheSpec] = {}
    owner: dict[str, int] = {}
    for stage in range(parallelism.pp_size):
        ranks = parallelism.stage_ranks(stage)
        _check_same_layers(stage, [rank_specs[r] for r in ranks], ranks)
        stage_specs = merge_worker_specs([rank_specs[r] for r in ranks], ranks=ranks)
        for name, spec in stage_specs.items():
            if name in owner:
                first = owner[name]
                earlier = _ranks_text(parallelism.stage_ranks(first))
                raise SpecMismatchError(
                    f"layer {name!r} is held by pipeline stages {first} ({earlier}) and {stage} "
                    f"({_ranks_text(ranks)}); pipeline stages must own disjoint layers"
                )
            owner[name] = stage
            merged[name] = spec
    return merged


def _check_same_layers(stage: int, specs: Sequence[Mapping[str, KVCacheSpec]], ranks: Sequence[int]) -> None:
    everything = list(dict.fromkeys(name for rank_specs in specs for name in rank_specs))
    for name in everything:
        holders = [rank for rank, rank_specs in zip(ranks, specs, strict=True) if name in rank_specs]
        if len(holders) != len(ranks):
            missing = [rank for rank in ranks if rank not in holders]
            raise SpecMismatchError(
                f"layer {name!r} is held by {_ranks_text(holders)} but not by {_ranks_text(missing)} of "
                f"pipeline stage {stage}; the tensor-parallel ranks of a stage must hold the same layers"
            )


def plan_for_ranks(
    rank_specs: Sequence[Mapping[str, KVCacheSpec]],
    rank_memory: Sequence[int],
    context: SizingContext,
    *,
    registry: Registry,
    tp_size: int = 1,
    **fields: Unpack[KeywordFields],
) -> list[KVCachePlan]:
    """One plan per rank, all with the same groups and the same ``num_blocks``.

    With one rank this is :func:`~kvcore.plan_kv_cache`. With several, the stages' specs are
    merged and grouped as one model; each rank's plan holds every group, projected onto its
    own layers, and its own tensors; ``num_blocks`` is the smallest ``memory // bytes per
    block`` over the ranks. See the module docstring for the rules.

    Args:
        rank_specs: one ``{layer: spec}`` per rank, in rank order.
        rank_memory: one byte budget per rank, in the same order.
        context: the request length (and step size) to size for.
        registry: where policies are looked up.
        tp_size: tensor-parallel ranks per stage; ``len(rank_specs) // tp_size`` stages.
        fields: the request's other fields, as :func:`~kvcore.plan_kv_cache` takes them
            (:class:`~kvcore.planning.request.KeywordFields`): the policy plans the whole
            model, a forced ``num_blocks`` is checked against every rank's memory, and
            ``max_model_len="auto"`` plans for the longest request every rank admits.

    Returns:
        The plans, in rank order.

    Raises:
        InvalidInputError: the lists differ in length or are empty, a budget is not a
            non-negative int, or the rank count is not a multiple of ``tp_size``.
        SpecMismatchError: ranks disagree (names the layer and the ranks).
        PolicyNotApplicableError: the policy cannot plan the whole model.
        InsufficientMemoryError: the forced block count exceeds a rank's memory, or one
            request does not fit in the common block count (names the rank with the fewest
            blocks).
    """
    one = request_from_keywords({}, 0, context, fields)  # the ranks' specs and budgets replace its own
    return list(plan(ranks_request(one, rank_specs, rank_memory, tp_size=tp_size), registry=registry).plans)


def ranks_request(
    request: PlanRequest,
    rank_specs: Sequence[Mapping[str, KVCacheSpec]],
    rank_memory: Sequence[int],
    *,
    tp_size: int = 1,
) -> PlanRequest:
    """``request`` (its length, policy, options, forced count) made for the ranks that report
    ``rank_specs`` and ``rank_memory``: the stages' specs merged into the whole model, each
    rank's budget, layers and name. With one rank, its specs and budget as they are.

    Args:
        request: what to plan; its own specs and budgets are replaced.
        rank_specs: one ``{layer: spec}`` per rank, in rank order.
        rank_memory: one byte budget per rank, in the same order.
        tp_size: tensor-parallel ranks per stage; ``len(rank_specs) // tp_size`` stages.

    Raises:
        InvalidInputError: the lists differ in length or are empty, a budget is not a
            non-negative int, or the rank count is not a multiple of ``tp_size``.
        SpecMismatchError: ranks disagree (names the layer and the ranks).
    """
    if not rank_specs:
        raise InvalidInputError("no ranks reported layer specs (got an empty list)")
    if len(rank_specs) != len(rank_memory):
        raise InvalidInputError(
            f"got specs from {len(rank_specs)} worker(s) but memory from {len(rank_memory)}; "
            "every rank must report both"
        )
    parallelism = Parallelism.for_world(len(rank_specs), tp_size)
    if parallelism.world_size == 1:  # one rank: its specs are the model's
        return attrs.evolve(
            request, specs=rank_specs[0], budgets=rank_memory, rank_layers=None, rank_names=None
        )
    return attrs.evolve(
        request,
        specs=merge_rank_specs(rank_specs, parallelism),
        budgets=rank_memory,
        rank_layers=rank_specs,
        rank_names=[parallelism.describe(r) for r in range(parallelism.world_size)],
    )


if not TYPE_CHECKING:  # type checkers keep refusing names the module does not define
    __getattr__ = names_removed_from(__name__, {"RankLayout": "Parallelism"})
