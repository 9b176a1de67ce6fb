"""kvcore: plan, allocate and bind the KV cache of an LLM inference engine.

Spec kinds and allocation policies are plugins (pluggy); the built-ins register through the
same hooks a third-party package uses. Start with :func:`get_plugin_manager` /
:class:`Registry`, then :func:`plan_kv_cache`.
"""

from __future__ import annotations

from typing import Any

from kvcore._manager import PluginOrigin, get_plugin_manager
from kvcore.capacity import efficiency, ideal_concurrency, request_bytes
from kvcore.errors import (
    DuplicateRegistrationError,
    InsufficientMemoryError,
    InvalidInputError,
    InvalidSpecError,
    KVCoreError,
    PlanValidationError,
    PluginLoadError,
    PluginValidationError,
    PolicyNotApplicableError,
    SpecMismatchError,
    UnknownPolicyError,
    UnknownSpecKindError,
)
from kvcore.hookspecs import hookimpl, hookspec
from kvcore.layout import CacheLayout, PagePart
from kvcore.plan import KVCacheConfig, KVCacheGroup, KVCacheTensor
from kvcore.planner import plan_kv_cache
from kvcore.policy import AllocationPolicy, Layout, PlanOptions
from kvcore.registry import Registry
from kvcore.spec import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KVCacheSpec,
    SizingContext,
    is_kv_cache_type_uniform,
)
from kvcore.units import format_bytes, parse_size

__all__ = [
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "AllocationPolicy",
    "CacheLayout",
    "DuplicateRegistrationError",
    "InsufficientMemoryError",
    "InvalidInputError",
    "InvalidSpecError",
    "KVCacheConfig",
    "KVCacheGroup",
    "KVCacheSpec",
    "KVCacheTensor",
    "KVCoreError",
    "Layout",
    "PagePart",
    "PlanOptions",
    "PlanValidationError",
    "PluginLoadError",
    "PluginOrigin",
    "PluginValidationError",
    "PolicyNotApplicableError",
    "Registry",
    "SizingContext",
    "SpecMismatchError",
    "UnknownPolicyError",
    "UnknownSpecKindError",
    "efficiency",
    "format_bytes",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "ideal_concurrency",
    "is_kv_cache_type_uniform",
    "parse_size",
    "plan_kv_cache",
    "request_bytes",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("kvcore")
    raise AttributeError(f"module 'kvcore' has no attribute {name!r}")
