"""The deprecated keyword forms of the planning entry points (``kvcore.planning.keyword_form``):
each still plans, warns naming its replacement, and gives what the request form gives."""

import warnings

import pytest

from kvcore import InvalidInputError, PlanOptions, SizingContext
from kvcore.planning.compare import compare_policies
from kvcore.planning.frontier import policy_frontier
from kvcore.planning.keyword_form import keyword_request
from kvcore.planning.planner import largest_admitted, longest_admitted, plan, plan_longest, plan_model
from kvcore.planning.request import MaxModelLen, PlanRequest
from tests.helpers import full, mix, sliding

# issue 12's reproducer (tests/planning/test_max_len.py): 32,768 tokens do not fit, 7,312 do
REPRO = mix((1, full()), (36, sliding(4096)))
REPRO_BYTES = 938_292_019
SPECS = mix((2, full()), (6, sliding(1024)))
CONTEXT = SizingContext(max_model_len=8192)
OPTIONS = PlanOptions(max_groups=2)


def _candidates(candidates):
    # a candidate's failure is an exception object, equal only to itself: compare what it says
    return [(c.policy, c.block_size, c.plan, c.error) for c in candidates]


#: (the deprecated call, the request form, the replacement its warning names, a view to compare)
CASES = {
    "plan_model": (
        lambda r: plan_model(SPECS, [2**30], CONTEXT, registry=r, policy="shared_buffer", options=OPTIONS),
        lambda r: plan(
            PlanRequest(
                specs=SPECS, budgets=2**30, max_model_len=8192, policy="shared_buffer", options=OPTIONS
            ),
            registry=r,
        ),
        "plan\\(PlanRequest",
        lambda result: result,
    ),
    "plan_longest": (
        lambda r: plan_longest(REPRO, [REPRO_BYTES], SizingContext(max_model_len=32768), registry=r),
        lambda r: plan(
            PlanRequest(specs=REPRO, budgets=REPRO_BYTES, max_model_len=MaxModelLen.up_to(32768)), registry=r
        ),
        "plan\\(PlanRequest\\(.*MaxModelLen.up_to",
        lambda result: result,
    ),
    "largest_admitted": (
        lambda r: largest_admitted(REPRO, [REPRO_BYTES], SizingContext(max_model_len=32768), registry=r),
        lambda r: longest_admitted(
            PlanRequest(specs=REPRO, budgets=REPRO_BYTES, max_model_len=32768, check_fit=False), registry=r
        ),
        "longest_admitted\\(PlanRequest",
        lambda search: search,
    ),
    "compare_policies": (
        lambda r: compare_policies(
            SPECS, 2**30, CONTEXT, registry=r, policies=["uniform", "shared_buffer"], options=OPTIONS
        ),
        lambda r: compare_policies(
            PlanRequest.for_context(SPECS, 2**30, CONTEXT, options=OPTIONS),
            ["uniform", "shared_buffer"],
            registry=r,
        ),
        "compare_policies\\(PlanRequest",
        _candidates,
    ),
    "policy_frontier": (
        lambda r: policy_frontier(SPECS, 2**30, CONTEXT, registry=r, policy="shared_buffer", max_plans=3),
        lambda r: policy_frontier(
            PlanRequest.for_context(SPECS, 2**30, CONTEXT, policy="shared_buffer"), registry=r, max_plans=3
        ),
        "policy_frontier\\(PlanRequest",
        lambda points: points,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_keyword_form_warns_and_plans_what_the_request_plans(registry, name):
    old, new, replacement, view = CASES[name]
    with pytest.warns(DeprecationWarning, match=f"{name}\\(.* is deprecated: use {replacement}") as caught:
        by_keywords = old(registry)
    assert all(w.filename == __file__ for w in caught)  # the warning names the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the request form does not warn
        by_request = new(registry)
    assert view(by_keywords) == view(by_request)
    assert view(by_request)  # something was planned: the comparison compares plans


def test_the_keyword_form_still_checks_its_fields(registry):
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidInputError, match="'num_blocks'"):
        plan_model(SPECS, [2**30], CONTEXT, registry=registry, num_blocks=0)
    # an argument the old form never took is still refused, by the function itself
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="colour"):
        compare_policies(SPECS, 2**30, CONTEXT, registry=registry, colour="red")


def test_the_conversion_takes_the_request_fields_and_leaves_the_rest():
    fields = {"policy": "uniform", "num_blocks": 9, "max_model_len": "auto", "registry": None, "estimate": 5}
    with pytest.warns(DeprecationWarning, match="old\\(\\) is deprecated: use new\\(\\)"):
        made = keyword_request("old()", "new()", SPECS, [2**30], CONTEXT, fields)
    assert made == PlanRequest(
        specs=SPECS, budgets=2**30, max_model_len=MaxModelLen(8192, auto=True), policy="uniform", num_blocks=9
    )
    assert fields == {"registry": None, "estimate": 5}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"budgets": [2**30, 2**30], "rank_layers": [["a"], ["b"]]}, "the budgets of 2 ranks"),
        ({"max_model_len": "auto"}, "max_model_len='auto'"),
    ],
)
def test_one_rank_entry_points_refuse_what_they_cannot_plan(registry, fields, words):
    specs = {"a": full(), "b": full()}
    request = PlanRequest(**{"specs": specs, "budgets": 2**30, "max_model_len": 8192, **fields})
    with pytest.raises(InvalidInputError, match=words):
        compare_policies(request, registry=registry)
    with pytest.raises(InvalidInputError, match=words):
        policy_frontier(request, registry=registry)
