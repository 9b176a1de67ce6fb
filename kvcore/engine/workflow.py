"""The start-up workflow an engine core runs, and the executor that serves it on one device.

::

    specs  = executor.get_kv_cache_spec()            # {layer: spec}
    memory = executor.determine_available_memory()   # bytes for the KV cache
    plan   = plan(PlanRequest(specs=specs, budgets=memory, ...))   # or executor.agree_on_plan(request)
    executor.initialize(plan)                        # allocate, bind, warm up

:func:`initialize_kv_caches` runs it. An executor whose ranks must agree on the plan (an
:class:`AgreeingExecutor`, e.g. :class:`kvcore.distributed.DistributedExecutor`) plans through
its own ``agree_on_plan``: it gathers every rank's specs and memory and returns this rank's
plan (:func:`kvcore.planning.ranks.ranks_request`); the workflow stays the same. Both plan a
:class:`~kvcore.planning.request.PlanRequest` with the one implementation,
:func:`kvcore.planning.planner.plan`.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

from kvcore.errors import InvalidInputError, PluginValidationError
from kvcore.plan import KVCachePlan
from kvcore.planning import planner
from kvcore.planning.capacity import Capacity, format_figure
from kvcore.planning.ranks import merge_worker_specs as merge_worker_specs
from kvcore.planning.registry import Registry
from kvcore.planning.request import MaxModelLen, PlanRequest, sizing_of
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.removed import removed_message
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.units import format_bytes

#: One logger for the whole start-up workflow, whichever module logs.
logger = logging.getLogger("kvcore.engine")


@runtime_checkable
class Executor(Protocol):
    """What the workflow asks of whatever runs the model (one device, or many workers)."""

    def get_kv_cache_spec(self) -> Mapping[str, KVCacheSpec]:
        """``{layer name: spec}`` of every layer that needs cache memory, in model order."""
        ...

    def determine_available_memory(self) -> int:
        """Bytes the KV cache may take (profiled, or fixed by configuration)."""
        ...

    def initialize(self, plan: KVCachePlan) -> None:
        """Allocate ``plan``, bind every layer to its view, and warm up."""
        ...


@runtime_checkable
class AgreeingExecutor(Executor, Protocol):
    """An executor whose ranks agree on the plan (several processes, one block pool).

    :func:`initialize_kv_caches` calls :meth:`agree_on_plan` instead of planning alone.
    """

    def agree_on_plan(self, request: PlanRequest, *, registry: Registry) -> KVCachePlan:
        """Share the request's specs and budget (this rank's) with every rank, and return this
        rank's plan."""
        ...


def capacity_summary(plan: KVCachePlan, specs: Mapping[str, KVCacheSpec] | None = None) -> str:
    """The plan's capacity as an operator reads it at start-up: the total first, then each group.

    The first line states the KV tokens the pool holds in all (requests of ``max_model_len``
    tokens held at once, times that length: what engines log as the cache's token capacity) and
    the max concurrency, then the blocks, bytes and policy. Each group's line says its kind, its
    layers, its block size (and when the policy raised it above the spec's, as a policy does to
    even out pages of different sizes) and the pages one request holds in it; a group's own
    token capacity is not a total and is not shown as one.

    Args:
        plan: the plan; every number comes from its :class:`~kvcore.planning.capacity.Capacity`.
        specs: the layer specs it was made from, for the block sizes they asked for (without
            them a raised block size cannot be told).

    Returns:
        The lines, joined with newlines (what :func:`initialize_kv_caches` logs).
    """
    capacity = Capacity.of(plan, specs)
    groups = len(plan.groups)
    if plan.names_pools:
        each = ", ".join(f"{p.num_blocks:,} x {format_bytes(p.bytes_per_block)}" for p in plan.pools)
        blocks = f"{len(plan.pools)} block pools ({each})"
    else:
        blocks = f"{plan.num_blocks:,} blocks x {format_bytes(plan.bytes_per_block)}"
    lines = [
        f"KV cache: {format_figure(capacity.kv_cache_tokens, ',')} tokens, "
        f"max concurrency {format_figure(capacity.max_concurrency)} "
        f"requests of {capacity.max_model_len:,} tokens; {blocks} = {format_bytes(plan.kv_cache_bytes)} "
        f"(policy {plan.policy}, {groups} group{'' if groups == 1 else 's'})"
    ]
    context = plan.context
    for index, group in enumerate(plan.groups):
        count = len(group.layer_names)
        layers = f"{count} layer" + ("" if count == 1 else "s")
        size = group.spec.block_size
        asked = sorted(
            {specs[name].block_size for name in group.layer_names if specs and name in specs} - {size}
        )
        raised = f" (raised from {', '.join(map(str, asked))} by the policy)" if asked else ""
        per_request = group.pages_per_request(context)
        pool = f", pool {group.pool}" if plan.names_pools else ""
        sizes = sorted({spec.page_size_bytes for spec in group.specs})
        pages = f", pages of {'/'.join(map(format_bytes, sizes))}" if len(sizes) > 1 else ""
        lines.append(
            f"  group {index}: {group.spec.kind}, {layers}{pool}, block size {size}{raised}{pages}, "
            f"{per_request:,} page{'' if per_request == 1 else 's'} per request"
        )
    return "\n".join(lines)


