"""Model options are one typed object: validated once where a caller hands them in (a
``ModelOptions`` or a plain mapping), and received as that object by families and the module
hook."""

from __future__ import annotations

import pytest
import torch

from kvcore import (
    InvalidInputError,
    LocalExecutor,
    ModelOptions,
    hookimpl,
    layer_specs_from_config,
    model_layer_specs,
    scan_module,
)
from kvcore.model_options import AUTO, DEFAULT_BLOCK_SIZE, DEFAULT_MODEL_DTYPE, to_model_options
from kvcore.plugins.full_attention import FullAttentionSpec
from tests.zoo import bundled

UNKNOWN = (
    r"unknown model options \['pp'\]; known options: "
    r"\['block_size', 'kv_cache_dtype', 'speculative', 'state_dtype', 'tp'\]"
)


class Attention(torch.nn.Module):
    """A module the spy plugin below recognises."""


class SpyScanner:
    """Answers for :class:`Attention` modules and records the options it was given."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def kvcore_spec_for_module(self, module, name, options):
        self.seen.append(options)
        if not isinstance(module, Attention):
            return None
        return FullAttentionSpec(block_size=options.block_size, num_kv_heads=1, head_size=8, dtype="float32")


def test_defaults():
    options = ModelOptions()
    assert (options.tp, options.kv_cache_dtype, options.state_dtype, options.block_size) == (
        1,
        None,
        None,
        DEFAULT_BLOCK_SIZE,
    )
    assert ModelOptions(kv_cache_dtype=AUTO, state_dtype="Auto") == options
    assert DEFAULT_MODEL_DTYPE.name == "bfloat16"
    assert options.cache_dtype("float16").name == "float16"
    assert ModelOptions(kv_cache_dtype="fp8").cache_dtype("float16").name == "float8_e4m3fn"


@pytest.mark.parametrize("given", [None, {}, ModelOptions()])
def test_to_model_options_accepts_the_object_a_mapping_or_nothing(given):
    assert to_model_options(given) == ModelOptions()


def test_to_model_options_keeps_the_object_and_refuses_other_things():
    options = ModelOptions(tp=4)
    assert to_model_options(options) is options
    with pytest.raises(InvalidInputError, match=r"must be kvcore\.ModelOptions or a mapping"):
        to_model_options([("tp", 2)])
    with pytest.raises(InvalidInputError, match=UNKNOWN):
        to_model_options({"pp": 2})


def test_the_config_doors_take_a_mapping_and_refuse_an_unknown_key(registry):
    config = bundled("meta-llama/Llama-3.2-1B")
    as_object = layer_specs_from_config(config, registry, ModelOptions(tp=2, kv_cache_dtype="fp8"))
    assert layer_specs_from_config(config, registry, {"tp": 2, "kv_cache_dtype": "fp8"}) == as_object
    with pytest.raises(InvalidInputError, match=UNKNOWN):
        layer_specs_from_config(config, registry, {"tp": 2, "pp": 2})
    with pytest.raises(InvalidInputError, match=UNKNOWN):
        model_layer_specs("meta-llama/Llama-3.2-1B", registry, {"pp": 2})


def test_scan_module_validates_a_mapping_once_and_the_hook_gets_the_object(make_registry):
    spy = SpyScanner()
    registry = make_registry(spy)
    model = torch.nn.Sequential(Attention(), torch.nn.Linear(2, 2))
    specs = scan_module(model, registry, {"block_size": 32, "kv_cache_dtype": "fp8"})
    assert [spec.block_size for spec in specs.values()] == [32]
    expected = ModelOptions(block_size=32, kv_cache_dtype="fp8")
    assert spy.seen and all(options == expected for options in spy.seen)
    assert len({id(options) for options in spy.seen}) == 1  # one object, not re-parsed per module
    with pytest.raises(InvalidInputError, match=UNKNOWN):
        scan_module(model, registry, {"pp": 2})


def test_local_executor_refuses_unknown_scan_options_when_built(make_registry):
    registry = make_registry(SpyScanner())
    model = torch.nn.Sequential(Attention())
    with pytest.raises(InvalidInputError, match=UNKNOWN):
        LocalExecutor(model, "cpu", registry=registry, scan_options={"pp": 2}, kv_cache_bytes=1 << 20)
    executor = LocalExecutor(
        model, "cpu", registry=registry, scan_options={"block_size": 4}, kv_cache_bytes=1 << 20
    )
    assert [spec.block_size for spec in executor.get_kv_cache_spec().values()] == [4]
