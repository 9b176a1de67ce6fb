"""Stand-in layers: a module tree for a spec file, so that caches can be bound without a model.

``kvcore allocate``, the distributed example and the allocation benchmark plan specs that come
from a file, not from a ``torch.nn.Module``. Binding needs a module per layer name; this builds a
tree of empty modules whose qualified names are exactly the layer names.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvcore.errors import InvalidSpecError
from kvcore.limits import check_layer_name


class StandIn(torch.nn.Module):
    """A module with no parameters that only receives a bound view (``kv_cache``)."""


def stand_in_model(layer_names: Iterable[str]) -> torch.nn.Module:
    """A tree of :class:`StandIn` modules in which every layer name is a qualified module name.

    Args:
        layer_names: dotted names such as ``model.layers.0.self_attn``.

    Returns:
        The root module; ``root.get_submodule(name)`` is a :class:`StandIn` for every name.

    Raises:
        InvalidSpecError: a name breaks the layer-name rule (:func:`kvcore.limits.check_layer_name`).
    """
    root = StandIn()
    nodes: dict[str, torch.nn.Module] = {"": root}
    for name in layer_names:
        check_layer_name(name)
        path = ""
        for part in name.split("."):
            parent, path = nodes[path], f"{path}.{part}" if path else part
            if path not in nodes:
                nodes[path] = StandIn()
                try:
                    parent.add_module(part, nodes[path])
                except KeyError as exc:  # a name torch reserves that the torch-free rule missed
                    raise InvalidSpecError(
                        f"layer name {name!r}: torch refuses the part {part!r}: {exc}"
                    ) from None
    return root
