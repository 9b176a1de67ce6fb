"""What each engine integration can run of what kvcore plans: one value per engine.

Every integration sub-package (``kvcore.integrations.<engine>``) has a torch-free,
engine-free module that answers :func:`EngineCapabilities` for its engine from its own
conversion tables (the kinds it converts, the plans it refuses), so the engine matrix in the
docs is read from the adapters, not written by hand. :data:`ENGINE_CAPABILITY_MODULES` names
those modules; :func:`engine_capabilities` imports them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import attrs

#: The module of each integration that defines ``capabilities() -> EngineCapabilities``
#: without importing its engine (so the matrix can be read where no engine is installed).
ENGINE_CAPABILITY_MODULES: dict[str, str] = {
    "vllm": "kvcore.integrations.vllm.rules",
    "sglang": "kvcore.integrations.sglang.rules",
}


def _names(value: object) -> tuple[str, ...]:
    return tuple(sorted(str(v) for v in value))  # type: ignore[attr-defined]


@attrs.frozen(kw_only=True)
class EngineCapabilities:
    """Which kvcore features one engine integration runs.

    Attributes:
        engine: the engine's name (``"vllm"``).
        versions: the engine versions the integration is written and tested against.
        kinds: spec kinds the integration converts to the engine's own cache specs.
        policies: built-in policies whose plans the engine can run (with the integration's
            planning options).
        several_pools: whether a plan of several block pools runs.
        mixed_pages: whether a group whose layers have different page sizes runs.
        prefix_caching: whether the engine's prefix caching works on kvcore's plans.
        speculative_decoding: whether kvcore sizes for the engine's speculative decoding.
        notes: one line each on what the integration refuses or approximates.
    """

    engine: str
    versions: str
    kinds: tuple[str, ...] = attrs.field(converter=_names)
    policies: tuple[str, ...] = attrs.field(converter=_names)
    several_pools: bool
    mixed_pages: bool
    prefix_caching: bool
    speculative_decoding: bool
    notes: tuple[str, ...] = ()


def engine_capabilities() -> dict[str, EngineCapabilities]:
    """Every integration's capabilities, keyed by engine, read from its adapter module."""
    found: dict[str, EngineCapabilities] = {}
    for engine, module_name in ENGINE_CAPABILITY_MODULES.items():
        module = importlib.import_module(module_name)
        capabilities: Callable[[], EngineCapabilities] = module.capabilities
        found[engine] = capabilities()
    return found
