"""Chunked local attention under vLLM's prefix cache: vLLM 0.33 looks a chunked local group up
only when its block is the scheduler's (the least common multiple of every group's block size;
``ChunkedLocalAttentionManager.find_longest_cache_hit`` asserts it), so ``plan_for_vllm`` gives a
model with chunked local layers one block size, ``check_runnable`` refuses a plan that breaks the
rule, and the ``vllm`` scheduler profile hits on such groups from their chunk's start (no vLLM
needed; ``test_scheduler_profile.py`` checks the hits against vLLM's real scheduler)."""

from __future__ import annotations

import math
import warnings

import pytest

from kvcore import model_layer_specs, plan_kv_cache, simulate
from kvcore.errors import SimulationWarning
from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules, check_runnable, plan_for_vllm
from kvcore.simulation.workload import parse_length, synthetic

GIB = 2**30
SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"


def _plans(registry):
    """Llama-4-Scout at 8 GiB, max_model_len 16,384: ``plan_for_vllm``'s plan, and the plan
    ``shared_buffer`` makes under the same rules left to choose its block sizes."""
    rules = VllmRules(max_model_len=16384)
    specs = model_layer_specs(SCOUT, registry)
    request = rules.request(specs, 8 * GIB, policy="shared_buffer")
    free = plan_kv_cache(
        specs, 8 * GIB, rules.context(), registry=registry, policy="shared_buffer", options=rules.options()
    )
    return plan_for_vllm(request, rules, registry=registry), free


def test_plan_for_vllm_gives_chunked_local_groups_the_scheduler_block(registry):
    made, free = _plans(registry)
    scheduler_block = math.lcm(*(g.spec.block_size for g in made.groups))
    assert {g.spec.block_size for g in made.groups} == {scheduler_block}
    check_runnable(made)
    # the case's premise: left to itself the policy enlarges some blocks, chunked ones among them
    sizes = {g.spec.kind: set() for g in free.groups}
    for g in free.groups:
        sizes[g.spec.kind].add(g.spec.block_size)
    assert len(sizes["chunked_local_attention"] | sizes["full_attention"]) > 1
    # one block size costs nothing here: every layer's page is the same per token
    assert made.max_concurrency() >= free.max_concurrency()


def test_a_chunked_group_off_the_scheduler_block_is_refused(registry):
    _, free = _plans(registry)
    with pytest.raises(
        VllmIntegrationError, match=r"chunked local attention group \d+ blocks of 16 tokens"
    ) as caught:
        check_runnable(free)
    assert "(32 tokens" in str(caught.value) and "uniform_block_size=True" in str(caught.value)


def test_the_vllm_profile_hits_chunked_groups_only_on_the_scheduler_block(registry):
    made, free = _plans(registry)
    prompt, output = parse_length("lognormal:600:0.5"), parse_length("lognormal:100:0.5")
    workload = synthetic(
        60, prompt, output, rate=0.5, seed=4, max_model_len=16384, prefix_share=0.8, prefix_tokens=512
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulationWarning)  # a plan vLLM runs: nothing to warn of
        hit = simulate(made, workload, prefix_caching=True, registry=registry)
    assert hit.cached_tokens > 0
    # vLLM would stop at its assertion on this plan; the profile lets its chunked groups never
    # hit, and a hit needs every group, so nothing hits, and it says so
    with pytest.warns(SimulationWarning, match=r"group 0 has blocks of 16 tokens, not the scheduler's 32"):
        missed = simulate(free, workload, prefix_caching=True, registry=registry)
    assert missed.cached_tokens == 0


def test_the_command_line_replays_the_plan_vllm_runs_which_has_nothing_to_warn_of(capsys):
    """``kvcore simulate`` under the vllm profile plans each candidate as vLLM runs it
    (``plan_for_vllm``: one block size for a model with chunked local attention), so the
    profile's warning of a chunked group off the scheduler block, which kvcore's own
    ``shared_buffer`` plan of Llama 4 would draw (the API still warns of it, above), does not
    arise, and the plans line says which plan was replayed."""
    from kvcore.cli import main

    argv = [
        *("simulate", "--model", SCOUT, "--memory", "8GiB", "--max-model-len", "8192"),
        *("--requests", "20", "--prompt-len", "uniform:64:256", "--output-len", "uniform:8:32"),
        *("--prefix-caching", "--policies", "shared_buffer,kind_pools"),
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "chunked local attention group" not in err
    assert "plans: as vLLM runs them (plan_for_vllm" in out
