"""Hand each layer its cache view: on the model's modules, in a forward context, or in a list.

This is runner-side code, kept out of the planning core. Three targets, one rule: every layer
is bound exactly once, or :class:`~kvcore.errors.KVCacheBindingError` names every missing and
extra layer.

Cross-layer KV sharing (Gemma-3n's last layers, YOCO-style models) is a mapping
``{layer: target layer}``: such a layer has no spec and no memory of its own (leave it out of
the specs and the plan) and is bound to its target's view.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar

from kvcore.errors import InvalidSpecError, KVCacheBindingError
from kvcore.limits import check_layer_name

if TYPE_CHECKING:
    import torch

_V = TypeVar("_V")

#: The attribute a bound module (or forward-context entry) gets, unless told otherwise.
DEFAULT_ATTRIBUTE = "kv_cache"

_INDEX = re.compile(r"^\d+$")


def _listing(names: Iterable[str], limit: int = 8) -> str:
    ordered = sorted(names)
    shown = ", ".join(repr(n) for n in ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def resolve_kv_sharing(views: Mapping[str, _V], kv_sharing: Mapping[str, str] | None = None) -> dict[str, _V]:
    """``views`` plus one entry per sharing layer, holding its target's view.

    Args:
        views: ``{layer: view}`` of the layers with memory of their own.
        kv_sharing: ``{layer: target layer}``; the target must have its own view.

    Returns:
        Every layer's view: the planned ones, then the sharing ones.

    Raises:
        KVCacheBindingError: a sharing layer also has its own view, or a target has none.
    """
    out = dict(views)
    for layer, target in (kv_sharing or {}).items():
        if layer in views:
            raise KVCacheBindingError(
                f"layer {layer!r} is declared to share {target!r}'s cache but also has a cache of its own; "
                "leave sharing layers out of the specs (they need no memory)"
            )
        if target not in views:
            why = "itself shares another layer's cache" if target in (kv_sharing or {}) else "has no cache"
            raise KVCacheBindingError(
                f"layer {layer!r} shares the cache of {target!r}, which {why}; a target must be a "
                "layer with its own cache"
            )
        out[layer] = views[target]
    return out


def _check_same(what: str, expected: Iterable[str], provided: Iterable[str]) -> None:
    expected_set, provided_set = set(expected), set(provided)
    missing = expected_set - provided_set
    extra = provided_set - expected_set
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} layer(s) get no view: {_listing(missing)}")
        if extra:
            parts.append(f"{len(extra)} view(s) have no {what}: {_listing(extra)}")
        raise KVCacheBindingError(
            "cannot bind every layer exactly once: " + "; ".join(parts) + "; the specs, the plan and the "
            "model must name the same layers"
        )


def module_targets(
    model: torch.nn.Module, layers: Iterable[str], *, expected: Iterable[str] | None = None
) -> dict[str, torch.nn.Module]:
    """The submodule each layer name names, checked before anything is bound (or allocated).

    Args:
        model: the model.
        layers: qualified module names (``model.layers.3.attn``).
        expected: the layers that must be among them, no more and no fewer (default: no check).

    Returns:
        ``{layer: module}``.

    Raises:
        KVCacheBindingError: a layer name breaks the layer-name rule
            (:func:`kvcore.limits.check_layer_name`, which spec files and configs are read by),
            names no submodule, or the layers differ from ``expected``.
    """
    names = list(layers)
    for name in names:
        try:
            check_layer_name(name)
        except InvalidSpecError as exc:
            raise KVCacheBindingError(str(exc)) from None
    if expected is not None:
        _check_same("module to bind to", expected, names)
    modules = dict(model.named_modules())
    absent = [name for name in names if name not in modules]
    if absent:
        raise KVCacheBindingError(
            f"{len(absent)} layer(s) name no submodule of {type(model).__name__}: {_listing(absent)}; layer "
            "names must be qualified module names as model.named_modules() gives them"
        )
    return {name: modules[name] for name in names}


def bind_to_modules(
    model: torch.nn.Module,
    views: Mapping[str, _V],
    *,
    kv_sharing: Mapping[str, str] | None = None,
    attribute: str = DEFAULT_ATTRIBUTE,
    expected: Iterable[str] | None = None,
) -> dict[str, torch.nn.Module]:
    """Set ``module.<attribute> = view`` on the submodule each layer name names.

    Args:
        model: the model; layer names are qualified submodule names (``model.layers.3.attn``).
        views: ``{layer: view}`` from :func:`kvcore.runtime.allocation.allocate`.
        kv_sharing: ``{layer: target}``; sharing layers get their target's view.
        attribute: the attribute to set.
        expected: the layers that must be bound (default: the views' and sharing layers' names);
            e.g. the names a model scan found.

    Returns:
        ``{layer: module}`` for every bound layer.

    Raises:
        KVCacheBindingError: a layer names no submodule, or the layers differ from ``expected``;
            nothing is bound then.
    """
    every = resolve_kv_sharing(views, kv_sharing)
    targets = module_targets(model, every, expected=expected)
    for name, view in every.items():
        setattr(targets[name], attribute, view)
    return targets


def bind_to_forward_context(
    context: Mapping[str, Any],
    views: Mapping[str, _V],
    *,
    kv_sharing: Mapping[str, str] | None = None,
    attribute: str = DEFAULT_ATTRIBUTE,
) -> None:
    """Give every entry of a forward context its layer's view.

    Args:
        context: ``{layer: entry}``; an entry is an object (``entry.<attribute> = view``) or a
            mutable mapping (``entry[attribute] = view``).
        views: ``{layer: view}``.
        kv_sharing: ``{layer: target}``; sharing layers get their target's view.
        attribute: the attribute or key to set.

    Raises:
        KVCacheBindingError: the context's layers and the views' layers differ.
    """
    every = resolve_kv_sharing(views, kv_sharing)
    _check_same("forward-context entry", context, every)
    for name, view in every.items():
        entry = context[name]
        if isinstance(entry, MutableMapping):
            entry[attribute] = view
        else:
            setattr(entry, attribute, view)


def layer_index(name: str) -> int:
    """The layer index in a layer name: its one all-digit component (``model.layers.12.attn`` -> 12).

    Raises:
        KVCacheBindingError: the name has no such component, or more than one.
    """
    found = [int(part) for part in name.split(".") if _INDEX.match(part)]
    if len(found) != 1:
        raise KVCacheBindingError(
            f"cannot read a layer index from {name!r}: it has {len(found)} all-digit components "
            f"({found}), one is needed (e.g. 'model.layers.12.self_attn')"
        )
    return found[0]


def bind_to_runner_list(views: Mapping[str, _V], *, kv_sharing: Mapping[str, str] | None = None) -> list[_V]:
    """The views as a list ordered by layer index, as a model runner indexes its caches.

    Args:
        views: ``{layer: view}``.
        kv_sharing: ``{layer: target}``; a sharing layer takes its target's view at its own
            index. Two layers may have one index only when one shares the other's cache; the
            slot then holds that cache once.

    Returns:
        One view per distinct layer index, in index order.

    Raises:
        KVCacheBindingError: a name has no index, or two layers have one index and neither
            shares the other's cache.
    """
    sharing = dict(kv_sharing or {})
    every = resolve_kv_sharing(views, sharing)
    by_index: dict[int, str] = {}
    for name in every:
        index = layer_index(name)
        other = by_index.get(index)
        if other is None:
            by_index[index] = name
        elif sharing.get(name) == other or sharing.get(other) == name:
            by_index[index] = other if sharing.get(name) == other else name  # keep the owner
        else:
            raise KVCacheBindingError(
                f"layers {other!r} and {name!r} both have layer index {index}; one of them must share the "
                "other's cache (kv_sharing) to take one list slot, or they need distinct indices"
            )
    return [every[by_index[index]] for index in sorted(by_index)]
