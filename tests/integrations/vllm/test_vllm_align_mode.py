"""Hybrids with prefix caching on, vLLM 0.33's default for them: every Mamba layer's
``MambaSpec`` in ``mamba_cache_mode='align'`` (``MambaModelConfig.verify_and_update_config``).

For a Jamba-like hybrid (Mamba-1: no prefill checkpoint block), a Mamba-2-like one
(Nemotron-H's mixer: one checkpoint block, alignment 1) and a gated-delta-net one (Qwen3-Next's:
one checkpoint block on a 64-token grid), the layers as vLLM reports them
(:func:`~kvcore.integrations.vllm.admission.vllm_layer_specs`: the attention block raised until
its page holds a state, the state block that attention block) are planned through the plugin's
path (:func:`~kvcore.integrations.vllm.plugin.kvcore_plans`), set beside vLLM's own
``KVCacheConfig`` for the same layers and budget, and run through vLLM's ``KVCacheManager`` with
prefix caching on.

Where kvcore's plan and vLLM's differ, it is by grouping alone: vLLM puts as many state layers
in a group as there are attention layers and gives a block id one page of each group
(``get_kv_cache_groups``), kvcore's ``shared_buffer`` gives every state layer a group of its own
beside the attention groups, all of one page. The pages per request of each layer, the state
block, the state cache mode and the checkpoint blocks are the same, and so is what the budget
holds: kvcore's promise is what vLLM's manager runs on vLLM's own plan, and what it runs on
kvcore's.
"""

from __future__ import annotations

import dataclasses

import attrs
import pytest
import torch
from vllm.v1 import kv_cache_interface as vk

from kvcore import Registry, model_layer_specs
from kvcore.integrations.vllm import admission, convert, plugin
from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.simulation.profiles.vllm_groups import align_state_block
from tests.integrations.vllm.scheduler_cases import align_mode_differs

GIB = 2**30
BUDGET = 8 * GIB
LENGTH = 8192
REGISTRY = Registry.default()


def _hybrid(
    state: StateSpec, attention: FullAttentionSpec, pattern: str
) -> dict[str, StateSpec | FullAttentionSpec]:
    """A model whose layer ``i`` is attention where ``pattern[i]`` is ``*``, else a state."""
    return {
        f"model.layers.{i}.{'self_attn' if kind == '*' else 'mixer'}": attention if kind == "*" else state
        for i, kind in enumerate(pattern)
    }


#: Nemotron-H-8B's Mamba-2 mixer: 128 heads of 64, state 128, 8 groups (conv over 10,240
#: channels), one checkpoint block at alignment 1 (vLLM's mamba_mixer2.py); 4 of 28 layers
#: attention of 8 KV heads of 128.
MAMBA2 = _hybrid(
    StateSpec(
        block_size=16,
        parts=(
            StatePart(name="conv", shape=(3, 10240), dtype="bfloat16"),
            StatePart(name="ssm", shape=(128, 64, 128), dtype="bfloat16"),
        ),
        checkpoint_slots=1,
        checkpoint_alignment=1,
    ),
    FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16"),
    "-----*-------*-------*-------*"[:28],
)
#: Qwen3-Next's gated delta net: 16 key and 32 value heads of 128, kernel 4 (conv over 8,192
#: channels), one checkpoint block on FlashInfer's 64-token grid (qwen_gdn_linear_attn.py); one
#: layer in four full attention of 2 KV heads of 256.
GDN = _hybrid(
    StateSpec(
        block_size=16,
        parts=(
            StatePart(name="conv", shape=(3, 8192), dtype="bfloat16"),
            StatePart(name="ssm", shape=(32, 128, 128), dtype="bfloat16"),
        ),
        checkpoint_slots=1,
        checkpoint_alignment=64,
    ),
    FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=256, dtype="bfloat16"),
    "---*" * 12,
)
MODELS = {
    "Jamba (Mamba-1)": model_layer_specs("ai21labs/AI21-Jamba-1.5-Mini", REGISTRY),
    "Mamba-2": MAMBA2,
    "gated delta net": GDN,
}
#: Checkpoint blocks each model's state layers ask for.
CHECKPOINTS = {"Jamba (Mamba-1)": 0, "Mamba-2": 1, "gated delta net": 1}
ALIGN = VllmRules(max_model_len=LENGTH, state_cache_mode="align")
SYNC = VllmRules(max_model_len=LENGTH, state_cache_mode="align", async_scheduling=False)


