"""vLLM's rules for a KV-cache plan, and planning under them with any kvcore policy (no vLLM needed).

vLLM 0.33 runs a plan differently from kvcore's own block pool in four ways that change what a
plan holds; :func:`plan_for_vllm` plans for them:

1. **The null block.** vLLM's block pool keeps block id 0 back to pad block tables, so a pool of
   ``num_blocks`` ids serves requests with ``num_blocks - 1`` (``PlanOptions.reserve_null_block``).
2. **Tokens in flight.** A sliding-window or chunked layer frees its old blocks only once the
   tokens that read them are *processed*. vLLM sizes and admits them for
   ``max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens`` tokens: one batch
   when scheduling synchronously, two with async scheduling (vLLM 0.33's default), since the
   next batch is scheduled before the previous one returns. kvcore's sliding and chunked kinds
   size for ``SizingContext.max_num_batched_tokens`` tokens per step, so the plan is made with
   that field set to vLLM's tokens in flight (:meth:`VllmRules.context`).
3. **One block id per page.** vLLM's managers hand each group one block id per page. A kvcore
   plan whose state page spans an aligned run of several block ids (``blocks_per_page > 1``,
   ``shared_buffer`` on SSM hybrids, whose state group lays all its layers' states side by
   side) has no vLLM form, so the layers are re-planned until every page takes one block id:
   the state layers cut into ``k`` groups and the attention blocks ``f`` times larger (``f x
   block_size``, so a multiple of the kernel's block), keeping the ``(k, f)`` that holds the
   most requests.
4. **One backing allocation.** Every vLLM ``KVCacheTensor`` is a view of one buffer; a plan of
   separate tensors is laid end to end in one buffer when it is converted
   (:func:`kvcore.integrations.vllm.convert.plan_to_vllm_config`); its figures do not change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from kvcore.errors import KVCoreError, PolicyNotApplicableError
from kvcore.plan import KVCachePlan
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.spec import DEFAULT_MAX_NUM_BATCHED_TOKENS, KVCacheSpec, SizingContext, cdiv
from kvcore.validators import boolean, positive_int


class VllmIntegrationError(KVCoreError, ValueError):
    """Something kvcore and vLLM cannot agree on: a vLLM spec kind kvcore does not know, a plan
    vLLM cannot run, or vLLM missing or of a version the integration does not support."""


@attrs.frozen(kw_only=True)
class VllmRules:
    """The scheduler settings of a vLLM engine that a KV-cache plan depends on.

    Attributes:
        max_model_len: vLLM's ``max_model_len``.
        max_num_batched_tokens: vLLM's ``max_num_batched_tokens`` (the chunked-prefill budget
            of one step; kvcore's default, 2048, unless given).
        async_scheduling: vLLM's ``async_scheduling`` (the default in 0.33): two batches in
            flight instead of one.
    """

    max_model_len: int = attrs.field(validator=positive_int)
    max_num_batched_tokens: int = attrs.field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS, validator=positive_int)
    async_scheduling: bool = attrs.field(default=True, validator=boolean)

    @property
    def max_concurrent_batches(self) -> int:
        """Batches scheduled but not yet processed: 2 with async scheduling, else 1 (one
        pipeline stage; vLLM's ``VllmConfig.max_concurrent_batches``)."""
        return 2 if self.async_scheduling else 1

    @property
    def max_in_flight_tokens(self) -> int:
        """vLLM's ``VllmConfig.max_in_flight_tokens``: batches in flight x tokens per batch."""
        return self.max_concurrent_batches * self.max_num_batched_tokens

    def context(self) -> SizingContext:
        """The sizing context of a plan vLLM runs: the tokens in flight stand for the step.

        A sliding or chunked layer then holds ``window - 1 + max_in_flight_tokens`` tokens at
        worst, which is what vLLM's admission cap and pool sizing count.
        """
        return SizingContext(
            max_model_len=self.max_model_len, max_num_batched_tokens=self.max_in_flight_tokens
        )

    def options(self, options: PlanOptions | None = None) -> PlanOptions:
        """``options`` (or the defaults) with the null block reserved, as vLLM's pool keeps it,
        and one spec per group (no mixed-page groups, which kvcore does not convert yet)."""
        return attrs.evolve(options or PlanOptions(), reserve_null_block=True, mixed_pages=False)


def page_span(plan: KVCachePlan) -> int:
    """The most block ids one page of ``plan`` takes (``1``: vLLM can run it as it is)."""
    return max((g.blocks_per_page for g in plan.groups), default=1)


def check_runnable(plan: KVCachePlan) -> None:
    """Raise unless vLLM 0.33's one block pool and one page size per group can run ``plan``.

    Args:
        plan: a kvcore plan.

    Raises:
        VllmIntegrationError: the plan has several block pools (vLLM has one
            ``BlockPool``), or a group whose layers have different page sizes (vLLM puts such
            layers in one group only when they are the whole model, and kvcore does not
            convert those groups yet).
    """
    if plan.is_multi_pool:
        raise VllmIntegrationError(
            f"policy {plan.policy!r} made a plan of {len(plan.pools)} block pools, but vLLM 0.33 has one "
            "block pool shared by every group; plan for vLLM with a policy of one pool (shared_buffer, "
            "uniform, equal_groups)"
        )
    mixed = [index for index, group in enumerate(plan.groups) if group.layer_specs]
    if mixed:
        raise VllmIntegrationError(
            f"policy {plan.policy!r} made group(s) {mixed} of layers with different page sizes (mixed-page "
            "groups); kvcore does not convert them to vLLM's UniformTypeKVCacheSpecs yet; plan for vLLM "
            "with a policy whose groups have one spec each (shared_buffer, uniform, equal_groups)"
        )


def scale_blocks(specs: Mapping[str, KVCacheSpec], factor: int) -> dict[str, KVCacheSpec]:
    """``specs`` with every block size whose page scales with it multiplied by ``factor``
    (state pages keep theirs); equal specs stay one object."""
    scaled: dict[int, KVCacheSpec] = {}
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        new = scaled.get(id(spec))
        if new is None:
            new = spec.with_block_size(spec.block_size * factor) if spec.page_scales_with_block_size else spec
            scaled[id(spec)] = new
        out[name] = new
    return out


def plan_for_vllm(
    specs: Mapping[str, KVCacheSpec],
    available_bytes: int,
    rules: VllmRules,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    options: PlanOptions | None = None,
    num_blocks: int | None = None,
) -> KVCachePlan:
    """Plan ``specs`` with a kvcore policy so that vLLM runs the plan as kvcore counts it.

    The plan reserves the null block, is sized for vLLM's tokens in flight
    (:meth:`VllmRules.context`) and gives every page one block id (see the module docstring);
    its ``max_concurrency()`` is what vLLM's ``KVCacheManager`` admits.

    Args:
        specs: ``{layer name: spec}`` in model order, kvcore's specs (convert vLLM's with
            :func:`kvcore.integrations.vllm.convert.specs_from_vllm`).
        available_bytes: vLLM's KV-cache budget in bytes.
        rules: vLLM's scheduler settings.
        registry: where the policy is looked up.
        policy: a policy name, ``"auto"``, or a policy object.
        options: policy knobs; the null block is reserved whatever they say.
        num_blocks: force this many block ids (null block included), as
            ``num_gpu_blocks_override`` does.

    Returns:
        The plan (``policy`` is the policy's name).

    Raises:
        PolicyNotApplicableError: the policy cannot plan the specs, or no larger attention
            block size gives every page of its plan one block id.
        InsufficientMemoryError: the budget cannot hold one request of ``max_model_len``.
        VllmIntegrationError: the policy's plan has several block pools or a mixed-page
            group, which vLLM cannot run (:func:`check_runnable`).
    """
    context = rules.context()
    chosen = rules.options(options)

    def plan_at(layers: Mapping[str, KVCacheSpec], factor: int) -> KVCachePlan:
        scaled = layers if factor == 1 else scale_blocks(layers, factor)
        return plan_kv_cache(
            scaled,
            available_bytes,
            context,
            registry=registry,
            policy=policy,
            options=chosen,
            num_blocks=num_blocks,
        )

    plan = plan_at(specs, 1)
    check_runnable(plan)
    if page_span(plan) == 1:
        return plan
    best = _page_sized(specs, plan_at)
    if best is None:
        raise PolicyNotApplicableError(
            f"policy {plan.policy!r} gives a page {page_span(plan)} block ids, and no larger attention block "
            "size gives every page one block id, which vLLM needs (its managers hand each group one block "
            "id per page); plan with another policy"
        )
    return best


def _page_sized(
    specs: Mapping[str, KVCacheSpec], plan_at: Callable[[Mapping[str, KVCacheSpec], int], KVCachePlan]
) -> KVCachePlan | None:
    """The best plan whose every page takes one block id, over the state layers cut into ``k``
    groups and the attention blocks ``f`` times larger (see :func:`_shapes`)."""
    best: KVCachePlan | None = None
    for count, factor in _shapes(specs):
        try:
            candidate = plan_at(split_states(specs, _states(specs), count), factor)
        except KVCoreError:
            continue
        if page_span(candidate) != 1:
            continue
        if best is None or candidate.max_concurrency() > best.max_concurrency():
            best = candidate
    return best


def _states(specs: Mapping[str, KVCacheSpec]) -> list[str]:
    return [name for name, spec in specs.items() if not spec.page_scales_with_block_size]


def _shapes(specs: Mapping[str, KVCacheSpec]) -> list[tuple[int, int]]:
    """The ``(k, f)`` worth planning: state groups of at most ``m`` layers each, in the fewest
    groups that allows (``k = ceil(n / m)``: more groups of the same width only add pages per
    request), and for each the factors ``f`` at which ``c`` attention pages of one kind just
    cover such a group's states side by side (``c`` = 1 .. that kind's layer count), where a
    row of the attention group is as wide as the state group's page with the least padding;
    plus ``f = 1`` (attention pages left small in a row the states set). These are a handful
    of plans per width (about 2·sqrt(n) widths), where trying every ``(k, f)`` up to
    :data:`_MAX_FACTOR` took thousands of plans on a model of 54 state layers.
    """
    states = _states(specs)
    if not states:
        return []
    distinct = {id(specs[name]): specs[name] for name in states}.values()
    # bytes one state takes beside the others in a row (its slot, on its alignment)
    slot = max(cdiv(s.page_size_bytes, s.alignment_bytes) * s.alignment_bytes for s in distinct)
    attention: dict[int, int] = {}  # page bytes at the model's block size -> layers
    for spec in specs.values():
        if spec.page_scales_with_block_size and spec.page_size_bytes:
            attention[spec.page_size_bytes] = attention.get(spec.page_size_bytes, 0) + 1
    n = len(states)
    shapes: list[tuple[int, int]] = []
    for count in sorted({cdiv(n, m) for m in range(1, n + 1)}):
        need = cdiv(n, count) * slot  # the widest state group's page
        factors = {1}
        for page, layers in attention.items():
            for c in range(1, layers + 1):
                factor = cdiv(need, c * page)
                if factor <= _MAX_FACTOR:
                    factors.add(factor)
        shapes.extend((count, f) for f in sorted(factors))
    return shapes


#: The largest attention block enlargement :func:`plan_for_vllm` tries.
_MAX_FACTOR = 256


def split_states(
    specs: Mapping[str, KVCacheSpec], states: Sequence[str], count: int
) -> dict[str, KVCacheSpec]:
    """``specs`` with the state layers ``states`` dealt into ``count`` groups, layer ``i`` to
    group ``i mod count``: group ``j``'s specs get block size ``block_size + j``, which a state's
    page does not depend on, so that a policy, which groups equal specs, keeps them apart."""
    out = dict(specs)
    made: dict[tuple[int, int], KVCacheSpec] = {}
    for i, name in enumerate(states):
        spec, j = specs[name], i % count
        if j:
            key = (id(spec), j)
            if key not in made:
                made[key] = spec.with_block_size(spec.block_size + j)
            out[name] = made[key]
    return out
