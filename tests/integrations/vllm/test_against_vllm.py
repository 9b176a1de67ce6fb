"""kvcore's plans run by the real vLLM 0.33: its spec classes, its ``KVCacheManager`` (the
scheduler's block allocator) and its worker allocation on the meta device.

For every bundled model (the encoder-decoder Whisper and the cross-attention Llama-3.2-Vision
among them) and every synthetic mix of :mod:`kvcore.testing.mixes` (the mixed-page ones
included), each policy's plan made under vLLM's rules is converted to vLLM's
``KVCacheConfig``; vLLM's manager then runs exactly kvcore's promised number of requests of
``max_model_len`` at once (prompt of ``max_model_len - 1`` tokens, chunked prefill through
``allocate_slots``, one decode token; an encoder-decoder request's encoder tokens allocated at its
first step, as vLLM's scheduler does), in synchronous and asynchronous scheduling, and refuses
one more.
"""

from __future__ import annotations

import dataclasses

import attrs
import pytest
import torch
from vllm.v1 import kv_cache_interface as vk

from kvcore import (
    InsufficientMemoryError,
    ModelOptions,
    PolicyNotApplicableError,
    Registry,
    model_layer_specs,
)
from kvcore.frontends.hf_config import bundled_models
from kvcore.integrations.vllm import admission, convert
from kvcore.integrations.vllm.rules import (
    VLLM_SPEC_CLASSES,
    VllmIntegrationError,
    VllmRules,
    encoder_tokens_of,
    page_span,
    plan_for_vllm,
    vllm_blocks_per_request,
    vllm_pages_per_request,
)
from kvcore.planning.invariants import check_plan
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.dsa_indexer import DSAIndexerSpec, dsa_latent
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.policy import PlanOptions
from kvcore.spec import SizingContext
from kvcore.testing.mixes import ISSUE_CASES, TARGET_MIXES
from tests.helpers import chunked, full, mla, sliding

GIB = 2**30
BUDGET = 8 * GIB
LENGTH = 8192
REGISTRY = Registry.default()
#: Every bundled model.
MODELS = [m.name for m in bundled_models()]
#: DeepSeek-V3.2 as vLLM serves it with an fp8 cache: 61 fp8_ds_mla latents (656 bytes a token)
#: and 61 indexer key caches (132), blocks of 64 (the sparse MLA kernels' page).
DSA_FP8 = "DeepSeek-V3.2 fp8_ds_mla"
#: Mixes whose layers of one kind have pages of several sizes (mixed-page groups).
MIXED = {name: ISSUE_CASES[name][0] for name in ("OpenELM-like", "DeepSeek-V3.2-like")} | {
    DSA_FP8: model_layer_specs(
        "deepseek-ai/DeepSeek-V3.2", REGISTRY, options=ModelOptions(kv_cache_dtype="fp8", block_size=64)
    )
}
MIXES = {**TARGET_MIXES, **MIXED}
POLICIES = ["uniform", "equal_groups", "shared_buffer"]
MODES = {"sync": False, "async": True}
#: Whisper decodes at most 448 tokens (``max_target_positions``); the rest run at LENGTH.
LENGTHS = {"openai/whisper-large-v3": 448}


def _layers(source):
    return dict(MIXES[source]) if source in MIXES else model_layer_specs(source, REGISTRY)


def _rules(source, async_scheduling=True):
    """vLLM's settings for ``source``: its length, and a cross-attention model's encoder output
    (what each request brings; vLLM's scheduler allocates its blocks at the first step)."""
    return VllmRules(
        max_model_len=LENGTHS.get(source, LENGTH),
        async_scheduling=async_scheduling,
        max_encoder_tokens=encoder_tokens_of(_layers(source)),
    )


def _plan(source, policy, async_scheduling, *, budget=BUDGET, options=None):
    rules = _rules(source, async_scheduling)
    plan = plan_for_vllm(
        rules.request(_layers(source), budget, policy=policy, options=options), rules, registry=REGISTRY
    )
    return plan, rules


