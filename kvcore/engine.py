"""The start-up workflow an engine core runs, and the executor that serves it on one device.

::

    specs  = executor.get_kv_cache_spec()            # {layer: spec}
    memory = executor.determine_available_memory()   # bytes for the KV cache
    plan   = plan_for_ranks([specs], [memory], ...)[0]  # or executor.agree_on_plan(...)
    executor.initialize(plan)                        # allocate, bind, warm up

:func:`initialize_kv_caches` runs it. An executor whose ranks must agree on the plan (an
:class:`AgreeingExecutor`, e.g. :class:`kvcore.distributed.DistributedExecutor`) plans through
its own ``agree_on_plan``: it gathers every rank's specs and memory and returns this rank's
plan (:func:`kvcore.parallel.plan_for_ranks`); the workflow stays the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from kvcore.allocation import Allocator, LayerView, allocate, allocation_sizes
from kvcore.binding import DEFAULT_ATTRIBUTE, bind_to_modules, module_targets, resolve_kv_sharing
from kvcore.errors import InvalidInputError, KVCacheBindingError
from kvcore.memory import DEFAULT_UTILIZATION, DeviceMemory, MemoryProfile, check_device
from kvcore.memory import determine_available_memory as profile_memory
from kvcore.module_scan import scan_module
from kvcore.parallel import merge_worker_specs as merge_worker_specs
from kvcore.parallel import plan_for_ranks
from kvcore.plan import KVCacheConfig
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.registry import Registry
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.units import format_bytes

logger = logging.getLogger(__name__)


@runtime_checkable
class Executor(Protocol):
    """What the workflow asks of whatever runs the model (one device, or many workers)."""

    def get_kv_cache_spec(self) -> Mapping[str, KVCacheSpec]:
        """``{layer name: spec}`` of every layer that needs cache memory, in model order."""
        ...

    def determine_available_memory(self) -> int:
        """Bytes the KV cache may take (profiled, or fixed by configuration)."""
        ...

    def initialize(self, plan: KVCacheConfig) -> None:
        """Allocate ``plan``, bind every layer to its view, and warm up."""
        ...


@runtime_checkable
class AgreeingExecutor(Executor, Protocol):
    """An executor whose ranks agree on the plan (several processes, one block pool).

    :func:`initialize_kv_caches` calls :meth:`agree_on_plan` instead of planning alone.
    """

    def agree_on_plan(
        self,
        specs: Mapping[str, KVCacheSpec],
        memory: int,
        context: SizingContext,
        *,
        registry: Registry,
        policy: str | AllocationPolicy = "auto",
        options: PlanOptions | None = None,
        num_blocks: int | None = None,
    ) -> KVCacheConfig:
        """Share ``specs`` and ``memory`` with every rank, and return this rank's plan."""
        ...


def capacity_summary(plan: KVCacheConfig) -> str:
    """The plan's capacity in a few lines: blocks and bytes, tokens per group, max concurrency.

    Args:
        plan: the plan; every number comes from its own figures (``tokens_held``,
            ``max_concurrency``).

    Returns:
        The lines, joined with newlines (what :func:`initialize_kv_caches` logs).
    """
    lines = [
        f"KV cache: {plan.num_blocks:,} blocks x {format_bytes(plan.bytes_per_block)} = "
        f"{format_bytes(plan.kv_cache_bytes)} (policy {plan.policy}, {len(plan.groups)} groups)"
    ]
    for index, group in enumerate(plan.groups):
        held = plan.tokens_held(group)
        what = f"{held:,} tokens" if held is not None else f"{plan.num_pages(group):,} request states"
        count = len(group.layer_names)
        layers = f"{count} layer" + ("" if count == 1 else "s")
        lines.append(f"  group {index} {group.spec.kind} ({layers}): {what}")
    length = plan.context.max_model_len
    lines.append(f"  max concurrency: {plan.max_concurrency():,.2f} requests of {length:,} tokens")
    return "\n".join(lines)


def _sizing(context: SizingContext | None, max_model_len: int | None) -> SizingContext:
    if context is not None and max_model_len is not None and context.max_model_len != max_model_len:
        raise InvalidInputError(
            f"got context.max_model_len={context.max_model_len} and max_model_len={max_model_len}; "
            "give one of them"
        )
    if context is not None:
        return context
    if max_model_len is None:
        raise InvalidInputError(
            "give the request length to size for: max_model_len=N or context=SizingContext(...)"
        )
    return SizingContext(max_model_len=max_model_len)


