"""transformers' paged-cache rules in kvcore's terms (``kvcore.integrations.transformers.rules``):
hand-computed layouts, the sectors a number of requests takes, page-size choice and refusals.
Torch-free: the same figures against transformers' real cache are in
``tests/engine/decode/test_continuous_batching.py``."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from kvcore.errors import KVCoreError
from kvcore.integrations.transformers.rules import (
    ALLOCATOR_OF_KIND,
    PAGE_SIZES,
    RUNNABLE_POLICIES,
    TRASH_SECTORS,
    TransformersIntegrationError,
    TransformersRules,
    capabilities,
    check_runnable,
    layout_in,
    own_layout,
    plan_for_transformers,
)
from kvcore.planning.planner import plan_kv_cache
from kvcore.spec import SizingContext
from tests.helpers import chunked, full, mix, sliding

MIB = 1 << 20
RULES = TransformersRules(max_model_len=4096)


def gemma3_like(block_size=256):
    """Five sliding layers (window 1024) to one full, 8 KV heads of 128, bfloat16: a page of
    256 tokens is 2 x 8 x 128 x 2 x 256 bytes = 1 MiB."""
    return mix((5, sliding(1024, block_size=block_size)), (1, full(block_size=block_size)))


def test_a_sliding_hybrid_laid_out_by_hand():
    layout = layout_in(gemma3_like(), 100 * MIB, 256)

    sliding_, full_ = sorted(layout.allocators, key=lambda a: a.attention, reverse=True)
    assert (sliding_.attention, full_.attention) == ("sliding_attention", "full_attention")
    assert sliding_.bytes_per_block == 5 * MIB and full_.bytes_per_block == MIB
    assert layout.bytes_per_sector == 5 * MIB  # lcm(5 MiB, 1 MiB, 128)
    # 20 sectors in 100 MiB, 2 of them trash; 18 x 5 MiB hold 15 whole-model blocks of 6 MiB,
    # which transformers rounds back up to exactly 18 sectors
    assert layout.num_sectors == 18
    assert layout.num_blocks == 15 and layout.configured_sectors == 18
    assert layout.cache_bytes == 100 * MIB
    # a request of 4096 tokens: a ring of 4 sliding blocks (one sector each) and 16 full blocks
    # (five to a sector): 4 + 4 sectors; two take 8 + ceil(32 / 5) = 15, three 12 + 10 = 22
    assert [layout.sectors_for(n, 4096) for n in (1, 2, 3)] == [8, 15, 22]
    assert layout.sequences_held(4096) == 2
    # the window bounds the sliding ring, so short requests cost their full blocks and one ring
    assert sliding_.blocks_per_request(100) == 1 and sliding_.blocks_per_request(5000) == 4


def test_transformers_own_sizing_rounds_up_and_adds_the_trash_beyond_the_budget():
    own = own_layout(gemma3_like(), 100 * MIB)

    # 100 MiB // 6 MiB = 16 whole-model blocks -> ceil(96 / 5) = 20 sectors, plus 2 of trash
    assert own.num_sectors == 20
    assert own.cache_bytes == 110 * MIB
    assert own.sequences_held(4096) == 2


def test_the_largest_page_among_the_best_wins(registry):
    specs = mix((2, full(block_size=16, heads=2, head_size=8, dtype="float32")))
    rules = TransformersRules(max_model_len=32, max_batch_tokens=16)

    chosen = plan_for_transformers(rules.request(specs, 1 << 16), rules, registry=registry)

    each = {}
    for size in PAGE_SIZES:
        try:
            each[size] = plan_for_transformers(
                rules.request(specs, 1 << 16), rules, registry=registry, page_sizes=(size,)
            )
        except TransformersIntegrationError:  # 64 KiB is less than trash and one sector at large pages
            assert size >= 64
    best = max(p.sequences_held for p in each.values())
    assert chosen.sequences_held == best
    assert chosen.layout.page_size == max(size for size, p in each.items() if p.sequences_held == best)
    assert chosen.layout.page_size == 16  # 32 tokens are two pages of 16: nothing wasted, fewest pages
    assert chosen.config_fields() == {
        "page_size": 16,
        "num_blocks": chosen.layout.num_blocks,
        "max_batch_tokens": 16,
    }
    assert chosen.layout.cache_bytes <= chosen.plan.kv_cache_bytes <= 1 << 16


@given(
    sliding_layers=st.integers(0, 6),
    full_layers=st.integers(0, 6),
    window=st.integers(1, 300),
    page=st.sampled_from(PAGE_SIZES),
    heads=st.sampled_from([1, 2, 8]),
    budget=st.integers(1, 1 << 24),
    tokens=st.integers(1, 2000),
)
def test_the_cache_fits_its_budget_and_holds_exactly_what_its_sectors_allow(
    sliding_layers, full_layers, window, page, heads, budget, tokens
):
    if sliding_layers + full_layers == 0:
        return
    specs = mix(
        *[
            (n, spec)
            for n, spec in ((sliding_layers, sliding(window, heads=heads)), (full_layers, full(heads=heads)))
            if n
        ]
    )
    try:
        layout = layout_in(specs, budget, page)
    except TransformersIntegrationError:
        sector = math.lcm(*(n * 2 * heads * 128 * 2 * page for n in (sliding_layers, full_layers) if n), 128)
        model_block = (sliding_layers + full_layers) * 2 * heads * 128 * 2 * page
        room = budget // sector - TRASH_SECTORS
        assert room < 1 or room * sector < model_block  # refused only when not one model block fits
        return
    assert layout.cache_bytes <= budget
    assert layout.configured_sectors == layout.num_sectors, "the num_blocks given makes the sectors planned"
    held = layout.sequences_held(tokens)
    assert layout.sectors_for(held, tokens) <= layout.num_sectors < layout.sectors_for(held + 1, tokens)


def test_layers_transformers_has_no_allocator_for_are_refused(registry):
    rules = TransformersRules(max_model_len=64)
    with pytest.raises(TransformersIntegrationError, match="chunked_local_attention"):
        plan_for_transformers(
            rules.request(mix((3, chunked(64)), (1, full())), MIB * 64), rules, registry=registry
        )
    with pytest.raises(TransformersIntegrationError, match=r"windows \[128, 512\]"):
        plan_for_transformers(
            rules.request(mix((2, sliding(128)), (2, sliding(512))), MIB * 64), rules, registry=registry
        )
    with pytest.raises(TransformersIntegrationError, match="bytes per token"):
        plan_for_transformers(
            rules.request(mix((2, full(head_size=64)), (2, full())), MIB * 64), rules, registry=registry
        )
    with pytest.raises(TransformersIntegrationError, match="page sizes"):
        plan_for_transformers(
            rules.request(gemma3_like(), MIB * 64), rules, registry=registry, page_sizes=(2,)
        )


def test_several_pools_are_refused(registry):
    specs = gemma3_like(block_size=16)
    plan = plan_kv_cache(
        specs, 256 * MIB, SizingContext(max_model_len=4096), registry=registry, policy="kind_pools"
    )
    assert not plan.runs_in_one_pool
    with pytest.raises(TransformersIntegrationError, match="one pool of sectors"):
        check_runnable(plan)
    with pytest.raises(TransformersIntegrationError, match="one pool of sectors"):
        plan_for_transformers(RULES.request(specs, 256 * MIB, policy="kind_pools"), RULES, registry=registry)


def test_too_little_memory_says_so(registry):
    with pytest.raises(KVCoreError):
        plan_for_transformers(RULES.request(gemma3_like(), 4 * MIB), RULES, registry=registry)


@pytest.mark.parametrize("policy", RUNNABLE_POLICIES)
def test_the_policies_the_matrix_lists_run(registry, policy):
    specs = gemma3_like(block_size=16) if policy != "uniform" else mix((4, full(block_size=16)))
    made = plan_for_transformers(RULES.request(specs, 512 * MIB, policy=policy), RULES, registry=registry)
    check_runnable(made.plan)
    assert made.plan.policy == policy and made.sequences_held >= 1


def test_every_builtin_policy_is_listed_or_refused(registry):
    refused = set()
    for policy in registry.policies:
        try:
            plan_for_transformers(
                RULES.request(gemma3_like(16), 512 * MIB, policy=policy), RULES, registry=registry
            )
        except TransformersIntegrationError:
            refused.add(policy)
        except KVCoreError:  # the policy does not plan hybrids at all (uniform)
            assert policy in RUNNABLE_POLICIES
    assert refused == {"kind_pools", "unified_pool"}
    assert set(registry.policies) == set(RUNNABLE_POLICIES) | refused


def test_capabilities_are_read_from_the_tables(registry):
    caps = capabilities()
    assert caps.engine == "transformers"
    assert set(caps.kinds) == set(ALLOCATOR_OF_KIND) <= set(registry.kinds)
    assert set(caps.policies) == set(RUNNABLE_POLICIES) < set(registry.policies)
    assert "kind_pools" not in caps.policies and not caps.several_pools and not caps.mixed_pages


def test_the_rules_and_the_capabilities_need_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "from kvcore import Registry, get_plugin_manager\n"
        "from kvcore.integrations.transformers import rules\n"
        "from tests.helpers import full, mix, sliding\n"
        "registry = Registry.from_plugin_manager(get_plugin_manager(autoload=False))\n"
        "specs = mix((5, sliding(1024)), (1, full()))\n"
        "limits = rules.TransformersRules(max_model_len=4096)\n"
        "rules.plan_for_transformers(limits.request(specs, 1 << 30), limits, registry=registry)\n"
        "rules.capabilities()\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True
    )
    assert out.stdout.strip() == "[]"
