"""Compare policies (and block sizes, KV dtypes) on one model and budget.

Every figure comes from a real plan made by :func:`kvcore.planning.planner.plan` of the
request with the candidate's policy, exactly as ``kvcore plan --policy NAME`` would make it, so
the two commands always agree.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from kvcore.dtypes import DType, DTypeLike, to_dtype
from kvcore.errors import InvalidSpecError, KVCoreError
from kvcore.plan import KVCachePlan
from kvcore.planning.capacity import Capacity, ideal_concurrency
from kvcore.planning.planner import plan as plan_request
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest, one_budget, takes_request
from kvcore.spec import KVCacheSpec, resize_blocks


@attrs.frozen(kw_only=True)
class Candidate:
    """One policy's plan for one variant of the model (block size, KV dtype).

    Attributes:
        policy: the policy name.
        block_size: the block size asked for (``None``: as the specs say).
        kv_cache_dtype: the KV dtype asked for (``None``: as the specs say).
        state_cache_mode: the state cache mode asked for (``None``: as the context says).
        plan: the plan, or ``None`` when the policy could not make one.
        capacity: the plan's figures (:meth:`Capacity.of` the plan and this variant's specs),
            or ``None`` without a plan.
        ideal_concurrency: the bound for these specs and budget (with or without a plan).
        error: why there is no plan (one sentence), else ``None``.
        failure: the error itself, so that a front end can word it for its own users (the
            command line names its flags), else ``None``.
    """

    policy: str
    block_size: int | None
    kv_cache_dtype: DType | None
    plan: KVCachePlan | None
    capacity: Capacity | None
    ideal_concurrency: float
    error: str | None = None
    failure: KVCoreError | None = attrs.field(default=None, eq=False, repr=False)
    state_cache_mode: str | None = None

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` the plan holds (0 without a plan)."""
        return self.capacity.max_concurrency if self.capacity is not None else 0.0

    @property
    def efficiency(self) -> float:
        """``max_concurrency / ideal_concurrency`` (0 without a plan)."""
        return self.capacity.efficiency if self.capacity is not None else 0.0

    @property
    def padding_bytes(self) -> int | None:
        """Bytes one request of ``max_model_len`` takes beyond what its layers need."""
        return self.capacity.padding_bytes if self.capacity is not None else None


def with_kv_dtype(specs: Mapping[str, KVCacheSpec], dtype: DTypeLike) -> dict[str, KVCacheSpec]:
    """Give every spec that has a ``dtype`` field the cache dtype ``dtype``.

    Args:
        specs: ``{layer name: spec}``.
        dtype: the cache dtype: a :class:`~kvcore.dtypes.DType`, its name (``"fp8"``) or a
            ``torch.dtype``.

    Returns:
        The specs, those with a ``dtype`` field in the new dtype.

    Raises:
        InvalidSpecError: ``dtype`` cannot hold a cache.
    """
    dtype = to_dtype(dtype)
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        if "dtype" in attrs.fields_dict(type(spec)):
            out[name] = attrs.evolve(spec, dtype=dtype)  # type: ignore[call-arg]
        else:
            out[name] = spec
    return out


def variant_specs(
    specs: Mapping[str, KVCacheSpec],
    *,
    block_size: int | None = None,
    kv_cache_dtype: DTypeLike | None = None,
) -> dict[str, KVCacheSpec]:
    """``specs`` as one variant of :func:`compare_policies` plans them (a :class:`Candidate`'s
    ``block_size`` and ``kv_cache_dtype``; ``None`` keeps what the specs say).

    Raises:
        InvalidSpecError: the dtype cannot hold a cache, or a block size does not suit a spec.
    """
    variant = dict(specs)
    if kv_cache_dtype is not None:
        variant = with_kv_dtype(variant, kv_cache_dtype)
    if block_size is not None:
        variant = resize_blocks(variant, block_size)
    return variant


@takes_request("specs, available_bytes, context", "compare_policies(PlanRequest(...), registry=...)")
def compare_policies(
    request: PlanRequest,
    policies: Sequence[str] | None = None,
    *,
    registry: Registry,
    block_sizes: Iterable[int | None] = (None,),
    kv_cache_dtypes: Iterable[DTypeLike | None] = (None,),
    state_cache_modes: Iterable[str | None] = (None,),
    planner: Callable[[PlanRequest], KVCachePlan] | None = None,
) -> list[Candidate]:
    """Plan the request's specs with every policy (default: all registered), for every variant.

    Variants are every KV dtype x block size x state cache mode (a mode replaces the
    context's ``state_cache_mode``: what keeping states for prefix caching costs).

    A policy that cannot plan the specs, or whose plan cannot hold one request of
    ``max_model_len``, appears with ``plan=None`` and the reason in ``error``.

    Args:
        request: the specs, the budget, the length and context, the options (and a forced
            block count) every candidate is planned with; each policy of ``policies`` replaces
            its policy.
        policies: the policies to compare (default: every registered one).
        registry: where the policies are looked up.
        block_sizes, kv_cache_dtypes, state_cache_modes: the variants (``None``: as the
            request has it).
        planner: makes each candidate's plan from its request (default: kvcore's own,
            :func:`~kvcore.planning.planner.plan`); an engine's rules may stand behind it, as
            ``kvcore simulate`` plans the way vLLM runs a plan under a vLLM profile.

    Returns:
        Candidates, variant by variant, policies in registry order.

    Raises:
        InvalidSpecError: a variant's specs are invalid (every policy would fail alike).
    """
    names = list(policies) if policies is not None else list(registry.policies)
    out: list[Candidate] = []
    modes = list(state_cache_modes)
    available_bytes = one_budget(request, "compare_policies")
    for wanted in kv_cache_dtypes:
        dtype = to_dtype(wanted) if wanted is not None else None
        for block_size, mode in itertools.product(block_sizes, modes):
            variant = variant_specs(request.specs, block_size=block_size, kv_cache_dtype=dtype)
            sized = request.context if mode is None else attrs.evolve(request.context, state_cache_mode=mode)
            ideal = ideal_concurrency(variant, available_bytes, sized)
            for name in names:
                try:
                    candidate = attrs.evolve(request, specs=variant, context=sized, policy=name)
                    plan: KVCachePlan | None = (
                        planner(candidate)
                        if planner is not None
                        else plan_request(candidate, registry=registry).plans[0]
                    )
                    error, failure = None, None
                except InvalidSpecError:
                    raise
                except KVCoreError as exc:
                    plan, error, failure = None, str(exc), exc
                out.append(
                    Candidate(
                        policy=name,
                        block_size=block_size,
                        kv_cache_dtype=dtype,
                        plan=plan,
                        capacity=Capacity.of(plan, variant) if plan is not None else None,
                        ideal_concurrency=ideal,
                        error=error,
                        failure=failure,
                        state_cache_mode=mode,
                    )
                )
    return out
