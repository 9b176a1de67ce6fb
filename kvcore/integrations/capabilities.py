"""What each engine integration can run of what kvcore plans: one value per engine.

Every integration sub-package (``kvcore.integrations.<engine>``) has a torch-free,
engine-free module that answers :func:`EngineCapabilities` for its engine from its own
conversion tables (the kinds it converts, the plans it refuses), so the engine matrix in the
docs is read from the adapters, not written by hand. :data:`ENGINE_CAPABILITY_MODULES` names
those modules; :func:`engine_capabilities` imports them, and :func:`render_matrix` writes the
table of ``docs/reference/engines.md`` (``python -m kvcore.integrations.capabilities`` prints it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

import attrs

from kvcore.planning.registry import Registry

#: The module of each integration that defines ``capabilities() -> EngineCapabilities``
#: without importing its engine (so the matrix can be read where no engine is installed).
ENGINE_CAPABILITY_MODULES: dict[str, str] = {
    "vllm": "kvcore.integrations.vllm.rules",
    "transformers": "kvcore.integrations.transformers.rules",
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


#: The rows of the matrix after the kinds and policies: ``(label, field)``.
FEATURE_ROWS: tuple[tuple[str, str], ...] = (
    ("several pools", "several_pools"),
    ("mixed-page groups", "mixed_pages"),
    ("prefix caching", "prefix_caching"),
    ("speculative decoding", "speculative_decoding"),
)

_YES, _NO = "yes", "no"


def matrix_rows(engines: Mapping[str, EngineCapabilities]) -> list[tuple[str, list[str]]]:
    """``(row label, one cell per engine)`` of the engine matrix, engines in ``engines``' order.

    Rows: the versions, one per spec kind and per policy (kvcore's built-ins, then any other an
    engine claims), then :data:`FEATURE_ROWS`.
    """
    builtin = Registry.default(autoload=False)
    values = list(engines.values())

    def ordered(known: list[str], claimed: list[tuple[str, ...]]) -> list[str]:
        extra = sorted({name for names in claimed for name in names} - set(known))
        return known + extra

    kinds = ordered(sorted(builtin.kinds), [e.kinds for e in values])
    policies = ordered(list(builtin.policies), [e.policies for e in values])
    rows: list[tuple[str, list[str]]] = [("versions", [e.versions for e in values])]
    rows += [(f"kind `{k}`", [_YES if k in e.kinds else _NO for e in values]) for k in kinds]
    rows += [(f"policy `{p}`", [_YES if p in e.policies else _NO for e in values]) for p in policies]
    rows += [(label, [_YES if getattr(e, field) else _NO for e in values]) for label, field in FEATURE_ROWS]
    return rows


def render_matrix(engines: Mapping[str, EngineCapabilities] | None = None) -> str:
    """The engine matrix as a Markdown table (one column per engine), then each engine's
    notes as a list: what ``docs/reference/engines.md`` holds between its markers."""
    engines = engine_capabilities() if engines is None else engines
    lines = [
        "| feature | " + " | ".join(engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in matrix_rows(engines)]
    for name, engine in engines.items():
        if engine.notes:
            lines += ["", f"**{name}**:", ""]
            lines += [f"- {note}" for note in engine.notes]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_matrix())