def _pairs(sources):
    """``(source, policy)`` for every policy that plans the source (``why_not`` is ``None``):
    the rest are refused by the policy itself, which tests/policies checks."""
    return [
        (source, policy)
        for source in sources
        for policy in POLICIES
        if REGISTRY.policies[policy].why_not(_layers(source)) is None
    ]


def test_the_policies_left_out_refuse_the_layers():
    for source in MODELS + list(MIXES):
        for policy in POLICIES:
            if (source, policy) not in _pairs([source]):
                with pytest.raises(PolicyNotApplicableError):
                    _plan(source, policy, True)


# -- specs ---------------------------------------------------------------------------------


STATE = StateSpec(
    block_size=16,
    parts=(
        StatePart(name="conv", shape=(3, 64), dtype="bfloat16"),
        StatePart(name="ssm", shape=(64, 16), dtype="float32"),
    ),
)


CROSS = CrossAttentionSpec(
    block_size=16, num_kv_heads=20, head_size=64, dtype="float16", max_encoder_tokens=1500
)
KINDS = {"full": full(), "sliding": sliding(window=128), "chunked": chunked(chunk=512), "mla": mla()}
INDEXER = DSAIndexerSpec(block_size=16, index_head_dim=128, dtype="fp8")
KINDS |= {"cross": CROSS, "state": STATE, "dsa_indexer": INDEXER}
#: DeepSeek-V3.2's fp8 latent, vLLM's fp8_ds_mla: a kind already in KINDS, packed
FP8_DS_MLA = dsa_latent(mla(dtype="fp8"))
KINDS_BY_NAME = {spec.kind: spec for spec in KINDS.values()}


@pytest.mark.parametrize("spec", [*KINDS.values(), FP8_DS_MLA], ids=[*KINDS, "mla-fp8_ds_mla"])
def test_every_kind_converts_both_ways_with_the_same_page(spec):
    vllm_spec = convert.spec_to_vllm(spec)
    assert type(vllm_spec).__name__ == VLLM_SPEC_CLASSES[spec.kind]
    assert vllm_spec.page_size_bytes == spec.page_size_bytes
    back = convert.spec_from_vllm("model.layers.0.self_attn.attn", vllm_spec, max_encoder_tokens=1500)
    assert back == spec
    assert back.max_num_blocks(VllmRules(max_model_len=LENGTH).context()) == spec.max_num_blocks(
        VllmRules(max_model_len=LENGTH).context()
    )


def test_the_adapters_kinds_are_every_vllm_class_it_names():
    """The torch-free table the engine matrix reads names vLLM's real classes, and each kind
    in it converts (the test above), so the matrix claims no kind the adapter refuses."""
    assert set(KINDS_BY_NAME) == set(VLLM_SPEC_CLASSES)
    for cls in VLLM_SPEC_CLASSES.values():
        assert issubclass(getattr(vk, cls), vk.KVCacheSpec)


def test_cross_attention_needs_its_encoder_length():
    vllm_spec = convert.spec_to_vllm(CROSS)
    with pytest.raises(VllmIntegrationError, match="max_encoder_tokens"):
        convert.specs_from_vllm({"model.decoder.layers.0.encoder_attn.attn": vllm_spec})
    # vLLM sizes its cross attention from the scheduler's encoder budget; kvcore then counts alike
    rules = VllmRules(max_model_len=448, max_encoder_tokens=2048)
    config = admission.vllm_config(rules)
    assert vllm_spec.max_memory_usage_bytes(config) == (
        CROSS.max_num_blocks(rules.context()) * CROSS.page_size_bytes
    )


