"""Scan a ``torch.nn.Module`` into ``{layer name: spec}`` through the module hook.

Every submodule is offered to the ``kvcore_spec_for_module`` hook (first result wins); the
modules some plugin recognises become the model's cache-holding layers, named by their
qualified module name, in model order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvcore.errors import InvalidSpecError, PluginValidationError
from kvcore.spec import KVCacheSpec

if TYPE_CHECKING:
    import torch

    from kvcore.planning.registry import Registry


def scan_module(
    model: torch.nn.Module, registry: Registry, options: Mapping[str, Any] | None = None
) -> dict[str, KVCacheSpec]:
    """``{qualified module name: spec}`` for every submodule a plugin recognises.

    Args:
        model: the model to scan.
        registry: whose plugins answer ``kvcore_spec_for_module``.
        options: model options passed to the hook (e.g. ``tp``, ``kv_cache_dtype``).

    Raises:
        InvalidSpecError: no submodule was recognised.
        PluginValidationError: a plugin returned something that is not a spec.
    """
    opts = dict(options or {})
    specs: dict[str, KVCacheSpec] = {}
    for name, module in model.named_modules():
        spec = registry.pm.hook.kvcore_spec_for_module(module=module, name=name, options=opts)
        if spec is None:
            continue
        if not isinstance(spec, KVCacheSpec):
            raise PluginValidationError(
                f"kvcore_spec_for_module returned {spec!r} for module {name!r}; "
                "expected a KVCacheSpec or None"
            )
        specs[name] = spec
    if not specs:
        raise InvalidSpecError(
            f"no submodule of {type(model).__name__} was recognised as a cache-holding layer; "
            "install or register a plugin that implements kvcore_spec_for_module for its attention modules"
        )
    return specs
