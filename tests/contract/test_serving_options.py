"""Speculative decoding, state cache modes and draft layers in the sizing context, by hand."""

from __future__ import annotations

import pytest

from kvcore import SizingContext, model_layer_specs, plan_kv_cache
from kvcore.errors import InvalidInputError, InvalidSpecError, ModelConfigError
from kvcore.model_options import ModelOptions
from kvcore.planning.serialization import plan_from_dict, plan_to_dict, spec_from_dict, spec_to_dict
from kvcore.plugins.state import StatePart, StateSpec
from tests.helpers import chunked, full, mla, sliding

GIB = 2**30


def state(**fields):
    return StateSpec(
        block_size=16, parts=(StatePart(name="ssm", shape=(64, 16), dtype="bfloat16"),), **fields
    )


@pytest.mark.parametrize(
    ("mode", "slots", "expected"),
    [("none", 0, 1), ("none", 2, 3), ("align", 0, 2), ("align", 2, 4), ("all", 0, 64), ("all", 2, 66)],
)
def test_states_per_request(mode, slots, expected):
    # all: one state per block of 16 tokens, 1024 / 16 = 64
    context = SizingContext(max_model_len=1024, state_cache_mode=mode, num_speculative_tokens=slots)
    assert state().max_num_blocks(context) == expected
    sized = state().sized_for(context)
    assert len(sized.live_pages(1024)) == expected
    assert sized.max_num_blocks(context) == expected


def test_a_plain_context_leaves_every_spec_as_it_is():
    spec = state()
    assert spec.sized_for(SizingContext(max_model_len=1024)) is spec
    assert state(speculative_slots=2).max_num_blocks(SizingContext(max_model_len=1024)) == 3


def test_new_state_fields_stay_out_of_json_and_descriptions_at_their_defaults(registry):
    assert "cache_mode" not in spec_to_dict(state(), registry)
    assert "speculative_slots" not in repr(state())
    data = spec_to_dict(state(cache_mode="align", speculative_slots=1), registry)
    assert (data["cache_mode"], data["speculative_slots"]) == ("align", 1)
    assert spec_from_dict(data, registry) == state(cache_mode="align", speculative_slots=1)


@pytest.mark.parametrize(("mode", "expected"), [("none", 1), ("align", 2 + 1 + 1), ("all", 64)])
def test_checkpoint_and_in_flight_slots_count_in_align_mode_only(mode, expected):
    # vLLM 0.33: a Mamba-2 mixer's checkpoint block is held only in 'align' mode
    # (MambaSpec.max_memory_usage_bytes); a step in flight keeps the state it replaced there
    spec = state(checkpoint_slots=1, checkpoint_alignment=1, in_flight_slots=1)
    assert spec.max_num_blocks(SizingContext(max_model_len=1024, state_cache_mode=mode)) == expected


def test_checkpoint_fields_round_trip_and_stay_out_at_their_defaults(registry):
    for name in ("checkpoint_slots", "checkpoint_alignment", "in_flight_slots"):
        assert name not in spec_to_dict(state(), registry) and name not in repr(state())
    spec = state(cache_mode="align", checkpoint_slots=1, checkpoint_alignment=64, in_flight_slots=1)
    assert spec_from_dict(spec_to_dict(spec, registry), registry) == spec


def test_a_checkpoint_alignment_without_checkpoints_is_refused():
    with pytest.raises(InvalidSpecError, match="checkpoint_slots"):
        state(checkpoint_alignment=64)
    with pytest.raises(InvalidSpecError, match="checkpoint_slots"):
        state(checkpoint_slots=-1)


def test_vllm_has_no_state_per_block_mode():
    from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules

    with pytest.raises(VllmIntegrationError, match="state_cache_mode 'align'"):
        VllmRules(max_model_len=1024, state_cache_mode="all")
    rules = VllmRules(max_model_len=1024, state_cache_mode="align")
    assert rules.context().state_cache_mode == "align"
    # async scheduling (the default) keeps one more state a request in align mode, sync none
    specs = {"model.layers.0.mixer": state(), "model.layers.1.self_attn": full()}
    held = rules.state_specs(specs)
    assert held["model.layers.0.mixer"].max_num_blocks(rules.context()) == 3
    assert held["model.layers.1.self_attn"] is specs["model.layers.1.self_attn"]
    sync = VllmRules(max_model_len=1024, state_cache_mode="align", async_scheduling=False)
    assert sync.state_specs(specs)["model.layers.0.mixer"].max_num_blocks(sync.context()) == 2
    none = VllmRules(max_model_len=1024, state_cache_mode="none")
    assert none.state_specs(specs)["model.layers.0.mixer"] is specs["model.layers.0.mixer"]


def test_bad_modes_are_refused():
    with pytest.raises(InvalidSpecError, match="state_cache_mode"):
        SizingContext(max_model_len=16, state_cache_mode="some")
    with pytest.raises(InvalidSpecError, match="cache_mode"):
        state(cache_mode="some")
    with pytest.raises(InvalidInputError, match="speculative"):
        ModelOptions(speculative="medusa")


