"""The trade a policy offers between capacity and block tables: its group-count frontier.

Fewer groups mean fewer block tables per request and fewer kernel arguments; more groups let a
policy fit pages of different sizes more tightly. :func:`policy_frontier` plans the same layers
with one policy under tighter and tighter bounds on the group count
(``PlanOptions(max_groups=k, grouping_tolerance=0)``: the best layout within the bound) and
keeps the Pareto points: each has fewer groups than the one before and strictly less capacity
(a layout with more groups and no more capacity is never worth its block tables).

The work is bounded whatever the model: the bound steps down one group at a time below
:data:`DENSE_GROUPS` groups and halves above it, and at most ``max_plans`` plans are made, so a
10,000-layer model with thousands of groups costs a few dozen plans.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kvcore.errors import InvalidSpecError, KVCoreError
from kvcore.plan import KVCachePlan
from kvcore.planning.capacity import Capacity, finite_or_none
from kvcore.planning.planner import plan as plan_request
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest, one_budget, takes_request
from kvcore.spec import KVCacheSpec
from kvcore.validators import check_int

#: Below this many groups the bound steps down one group at a time; above it, it halves.
DENSE_GROUPS = 16

#: The most plans :func:`policy_frontier` makes by default.
MAX_PLANS = 32


@attrs.frozen(kw_only=True)
class FrontierPoint:
    """One layout on a policy's frontier.

    Attributes:
        groups: its groups (block tables per request).
        pools: its block pools.
        max_concurrency: requests of ``max_model_len`` tokens it holds at once.
        efficiency: ``max_concurrency`` against the ideal bound.
    """

    groups: int
    pools: int
    max_concurrency: float
    efficiency: float

    def to_dict(self) -> dict[str, int | float | None]:
        """The point as JSON: ``{"groups", "pools", "max_concurrency", "efficiency"}``
        (``max_concurrency`` ``null`` when unbounded: a plan with no cache-holding layer)."""
        return {**attrs.asdict(self), "max_concurrency": finite_or_none(self.max_concurrency)}


@takes_request("specs, available_bytes, context", "policy_frontier(PlanRequest(...), registry=...)")
def policy_frontier(
    request: PlanRequest, *, registry: Registry, max_plans: int = MAX_PLANS
) -> tuple[FrontierPoint, ...]:
    """Capacity against group count for one policy: the layouts a user picks from.

    Args:
        request: the layers, the budget (one rank), the length and context, the policy (a
            name or object; ``"auto"`` is resolved as :func:`~kvcore.planning.planner.plan`
            resolves it) and its options (block sizes, null block; their ``max_groups`` and
            ``grouping_tolerance`` are replaced).
        registry: where the policy is looked up.
        max_plans: the most plans to make (at least 1).

    Returns:
        The Pareto points, most groups first: strictly fewer groups and strictly less
        concurrency at every step. Empty when the policy cannot plan the layers at all.

    Raises:
        InvalidSpecError: a spec is invalid (every policy would fail alike).
        InvalidInputError: ``max_plans`` is not an int >= 1, or the request is not of one
            rank at a given length (:func:`~kvcore.planning.request.one_budget`).
    """
    check_int(max_plans, "'max_plans'", minimum=1)
    one_budget(request, "policy_frontier")
    base = request.options
    points: list[FrontierPoint] = []
    bound: int | None = None
    for _ in range(max_plans):
        chosen = attrs.evolve(base, grouping_tolerance=0.0, max_groups=bound)
        try:
            plan = plan_request(attrs.evolve(request, options=chosen), registry=registry).plans[0]
        except InvalidSpecError:
            raise
        except KVCoreError:  # GroupLimitError: no layout this small; or nothing fits
            break
        groups = len(plan.groups)
        if bound is not None and groups > bound:
            break  # the policy does not take max_groups: nothing smaller to find
        point = _point(plan, request.specs)
        # a layout with more groups and no more capacity is dominated by this one
        while points and points[-1].max_concurrency <= point.max_concurrency:
            points.pop()
        points.append(point)
        if groups <= 1:
            break
        bound = groups - 1 if groups <= DENSE_GROUPS else max(DENSE_GROUPS, groups // 2)
    return tuple(points)


def _point(plan: KVCachePlan, specs: Mapping[str, KVCacheSpec]) -> FrontierPoint:
    capacity = Capacity.of(plan, specs)
    return FrontierPoint(
        groups=len(plan.groups),
        pools=len(plan.pools),
        max_concurrency=capacity.max_concurrency,
        efficiency=capacity.efficiency,
    )