def initialize_kv_caches(
    executor: Executor,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    context: SizingContext | None = None,
    max_model_len: int | None = None,
    options: PlanOptions | None = None,
    num_blocks: int | None = None,
) -> KVCacheConfig:
    """Run the workflow: specs, available memory, plan, initialize. Logs the capacity.

    Args:
        executor: what runs the model (e.g. a :class:`LocalExecutor`); an
            :class:`AgreeingExecutor` (one rank of several) plans with its ``agree_on_plan``.
        registry: spec kinds, policies and layouts.
        policy: a policy name, ``"auto"`` or a policy object.
        context: the request length and step size to size for ...
        max_model_len: ... or just the request length (default step size).
        options: policy knobs.
        num_blocks: force this many block ids (still checked against the memory).

    Returns:
        The plan the executor was initialized with. The executor holds the views (for a
        :class:`LocalExecutor`: ``executor.kv_caches`` and ``executor.bound``).

    Raises:
        InvalidInputError: neither or conflicting ``context`` / ``max_model_len``.
        MemoryProfilingError: profiling left nothing for the KV cache.
        InsufficientMemoryError: one request of ``max_model_len`` does not fit.
        KVCacheAllocationError: allocation failed (nothing stays allocated).
        KVCacheBindingError: a layer could not be bound.
        SpecMismatchError: ranks of an :class:`AgreeingExecutor` disagree on a layer.
        DistributedAgreementError: ranks of an :class:`AgreeingExecutor` did not answer in
            time, or one of them failed; names the ranks.
    """
    ctx = _sizing(context, max_model_len)
    specs = executor.get_kv_cache_spec()
    memory = executor.determine_available_memory()
    if isinstance(executor, AgreeingExecutor):
        plan = executor.agree_on_plan(
            specs, memory, ctx, registry=registry, policy=policy, options=options, num_blocks=num_blocks
        )
    else:
        (plan,) = plan_for_ranks(
            [specs], [memory], ctx, registry=registry, policy=policy, options=options, num_blocks=num_blocks
        )
    logger.info("%s", capacity_summary(plan))
    executor.initialize(plan)
    return plan