def test_lookahead_slots_widen_windows_and_chunks_but_not_full_attention():
    # T = 2048, S = 3: a window of 1024 keeps 1023 + 2051 live tokens, which touch at most
    # ceil((3074 + 15) / 16) = 194 blocks (193 without the lookahead slots)
    plain = SizingContext(max_model_len=32768)
    spec_decode = SizingContext(max_model_len=32768, num_speculative_tokens=3)
    assert spec_decode.max_tokens_per_step == 2051
    assert sliding(1024).max_num_blocks(plain) == 193
    assert sliding(1024).max_num_blocks(spec_decode) == 194
    assert chunked(8192).max_num_blocks(spec_decode) == -(-(8191 + 2051) // 16)
    # vLLM caps lookahead slots at max_model_len: full attention and MLA hold ceil(L / B)
    assert full().max_num_blocks(spec_decode) == mla().max_num_blocks(spec_decode) == 2048


def test_jamba_holds_three_states_per_request_with_two_speculative_tokens(registry):
    specs = model_layer_specs("ai21labs/AI21-Jamba-1.5-Mini", registry)
    plain = plan_kv_cache(specs, 24 * GIB, SizingContext(max_model_len=65536), registry=registry)
    spec_decode = plan_kv_cache(
        specs, 24 * GIB, SizingContext(max_model_len=65536, num_speculative_tokens=2), registry=registry
    )
    (states,) = [g for g in spec_decode.groups if g.spec.kind == "state"]
    assert states.spec.speculative_slots == 2 and states.pages_per_request(spec_decode.context) == 3
    # the layout does not change: the same blocks, a state page is the same run of block ids
    assert (spec_decode.num_blocks, spec_decode.bytes_per_block) == (plain.num_blocks, plain.bytes_per_block)
    run = states.blocks_per_page
    # a row is the 4 attention layers' pages, 4 x 64 KiB; 28 states of 311,296 bytes span 34 rows
    assert run == -(-28 * 311_296 // (4 * 64 * 1024)) == 34
    attention = 65536 // 16  # blocks of the full-attention group per request
    assert plain.blocks_per_request() == attention + run
    assert spec_decode.blocks_per_request() == attention + 3 * run
    assert spec_decode.max_concurrency() == pytest.approx(plain.num_blocks / (attention + 3 * run))
    assert spec_decode.max_concurrency() < plain.max_concurrency()
    assert plan_from_dict(plan_to_dict(spec_decode, registry), registry) == spec_decode


def test_deepseek_v3_mtp_plans_62_mla_layers(registry):
    specs = model_layer_specs("deepseek-ai/DeepSeek-V3", registry, ModelOptions(speculative="mtp"))
    assert len(specs) == 62 and {s.kind for s in specs.values()} == {"mla"}
    assert list(specs)[-1] == "model.layers.61.self_attn"


def test_deepseek_v32_mtp_layer_brings_its_indexer(registry):
    """vLLM builds an indexer on every MTP layer (deepseek_v2.py:1158-1168): the draft layer
    caches a latent and indexer keys, as the target's layers do."""
    target = model_layer_specs("deepseek-ai/DeepSeek-V3.2", registry)
    specs = model_layer_specs("deepseek-ai/DeepSeek-V3.2", registry, ModelOptions(speculative="mtp"))
    assert list(specs)[: len(target)] == list(target)
    assert list(specs)[len(target) :] == ["model.layers.61.self_attn", "model.layers.61.self_attn.indexer"]
    assert specs["model.layers.61.self_attn.indexer"] == target["model.layers.60.self_attn.indexer"]


def test_eagle_adds_one_full_attention_layer_with_the_target_geometry(registry):
    target = model_layer_specs("openai/gpt-oss-20b", registry)
    specs = model_layer_specs("openai/gpt-oss-20b", registry, ModelOptions(speculative="eagle"))
    assert list(specs)[:-1] == list(target)
    assert list(specs)[-1] == "model.layers.24.self_attn"
    assert (
        specs["model.layers.24.self_attn"] == target["model.layers.23.self_attn"]
    )  # gpt-oss's last full layer
    # a model without a full-attention layer: the geometry of its last attention layer
    mistral = model_layer_specs("mistralai/Mistral-7B-v0.1", registry, ModelOptions(speculative="eagle"))
    draft = mistral["model.layers.32.self_attn"]
    assert draft.kind == "full_attention" and (draft.num_kv_heads, draft.head_size) == (8, 128)


def test_mtp_on_a_model_without_mtp_layers_says_so(registry):
    with pytest.raises(ModelConfigError, match="num_nextn_predict_layers"):
        model_layer_specs("meta-llama/Llama-3.1-8B", registry, ModelOptions(speculative="mtp"))
