"""Giving a plan's caches back: unbind what kvcore bound, and return the memory to the device.

A plan's memory lives as long as something references one of its views: the modules kvcore
bound (``module.kv_cache``), the executor's ``kv_caches``, and whatever the engine kept (a
runner's page views, a captured CUDA graph). :meth:`kvcore.LocalExecutor.release` drops
kvcore's own references with :func:`unbind_modules`, then :func:`return_memory` collects the
garbage and, on CUDA, hands the freed blocks from torch's caching allocator back to the driver,
so the next memory profile (a re-plan) counts them as free.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping

import torch

#: What :func:`unbind_modules` restores when a module had no such attribute before binding.
MISSING: object = object()


def previous_values(
    modules: Mapping[str, torch.nn.Module],
    attribute: str,
    *,
    bound: Mapping[str, object] | None = None,
    earlier: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """What each module's ``attribute`` held before kvcore binds a view to it.

    Args:
        modules: ``{layer: module}`` about to be bound.
        attribute: the attribute kvcore will set.
        bound: ``{layer: view}`` kvcore bound before (a plan initialized again without a
            release): a module still holding that view counts as holding ...
        earlier: ... what :func:`previous_values` recorded then.

    Returns:
        ``{layer: the old value}``, :data:`MISSING` where the module had no such attribute.
    """
    held = bound or {}
    before = earlier or {}
    out: dict[str, object] = {}
    for name, module in modules.items():
        value = getattr(module, attribute, MISSING)
        if name in held and value is held[name]:
            value = before.get(name, MISSING)
        out[name] = value
    return out


def unbind_modules(
    bound: Mapping[str, torch.nn.Module],
    views: Mapping[str, object],
    attribute: str,
    previous: Mapping[str, object] | None = None,
) -> int:
    """Take kvcore's views off the modules it bound, putting back what was there before.

    A module whose attribute no longer holds the view kvcore gave it (the engine rebound it)
    is left alone.

    Args:
        bound: ``{layer: module}`` as :func:`kvcore.bind_to_modules` returned it.
        views: ``{layer: view}`` that was bound (sharing layers included).
        attribute: the attribute the views were set on.
        previous: ``{layer: old value}`` from :func:`previous_values`; a layer without an
            entry (or with :data:`MISSING`) loses the attribute.

    Returns:
        How many modules were unbound.
    """
    count = 0
    before = previous or {}
    for name, module in bound.items():
        if name not in views or getattr(module, attribute, None) is not views[name]:
            continue
        old = before.get(name, MISSING)
        if old is MISSING:
            delattr(module, attribute)
        else:
            setattr(module, attribute, old)
        count += 1
    return count


def return_memory(device: torch.device) -> None:
    """Free what nothing references any more and hand it back to the device.

    Collects garbage (a view caught in a reference cycle would otherwise keep its buffer), and
    on a CUDA device synchronizes and empties torch's caching allocator, so that
    ``torch.cuda.mem_get_info`` (and the next :func:`kvcore.determine_available_memory`) sees
    the memory as free. On the CPU the allocator returns large buffers to the system itself.

    Args:
        device: the device the caches were on.
    """
    gc.collect()
    if device.type == "cuda" and torch.cuda.is_available():
        with torch.cuda.device(device):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
