"""Runtime doors of issue 12: allocation failures of any kind, and the layer-name rule against torch."""

from __future__ import annotations

import pytest
import torch

from kvcore.engine.stand_in import stand_in_model
from kvcore.errors import InvalidSpecError, KVCacheAllocationError, KVCacheBindingError
from kvcore.limits import RESERVED_NAME_PARTS
from kvcore.runtime.allocation import allocate_buffers
from kvcore.runtime.binding import module_targets


def test_the_reserved_names_cover_every_attribute_of_a_module():
    names = {n for n in dir(torch.nn.Module()) if not (n.startswith("__") and n.endswith("__"))}
    assert names <= RESERVED_NAME_PARTS


@pytest.mark.parametrize("size", [10**25, 2**63])
def test_a_size_torch_cannot_take_is_an_allocation_error(size):
    with pytest.raises(KVCacheAllocationError, match="allocating the KV cache on cpu failed"):
        allocate_buffers([size], torch.device("cpu"))


@pytest.mark.parametrize("name", ["a..b", "y.", "to", "training", "model.layers.0.forward"])
def test_stand_ins_and_binding_use_the_layer_name_rule(name):
    with pytest.raises(InvalidSpecError, match="layer name"):
        stand_in_model([name])
    with pytest.raises(KVCacheBindingError, match="layer name"):
        module_targets(torch.nn.Module(), [name])


def test_every_accepted_name_gets_a_stand_in():
    names = ["a", "a.b", "_orig_mod.model.layers.0.self_attn", "layer-0.attn"]
    root = stand_in_model(names)
    assert all(root.get_submodule(name) is not None for name in names)
