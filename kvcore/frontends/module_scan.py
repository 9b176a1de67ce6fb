"""Scan a ``torch.nn.Module`` into ``{layer name: spec}`` through the module hook.

Every submodule is offered to the ``kvcore_spec_for_module`` hook through the registry
(:meth:`~kvcore.planning.registry.Registry.spec_for_module`; first result wins); the modules some
plugin recognises become the model's cache-holding layers, named by their qualified module name,
in model order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvcore.errors import InvalidSpecError
from kvcore.limits import check_layer_count
from kvcore.model_options import ModelOptions, to_model_options
from kvcore.spec import KVCacheSpec

if TYPE_CHECKING:
    import torch

    from kvcore.planning.registry import Registry


def scan_module(
    model: torch.nn.Module,
    registry: Registry,
    options: ModelOptions | Mapping[str, Any] | None = None,
) -> dict[str, KVCacheSpec]:
    """``{qualified module name: spec}`` for every submodule a plugin recognises.

    Args:
        model: the model to scan.
        registry: whose plugins answer ``kvcore_spec_for_module``.
        options: the :class:`~kvcore.model_options.ModelOptions` the hook receives, or a plain
            mapping of them (``{"tp": 2, "kv_cache_dtype": "fp8"}``), validated once here.

    Returns:
        The recognised modules' specs, in model order.

    Raises:
        InvalidInputError: an unknown option (the message lists the known ones) or a bad value.
        InvalidSpecError: no submodule was recognised, or more than
            :data:`~kvcore.limits.MAX_LAYERS` were (checked as they are found).
        PluginValidationError: a plugin returned something that is not a spec.
    """
    opts = to_model_options(options)
    specs: dict[str, KVCacheSpec] = {}
    for name, module in model.named_modules():
        spec = registry.spec_for_module(module, name, opts)
        if spec is not None:
            specs[name] = spec
            check_layer_count(len(specs), f"{type(model).__name__} (scanned)")
    if not specs:
        raise InvalidSpecError(
            f"no submodule of {type(model).__name__} was recognised as a cache-holding layer; "
            "install or register a plugin that implements kvcore_spec_for_module for its attention modules"
        )
    return specs
