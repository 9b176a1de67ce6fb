"""SGLang 0.5's pool rules without SGLang (kvcore.integrations.sglang.rules): its own sizing,
what a plan turns into, and the plans it refuses. tests/integrations/sglang checks the same figures against
SGLang's own configurators."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import assume, given, settings, strategies as st

from kvcore import Registry
from kvcore.errors import InsufficientMemoryError, KVCoreError
from kvcore.integrations.capabilities import ENGINE_CAPABILITY_MODULES
from kvcore.integrations.sglang import rules
from kvcore.integrations.sglang.model import runs_hybrid_swa
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.mla import MLAAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.plugins.state import StatePart, StateSpec

PAGE = 16
RULES = rules.SglangRules(context_len=1024, page_size=PAGE, chunked_prefill_size=128)
FULL = FullAttentionSpec(block_size=PAGE, num_kv_heads=2, head_size=64, dtype="bfloat16")  # 512 B/token
SLIDING = SlidingWindowSpec(
    block_size=PAGE, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=256
)


REGISTRY = Registry.default(autoload=False)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return REGISTRY


#: a Mamba-2-shaped state as SGLang keeps it: bfloat16 conv window, float32 temporal state
STATE = StateSpec(
    block_size=PAGE,
    parts=(
        StatePart(name="conv", shape=(3, 256), dtype="bfloat16"),
        StatePart(name="ssm", shape=(8, 16, 16), dtype="float32"),
    ),
)  # 1,536 + 8,192 = 9,728 bytes a slot


def mamba_hybrid(layers: int = 8) -> dict:
    return {f"l{i}": FULL if i % 4 == 3 else STATE for i in range(layers)}


def hybrid(layers: int = 6) -> dict:
    return {f"l{i}": FULL if i % 3 == 0 else SLIDING for i in range(layers)}


def test_own_sizing_of_full_layers_is_budget_over_cell_floored_to_a_page():
    specs = {f"l{i}": FULL for i in range(4)}  # 2,048 bytes a token
    sizes = rules.own_pool_sizes(specs, 10_000_000, RULES)
    assert sizes.full_tokens == 10_000_000 // 2048 // PAGE * PAGE == 4880
    assert sizes.swa_tokens == 0 and not sizes.is_hybrid_swa


def test_own_sizing_of_a_hybrid_splits_by_swa_full_tokens_ratio():
    specs = hybrid()  # 2 full layers (1,024 B/token), 4 sliding (2,048 B/token)
    budget = 10_000_000
    sizes = rules.own_pool_sizes(specs, budget, RULES)
    full = int(budget // (1024 + 0.8 * 2048)) // PAGE * PAGE
    assert (sizes.full_tokens, sizes.swa_tokens) == (full, int(full * 0.8) // PAGE * PAGE)
    assert sizes.max_total_num_tokens == sizes.full_tokens and sizes.sliding_window == 256
    # the ratio moves tokens between the pools, never past the budget
    for ratio in (0.1, 0.5, 1.0):
        other = rules.own_pool_sizes(
            specs, budget, rules.SglangRules(context_len=1024, page_size=PAGE, swa_full_tokens_ratio=ratio)
        )
        assert other.full_tokens * 1024 + other.swa_tokens * 2048 <= budget


def test_own_sizing_refuses_a_sliding_pool_that_holds_no_request():
    with pytest.raises(rules.SglangIntegrationError, match="cannot hold one request"):
        rules.own_pool_sizes(
            hybrid(), 600_000, rules.SglangRules(context_len=1024, page_size=PAGE, swa_full_tokens_ratio=0.05)
        )


def test_a_kind_pools_plan_is_sglangs_pools_with_the_padded_page_inside_the_budget(registry):
    specs = hybrid()
    budget = 10_000_000
    plan = rules.plan_for_sglang(RULES.request(specs, budget), RULES, registry=registry)
    sizes = rules.pool_sizes(plan, specs)
    assert plan.null_block is not None and len(plan.pools) == 2
    for group in plan.groups:
        assert plan.tokens_held(group) in (sizes.full_tokens, sizes.swa_tokens)
    # SGLang allocates (tokens + page) rows per layer: exactly the plan's bytes
    assert rules.pool_bytes(sizes, specs) == plan.kv_cache_bytes <= budget


def test_mla_goes_to_the_full_pool(registry):
    mla = MLAAttentionSpec(block_size=PAGE, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16")
    specs = {f"l{i}": mla for i in range(3)}
    sizes = rules.pool_sizes(
        rules.plan_for_sglang(RULES.request(specs, 50_000_000), RULES, registry=registry), specs
    )
    assert sizes.full_tokens > 0 and sizes.swa_tokens == 0
    assert sizes.full_tokens <= rules.own_pool_sizes(specs, 50_000_000, RULES).full_tokens


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        ("shared_buffer", "one --page-size|never share memory"),
        ("equal_groups", "one token index"),
        ("uniform", "cannot plan"),
    ],
)
def test_plans_sglang_cannot_run_are_refused_naming_why(registry, policy, why):
    with pytest.raises(KVCoreError, match=why):
        rules.plan_for_sglang(RULES.request(hybrid(), 10_000_000, policy=policy), RULES, registry=registry)


def test_two_windows_state_layers_and_unequal_heads_are_refused(registry):
    other = SlidingWindowSpec(
        block_size=PAGE, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=512
    )
    with pytest.raises(rules.SglangIntegrationError, match=r"windows \[256, 512\]"):
        rules.check_specs({"a": SLIDING, "b": other})
    with pytest.raises(rules.SglangIntegrationError, match=r"state and sliding-window.*unified memory"):
        rules.check_specs({"a": SLIDING, "m": STATE})
    wide = FullAttentionSpec(block_size=PAGE, num_kv_heads=4, head_size=64, dtype="bfloat16")
    with pytest.raises(rules.SglangIntegrationError, match="one head count"):
        rules.check_specs({"a": FULL, "b": wide})


def test_a_budget_too_small_for_one_request_is_kvcores_error(registry):
    with pytest.raises(InsufficientMemoryError):
        rules.plan_for_sglang(RULES.request(hybrid(), 100_000), RULES, registry=registry)


def test_models_sglang_gives_no_sliding_pool_keep_every_token():
    assert runs_hybrid_swa(["GptOssForCausalLM"]) and not runs_hybrid_swa(["Gemma3ForConditionalGeneration"])
    full = rules.as_sglang_runs(hybrid(), hybrid_swa=False)
    assert {s.kind for s in full.values()} == {"full_attention"}
    assert rules.as_sglang_runs(hybrid(), hybrid_swa=True) == hybrid()


def test_kv_budget_is_gpu_times_mem_fraction_static_less_weights():
    assert rules.kv_budget(80 << 30, 16 << 30, 0.9) == int((80 << 30) * 0.9) - (16 << 30)
    with pytest.raises(rules.SglangIntegrationError, match="mem-fraction-static"):
        rules.kv_budget(16 << 30, 16 << 30, 0.9)


def test_capabilities_are_read_from_the_rules():
    assert ENGINE_CAPABILITY_MODULES["sglang"] == rules.__name__
    caps = rules.capabilities()
    assert set(caps.kinds) == set(rules.POOL_OF_KIND) and "state" in caps.kinds
    assert "kind_pools" in caps.policies and caps.several_pools and not caps.mixed_pages
    # kind_pools runs all three reference models (full; full and sliding; full and state)
    assert not any(note.startswith("kind_pools:") for note in caps.notes)
    assert any(note.startswith("state: SGLang's Mamba pool") for note in caps.notes)


@settings(max_examples=40, deadline=None)
@given(
    full_layers=st.integers(0, 4),
    sliding_layers=st.integers(0, 4),
    heads=st.sampled_from([1, 2, 8]),
    window=st.sampled_from([32, 128, 1000]),
    page=st.sampled_from([1, 16, 64]),
    budget=st.integers(1 << 20, 64 << 20),
)
def test_sglangs_pools_of_a_plan_fit_the_budget_and_hold_its_tokens(
    full_layers, sliding_layers, heads, window, page, budget
):
    assume(full_layers + sliding_layers > 0)
    full = FullAttentionSpec(block_size=page, num_kv_heads=heads, head_size=64, dtype="bfloat16")
    sliding = SlidingWindowSpec(
        block_size=page, num_kv_heads=heads, head_size=64, dtype="bfloat16", sliding_window=window
    )
    specs = {
        **{f"f{i}": full for i in range(full_layers)},
        **{f"s{i}": sliding for i in range(sliding_layers)},
    }
    sglang = rules.SglangRules(context_len=512, page_size=page, chunked_prefill_size=64)
    try:
        plan = rules.plan_for_sglang(sglang.request(specs, budget), sglang, registry=REGISTRY)
    except InsufficientMemoryError:
        return
    sizes = rules.pool_sizes(plan, specs)
    # every pool a whole number of pages, the padded page inside the budget, one request held
    assert sizes.full_tokens % page == 0 and sizes.swa_tokens % page == 0
    assert rules.pool_bytes(sizes, specs) == plan.kv_cache_bytes <= budget
    assert plan.max_concurrency() >= 1
    for group in plan.groups:
        assert plan.tokens_held(group) in (sizes.full_tokens, sizes.swa_tokens)


def test_sglangs_mamba_split_takes_r_over_1_plus_r_of_the_budget_less_a_padding_slot():
    specs = mamba_hybrid()  # 6 state layers (58,368 B a slot), 2 full (1,024 B a token)
    slot = 6 * 9728
    budget = 1 << 30
    states, left = rules.own_mamba_split(budget, slot, RULES)
    share = budget * 0.9 / 1.9
    assert states == int((share - slot) // slot)
    assert left == budget - (states + 1) * slot  # exact: budget and slot bytes are whole
    sizes = rules.own_pool_sizes(specs, budget, RULES)
    assert sizes.mamba_states == states and sizes.full_tokens == left // 1024 // PAGE * PAGE
    # a larger ratio moves bytes to the state pool, never past the budget
    more = rules.own_pool_sizes(specs, budget, attrs.evolve(RULES, mamba_full_memory_ratio=2.0))
    assert more.mamba_states > sizes.mamba_states and more.full_tokens < sizes.full_tokens
    assert rules.pool_bytes(more, specs) <= budget + PAGE * 1024
    with pytest.raises(rules.SglangIntegrationError, match="no state slot"):
        rules.own_mamba_split(slot, slot, RULES)


def test_mamba_slots_per_request_are_sglangs_calculate_mamba_ratio():
    assert rules.mamba_slots_per_request(radix_cache=False) == 1
    assert rules.mamba_slots_per_request() == 3  # no extra buffer
    assert rules.mamba_slots_per_request(extra_buffer=True) == 5  # with the overlap scheduler
    assert rules.mamba_slots_per_request(extra_buffer=True, overlap_schedule=False) == 4
    assert rules.mamba_slots_per_request(extra_buffer=True, lazy=True) == 4
    assert rules.mamba_slots_per_request(skip_decode_lock=True) == 3
    assert rules.mamba_slots_per_request(extra_buffer=True, skip_decode_lock=True) == 4


def test_a_kind_pools_plan_of_a_mamba_hybrid_is_sglangs_mamba_and_kv_pools(registry):
    specs = mamba_hybrid()
    budget = 64 << 20
    plan = rules.plan_for_sglang(RULES.request(specs, budget), RULES, registry=registry)
    paged = rules.sglang_specs(specs, RULES)
    sizes = rules.pool_sizes(plan, paged)
    state = next(g for g in plan.groups if g.spec.kind == "state")
    # a request holds SGLang's 3 slots; block 0 is the MambaPool's padding slot
    assert state.spec.max_num_blocks(RULES.context()) == 3
    assert sizes.mamba_states == plan.pools[state.pool].num_blocks - 1
    assert rules.pool_bytes(sizes, paged) == plan.kv_cache_bytes <= budget
    # both pools hold the same number of requests of context_len, as SGLang caps them
    requests = sizes.mamba_states // 3
    assert abs(requests - sizes.full_tokens // RULES.context_len) <= 1


def test_sglang_keeps_the_ssm_state_in_float32():
    bf16 = StateSpec(
        block_size=PAGE,
        parts=(
            StatePart(name="conv", shape=(3, 8), dtype="bfloat16"),
            StatePart(name="ssm", shape=(4, 8), dtype="bfloat16"),
        ),
    )
    (kept,) = rules.as_sglang_runs({"m": bf16}, hybrid_swa=False).values()
    assert [p.dtype for p in kept.parts] == [
        bf16.parts[0].dtype,
        rules.StatePart(name="x", shape=(1,), dtype="float32").dtype,
    ]
    assert rules.token_bytes(kept) == 3 * 8 * 2 + 4 * 8 * 4


@settings(max_examples=30, deadline=None)
@given(
    state_layers=st.integers(1, 6),
    full_layers=st.integers(0, 3),
    ratio=st.sampled_from([0.1, 0.9, 3.0]),
    slots=st.integers(1, 5),
    budget=st.integers(1 << 20, 256 << 20),
)
def test_a_mamba_plan_fits_the_budget_and_holds_its_requests(state_layers, full_layers, ratio, slots, budget):
    specs = {**{f"s{i}": STATE for i in range(state_layers)}, **{f"f{i}": FULL for i in range(full_layers)}}
    sglang = attrs.evolve(RULES, mamba_full_memory_ratio=ratio, mamba_slots_per_request=slots)
    try:
        plan = rules.plan_for_sglang(sglang.request(specs, budget), sglang, registry=REGISTRY)
    except InsufficientMemoryError:
        return
    paged = rules.sglang_specs(specs, sglang)
    sizes = rules.pool_sizes(plan, paged)
    assert rules.pool_bytes(sizes, paged) == plan.kv_cache_bytes <= budget
    # every request kvcore admits has SGLang's slots (resolve_max_num_reqs caps at states // slots)
    assert 1 <= plan.max_concurrency() <= sizes.mamba_states / slots


def test_dsa_models_kvcore_does_not_map_are_refused_naming_the_gap():
    v32 = {"model_type": "deepseek_v32", "index_topk": 2048}
    rules.refuse_dsa(["DeepseekV32ForCausalLM"], v32, "the fix")  # DeepSeek-V3.2 maps (rule 6)
    rules.refuse_dsa(["DeepseekV3ForCausalLM"], {"kv_lora_rank": 512}, "the fix")  # no indexer: plain MLA
    cases = {
        "model type 'glm_moe_dsa'": {"model_type": "glm_moe_dsa", "index_topk": 2048},
        "index_kpool 4": {**v32, "index_kpool": 4},
        "indexer_types": {**v32, "indexer_types": ["full", "shared"]},
        "cli_factor": {"text_config": {**v32, "cli_factor": 2}},
    }
    for gap, config in cases.items():
        with pytest.raises(rules.SglangIntegrationError, match=rf"DSA.*{gap}.*; the fix"):
            rules.refuse_dsa(["GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"], config, "the fix")


def test_a_dsa_pool_is_one_group_of_latents_and_indexer_keys():
    from kvcore import ModelOptions, model_layer_specs

    specs = model_layer_specs("deepseek-ai/DeepSeek-V3.2", REGISTRY, ModelOptions(block_size=64))
    sglang = rules.SglangRules(context_len=4096, page_size=64)
    plan = rules.plan_for_sglang(sglang.request(specs, 4 << 30), sglang, registry=REGISTRY)
    (group,) = plan.groups
    assert {s.kind for s in group.specs} == {"mla", "dsa_indexer"}
    sizes = rules.pool_sizes(plan, specs)
    # 61 x (1152 + 132) bytes a token, the padded page included
    assert (
        rules.pool_bytes(sizes, specs) == (sizes.full_tokens + 64) * 61 * (1152 + 132) == plan.kv_cache_bytes
    )
    # SGLang's own sizing divides by the same cell
    own = rules.own_pool_sizes(specs, 4 << 30, sglang)
    assert own.full_tokens == (4 << 30) // (61 * 1284) // 64 * 64
    sized = rules.SglangRules(context_len=4096, page_size=16)
    with pytest.raises(rules.SglangIntegrationError, match="64-token pages"):
        rules.plan_for_sglang(sized.request(specs, 4 << 30), sized, registry=REGISTRY)