@pytest.mark.parametrize("window", [1000, 1024, 1025])
def test_sliding_and_chunked_size_for_vllms_tokens_in_flight(window):
    for async_scheduling in (False, True):
        rules = VllmRules(max_model_len=LENGTH, async_scheduling=async_scheduling)
        config = admission.vllm_config(rules)
        for spec in (sliding(window=window), chunked(chunk=window)):
            vllm_spec = convert.spec_to_vllm(spec)
            cap = vllm_spec.max_admission_blocks_per_request(config.max_in_flight_tokens, LENGTH)
            # kvcore's model of vLLM's admission rule is vLLM's own figure
            assert vllm_pages_per_request(spec, rules) == min(cap, -(-LENGTH // spec.block_size))
            # and at most one page above the most a request of the kind holds, kvcore's figure
            assert 0 <= vllm_pages_per_request(spec, rules) - spec.max_num_blocks(rules.context()) <= 1


@pytest.mark.parametrize(
    "spec",
    [
        vk.SinkFullAttentionSpec(
            block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sink_len=4
        ),
        vk.FullAttentionSpec(
            block_size=16,
            num_kv_heads=2,
            head_size=64,
            dtype=torch.uint8,
            kv_quant_mode=vk.KVQuantMode.FP8_PER_TENSOR,
        ),
        vk.MambaSpec(
            block_size=16,
            shapes=((3, 64),),
            dtypes=(torch.bfloat16,),
            mamba_cache_mode="align",
            num_speculative_blocks=2,
        ),
        vk.MambaSpec(block_size=16, shapes=((3, 64),), dtypes=(torch.bfloat16,), mamba_cache_mode="all"),
    ],
    ids=["sink", "quantized", "mamba-speculative", "mamba-all"],
)
def test_a_spec_kvcore_cannot_hold_is_refused_by_name(spec):
    with pytest.raises(VllmIntegrationError) as caught:
        convert.specs_from_vllm({"model.layers.3.self_attn.attn": spec})
    message = str(caught.value)
    assert type(spec).__name__ in message and "model.layers.3.self_attn.attn" in message
    assert "SlidingWindowSpec -> sliding_window" in message  # says what does convert


def test_a_mamba2_checkpoint_block_counts_only_in_align_mode():
    # vLLM's Mamba-2 mixer asks for one prefill checkpoint block (mamba_mixer2.py), which only
    # 'align' mode holds: with 'none' a request keeps one state, as kvcore plans it
    spec = vk.MambaSpec(
        block_size=16,
        shapes=((3, 64), (4, 16, 8)),
        dtypes=(torch.bfloat16, torch.float32),
        mamba_cache_mode="none",
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=1,
    )
    context = SizingContext(max_model_len=4096)
    state = convert.specs_from_vllm({"model.layers.0.mixer": spec})["model.layers.0.mixer"]
    assert state.page_size_bytes == 3 * 64 * 2 + 4 * 16 * 8 * 4
    assert state.max_num_blocks(context) == 1
    aligned = convert.specs_from_vllm(
        {"model.layers.0.mixer": dataclasses.replace(spec, mamba_cache_mode="align")}
    )
    assert aligned["model.layers.0.mixer"].max_num_blocks(context) == 3  # 2 + the checkpoint


def test_layer_names_follow_vllm():
    specs = model_layer_specs("ai21labs/AI21-Jamba-1.5-Mini", REGISTRY)
    names = list(convert.specs_to_vllm(specs))
    assert "model.layers.4.self_attn.attn" in names and "model.layers.0.mamba" in names
    assert list(convert.specs_from_vllm(convert.specs_to_vllm(specs))) == list(specs)


def _vllms_dsa_specs(kv_cache_dtype):
    """One DeepSeek-V3.2 layer's two specs as vLLM's own modules report them (block 64): the
    MLA layer's (``MLAAttention.get_kv_cache_spec``, run on a stand-in holding the fields it
    reads) and the indexer cache's (``DeepseekV32IndexerCache``, made as ``Indexer`` makes it:
    128 + 128 // 128 x 4 uint8 bytes a token)."""
    from types import SimpleNamespace

    from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache

    config = VllmConfig(cache_config=CacheConfig(block_size=64))
    attention = SimpleNamespace(
        kv_cache_dtype=kv_cache_dtype,
        head_size=512 + 64,
        sliding_window=None,
        topk_buffer_width=2048,
        indexer=object(),
        non_causal_multi_token_decode=False,
        # vLLM 0.34 asks the layer's backend for the packed row's bytes; the base backend's
        # answer (vllm/v1/attention/backend.py, get_fp8_ds_mla_row_bytes) is DeepSeek-V3.2's 656
        impl=SimpleNamespace(get_fp8_ds_mla_row_bytes=lambda: 656),
    )
    with set_current_vllm_config(config):
        indexer = DeepseekV32IndexerCache(
            head_dim=128 + 128 // 128 * 4,
            dtype=torch.uint8,
            prefix="model.layers.0.self_attn.indexer.k_cache",
            cache_config=config.cache_config,
        )
        return {
            "model.layers.0.self_attn.attn": MLAAttention.get_kv_cache_spec(attention, config),
            "model.layers.0.self_attn.indexer.k_cache": indexer.get_kv_cache_spec(config),
        }


@pytest.mark.parametrize(
    ("kv_cache_dtype", "kvcore_dtype", "latent_bytes"),
    [
        ("fp8_ds_mla", "fp8", 656),
        ("bfloat16", None, 1152),
    ],
)
def test_dsa_layers_as_vllms_modules_report_them_are_kvcores_deepseek_v32(
    kv_cache_dtype, kvcore_dtype, latent_bytes
):
    theirs = convert.specs_from_vllm(_vllms_dsa_specs(kv_cache_dtype))
    ours = model_layer_specs(
        "deepseek-ai/DeepSeek-V3.2",
        REGISTRY,
        options=ModelOptions(kv_cache_dtype=kvcore_dtype, block_size=64),
    )
    assert theirs == {
        name: ours[name] for name in ("model.layers.0.self_attn", "model.layers.0.self_attn.indexer")
    }
    assert theirs["model.layers.0.self_attn"].page_size_bytes == 64 * latent_bytes
    assert theirs["model.layers.0.self_attn.indexer"].page_size_bytes == 64 * 132
    # and back, with vLLM's names and pages
    back = convert.specs_to_vllm(theirs)
    assert list(back) == list(_vllms_dsa_specs(kv_cache_dtype))
    assert [s.page_size_bytes for s in back.values()] == [
        s.page_size_bytes for s in _vllms_dsa_specs(kv_cache_dtype).values()
    ]


def test_a_dsa_cache_kvcore_cannot_pack_is_refused_by_name():
    """vLLM's nvfp4_ds_mla (352 bytes a token) is not kvcore's fp8 packing: refused, not guessed."""
    spec = _vllms_dsa_specs("nvfp4_ds_mla")["model.layers.0.self_attn.attn"]
    with pytest.raises(
        VllmIntegrationError,
        match=r"model.layers.0.self_attn.attn.*MLAAttentionSpec.*nvfp4_ds_mla.*352 bytes",
    ):
        convert.specs_from_vllm({"model.layers.0.self_attn.attn": spec})


# -- admission -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("source", "policy"), _pairs(MODELS + list(MIXES)))
def test_vllms_manager_admits_exactly_kvcores_promise(source, policy, mode):
    plan, rules = _plan(source, policy, MODES[mode])
    assert plan.null_block == 0 and page_span(plan) == 1
    check_plan(plan)
    promise = admission.promised(plan)
    assert promise >= 1
    config = convert.plan_to_vllm_config(plan)
    firsts = admission.first_chunks(config, rules)
    for first in firsts:  # the promise holds however the chunks fall
        ran = admission.run_requests(config, rules, promise, first_chunk=first)
        assert ran.completed, (
            f"vLLM refused request {ran.refused_at} of {promise} kvcore promised (first {first})"
        )
        assert ran.peak_blocks <= plan.usable_blocks
    # and is the most: one more request does not fit where the chunks fall worst
    over = [admission.run_requests(config, rules, promise + 1, first_chunk=first) for first in firsts]
    assert not all(run.completed for run in over), (
        f"vLLM ran {promise + 1} requests where kvcore promised {promise}"
    )


@pytest.mark.parametrize(("mode", "figures"), [("sync", (2560, 2944, 5, 4)), ("async", (3072, 3328, 4, 4))])
def test_the_chunked_mix_promises_what_vllms_manager_runs(mode, figures):
    # 12 full + 36 chunked-local(8192) layers, 16k tokens: the chunked groups hold the most
    # mid-chunk and the full group at the end, so a request never holds every group's worst
    # case at once; kvcore counts the joint peak, vLLM admits by the per-group sum
    rules = VllmRules(max_model_len=16384, async_scheduling=MODES[mode])
    specs = dict(TARGET_MIXES["g 12 full + 36 chunked(8192)"])
    plan = plan_for_vllm(rules.request(specs, 10 * GIB, policy="shared_buffer"), rules, registry=REGISTRY)
    joint, per_group, promise, summed = figures
    assert (plan.blocks_per_request(), vllm_blocks_per_request(plan, rules)) == (joint, per_group)
    assert admission.promised(plan) == plan.usable_blocks // joint == promise
    assert plan.usable_blocks // per_group == summed  # what the per-group sum would have promised
    config = convert.plan_to_vllm_config(plan)
    assert admission.admitted(config, rules, start=promise) == promise
    # a lone request, chunked so that a step starts where the groups hold the most, holds the peak
    peaks = [
        admission.run_requests(config, rules, 1, first_chunk=f).peak_blocks
        for f in admission.first_chunks(config, rules)
    ]
    assert max(peaks) == joint


def test_a_plan_vllm_would_not_admit_one_request_on_is_refused():
    # the joint peak fits the pool but vLLM's per-group admission figure does not
    rules = VllmRules(max_model_len=16384, async_scheduling=False)
    specs = dict(TARGET_MIXES["g 12 full + 36 chunked(8192)"])
    probe = plan_for_vllm(rules.request(specs, 10 * GIB, policy="shared_buffer"), rules, registry=REGISTRY)
    blocks = vllm_blocks_per_request(probe, rules)  # 2944, the joint peak 2560, plus the null block
    with pytest.raises(InsufficientMemoryError, match="every group's worst case") as caught:
        plan_for_vllm(
            rules.request(specs, 10 * GIB, policy="shared_buffer", num_blocks=blocks),
            rules,
            registry=REGISTRY,
        )
    assert caught.value.required_blocks == blocks and caught.value.available_blocks == blocks - 1
    config = convert.plan_to_vllm_config(
        plan_for_vllm(
            rules.request(specs, 10 * GIB, policy="shared_buffer", num_blocks=blocks + 1),
            rules,
            registry=REGISTRY,
        )
    )
    assert admission.admitted(config, rules) == 1


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("source", MODELS + list(MIXES))
def test_kvcores_best_plan_holds_at_least_vllms_own(source, mode):
    rules = _rules(source, MODES[mode])
    specs = _layers(source)
    best = max(
        admission.promised(
            plan_for_vllm(rules.request(specs, BUDGET, policy=policy), rules, registry=REGISTRY)
        )
        for policy in ("auto", "shared_buffer")
    )
    own_config = admission.vllm_own_config(admission.vllm_layer_specs(specs, rules), BUDGET, rules)
    own = admission.admitted(own_config, rules, start=best)
    assert best >= own


def test_async_scheduling_needs_the_second_batch_planned_for():
    """A plan sized for one batch in flight promises more than vLLM's async scheduling runs."""
    sync_plan, _ = _plan("google/gemma-3-27b-it", "shared_buffer", False)
    rules = VllmRules(max_model_len=LENGTH, async_scheduling=True)
    promise = admission.promised(sync_plan)
    assert not admission.run_requests(convert.plan_to_vllm_config(sync_plan), rules, promise).completed


def test_a_plan_without_the_null_block_is_refused():
    plan, _ = _plan("meta-llama/Llama-3.2-1B", "uniform", True)
    with pytest.raises(VllmIntegrationError, match="null block"):
        convert.plan_to_vllm_config(attrs.evolve(plan, null_block=None))


def test_jamba_state_pages_take_one_block_id_each():
    plan, _rules = _plan("ai21labs/AI21-Jamba-1.5-Mini", "shared_buffer", True)
    states = [g for g in plan.groups if isinstance(g.spec, StateSpec)]
    assert len(states) > 1 and all(g.blocks_per_page == 1 for g in plan.groups)
    config = convert.plan_to_vllm_config(plan)
    assert {type(g.kv_cache_spec) for g in config.kv_cache_groups} == {vk.FullAttentionSpec, vk.MambaSpec}
    assert all(
        g.kv_cache_spec.block_size == LENGTH
        for g in config.kv_cache_groups
        if g.kv_cache_spec.block_size > 1024
    )


# -- the reverse, and vLLM's allocation ------------------------------------------------------


@pytest.mark.parametrize(("source", "policy"), _pairs(MODELS + list(MIXED)))
def test_a_converted_plan_reads_back_with_the_same_figures(source, policy):
    plan, rules = _plan(source, policy, True)
    back = convert.plan_from_vllm_config(convert.plan_to_vllm_config(plan), rules.context(), BUDGET)
    check_plan(back)
    assert (back.num_blocks, back.usable_blocks) == (plan.num_blocks, plan.usable_blocks)
    assert back.blocks_per_request() == plan.blocks_per_request()
    assert [g.layer_names for g in back.groups] == [g.layer_names for g in plan.groups]

    # a mixed-page group reads back mixed, every layer with its page (an MLA latent's rope split
    # is not in vLLM's spec, so the spec itself may differ)
    def pages(p):
        return [{name: g.spec_of(name).page_size_bytes for name in g.layer_names} for g in p.groups]

    assert pages(back) == pages(plan)
    assert [bool(g.layer_specs) for g in back.groups] == [bool(g.layer_specs) for g in plan.groups]


@pytest.mark.parametrize("source", MODELS + list(MIXED))
def test_vllms_own_plan_reads_as_a_kvcore_plan(source):
    rules = _rules(source)
    specs = _layers(source)
    own = admission.vllm_own_config(admission.vllm_layer_specs(specs, rules), BUDGET, rules)
    plan = convert.plan_from_vllm_config(own, rules.context(), BUDGET)
    check_plan(plan)
    assert plan.kv_cache_bytes <= BUDGET and set(plan.layer_names) == set(specs)
    assert admission.admitted(own, rules, start=admission.promised(plan)) == admission.promised(plan)


@pytest.mark.parametrize(("source", "policy"), _pairs(MODELS + list(MIXED)))
def test_vllms_meta_allocation_stays_in_the_budget_and_views_kvcores_pages(source, policy):
    plan, _ = _plan(source, policy, True)
    config = convert.plan_to_vllm_config(plan)
    views = admission.allocate_on_meta(config)
    backing_bytes = config.kv_cache_tensors[0].size
    assert backing_bytes == plan.kv_cache_bytes <= BUDGET
    names = {convert.vllm_layer_name(n, plan.group_of(n).spec): n for n in plan.layer_names}
    assert set(views) == set(names)
    base = 0
    starts = {}
    for tensor in plan.tensors:
        for name in tensor.shared_by:
            starts[name] = (tensor.offset if plan.single_buffer else base + tensor.offset, tensor.page_stride)
        base += tensor.size
    for vllm_name, view in views.items():
        name = names[vllm_name]
        page = plan.group_of(name).spec_of(name).page_size_bytes
        start, stride, span = admission.view_pages(view)
        assert (start, stride) == starts[name], vllm_name
        assert span == page, vllm_name
        assert view.shape[0] == plan.num_blocks
        assert start + (plan.num_blocks - 1) * stride + span <= backing_bytes


# -- cross attention, mixed pages, several pools ----------------------------------------------


@pytest.mark.parametrize("source", ["openai/whisper-large-v3", "meta-llama/Llama-3.2-11B-Vision-Instruct"])
def test_cross_attention_blocks_come_at_the_first_step_and_stay(source):
    plan, rules = _plan(source, "shared_buffer", True)
    config = convert.plan_to_vllm_config(plan)
    cross = [
        i for i, g in enumerate(config.kv_cache_groups) if type(g.kv_cache_spec) is vk.CrossAttentionSpec
    ]
    assert cross
    manager = admission.make_manager(config, rules)
    request = admission.Request("r0", [1] * 16, admission.SamplingParams(max_tokens=1), None)
    encoder = rules.max_encoder_tokens
    assert manager.allocate_slots(request, 16, num_encoder_tokens=encoder, full_sequence_must_fit=True)
    request.num_computed_tokens = 16
    held = manager.get_block_ids("r0")
    for i in cross:  # every encoder page at once, as kvcore's cross_attention holds them
        spec = plan.groups[i].spec
        assert len(held[i]) == spec.max_num_blocks(rules.context()) == -(-encoder // spec.block_size)
    assert manager.allocate_slots(request, 1) is not None
    after = manager.get_block_ids("r0")
    assert all(after[i] == held[i] for i in cross)  # decoding adds none and frees none


@pytest.mark.parametrize("source", list(MIXED))
def test_a_mixed_page_group_becomes_one_uniform_type_spec(source):
    plan, _rules = _plan(source, "shared_buffer", True)
    mixed = [g for g in plan.groups if g.layer_specs]
    assert mixed, "the policy made no mixed-page group"
    config = convert.plan_to_vllm_config(plan)
    for group, vllm_group in zip(plan.groups, config.kv_cache_groups, strict=True):
        spec = vllm_group.kv_cache_spec
        if not group.layer_specs:
            assert not isinstance(spec, vk.UniformTypeKVCacheSpecs)
            continue
        assert isinstance(spec, vk.UniformTypeKVCacheSpecs)
        assert vk.UniformTypeKVCacheSpecs.is_uniform_type(spec.kv_cache_specs)
        for name in group.layer_names:
            layer = spec.kv_cache_specs[convert.vllm_layer_name(name, group.spec)]
            assert layer.page_size_bytes == group.spec_of(name).page_size_bytes


@pytest.mark.parametrize("source", list(MIXED))
def test_mixed_pages_hold_at_least_one_spec_per_group(source):
    """Mixed-page groups are on for vLLM because vLLM runs them; they never hold fewer."""
    mixed, _ = _plan(source, "shared_buffer", True)
    single, _ = _plan(source, "shared_buffer", True, options=PlanOptions(mixed_pages=False))
    assert not any(g.layer_specs for g in single.groups)
    assert admission.promised(mixed) >= admission.promised(single)


def test_several_pools_are_refused_saying_why():
    with pytest.raises(VllmIntegrationError, match="one block pool"):
        _plan("google/gemma-3-27b-it", "kind_pools", True)


@pytest.mark.parametrize("source", ["meta-llama/Llama-3.1-8B", "google/gemma-3-27b-it", "OpenELM-like"])
def test_prefix_caching_runs_kvcores_promise(source):
    """vLLM's manager with prefix caching on (its default for attention models) runs the
    promise too: prompts that share no prefix cache nothing, so they hold what they would."""
    plan, rules = _plan(source, "shared_buffer", True)
    config = convert.plan_to_vllm_config(plan)
    promise = admission.promised(plan)
    assert admission.run_requests(config, rules, promise, enable_caching=True).completed
