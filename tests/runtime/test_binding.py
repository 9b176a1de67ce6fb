"""Binding views to modules, a forward context and a runner list; KV sharing; clear errors."""

from __future__ import annotations

import types

import pytest
import torch

from kvcore import KVCacheBindingError, bind_to_forward_context, bind_to_modules, bind_to_runner_list
from kvcore.runtime.binding import layer_index, module_targets, resolve_kv_sharing


def _model(n=4):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList()
    for _ in range(n):
        block = torch.nn.Module()
        block.attn = torch.nn.Identity()
        model.layers.append(block)
    return model


def _views(names):
    return {name: torch.full((2,), float(i)) for i, name in enumerate(names)}


NAMES = [f"layers.{i}.attn" for i in range(4)]


def test_modules_get_their_layer_view():
    model = _model()
    views = _views(NAMES)
    bound = bind_to_modules(model, views)
    assert list(bound) == NAMES
    for name in NAMES:
        assert model.get_submodule(name).kv_cache is views[name]


def test_the_attribute_name_is_configurable():
    model = _model()
    bind_to_modules(model, _views(NAMES), attribute="cache")
    assert hasattr(model.layers[0].attn, "cache") and not hasattr(model.layers[0].attn, "kv_cache")


def test_kv_sharing_layers_get_their_target_view():
    model = _model()
    views = _views(NAMES[:2])
    bound = bind_to_modules(model, views, kv_sharing={NAMES[2]: NAMES[0], NAMES[3]: NAMES[1]})
    assert len(bound) == 4
    assert model.layers[2].attn.kv_cache is views[NAMES[0]]
    assert model.layers[3].attn.kv_cache is views[NAMES[1]]


def test_missing_and_extra_layers_are_named_and_nothing_is_bound():
    model = _model()
    views = _views([*NAMES[:3], "layers.9.attn"])
    with pytest.raises(KVCacheBindingError) as info:
        bind_to_modules(model, views, expected=NAMES)
    message = str(info.value)
    assert "'layers.3.attn'" in message and "get no view" in message
    assert "'layers.9.attn'" in message and "have no module" in message
    assert not hasattr(model.layers[0].attn, "kv_cache")


def test_a_layer_naming_no_module_is_an_error():
    with pytest.raises(KVCacheBindingError, match=r"'layers\.7\.attn'"):
        bind_to_modules(_model(), _views(["layers.7.attn"]))
    with pytest.raises(KVCacheBindingError, match="name no submodule"):
        module_targets(_model(), ["nope"])


def test_sharing_mistakes_are_errors():
    views = _views(NAMES[:2])
    with pytest.raises(KVCacheBindingError, match="also has a cache of its own"):
        resolve_kv_sharing(views, {NAMES[1]: NAMES[0]})
    with pytest.raises(KVCacheBindingError, match="has no cache"):
        resolve_kv_sharing(views, {NAMES[2]: "layers.8.attn"})
    with pytest.raises(KVCacheBindingError, match="itself shares"):
        resolve_kv_sharing(views, {NAMES[2]: NAMES[3], NAMES[3]: NAMES[0]})


def test_forward_context_objects_and_dicts():
    views = _views(NAMES[:3])
    context = {
        NAMES[0]: types.SimpleNamespace(kv_cache=None),
        NAMES[1]: {"kv_cache": None},
        NAMES[2]: types.SimpleNamespace(),
        NAMES[3]: {},
    }
    bind_to_forward_context(context, views, kv_sharing={NAMES[3]: NAMES[2]})
    assert context[NAMES[0]].kv_cache is views[NAMES[0]]
    assert context[NAMES[1]]["kv_cache"] is views[NAMES[1]]
    assert context[NAMES[2]].kv_cache is views[NAMES[2]]
    assert context[NAMES[3]]["kv_cache"] is views[NAMES[2]]


def test_forward_context_must_match_the_layers():
    with pytest.raises(KVCacheBindingError, match="get no view"):
        bind_to_forward_context({n: {} for n in NAMES}, _views(NAMES[:3]))
    with pytest.raises(KVCacheBindingError, match="have no forward-context entry"):
        bind_to_forward_context({n: {} for n in NAMES[:3]}, _views(NAMES))


def test_runner_list_is_ordered_by_layer_index():
    names = ["model.layers.10.attn", "model.layers.2.attn", "model.layers.1.attn"]
    views = _views(names)
    assert bind_to_runner_list(views) == [views[names[2]], views[names[1]], views[names[0]]]


def test_runner_list_shares_a_slot_only_when_declared():
    views = _views(["decoder.layers.0.self_attn", "decoder.layers.1.self_attn"])
    with pytest.raises(KVCacheBindingError, match="both have layer index 0"):
        bind_to_runner_list({**views, "decoder.layers.0.cross_attn": torch.zeros(1)})
    runner = bind_to_runner_list(
        views,
        kv_sharing={
            "decoder.layers.0.cross_attn": "decoder.layers.0.self_attn",
            "decoder.layers.5.attn": "decoder.layers.1.self_attn",
        },
    )
    assert len(runner) == 3  # index 0 once, 1, and 5 (sharing 1's cache)
    assert runner[0] is views["decoder.layers.0.self_attn"] and runner[2] is runner[1]


@pytest.mark.parametrize(
    ("name", "index"), [("model.layers.12.self_attn", 12), ("h.0", 0), ("blocks.003.attn", 3)]
)
def test_layer_index(name, index):
    assert layer_index(name) == index


@pytest.mark.parametrize("name", ["model.attn", "model.layers.1.experts.2.attn", "layer12.attn"])
def test_names_without_exactly_one_index_are_rejected(name):
    with pytest.raises(KVCacheBindingError, match="layer index"):
        layer_index(name)
