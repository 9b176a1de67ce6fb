"""``max_groups`` and ``uniform_block_size`` over random spec mixes: the bound holds or the error
names the fewest groups, which then plans; a bound the usual plan keeps changes nothing; one
block size means one block size; every plan keeps its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kvcore import (
    GroupLimitError,
    InvalidInputError,
    PlanOptions,
    PolicyNotApplicableError,
    plan_kv_cache,
)
from kvcore.planning.invariants import plan_problems
from kvcore.testing import strategies as kst

pytestmark = pytest.mark.property


POLICIES = ["shared_buffer", "equal_groups"]


#: ``(specs, context)``: up to 16 layers, requests of up to 4,096 tokens.
INPUTS = st.tuples(kst.layer_specs(max_layers=16), kst.sizing_contexts(max_model_len=st.integers(1, 4096)))


def _plan(registry, specs, context, policy, options):
    return plan_kv_cache(
        specs, 2**26, context, registry=registry, policy=policy, options=options, check_fit=False
    )


@pytest.mark.parametrize("policy", POLICIES)
@given(drawn=INPUTS, bound=st.integers(1, 6), uniform=st.booleans())
def test_the_group_bound_holds_or_names_the_fewest(module_registry, policy, drawn, bound, uniform):
    specs, context = drawn
    if policy == "equal_groups" and module_registry.policy(policy).why_not(specs) is not None:
        return
    options = PlanOptions(max_groups=bound, uniform_block_size=uniform)
    try:
        plan = _plan(module_registry, specs, context, policy, options)
    except GroupLimitError as exc:
        assert exc.smallest_groups > bound
        fewest = _plan(
            module_registry,
            specs,
            context,
            policy,
            PlanOptions(max_groups=exc.smallest_groups, uniform_block_size=uniform),
        )
        assert len(fewest.groups) == exc.smallest_groups
        return
    except InvalidInputError as exc:  # block sizes without a common multiple within bounds
        assert uniform and "uniform_block_size" in str(exc)
        return
    except PolicyNotApplicableError as exc:  # one block size makes pages equal_groups refuses
        assert uniform and policy == "equal_groups" and "uniform_block_size" in str(exc)
        return
    assert len(plan.groups) <= bound
    assert plan_problems(plan, capacity=False) == []  # (planned past the fit: check_fit=False)
    if uniform:
        assert len({g.spec.block_size for g in plan.groups if g.spec.page_scales_with_block_size}) <= 1
    free = _plan(module_registry, specs, context, policy, PlanOptions(uniform_block_size=uniform))
    if len(free.groups) <= bound:
        assert plan == free, "a bound the usual plan keeps changes nothing"
