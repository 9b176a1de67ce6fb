"""Cross attention and the families that have it (Whisper, Llama-3.2-Vision), by hand.

Whisper-large-v3 (float16): 32 decoder layers, 20 heads of 1280 // 20 = 64 -> a page of 16
tokens is 16 x 2 x 20 x 64 x 2 = 80 KiB for self and cross attention alike. A request of 448
tokens holds ceil(448 / 16) = 28 self-attention pages and ceil(1500 / 16) = 94 cross-attention
pages per layer, whatever its length.

Llama-3.2-11B-Vision (bfloat16): 40 layers, 8 KV heads of 128 -> 64 KiB pages; 8 cross-attention
layers over 4 x ((560 // 14)^2 + 1) = 6404 image tokens (ceil(6404 / 16) = 401 pages at block 16).
"""

from __future__ import annotations

import pytest

import kvcore
from kvcore import ModelOptions, SizingContext, model_layer_specs, plan_kv_cache
from kvcore.errors import InvalidSpecError, ModelConfigError
from kvcore.planning.capacity import Capacity
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.full_attention import FullAttentionSpec
from tests.zoo import bundled

GIB = 2**30
KIB = 2**10
WHISPER = "openai/whisper-large-v3"
MLLAMA = "meta-llama/Llama-3.2-11B-Vision-Instruct"


def cross(encoder_tokens=1500, block_size=16):
    return CrossAttentionSpec(
        block_size=block_size,
        num_kv_heads=20,
        head_size=64,
        dtype="float16",
        max_encoder_tokens=encoder_tokens,
    )


def test_cross_attention_holds_the_encoder_output_whatever_the_request_length():
    spec = cross()
    assert spec.page_size_bytes == 80 * KIB
    assert spec.live_pages(0) == range(0)
    assert spec.live_pages(1) == spec.live_pages(448, 400) == range(94)
    for length in (1, 448, 100_000):
        assert spec.max_num_blocks(SizingContext(max_model_len=length)) == 94


def test_the_context_encoder_length_replaces_the_spec_s():
    spec = cross()
    context = SizingContext(max_model_len=448, max_encoder_tokens=3000)
    assert spec.max_num_blocks(context) == 188  # ceil(3000 / 16)
    assert spec.sized_for(context) == cross(3000)
    assert spec.sized_for(SizingContext(max_model_len=448)) is spec


def test_bad_encoder_lengths_are_refused():
    with pytest.raises(InvalidSpecError):
        cross(0)
    with pytest.raises(InvalidSpecError):
        SizingContext(max_model_len=448, max_encoder_tokens=-1)


@pytest.mark.parametrize("length", [448, 100, 4096])
def test_whisper_plans_32_self_and_32_cross_attention_layers(registry, length):
    specs = model_layer_specs(WHISPER, registry)
    plan = plan_kv_cache(specs, 8 * GIB, SizingContext(max_model_len=length), registry=registry)
    by_kind = {g.spec.kind: g for g in plan.groups}
    assert {kind: len(g.layer_names) for kind, g in by_kind.items()} == {
        "full_attention": 32,
        "cross_attention": 32,
    }
    assert by_kind["cross_attention"].pages_per_request(plan.context) == 94  # ceil(1500 / 16) at any length
    assert by_kind["full_attention"].pages_per_request(plan.context) == -(-length // 16)


@pytest.mark.parametrize(("block_size", "pages"), [(16, 94), (32, 47), (64, 24)])
def test_whisper_cross_attention_pages_follow_the_block_size(registry, block_size, pages):
    specs = model_layer_specs(WHISPER, registry, ModelOptions(block_size=block_size))
    for length in (448, 64):
        plan = plan_kv_cache(specs, 8 * GIB, SizingContext(max_model_len=length), registry=registry)
        (group,) = [g for g in plan.groups if g.spec.kind == "cross_attention"]
        assert group.pages_per_request(plan.context) == pages == -(-1500 // group.spec.block_size)


def test_whisper_capacity_by_hand(registry):
    specs = model_layer_specs(WHISPER, registry)
    plan = plan_kv_cache(specs, 8 * GIB, SizingContext(max_model_len=448), registry=registry)
    capacity = Capacity.of(plan, specs)
    # 32 layers x (28 + 94) pages x 80 KiB per request
    assert capacity.ideal_request_bytes == 32 * (28 + 94) * 80 * KIB
    # one block id is a page of every layer: 32 x 80 KiB; 8 GiB holds 3276 of them
    assert plan.bytes_per_block == 32 * 80 * KIB and plan.num_blocks == 3276
    assert plan.blocks_per_request() == 28 + 94
    assert plan.max_concurrency() == pytest.approx(3276 / 122)  # 26.85


def test_mllama_plans_32_full_and_8_cross_attention_layers_of_6404_image_tokens(registry):
    specs = model_layer_specs(MLLAMA, registry)
    cross_layers = {n: s for n, s in specs.items() if isinstance(s, CrossAttentionSpec)}
    assert sorted(int(n.split(".")[-2]) for n in cross_layers) == [3, 8, 13, 18, 23, 28, 33, 38]
    assert sum(isinstance(s, FullAttentionSpec) for s in specs.values()) == 32
    assert {s.max_encoder_tokens for s in cross_layers.values()} == {6404}  # 4 x (40^2 + 1)
    plan = plan_kv_cache(specs, 8 * GIB, SizingContext(max_model_len=448), registry=registry)
    crossing = [g for g in plan.groups if g.spec.kind == "cross_attention"]
    assert sum(len(g.layer_names) for g in crossing) == 8
    for group in crossing:
        pages = group.pages_per_request(plan.context)
        assert pages == -(-6404 // group.spec.block_size)
    # 32 x 28 + 8 x 401 pages of 64 KiB per request, against 8 GiB
    need = (32 * 28 + 8 * 401) * 64 * KIB
    assert Capacity.of(plan, specs).ideal_concurrency == pytest.approx(8 * GIB / need)  # 31.94


def test_mllama_without_a_vision_config_names_it(registry):
    config = bundled(MLLAMA)
    del config["vision_config"]
    with pytest.raises(ModelConfigError, match="vision_config"):
        kvcore.layer_specs_from_config(config, registry)


def test_mllama_cross_layers_outside_the_model_are_refused(registry):
    config = bundled(MLLAMA)
    config["text_config"]["cross_attention_layers"] = [3, 40]
    with pytest.raises(ModelConfigError, match=r"outside 0\.\.39"):
        kvcore.layer_specs_from_config(config, registry)