def _vllm_side(model: str) -> tuple[dict[str, vk.KVCacheSpec], int]:
    """The layers as vLLM reports them in align mode, and their Mamba block (``mamba_block_size``)."""
    specs = admission.vllm_layer_specs(MODELS[model], ALIGN)
    (block,) = {s.block_size for s in specs.values() if isinstance(s, vk.MambaSpec)}
    return specs, block


def _engine(block: int, rules: VllmRules = ALIGN):
    """The engine's config in align mode, its Mamba block as vLLM's platform hook sets it."""
    config = admission.vllm_config(rules)
    config.cache_config.mamba_block_size = block
    return config


def _plans(model: str, rules: VllmRules):
    """The plugin's plan and the config it hands the engine, and vLLM's own config."""
    specs, block = _vllm_side(model)
    engine = _engine(block, rules)
    (plan,) = plugin.kvcore_plans(engine, [specs], [BUDGET], "shared_buffer")
    (config,) = plugin.kvcore_kv_cache_configs(engine, [specs], [BUDGET], "shared_buffer")
    return plan, config, admission.vllm_own_config(specs, BUDGET, rules)


@pytest.mark.parametrize("model", list(MODELS))
def test_an_align_mode_state_converts_both_ways_unchanged(model):
    specs, block = _vllm_side(model)
    state = next(s for s in specs.values() if isinstance(s, vk.MambaSpec))
    assert (state.mamba_cache_mode, state.num_prefill_checkpoint_blocks) == ("align", CHECKPOINTS[model])
    kvcore_spec = convert.spec_from_vllm("model.layers.0.mixer", state)
    assert isinstance(kvcore_spec, StateSpec) and kvcore_spec.cache_mode == "align"
    back = convert.spec_to_vllm(kvcore_spec)
    # vLLM's padding is placement (a plan's page), not the state: the rest comes back as it was
    assert back == dataclasses.replace(state, page_size_padded=back.page_size_padded)
    assert back.block_size == block


@pytest.mark.parametrize("model", list(MODELS))
def test_kvcore_sizes_an_align_mode_state_as_vllm_does(model):
    """2 + checkpoint states a request (``MambaSpec.max_memory_usage_bytes`` in align mode),
    and one in 'none' mode, where vLLM ignores the checkpoint block."""
    specs, _ = _vllm_side(model)
    state = dataclasses.replace(
        next(s for s in specs.values() if isinstance(s, vk.MambaSpec)), page_size_padded=None
    )
    kvcore_spec = convert.spec_from_vllm("model.layers.0.mixer", state)
    for rules in (ALIGN, VllmRules(max_model_len=LENGTH, state_cache_mode="none")):
        pages = kvcore_spec.max_num_blocks(rules.context())
        assert pages * kvcore_spec.page_size_bytes == state.max_memory_usage_bytes(
            admission.vllm_config(rules)
        )
    assert kvcore_spec.max_num_blocks(ALIGN.context()) == 2 + CHECKPOINTS[model]


