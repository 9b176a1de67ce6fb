"""The plan request: one checked value the planner takes (``kvcore.planning.request``), the
keyword function as a thin wrapper around it, and the length as a number or auto with a cap."""

import pytest

from kvcore import InsufficientMemoryError, InvalidInputError, InvalidSpecError, PlanOptions, SizingContext
from kvcore.limits import MAX_TOKENS
from kvcore.planning.planner import longest_admitted, plan, plan_kv_cache
from kvcore.planning.request import MaxModelLen, PlanRequest, sizing_of
from tests.helpers import full, mix, sliding

# issue 12's reproducer (tests/planning/test_max_len.py): the grouping changes with the length
REPRO = mix((1, full()), (36, sliding(4096)))
REPRO_BYTES = 938_292_019
SPECS = mix((2, full()), (6, sliding(1024)))


def request(**fields):
    return PlanRequest(**{"specs": SPECS, "budgets": 2**30, "max_model_len": 8192, **fields})


# -- the length -------------------------------------------------------------------------------


def test_a_length_is_a_number_or_auto_with_a_cap():
    assert MaxModelLen.of(8192) == MaxModelLen(8192) == MaxModelLen.fixed(8192)
    assert MaxModelLen(8192).cap is None and not MaxModelLen(8192).auto
    assert MaxModelLen.of("auto", cap=131072) == MaxModelLen(131072, auto=True)
    assert MaxModelLen.up_to(131072).cap == 131072
    assert MaxModelLen.up_to().tokens == MAX_TOKENS and MaxModelLen.up_to().cap is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "'max_model_len' must be an int >= 1"),
        (1.5, "or 'auto' \\(got 1.5\\)"),
        (MAX_TOKENS + 1, "MAX_TOKENS"),
        ("long", "or 'auto'"),
    ],
)
def test_a_bad_length_is_named(value, words):
    with pytest.raises(InvalidInputError, match=words):
        MaxModelLen.of(value)


def test_auto_must_be_a_bool():
    with pytest.raises(InvalidInputError, match="'auto' must be True or False"):
        MaxModelLen(8192, auto="yes")


# -- the request's fields ---------------------------------------------------------------------


def test_the_context_defaults_to_the_length_and_a_given_one_must_agree():
    assert request().context == SizingContext(max_model_len=8192)
    steps = SizingContext(max_model_len=8192, max_num_batched_tokens=512)
    assert request(context=steps).context is steps
    with pytest.raises(InvalidInputError, match=r"context\.max_model_len=4096 but max_model_len 8192"):
        request(context=SizingContext(max_model_len=4096))
    with pytest.raises(InvalidInputError, match="the cap of max_model_len='auto'"):
        request(max_model_len=MaxModelLen(8192, auto=True), context=SizingContext(max_model_len=4096))


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        ({"specs": [full()]}, InvalidSpecError, "must be a mapping of layer name to spec"),
        ({"specs": {"l0": "full"}}, InvalidSpecError, "l0"),
        ({"budgets": []}, InvalidInputError, "no rank budgets given"),
        ({"budgets": -1}, InvalidInputError, "available memory in bytes must be an int >= 0"),
        ({"budgets": [1, 2.5]}, InvalidInputError, "rank 1: available memory"),
        ({"context": "long"}, InvalidInputError, "context must be a kvcore.SizingContext"),
        ({"policy": 3}, InvalidInputError, "policy must be a policy name"),
        ({"options": {"max_groups": 2}}, InvalidInputError, "options must be a kvcore.PlanOptions"),
        ({"num_blocks": 0}, InvalidInputError, "'num_blocks' must be an int >= 1"),
        ({"num_blocks": []}, InvalidInputError, "one count per pool"),
        ({"num_blocks": (10, True)}, InvalidInputError, "'num_blocks' must be an int >= 1"),
        ({"check_fit": 1}, InvalidInputError, "'check_fit' must be True or False"),
        ({"budgets": [1, 1], "rank_layers": [{"l0"}]}, InvalidInputError, "the layers of 1 rank"),
        ({"rank_layers": "l0"}, InvalidInputError, "rank_layers must be one collection"),
        ({"budgets": [1, 1]}, InvalidInputError, "the memory of 2 ranks but not their layers"),
        (
            {"budgets": [2**30, 2**30], "rank_layers": [{"l0"}, {"l1"}], "rank_names": ["a"]},
            InvalidInputError,
            "got 1 rank names for 2 ranks",
        ),
    ],
)
def test_every_field_is_checked_when_the_request_is_made(fields, error, words):
    with pytest.raises(error, match=words):
        request(**fields)


