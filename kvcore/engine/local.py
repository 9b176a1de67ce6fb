"""The executor that serves the start-up workflow on one device: it scans a ``torch.nn.Module``,
profiles its memory, allocates the plan's tensors and binds every layer to its view.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kvcore.errors import KVCacheBindingError
from kvcore.frontends.module_scan import scan_module
from kvcore.model_options import ModelOptions, to_model_options
from kvcore.plan import KVCachePlan
from kvcore.planning.ranks import merge_worker_specs as merge_worker_specs
from kvcore.planning.registry import Registry
from kvcore.runtime import DEFAULT_UTILIZATION
from kvcore.runtime.allocation import Allocator, LayerView, allocate, allocation_sizes
from kvcore.runtime.binding import DEFAULT_ATTRIBUTE, bind_to_modules, module_targets, resolve_kv_sharing
from kvcore.runtime.memory import (
    DeviceMemory,
    MemoryProfile,
    check_device,
    determine_available_memory as profile_memory,
)
from kvcore.runtime.release import previous_values, return_memory, unbind_modules
from kvcore.spec import KVCacheSpec
from kvcore.units import format_bytes

#: One logger for the whole start-up workflow, whichever module logs.
logger = logging.getLogger("kvcore.engine")


class LocalExecutor:
    """Runs a ``torch.nn.Module`` on one device: scans it, profiles it, allocates and binds.

    Args:
        model: the model, already on ``device``.
        device: where the caches go (``"cuda:0"``, ``"cpu"``, ``"meta"`` with a fixed size).
        registry: spec kinds, layouts, and the module hook that scans the model.
        specs: ``{layer: spec}``; default: :func:`~kvcore.module_scan.scan_module`.
        scan_options: the :class:`~kvcore.model_options.ModelOptions` the module hook receives
            when the model is scanned, or a plain mapping of them (``{"block_size": 4}``),
            validated here: an unknown key is an ``InvalidInputError`` naming the known ones.
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
        scan_options: ModelOptions | Mapping[str, Any] | None = None,
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
        self._scan_options = to_model_options(scan_options)
        self.plan: KVCachePlan | None = None
        self.memory_profile: MemoryProfile | None = None
        self.kv_caches: dict[str, LayerView] = {}
        self.bound: dict[str, torch.nn.Module] = {}
        self.timings: dict[str, float] = {}
        self._layers: tuple[str, ...] = ()
        self._previous: dict[str, object] = {}

    @property
    def scan_options(self) -> ModelOptions:
        """The model options the spec scan uses (tp size, KV-cache and state dtypes, block
        size); ranks of one job must share them."""
        return self._scan_options

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
        """Profile ``profile_fn`` on the device (or take ``kv_cache_bytes``).

        See :mod:`kvcore.runtime.memory`.

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

    def initialize(self, plan: KVCachePlan) -> None:
        """Allocate ``plan``, bind every layer's view to its module, then run ``warmup_fn``.

        The modules are looked up before any memory is taken, so a naming problem costs nothing.

        Raises:
            KVCacheBindingError: the plan's layers and the model's differ.
            KVCacheAllocationError: allocation failed (nothing stays allocated).
        """
        sharing = {**plan.kv_sharing, **self.kv_sharing}  # the plan's, and this executor's
        layers = self._layers or (*plan.layer_names, *sharing)
        targets = module_targets(self.model, [*plan.layer_names, *sharing], expected=layers)
        start = time.perf_counter()
        views = allocate(plan, self.device, registry=self.registry, zero=self.zero, allocator=self.allocator)
        self.timings["allocate"] = time.perf_counter() - start
        start = time.perf_counter()
        self._previous = previous_values(
            targets, self.attribute, bound=self.kv_caches, earlier=self._previous
        )
        self.bound = bind_to_modules(
            self.model, views, kv_sharing=sharing, attribute=self.attribute, expected=layers
        )
        self.kv_caches = resolve_kv_sharing(views, sharing)
        self.plan = plan
        self.timings["bind"] = time.perf_counter() - start
        logger.info(
            "allocated %s on %s in %d tensor(s); bound %d layers",
            format_bytes(sum(allocation_sizes(plan))),
            self.device,
            len(allocation_sizes(plan)),
            len(self.bound),
        )
        self.timings["warmup"] = 0.0  # the documented key, also without a warm-up
        if self.warmup_fn is not None:
            start = time.perf_counter()
            self.warmup_fn(self.model)
            self.timings["warmup"] = time.perf_counter() - start

    def release(self) -> int:
        """Free the plan's caches: unbind every layer's view, drop the executor's references,
        and return the memory to the device (``torch.cuda.empty_cache`` on CUDA).

        Each module's attribute gets back what it held before :meth:`initialize` (or loses it,
        if it had none). Afterwards ``plan`` is ``None`` and ``kv_caches`` and ``bound`` are
        empty, and :func:`kvcore.initialize_kv_caches` may run again: its memory profile sees
        the released bytes as free. The memory is freed once nothing else references a view:
        drop the engine's own references (a runner's page views, CUDA graphs that captured
        them) first. Releasing an executor that holds nothing does nothing.

        Returns:
            The bytes of the allocations kvcore let go (0 if it held none).
        """
        plan = self.plan
        released = sum(allocation_sizes(plan)) if plan is not None else 0
        unbound = unbind_modules(self.bound, self.kv_caches, self.attribute, self._previous)
        self.kv_caches = {}
        self.bound = {}
        self._previous = {}
        self.plan = None
        return_memory(self.device)
        if plan is not None:
            logger.info("released %s on %s; unbound %d layers", format_bytes(released), self.device, unbound)
        return released
