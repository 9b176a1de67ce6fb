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
4. **Admission by group.** vLLM's scheduler admits a request only if the free block ids hold
   every group's own worst case of it (``full_sequence_must_fit``: each group's
   ``max_admission_blocks_per_request``, summed over groups; the same figure sizes its pool at
   start-up). A running request holds less: the most its groups hold at one moment, kvcore's
   joint peak (:func:`kvcore.peaks.joint_peak`), which is what the plan's figures count and what
   vLLM's manager runs at once. So a plan for vLLM must also admit one request by vLLM's rule
   (:func:`vllm_blocks_per_request`), which :func:`plan_for_vllm` checks, and the comparison
   (``kvcore compare --engine vllm``) shows both figures.
5. **One backing allocation.** Every vLLM ``KVCacheTensor`` is a view of one buffer; a plan of
   separate tensors is laid end to end in one buffer when it is converted
   (:func:`kvcore.integrations.vllm.convert.plan_to_vllm_config`); its figures do not change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from kvcore.errors import InsufficientMemoryError, KVCoreError, PolicyNotApplicableError
from kvcore.plan import KVCachePlan
from kvcore.planning.planner import plan_kv_cache
from kvcore.planning.registry import Registry
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.spec import DEFAULT_MAX_NUM_BATCHED_TOKENS, KVCacheSpec, SizingContext, cdiv
from kvcore.units import format_bytes
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


def vllm_pages_per_request(spec: KVCacheSpec, rules: VllmRules) -> int:
    """Pages vLLM 0.33 admits a request of ``rules.max_model_len`` tokens for in a group of
    ``spec``: its ``max_admission_blocks_per_request`` capped at ``ceil(L / B)``
    (``SingleTypeKVCacheManager.get_num_blocks_to_allocate``), with ``I`` its tokens in flight:
    ``ceil(min(W - 1 + I, L) / B) + 1`` for a sliding window (``SlidingWindowSpec``, one page
    above the most a window touches when ``W - 1 + I`` is one past a block boundary),
    ``ceil(min(C + I, L) / B)`` for a chunk (``ChunkedLocalAttentionSpec``); every other kind's
    is kvcore's own worst case (``vllm/v1/kv_cache_interface.py``)."""
    context = rules.context()
    length, in_flight = context.max_model_len, context.max_tokens_per_step
    whole = cdiv(length, spec.block_size)
    if isinstance(spec, SlidingWindowSpec):
        return min(cdiv(min(spec.sliding_window - 1 + in_flight, length), spec.block_size) + 1, whole)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return min(cdiv(min(spec.attention_chunk_size + in_flight, length), spec.block_size), whole)
    return spec.max_num_blocks(context)


def vllm_blocks_per_request(plan: KVCachePlan, rules: VllmRules) -> int:
    """Block ids vLLM's scheduler wants free to admit one request of ``rules.max_model_len``
    tokens on ``plan``: each group's :func:`vllm_pages_per_request` summed over the groups
    (vLLM reserves per group). At least the plan's joint peak, which is what a running request
    holds (``plan.blocks_per_request()``)."""
    return sum(vllm_pages_per_request(g.spec, rules) * g.blocks_per_page for g in plan.groups)


def check_vllm_admits(plan: KVCachePlan, rules: VllmRules) -> None:
    """Raise unless vLLM's scheduler admits one request of ``rules.max_model_len`` tokens on
    ``plan`` when it has the pool to itself (:func:`vllm_blocks_per_request` fits the usable ids).

    Raises:
        InsufficientMemoryError: with both figures and the longest length vLLM admits there.
    """
    need = vllm_blocks_per_request(plan, rules)
    if need <= plan.usable_blocks:
        return
    low, high = 0, rules.max_model_len  # low is admitted (0 trivially), high is not
    while high - low > 1:
        middle = (low + high) // 2
        if vllm_blocks_per_request(plan, attrs.evolve(rules, max_model_len=middle)) <= plan.usable_blocks:
            low = middle
        else:
            high = middle
    per_block = plan.pools[0].bytes_per_block
    raise InsufficientMemoryError(
        f"vLLM admits a request only when the free block ids hold every group's worst case of it: "
        f"{need:,} blocks of {format_bytes(per_block)} for {rules.max_model_len:,} tokens, but the plan has "
        f"{plan.usable_blocks:,} usable (a running request holds at most {plan.blocks_per_request():,} at "
        f"once, which is what kvcore counts); the largest max_model_len vLLM admits here is {low:,}; lower "
        "max_model_len or give the KV cache more memory",
        required_bytes=need * per_block,
        available_bytes=plan.usable_blocks * per_block,
        max_model_len=rules.max_model_len,
        largest_fitting_len=low,
        required_blocks=need,
        available_blocks=plan.usable_blocks,
        bytes_per_block=per_block,
    )


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
    (:meth:`VllmRules.context`), gives every page one block id and admits one request by vLLM's
    per-group rule (see the module docstring); its ``max_concurrency()`` counts each request at
    its joint peak, which is what vLLM's ``KVCacheManager`` runs at once.

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
        InsufficientMemoryError: the budget cannot hold one request of ``max_model_len``, or
            vLLM's per-group admission rule does not admit one (:func:`check_vllm_admits`).
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
    if page_span(plan) != 1:
        best = _page_sized(specs, plan_at)
        if best is None:
            raise PolicyNotApplicableError(
                f"policy {plan.policy!r} gives a page {page_span(plan)} block ids, and no larger "
                "attention block size gives every page one block id, which vLLM needs (its managers hand "
                "each group one block id per page); plan with another policy"
            )
        plan = best
    check_vllm_admits(plan, rules)
    return plan


def _page_sized(
    specs: Mapping[str, KVCacheSpec], plan_at: Callable[[Mapping[str, KVCacheSpec], int], KVCachePlan]
) -> KVCachePlan | None:
    """The best plan whose every page takes one block id: the state layers cut into ``k``
    groups (``k`` = 1 .. their count) and the attention blocks ``f`` times larger, from the
    smallest ``f`` that makes a row as wide as a state group's page up to twice that."""
    states = [name for name, spec in specs.items() if not spec.page_scales_with_block_size]
    best: KVCachePlan | None = None
    for count in range(1, len(states) + 1):
        tagged = split_states(specs, states, count)
        first: int | None = None
        factor = 1
        while factor <= _MAX_FACTOR and (first is None or factor <= 2 * first):
            try:
                candidate = plan_at(tagged, factor)
            except KVCoreError:
                candidate = None
            if candidate is not None and page_span(candidate) == 1:
                first = first or factor
                if best is None or candidate.max_concurrency() > best.max_concurrency():
                    best = candidate
            factor += 1
    return best


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