@pytest.mark.parametrize("rules", [ALIGN, SYNC], ids=["async", "sync"])
@pytest.mark.parametrize("model", list(MODELS))
def test_the_plugin_plans_an_align_mode_hybrid_as_vllm_holds_it(model, rules):
    """The plugin's plan beside vLLM's own: the same layers, state block, cache mode and
    checkpoint blocks; the same pages per request per layer, but for the state a batch in
    flight holds with async scheduling (``StateSpec.in_flight_slots``), which vLLM's sizing
    leaves out; and with the pages counted alike, at least vLLM's promise."""
    reason = align_mode_differs()
    if reason:
        pytest.skip(reason)
    plan, config, own = _plans(model, rules)
    own_plan = convert.plan_from_vllm_config(own, rules.context(), BUDGET)
    block = align_state_block(own_plan)
    assert align_state_block(plan) == block and block % 16 == 0
    assert config.num_blocks == plan.num_blocks and plan.kv_cache_bytes <= BUDGET

    def states(groups):
        return {
            (s.block_size, s.mamba_cache_mode, s.num_prefill_checkpoint_blocks)
            for s in (g.kv_cache_spec for g in groups)
            if isinstance(s, vk.MambaSpec)
        }

    assert (
        states(config.kv_cache_groups)
        == states(own.kv_cache_groups)
        == {(block, "align", CHECKPOINTS[model])}
    )
    context = rules.context()

    def pages(p):
        return {
            convert.kvcore_layer_name(n): g.spec.max_num_blocks(context)
            for g in p.groups
            for n in g.layer_names
        }

    in_flight = rules.max_concurrent_batches - 1
    own_pages = pages(own_plan)
    assert pages(plan) == {
        name: count + (in_flight if isinstance(own_plan.group_of(name).spec, StateSpec) else 0)
        for name, count in own_pages.items()
    }
    if not in_flight:
        assert admission.promised(plan) >= admission.promised(own_plan) > 0


@pytest.mark.parametrize("rules", [ALIGN, SYNC], ids=["async", "sync"])
@pytest.mark.parametrize("model", list(MODELS))
def test_vllms_manager_runs_what_kvcore_promises_with_prefix_caching(model, rules):
    """vLLM's KVCacheManager, prefix caching on, runs kvcore's promise; without checkpoint
    blocks it refuses one more (a checkpoint block is held only for the step that exports it,
    which kvcore counts throughout, as vLLM's sizing does, so there the manager runs more). On
    vLLM's own plan of such a model it runs no more than vLLM's sizing counts: fewer with async
    scheduling, whose third state a layer that sizing leaves out."""
    reason = align_mode_differs()
    if reason:
        pytest.skip(reason)
    plan, config, own = _plans(model, rules)
    promise = admission.promised(plan)
    assert promise > 0
    assert admission.runs_all(config, rules, promise, enable_caching=True)
    if CHECKPOINTS[model]:
        return
    assert not admission.runs_all(config, rules, promise + 1, enable_caching=True)
    own_promise = admission.promised(convert.plan_from_vllm_config(own, rules.context(), BUDGET))
    runs_on_own = admission.admitted(own, rules, start=own_promise, enable_caching=True)
    assert runs_on_own <= own_promise
    if rules.async_scheduling:
        assert runs_on_own < own_promise


def test_a_state_block_other_than_vllms_mamba_block_is_refused_with_the_fix():
    specs, block = _vllm_side("Jamba (Mamba-1)")
    with pytest.raises(VllmIntegrationError, match=f"block_size={block}"):
        plugin.kvcore_plans(_engine(2 * block), [specs], [BUDGET], "shared_buffer")


def test_a_state_per_block_has_no_vllm_form():
    state = next(s for s in MAMBA2.values() if isinstance(s, StateSpec))
    with pytest.raises(VllmIntegrationError, match="'all'"):
        VllmRules(max_model_len=LENGTH, state_cache_mode="all")
    with pytest.raises(VllmIntegrationError, match="state_cache_mode 'align'"):
        convert.spec_to_vllm(attrs.evolve(state, cache_mode="all"))


def test_a_checkpoint_grid_the_state_block_is_off_is_refused():
    state = attrs.evolve(next(s for s in GDN.values() if isinstance(s, StateSpec)), cache_mode="align")
    with pytest.raises(VllmIntegrationError, match="prefill checkpoint alignment, 64"):
        convert.spec_to_vllm(state, state_block=80)


def test_a_state_padded_per_tensor_is_refused_by_name():
    if "state_alignment" not in {field.name for field in dataclasses.fields(vk.MambaSpec)}:
        pytest.skip("this vLLM's MambaSpec has no state_alignment (0.34 added it)")
    spec = vk.MambaSpec(
        block_size=16, shapes=((3, 60), (5,)), dtypes=(torch.bfloat16,) * 2, state_alignment=16
    )
    with pytest.raises(VllmIntegrationError, match="state_alignment"):
        convert.spec_from_vllm("model.layers.0.mixer", spec)
