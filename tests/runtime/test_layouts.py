"""The layout promises of docs/reference/layouts.md, checked on real allocations.

For every bundled model (and mixes of kinds no bundled model has), with every built-in policy
that plans it, each layer's view must have the strides and storage offset the page formulas
give, computed here from the policy's documented placement and the kind's documented page,
never from kvcore's own view geometry; on the CPU, ``data_ptr`` arithmetic must land each page,
K half, V half and state part where the formulas say. And views never move while the plan
lives: the tensors bound to the modules are the executor's, with the same ``data_ptr`` after
every forward pass, pool operation and lookup.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvcore import (
    BlockPool,
    LocalExecutor,
    PolicyNotApplicableError,
    SizingContext,
    allocate,
    initialize_kv_caches,
    model_layer_specs,
    plan_kv_cache,
)
from kvcore.dtypes import dtype_size
from kvcore.frontends.hf_config import bundled_models
from kvcore.plugins.attention import AttentionSpec
from kvcore.plugins.dsa_indexer import DSAIndexerSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.runtime.allocation import empty_bytes
from tests.helpers import full, mix, mla, sliding
from tests.runtime._kinds import ToyAttention, ToyModel

POLICIES = ("uniform", "shared_buffer", "equal_groups")
CONTEXT = SizingContext(max_model_len=4096)


def _state(block_size=16):
    return StateSpec(
        block_size=block_size,
        parts=(
            StatePart(name="conv", shape=(3, 96), dtype="bfloat16"),
            StatePart(name="ssm", shape=(4, 16, 8), dtype="float32"),
        ),
    )


def _inputs():
    from kvcore import Registry

    registry = Registry.default()
    cases = {m.name: model_layer_specs(m.name, registry) for m in bundled_models()}
    cases["mix mla+full"] = mix((4, mla(rank=64, rope=16)), (3, full(heads=2, head_size=64)))
    cases["mix state+sliding+full"] = {
        **mix((5, sliding(64, heads=2, head_size=32)), (2, full(heads=2, head_size=32))),
        "model.layers.90": _state(),
        "model.layers.91": _state(),
    }
    # DeepSeek-V3.2 with an fp8 cache: packed (fp8_ds_mla) latents beside the indexer keys
    cases["DeepSeek-V3.2 fp8"] = model_layer_specs(
        "deepseek-ai/DeepSeek-V3.2", registry, {"kv_cache_dtype": "fp8", "block_size": 64}
    )
    cases["mix fp8+bf16"] = mix(
        (3, full(dtype="fp8", heads=2, head_size=64)), (3, sliding(128, heads=2, head_size=64))
    )
    return cases


INPUTS = _inputs()


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


def placement(plan, layer):
    """``(allocation index, offset O, page stride S)`` in bytes, from the policy's documented rule."""
    group_index = next(i for i, g in enumerate(plan.groups) if layer in g.layer_names)
    group = plan.groups[group_index]
    spec = group.spec
    if plan.policy == "uniform":
        # one allocation per layer, in plan order; pages back to back
        return plan.layer_names.index(layer), 0, spec.page_size_bytes
    if plan.policy == "equal_groups":
        # allocation i holds layer i of every group; pages back to back
        return group.layer_names.index(layer), 0, spec.page_size_bytes
    assert plan.policy == "shared_buffer"
    stride = plan.bytes_per_block * group.blocks_per_page
    if group.layer_specs:
        # a mixed-page group: each layer after the previous one's slot, on its own alignment
        end = 0
        for name in group.layer_names:
            own = group.spec_of(name)
            start = _round_up(end, own.alignment_bytes)
            if name == layer:
                return 0, start, stride
            end = start + _round_up(own.page_size_bytes, own.alignment_bytes)
    slot = _round_up(spec.page_size_bytes, spec.alignment_bytes)
    return 0, group.layer_names.index(layer) * slot, stride


