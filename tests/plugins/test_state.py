"""The ``state`` kind (SSM / linear-attention layers) and how shared_buffer plans it beside attention."""

from __future__ import annotations

import pytest
import torch

from kvcore import InvalidSpecError, SizingContext, dtypes, efficiency, layer_specs_from_config, plan_kv_cache
from kvcore.frontends.specfile import specs_from_dict, specs_to_dict
from kvcore.planning.invariants import check_plan
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.runtime.torch_dtypes import torch_dtype
from kvcore.spec import cdiv
from tests.zoo import NEMOTRON_H_LIKE, QWEN3_NEXT_LIKE, bundled, synthetic

GIB = 2**30


def mixed():
    # conv (3, 5) float16 = 30 bytes at 0; ssm (5, 2) float32 = 40 bytes at 32 (30 rounded up to 4)
    return StateSpec(
        block_size=16,
        parts=(
            StatePart(name="conv", shape=(3, 5), dtype="float16"),
            StatePart(name="ssm", shape=(5, 2), dtype="float32"),
        ),
    )


def test_page_is_the_parts_aligned():
    spec = mixed()
    assert spec.part_offsets == (0, 32)
    assert spec.state_bytes == 70
    assert spec.page_size_bytes == 72  # 32 + 40, a multiple of the 4-byte alignment
    assert spec.alignment_bytes == 4


def test_a_state_does_not_grow_with_length_or_block_size():
    spec = mixed()
    for length in (1, 16, 10_000, 1_000_000):
        ctx = SizingContext(max_model_len=length)
        assert spec.max_num_blocks(ctx) == 1
        assert spec.max_memory_usage_bytes(ctx) == 72
    assert spec.with_block_size(128).page_size_bytes == 72
    assert spec.tokens_per_page is None
    assert StateSpec.page_scales_with_block_size is False


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        ((), "at least one state tensor"),
        ((StatePart(name="a", shape=(1,), dtype="bf16"),) * 2, "part names must be unique"),
        ("conv", "must be a list of state tensors"),
    ],
)
def test_bad_parts(parts, match):
    with pytest.raises(InvalidSpecError, match=match):
        StateSpec(block_size=16, parts=parts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "", "shape": (1,), "dtype": "bf16"}, "'name' must be a non-empty string"),
        ({"name": "a", "shape": (3, 0), "dtype": "bf16"}, "must be an int >= 1"),
        ({"name": "a", "shape": (), "dtype": "bf16"}, "non-empty list of ints"),
        ({"name": "a", "shape": (2,), "dtype": "int4"}, "'dtype'"),
    ],
)
def test_bad_part(kwargs, match):
    with pytest.raises(InvalidSpecError, match=match):
        StatePart(**kwargs)


def test_state_round_trips_through_a_spec_file(registry):
    specs = {"model.layers.0.mamba": mixed()}
    data = specs_to_dict(specs, registry)
    assert data["layers"]["model.layers.0.mamba"] == {
        "kind": "state",
        "block_size": 16,
        "parts": [
            {"name": "conv", "shape": [3, 5], "dtype": "float16"},
            {"name": "ssm", "shape": [5, 2], "dtype": "float32"},
        ],
    }
    assert specs_from_dict(data, registry) == specs


def test_layout_views_each_part_inside_its_page(registry):
    spec = mixed()
    layout = registry.cache_layout(spec)
    assert [(p.name, p.shape, p.dtype, p.offset_bytes, p.block_dim) for p in layout.parts] == [
        ("conv", (3, 5), dtypes.float16, 0, 0),
        ("ssm", (5, 2), dtypes.float32, 32, 0),
    ]
    # real views over a buffer of 4 pages: writing one part of page 2 touches only its bytes
    pages = 4
    buffer = torch.zeros(pages * spec.page_size_bytes, dtype=torch.uint8)
    views = {}
    for part in layout.parts:
        stride = spec.page_size_bytes // part.dtype.itemsize
        flat = buffer.view(torch_dtype(part.dtype))
        views[part.name] = flat.as_strided(
            (pages, *part.shape),
            (stride, *torch.empty(part.shape).stride()),
            part.offset_bytes // part.dtype.itemsize,
        )
    views["ssm"][2].fill_(1.0)
    touched = buffer.view(pages, spec.page_size_bytes).nonzero()
    assert touched[:, 0].unique().tolist() == [2]
    assert touched[:, 1].min().item() >= 32 and touched[:, 1].max().item() < 72
    assert views["conv"].abs().sum().item() == 0


HYBRIDS = {
    "jamba-1.5-mini": lambda: bundled("ai21labs/AI21-Jamba-1.5-Mini"),
    "nemotron-h-like (synthetic)": lambda: synthetic(NEMOTRON_H_LIKE),
    "qwen3-next-like (synthetic)": lambda: synthetic(QWEN3_NEXT_LIKE),
}


@pytest.mark.parametrize("name", list(HYBRIDS))
@pytest.mark.parametrize("length", [1024, 32768, 131072])
def test_hybrids_reach_the_bound_without_inflating_attention_blocks(registry, name, length):
    specs = layer_specs_from_config(HYBRIDS[name](), registry)
    plan = plan_kv_cache(specs, 80 * GIB, SizingContext(max_model_len=length), registry=registry)
    assert efficiency(plan, specs) >= 0.99
    attention = [g for g in plan.groups if g.spec.kind != "state"]
    (state,) = [g for g in plan.groups if g.spec.kind == "state"]
    assert {g.spec.block_size for g in attention} == {16}
    assert {g.blocks_per_page for g in attention} == {1}
    # every state layer in one group whose page is an aligned run of rows wide enough for all of them
    state_layers = [n for n, s in specs.items() if s.kind == "state"]
    assert sorted(state.layer_names) == sorted(state_layers)
    assert state.blocks_per_page == cdiv(len(state_layers) * state.spec.page_size_bytes, plan.bytes_per_block)
    check_plan(plan)


def test_jamba_rows_and_padding(registry):
    # 4 attention layers of 16 x 4096 bytes fill a row: 262,144 bytes. The 28 states take
    # 28 x 311,296 = 8,716,288 bytes = 33.25 rows -> 34 rows per request, 196,608 bytes of padding.
    specs = layer_specs_from_config(bundled("ai21labs/AI21-Jamba-1.5-Mini"), registry)
    plan = plan_kv_cache(specs, 80 * GIB, SizingContext(max_model_len=131072), registry=registry)
    assert plan.bytes_per_block == 4 * 16 * 4096
    (state,) = [g for g in plan.groups if g.spec.kind == "state"]
    assert state.blocks_per_page == 34
    need = 4 * 131072 * 4096 + 28 * 311_296
    assert plan.blocks_per_request() * plan.bytes_per_block - need == 34 * 262_144 - 28 * 311_296


def test_a_model_of_states_only_plans_uniformly(registry):
    config = {**bundled("ai21labs/AI21-Jamba-1.5-Mini"), "num_hidden_layers": 2, "layer_types": ["mamba"] * 2}
    specs = layer_specs_from_config(config, registry)
    plan = plan_kv_cache(specs, GIB, SizingContext(max_model_len=10**6), registry=registry)
    assert plan.policy == "uniform"
    assert plan.num_blocks == GIB // (2 * 311_296)
    assert plan.max_concurrency() == plan.num_blocks  # one page per request, whatever its length