class LocalExecutor:
    """Runs a ``torch.nn.Module`` on one device: scans it, profiles it, allocates and binds.

    Args:
        model: the model, already on ``device``.
        device: where the caches go (``"cuda:0"``, ``"cpu"``, ``"meta"`` with a fixed size).
        registry: spec kinds, layouts, and the module hook that scans the model.
        specs: ``{layer: spec}``; default: :func:`~kvcore.module_scan.scan_module`.
        scan_options: options for the module hook (``tp``, ``kv_cache_dtype``, ...).
        kv_sharing: ``{layer: target layer}``: layers that reuse another layer's cache. They
            are left out of the specs and bound to the target's view.
        profile_fn: ``profile_fn(model)`` runs the largest forward pass the engine will run
            (e.g. ``max_num_batched_tokens`` dummy tokens); its peak stays free of KV cache.
        warmup_fn: ``warmup_fn(model)`` runs once every layer has its view (compile, capture
            graphs, ...).
        utilization: the share of memory the process may fill.
        kv_cache_bytes: a fixed KV-cache size; bypasses profiling.
        zero: zero-fill the caches.
        attribute: the module attribute that receives a layer's view.
        allocator: ``(nbytes, device) -> uint8 tensor`` (default ``torch.empty``).
        memory: a :class:`~kvcore.memory.DeviceMemory` probe (default: the device's own).

    After :func:`initialize_kv_caches`: ``plan``, ``memory_profile``, ``kv_caches``
    (``{layer: view}``, sharing layers included), ``bound`` (``{layer: module}``) and
    ``timings`` (seconds per step).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device | str,
        *,
        registry: Registry,
        specs: Mapping[str, KVCacheSpec] | None = None,
        scan_options: Mapping[str, Any] | None = None,
        kv_sharing: Mapping[str, str] | None = None,
        profile_fn: Callable[[torch.nn.Module], object] | None = None,
        warmup_fn: Callable[[torch.nn.Module], object] | None = None,
        utilization: float = DEFAULT_UTILIZATION,
        kv_cache_bytes: int | None = None,
        zero: bool = True,
        attribute: str = DEFAULT_ATTRIBUTE,
        allocator: Allocator | None = None,
        memory: DeviceMemory | None = None,
    ) -> None:
        self.model = model
        self.device = check_device(device)
        self.registry = registry
        self.kv_sharing = dict(kv_sharing or {})
        self.profile_fn = profile_fn
        self.warmup_fn = warmup_fn
        self.utilization = utilization
        self.kv_cache_bytes = kv_cache_bytes
        self.zero = zero
        self.attribute = attribute
        self.allocator = allocator
        self.memory = memory
        self._given_specs = dict(specs) if specs is not None else None
        self._scan_options = dict(scan_options or {})
        self.plan: KVCacheConfig | None = None
        self.memory_profile: MemoryProfile | None = None
        self.kv_caches: dict[str, LayerView] = {}
        self.bound: dict[str, torch.nn.Module] = {}
        self.timings: dict[str, float] = {}
        self._layers: tuple[str, ...] = ()

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """The specs given, or scanned from the model, without the KV-sharing layers.

        Raises:
            InvalidSpecError: the scan found no cache-holding module.
            KVCacheBindingError: a sharing target has no spec of its own.
        """
        start = time.perf_counter()
        found = (
            dict(self._given_specs)
            if self._given_specs is not None
            else scan_module(self.model, self.registry, self._scan_options)
        )
        self._layers = tuple(dict.fromkeys([*found, *self.kv_sharing]))
        specs = {name: spec for name, spec in found.items() if name not in self.kv_sharing}
        missing = sorted({t for t in self.kv_sharing.values() if t not in specs})
        if missing:
            raise KVCacheBindingError(
                f"KV-sharing targets {missing} have no spec of their own; a target must be a layer with "
                "its own cache"
            )
        self.timings["specs"] = time.perf_counter() - start
        return specs

    def determine_available_memory(self) -> int:
        """Profile ``profile_fn`` on the device (or take ``kv_cache_bytes``); see :mod:`kvcore.memory`.

        Raises:
            MemoryProfilingError: nothing is left for the KV cache.
            DeviceUnavailableError: the device cannot be profiled and no fixed size was given.
        """
        run = self.profile_fn
        model = self.model
        profile = profile_memory(
            self.memory if self.memory is not None else self.device,
            utilization=self.utilization,
            profile_fn=(lambda: run(model)) if run is not None else None,
            kv_cache_bytes=self.kv_cache_bytes,
        )
        self.memory_profile = profile
        self.timings["memory"] = profile.profile_seconds
        logger.info("%s", profile)
        return profile.kv_cache_bytes

    def initialize(self, plan: KVCacheConfig) -> None:
        """Allocate ``plan``, bind every layer's view to its module, then run ``warmup_fn``.

        The modules are looked up before any memory is taken, so a naming problem costs nothing.

        Raises:
            KVCacheBindingError: the plan's layers and the model's differ.
            KVCacheAllocationError: allocation failed (nothing stays allocated).
        """
        layers = self._layers or (*plan.layer_names, *self.kv_sharing)
        module_targets(self.model, [*plan.layer_names, *self.kv_sharing], expected=layers)
        start = time.perf_counter()
        views = allocate(plan, self.device, registry=self.registry, zero=self.zero, allocator=self.allocator)
        self.timings["allocate"] = time.perf_counter() - start
        start = time.perf_counter()
        self.bound = bind_to_modules(
            self.model, views, kv_sharing=self.kv_sharing, attribute=self.attribute, expected=layers
        )
        self.kv_caches = resolve_kv_sharing(views, self.kv_sharing)
        self.plan = plan
        self.timings["bind"] = time.perf_counter() - start
        logger.info(
            "allocated %s on %s in %d tensor(s); bound %d layers",
            format_bytes(sum(allocation_sizes(plan))),
            self.device,
            len(allocation_sizes(plan)),
            len(self.bound),
        )
        if self.warmup_fn is not None:
            start = time.perf_counter()
            self.warmup_fn(self.model)
            self.timings["warmup"] = time.perf_counter() - start