def _contiguous(shape):
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def expected_parts(spec, offset, stride, pages):
    """``[(name, shape, strides, storage offset)]`` in elements, from the kind's documented page."""
    if isinstance(spec, AttentionSpec):
        item = dtype_size(spec.dtype)
        b, h, d = spec.block_size, spec.num_kv_heads, spec.head_size
        # K half then V half of each page: (2, pages, block, heads, head)
        return [("kv", (2, pages, b, h, d), (b * h * d, stride // item, h * d, d, 1), offset // item)]
    if isinstance(spec, MLAAttentionSpec) and not spec.is_packed:
        item = dtype_size(spec.dtype)
        latent = spec.kv_lora_rank + spec.qk_rope_head_dim
        return [("latent", (pages, spec.block_size, latent), (stride // item, latent, 1), offset // item)]
    if isinstance(spec, (MLAAttentionSpec, DSAIndexerSpec)):
        # a packed latent or indexer keys: the page as uint8, (pages, block, bytes a token)
        name, n = "latent" if isinstance(spec, MLAAttentionSpec) else "index_k", spec.bytes_per_token
        return [(name, (pages, spec.block_size, n), (stride, n, 1), offset)]
    assert isinstance(spec, StateSpec)
    out = []
    for part, at in zip(spec.parts, spec.part_offsets, strict=True):
        item = dtype_size(part.dtype)
        out.append(
            (
                part.name,
                (pages, *part.shape),
                (stride // item, *_contiguous(part.shape)),
                (offset + at) // item,
            )
        )
    return out


def _plans(registry, name, context=CONTEXT, **kwargs):
    for policy in POLICIES:
        try:
            yield plan_kv_cache(INPUTS[name], 24 * 2**30, context, registry=registry, policy=policy, **kwargs)
        except PolicyNotApplicableError:
            continue


@pytest.mark.parametrize("name", list(INPUTS))
def test_every_view_has_the_documented_strides_and_offset(registry, name):
    checked = 0
    for plan in _plans(registry, name):
        views = allocate(plan, "meta", registry=registry)
        for layer in plan.layer_names:
            group = plan.group_of(layer)
            _, offset, stride = placement(plan, layer)
            tensor = plan.tensor_of(layer)
            assert (tensor.offset, tensor.page_stride) == (offset, stride), (
                "the plan says what the policy rule says"
            )
            view = views[layer]
            tensors = [view] if isinstance(view, torch.Tensor) else list(view)
            want = expected_parts(group.spec_of(layer), offset, stride, plan.num_pages(group))
            assert len(tensors) == len(want)
            for got, (_, shape, strides, storage_offset) in zip(tensors, want, strict=True):
                assert tuple(got.shape) == shape
                assert got.stride() == strides
                assert got.storage_offset() == storage_offset
            checked += 1
    assert checked


@pytest.mark.parametrize(
    "name",
    [
        "google/gemma-3-27b-it",
        "deepseek-ai/DeepSeek-V3",
        "ai21labs/AI21-Jamba-1.5-Mini",
        "meta-llama/Llama-3.2-1B",
        "mix mla+full",
        "mix state+sliding+full",
        "mix fp8+bf16",
    ],
)
def test_data_pointers_land_where_the_formulas_say(registry, name):
    # short requests, so that a plan of a few pages holds one (allocate() refuses one that does not)
    short = SizingContext(max_model_len=32, max_num_batched_tokens=32)
    for small in _plans(registry, name, short, num_blocks=64, check_fit=False):
        # a few pages of every group: a state page may span many block ids
        blocks = max(64, 3 * max(g.blocks_per_page for g in small.groups), small.blocks_per_request())
        plan = (
            small
            if blocks == 64
            else next(
                p
                for p in _plans(registry, name, short, num_blocks=blocks, check_fit=False)
                if p.policy == small.policy
            )
        )
        buffers = []

        def keep(nbytes, device, buffers=buffers):
            buffers.append(empty_bytes(nbytes, device))
            return buffers[-1]

        views = allocate(plan, "cpu", registry=registry, allocator=keep)
        for layer in plan.layer_names:
            group = plan.group_of(layer)
            index, offset, stride = placement(plan, layer)
            base = buffers[index].data_ptr()
            spec = group.spec_of(layer)
            view = views[layer]
            pages = plan.num_pages(group)
            assert pages >= 1
            for page in sorted({0, pages // 2, pages - 1}):
                start = base + offset + page * stride
                if isinstance(spec, AttentionSpec):
                    half = spec.page_size_bytes // 2
                    assert view[0, page].data_ptr() == start, "K of page j starts the page"
                    assert view[1, page].data_ptr() == start + half, "V follows K within the page"
                    item = dtype_size(spec.dtype)
                    token = spec.block_size - 1
                    assert (
                        view[1, page, token, 0].data_ptr()
                        == start + half + token * spec.num_kv_heads * spec.head_size * item
                    )
                elif isinstance(spec, MLAAttentionSpec):
                    assert view[page].data_ptr() == start
                else:
                    for part, at in zip(spec.parts, spec.part_offsets, strict=True):
                        assert view.part(part.name)[page].data_ptr() == start + at
                # every byte of the page lies inside its allocation
                assert start - base + spec.page_size_bytes <= buffers[index].numel()


def test_shared_buffer_block_stride_is_the_row_width(registry):
    plan = plan_kv_cache(INPUTS["google/gemma-3-27b-it"], 24 * 2**30, CONTEXT, registry=registry)
    views = allocate(plan, "meta", registry=registry)
    for layer in plan.layer_names:
        view = views[layer]
        assert view.stride(1) * view.element_size() == plan.bytes_per_block


def test_per_layer_allocations_are_page_major_and_contiguous(registry):
    """uniform and equal_groups: the bytes are (pages, 2, block, heads, head) in order, so the
    view with its first two dimensions swapped is contiguous."""
    for name, policy in (("meta-llama/Llama-3.2-1B", "uniform"), ("openai/gpt-oss-20b", "equal_groups")):
        plan = plan_kv_cache(INPUTS[name], 24 * 2**30, CONTEXT, registry=registry, policy=policy)
        views = allocate(plan, "meta", registry=registry)
        for view in views.values():
            assert view.transpose(0, 1).is_contiguous()
            assert view.storage_offset() == 0


def test_views_never_move_while_the_plan_lives(toy_registry_with_attention):
    registry = toy_registry_with_attention
    model = ToyModel()
    executor = LocalExecutor(
        model, "cpu", registry=registry, kv_cache_bytes=2**20, warmup_fn=lambda m: m(torch.randn(8, 32))
    )
    plan = initialize_kv_caches(executor, registry=registry, max_model_len=256)
    modules = {n: m for n, m in model.named_modules() if isinstance(m, ToyAttention)}
    first = {name: (view, view.data_ptr()) for name, view in executor.kv_caches.items()}
    pool = BlockPool(plan)
    for step in range(5):
        model(torch.randn(16, 32))
        pool.reserve("r", 16 * (step + 1))
        for name, module in modules.items():
            view, pointer = first[name]
            assert module.kv_cache is view is executor.kv_caches[name], "the bound tensor is the executor's"
            assert module.kv_cache.data_ptr() == pointer, "never reallocated"
    pool.free_request("r")
    assert {n: v.data_ptr() for n, v in executor.kv_caches.items()} == {n: p for n, (_, p) in first.items()}
    assert math.prod(next(iter(executor.kv_caches.values())).shape) > 0


@pytest.fixture
def toy_registry_with_attention():
    from kvcore import Registry, get_plugin_manager
    from tests.runtime._kinds import ToyAttentionPlugin

    return Registry.from_plugin_manager(get_plugin_manager(autoload=False, plugins=[ToyAttentionPlugin()]))