def test_rank_budgets_are_named_by_the_ranks():
    layers = [set(list(SPECS)[:4]), set(list(SPECS)[4:])]
    with pytest.raises(InvalidInputError, match=r"^stage 1: available memory in bytes"):
        request(budgets=[2**30, -5], rank_layers=layers, rank_names=["stage 0", "stage 1"])


# -- the planner takes it ---------------------------------------------------------------------


def test_the_keyword_function_plans_what_the_request_plans(registry):
    options = PlanOptions(max_groups=2)
    by_request = plan(request(options=options, policy="shared_buffer"), registry=registry)
    by_keywords = plan_kv_cache(
        SPECS,
        2**30,
        SizingContext(max_model_len=8192),
        registry=registry,
        options=options,
        policy="shared_buffer",
    )
    assert by_request.plans == (by_keywords,)
    assert by_keywords.context.max_model_len == 8192


def test_auto_plans_the_longest_admitted_length_and_says_how(registry):
    auto = plan(
        PlanRequest(specs=REPRO, budgets=REPRO_BYTES, max_model_len=MaxModelLen.up_to(32768)),
        registry=registry,
    )
    assert auto.length is not None
    assert auto.length.max_model_len == 7312  # the suggestion test_max_len's reproducer checks
    assert auto.length.limited_by == "memory" and auto.length.cap == 32768
    assert auto.plans[0].context.max_model_len == 7312


def test_a_refusal_names_the_longest_length_the_search_finds(registry):
    refused = PlanRequest(specs=REPRO, budgets=REPRO_BYTES, max_model_len=32768)
    with pytest.raises(InsufficientMemoryError) as info:
        plan(refused, registry=registry)
    search = longest_admitted(refused, registry=registry)
    assert info.value.largest_fitting_len == search.length == 7312
    # admitted at the length, refused one token later: the search's promise
    plan(refused.at_length(search.length), registry=registry)
    with pytest.raises(InsufficientMemoryError):
        plan(refused.at_length(search.length + 1), registry=registry)


def test_check_fit_off_returns_the_plan_that_holds_no_request(registry):
    result = plan(
        PlanRequest(specs=REPRO, budgets=REPRO_BYTES, max_model_len=32768, check_fit=False), registry=registry
    )
    assert not result.plans[0].fits()


def test_no_layers_is_a_plan_of_nothing(registry):
    (empty,) = plan(PlanRequest(specs={}, budgets=2**20, max_model_len="auto"), registry=registry).plans
    assert empty.num_blocks == 0 and not empty.groups


# -- one place reconciles a context and a length -----------------------------------------------


def test_sizing_of_reconciles_context_and_length_once():
    context = SizingContext(max_model_len=4096, max_num_batched_tokens=256)
    assert sizing_of(context, None) == (context, MaxModelLen(4096))
    assert sizing_of(None, 2048) == (SizingContext(max_model_len=2048), MaxModelLen(2048))
    assert sizing_of(context, "auto") == (context, MaxModelLen(4096, auto=True))
    assert sizing_of(None, "auto")[1] == MaxModelLen.up_to()
    assert sizing_of(context, MaxModelLen(4096, auto=True)) == (context, MaxModelLen(4096, auto=True))
    with pytest.raises(InvalidInputError, match="give the request length"):
        sizing_of(None, None)
    with pytest.raises(InvalidInputError, match=r"context\.max_model_len=4096 and max_model_len=8192"):
        sizing_of(context, 8192)


def test_the_keyword_function_takes_auto_or_none_and_nothing_else(registry):
    # a number once sent the keyword form down the auto path silently; the length goes in the context
    with pytest.raises(InvalidInputError, match="max_model_len takes 'auto' or None here"):
        plan_kv_cache(SPECS, 2**30, SizingContext(max_model_len=8192), registry=registry, max_model_len=8192)