def initialize_kv_caches(
    executor: Executor,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    context: SizingContext | None = None,
    max_model_len: int | Literal["auto"] | MaxModelLen | None = None,
    options: PlanOptions | None = None,
    num_blocks: int | Sequence[int] | None = None,
) -> KVCachePlan:
    """Run the workflow: specs, available memory, plan, initialize. Logs the capacity.

    Args:
        executor: what runs the model (e.g. a :class:`LocalExecutor`); an
            :class:`AgreeingExecutor` (one rank of several) plans with its ``agree_on_plan``.
        registry: spec kinds, policies and layouts.
        policy: a policy name, ``"auto"`` or a policy object.
        context: the request length and step size to size for ...
        max_model_len: ... or just the request length (default step size); or ``"auto"``:
            the longest request the memory admits, at most ``context.max_model_len`` when a
            context is given (a model's ``max_position_embeddings``), else bounded by memory
            alone; or a :class:`~kvcore.planning.request.MaxModelLen` (its number must be the
            context's). The two are reconciled by :func:`~kvcore.planning.request.sizing_of`.
            Under ``auto`` the plan's ``context.max_model_len`` is the length chosen. Not
            with an :class:`AgreeingExecutor`.
        options: policy knobs.
        num_blocks: force this many block ids (still checked against the memory); one count
            per pool for a policy of several pools.

    Returns:
        The plan the executor was initialized with. The executor holds the views (for a
        :class:`LocalExecutor`: ``executor.kv_caches`` and ``executor.bound``).

    Raises:
        InvalidInputError: neither or conflicting ``context`` / ``max_model_len``;
            ``"auto"`` with an :class:`AgreeingExecutor`, or where nothing bounds the length.
        MemoryProfilingError: profiling left nothing for the KV cache.
        InsufficientMemoryError: one request of ``max_model_len`` does not fit.
        KVCacheAllocationError: allocation failed (nothing stays allocated).
        KVCacheBindingError: a layer could not be bound.
        SpecMismatchError: ranks of an :class:`AgreeingExecutor` disagree on a layer.
        DistributedAgreementError: ranks of an :class:`AgreeingExecutor` did not answer in
            time, or one of them failed; names the ranks.
    """
    ctx, length = sizing_of(context, max_model_len)
    specs = executor.get_kv_cache_spec()
    memory = executor.determine_available_memory()
    start = time.perf_counter()
    if length.auto and isinstance(executor, AgreeingExecutor):
        raise InvalidInputError(
            "max_model_len='auto' plans one rank; ranks that agree on a plan need one length: "
            "give max_model_len a number"
        )
    request = PlanRequest.for_context(
        specs, memory, ctx, auto_length=length.auto, policy=policy, options=options, num_blocks=num_blocks
    )
    if isinstance(executor, AgreeingExecutor):
        plan = _agree(executor, request, registry)
    else:
        plan = planner.plan(request, registry=registry).plans[0]
    sharing = getattr(executor, "kv_sharing", None)
    if sharing:  # layers that reuse another layer's cache read its group's block table
        plan = plan.with_kv_sharing(sharing)
    timings = getattr(executor, "timings", None)
    if isinstance(timings, dict):  # executors that time their steps also get the planning time
        timings["plan"] = time.perf_counter() - start
    logger.info("%s", capacity_summary(plan, specs))
    executor.initialize(plan)
    return plan


def _agree(executor: AgreeingExecutor, request: PlanRequest, registry: Registry) -> KVCachePlan:
    """``executor.agree_on_plan(request)``.

    Raises:
        PluginValidationError: the executor's ``agree_on_plan(specs, memory, context, *,
            registry, policy, options, num_blocks)`` is the 0.1 protocol (deprecated in 0.2,
            removed in 0.3); the message names the one to write.
    """
    agree = executor.agree_on_plan
    if next(iter(inspect.signature(agree).parameters), None) == "specs":
        raise PluginValidationError(
            removed_message(
                f"{type(executor).__qualname__}.agree_on_plan(specs, memory, context, ...) (0.1's protocol)",
                "agree_on_plan(request, *, registry), which gets one kvcore.PlanRequest",
            )
        )
    return agree(request, registry=registry)
