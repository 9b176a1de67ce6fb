"""The engines' planning functions take a request sized by their rules
(``kvcore.integrations.engine_rules``), and refuse any other (the keyword form of 0.1, removed
in 0.3: tests/plugins/test_removed_in_0_3.py). Runs without any engine installed."""

from __future__ import annotations

import attrs
import pytest

from kvcore import InvalidInputError, PlanOptions, SizingContext
from kvcore.integrations.sglang.rules import SglangRules, plan_for_sglang
from kvcore.integrations.transformers.rules import TransformersRules, plan_for_transformers
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest
from tests.helpers import full, mix, sliding

BUILTIN = Registry.default(autoload=False)
SPECS = mix((2, full()), (6, sliding(1024)))
BUDGET = 2**30

#: (the planning function, its rules, the policy the old form is given)
ENGINES = {
    "vllm": (plan_for_vllm, VllmRules(max_model_len=8192, max_num_batched_tokens=512), "shared_buffer"),
    "sglang": (plan_for_sglang, SglangRules(context_len=8192, page_size=16), "kind_pools"),
    "transformers": (plan_for_transformers, TransformersRules(max_model_len=8192), "shared_buffer"),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_rules_request_plans_with_the_policy_and_options_given(engine):
    function, rules, policy = ENGINES[engine]
    options = PlanOptions(max_groups=4)
    answer = function(rules.request(SPECS, BUDGET, policy=policy, options=options), rules, registry=BUILTIN)
    plan = getattr(answer, "plan", answer)  # transformers' answer holds the plan and its layout
    assert plan.policy == policy and plan.num_blocks > 0


def test_sglangs_request_plans_sglangs_own_layout_unless_told():
    rules = ENGINES["sglang"][1]
    assert rules.request(SPECS, BUDGET).policy == "kind_pools"
    assert rules.request(SPECS, BUDGET, policy="shared_buffer").policy == "shared_buffer"
    assert plan_for_sglang(rules.request(SPECS, BUDGET), rules, registry=BUILTIN).policy == "kind_pools"


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_request_the_rules_did_not_size_is_refused(engine):
    function, rules, _ = ENGINES[engine]
    context = rules.context()
    unsized = [
        # vLLM's step is its batches in flight: a request of the engine's step alone plans too few tokens
        PlanRequest.for_context(SPECS, BUDGET, attrs.evolve(context, max_num_batched_tokens=1)),
        PlanRequest.for_context(SPECS, BUDGET, context.with_max_model_len(context.max_model_len // 2)),
        PlanRequest.for_context(SPECS, BUDGET, context, auto_length=True),
    ]
    for request in unsized:
        with pytest.raises(InvalidInputError, match=r"rules\.request\(specs, available_bytes"):
            function(request, rules, registry=BUILTIN)
    ranks = PlanRequest.for_context(
        SPECS, [BUDGET, BUDGET], context, rank_layers=[list(SPECS)[:4], list(SPECS)[4:]]
    )
    with pytest.raises(InvalidInputError, match="the budgets of 2 ranks"):
        function(ranks, rules, registry=BUILTIN)


def test_the_rules_size_the_request_as_the_engine_runs():
    rules = ENGINES["vllm"][1]
    request = rules.request(SPECS, BUDGET, num_blocks=100)
    assert (
        request.context == rules.context() == SizingContext(max_model_len=8192, max_num_batched_tokens=1024)
    )
    assert request.num_blocks == 100 and request.budgets == (BUDGET,)
