"""The longest admitted request: suggestions that hold and ``max_model_len="auto"`` (issue 12)."""

import pytest

from kvcore import InsufficientMemoryError, InvalidInputError, SizingContext, plan_kv_cache
from kvcore.engine.workflow import initialize_kv_caches
from kvcore.limits import MAX_TOKENS
from kvcore.planning.max_len import largest_admitted_len, memory_bound
from kvcore.planning.planner import longest_admitted, plan as plan_request
from kvcore.planning.ranks import plan_for_ranks
from kvcore.planning.request import PlanRequest
from tests.helpers import RecordingExecutor, full, mix, sliding

# issue 12's reproducer: 1 full + 36 sliding(4096), bf16 8 x 128, block 16
REPRO = mix((1, full()), (36, sliding(4096)))
REPRO_BYTES = 938_292_019


def admitted(registry, specs, budget, length, **kwargs):
    try:
        plan_kv_cache(specs, budget, SizingContext(max_model_len=length), registry=registry, **kwargs)
    except InsufficientMemoryError:
        return False
    return True


def test_the_issue_reproducer_gets_a_suggestion_that_plans(registry):
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache(REPRO, REPRO_BYTES, SizingContext(max_model_len=32768), registry=registry)
    suggestion = info.value.largest_fitting_len
    # the plan at 32,768 groups differently (its own estimate is 7,168); at 7,312 the tolerant
    # grouping holds no request, and the planner takes tolerance 0's (one group per layer),
    # which does: the tolerance never shortens the longest request (it once suggested 6,400)
    assert suggestion == 7312
    assert f"lower max_model_len to {suggestion}" in str(info.value)
    assert admitted(registry, REPRO, REPRO_BYTES, suggestion)
    assert not admitted(registry, REPRO, REPRO_BYTES, suggestion + 1)
    assert admitted(registry, REPRO, REPRO_BYTES, 7168)
    plan = plan_kv_cache(REPRO, REPRO_BYTES, SizingContext(max_model_len=suggestion), registry=registry)
    assert len(plan.groups) == 37


def test_the_search_costs_a_few_plans(registry):
    search = longest_admitted(
        PlanRequest.for_context(REPRO, [REPRO_BYTES], SizingContext(max_model_len=32768), check_fit=False),
        registry=registry,
    )
    assert search.length == 7312
    assert search.plans <= 20


def test_ranks_get_a_suggestion_that_holds(registry):
    specs = mix((2, full()), (22, sliding(1024)))
    stages = [dict(list(specs.items())[:12]), dict(list(specs.items())[12:])]
    memory = [300 * 2**20, 200 * 2**20]
    with pytest.raises(InsufficientMemoryError) as info:
        plan_for_ranks(stages, memory, SizingContext(max_model_len=131072), registry=registry)
    suggestion = info.value.largest_fitting_len
    assert suggestion > 0
    plan_for_ranks(stages, memory, SizingContext(max_model_len=suggestion), registry=registry)
    with pytest.raises(InsufficientMemoryError):
        plan_for_ranks(stages, memory, SizingContext(max_model_len=suggestion + 1), registry=registry)


class _Plan:
    """A stand-in plan that fits lengths in ``admitted`` only (the search reads fits and
    largest_fitting_len)."""

    def __init__(self, ok, estimate):
        self.ok, self.estimate = ok, estimate

    def fits(self):
        return self.ok

    def largest_fitting_len(self, upper=None):
        return self.estimate


@pytest.mark.parametrize("estimate", [1, 50, 99, 150, 180])
def test_the_search_ends_on_an_admitted_length_whose_successor_is_refused(estimate):
    # admission that is not monotone: 1-100 and 140-160 admitted, everything else refused
    admitted_lengths = set(range(1, 101)) | set(range(140, 161))

    def plans_at(length):
        return [_Plan(length in admitted_lengths, estimate if estimate < length else length - 1)]

    found = largest_admitted_len(plans_at, 200).length
    assert found in admitted_lengths and found + 1 not in admitted_lengths


def test_the_search_says_0_when_one_token_is_refused():
    assert largest_admitted_len(lambda length: [_Plan(False, 0)], 1000).length == 0


def test_the_memory_bound():
    specs = {"a": full()}  # 4 KiB per token, 64 KiB per block
    assert memory_bound([specs], [64 * 2**10 * 50 + 100], SizingContext(max_model_len=1)) == 800  # 50 blocks
    assert memory_bound([specs], [10], SizingContext(max_model_len=1)) == 0
    assert memory_bound([{"a": sliding(128)}], [2**30], SizingContext(max_model_len=1)) is None


# -- max_model_len="auto" ------------------------------------------------------------------


def test_auto_is_the_longest_admitted_length(registry):
    plan = plan_kv_cache(
        REPRO, REPRO_BYTES, SizingContext(max_model_len=MAX_TOKENS), registry=registry, max_model_len="auto"
    )
    assert plan.context.max_model_len == 7312
    result = plan_request(
        PlanRequest.for_context(REPRO, [REPRO_BYTES], SizingContext(max_model_len=131072), auto_length=True),
        registry=registry,
    )
    assert result.length is not None
    assert (result.length.max_model_len, result.length.cap, result.length.limited_by) == (
        7312,
        131072,
        "memory",
    )


def test_auto_stops_at_the_cap(registry):
    result = plan_request(
        PlanRequest.for_context(REPRO, [2**40], SizingContext(max_model_len=8192), auto_length=True),
        registry=registry,
    )
    assert result.plans[0].context.max_model_len == 8192
    assert result.length is not None and result.length.limited_by == "cap"


def test_auto_for_ranks(registry):
    stages = [mix((1, full()), (5, sliding(512))), {f"x.{i}": full() for i in range(6)}]
    plans = plan_for_ranks(
        stages,
        [2**28, 2**28],
        SizingContext(max_model_len=MAX_TOKENS),
        registry=registry,
        max_model_len="auto",
    )
    length = plans[0].context.max_model_len
    assert all(plan.context.max_model_len == length for plan in plans)
    with pytest.raises(InsufficientMemoryError):
        plan_for_ranks(stages, [2**28, 2**28], SizingContext(max_model_len=length + 1), registry=registry)


def test_auto_needs_a_bound_when_the_need_stops_growing(registry):
    with pytest.raises(InvalidInputError, match="cannot choose max_model_len automatically"):
        plan_kv_cache(
            {"a": sliding(128)},
            2**30,
            SizingContext(max_model_len=MAX_TOKENS),
            registry=registry,
            max_model_len="auto",
        )
    # with a cap, the cap is the answer
    plan = plan_kv_cache(
        {"a": sliding(128)}, 2**30, SizingContext(max_model_len=4096), registry=registry, max_model_len="auto"
    )
    assert plan.context.max_model_len == 4096


def test_auto_when_not_one_token_fits(registry):
    with pytest.raises(InsufficientMemoryError, match="not even a one-token request fits"):
        plan_kv_cache(
            {"a": full()}, 100, SizingContext(max_model_len=4096), registry=registry, max_model_len="auto"
        )


def test_initialize_kv_caches_with_auto(registry):
    executor = RecordingExecutor(REPRO, REPRO_BYTES)
    plan = initialize_kv_caches(executor, registry=registry, max_model_len="auto")
    assert plan.context.max_model_len == 7312 and executor.plan is plan
    capped = initialize_kv_caches(
        RecordingExecutor(REPRO, REPRO_BYTES),
        registry=registry,
        max_model_len="auto",
        context=SizingContext(max_model_len=4000),
    )
    assert capped.context.max_model_len == 4000
