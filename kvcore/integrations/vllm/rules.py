"""vLLM's rules for a KV-cache plan, and planning under them with any kvcore policy (no vLLM needed).

vLLM 0.33 runs a plan differently from kvcore's own block pool in these ways, which change what a
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
6. **States kept for prefix caching.** With prefix caching on (vLLM 0.33's default, hybrids
   included) every Mamba layer runs in ``mamba_cache_mode='align'``: a request holds its
   running state, the one at its last block boundary (the state block is the attention
   block) and the layer's prefill checkpoint blocks (:attr:`VllmRules.state_cache_mode`
   sizes them). vLLM frees the state a step replaced only once that step is processed, so
   with async scheduling a request holds one more, which vLLM's own sizing leaves out and
   :meth:`VllmRules.state_specs` counts.

What vLLM runs of a plan is read from the tables here (:data:`VLLM_SPEC_CLASSES`,
:data:`MIXED_PAGE_KINDS`), which the conversions and :func:`capabilities` (the engine
matrix) share: one block pool, every kind in the table, mixed-page groups of attention kinds
as vLLM's ``UniformTypeKVCacheSpecs``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import attrs

from kvcore.errors import InsufficientMemoryError, KVCoreError, PolicyNotApplicableError
from kvcore.integrations.capabilities import EngineCapabilities
from kvcore.integrations.engine_rules import EngineRules, takes_engine_request
from kvcore.integrations.vllm.errors import VllmIntegrationError as VllmIntegrationError
from kvcore.integrations.vllm.versions import VLLM_VERSIONS
from kvcore.plan import KVCachePlan
from kvcore.planning import planner
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest
from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.policy import PlanOptions
from kvcore.simulation.profiles.vllm import chunks_off_scheduler_block, scheduler_block
from kvcore.spec import DEFAULT_MAX_NUM_BATCHED_TOKENS, KVCacheSpec, SizingContext, cdiv
from kvcore.units import format_bytes
from kvcore.validators import boolean, non_negative_int, positive_int

#: kvcore's kinds the vLLM adapter converts, each to the vLLM 0.33 spec class of that name
#: (``vllm/v1/kv_cache_interface.py``), and back. A state becomes a ``MambaSpec`` in its cache
#: mode: ``'none'`` (one state per request) or ``'align'`` (prefix caching: two, plus the
#: layer's prefill checkpoint blocks; see :data:`VLLM_STATE_CACHE_MODES`).
VLLM_SPEC_CLASSES: dict[str, str] = {
    "full_attention": "FullAttentionSpec",
    "sliding_window": "SlidingWindowSpec",
    "chunked_local_attention": "ChunkedLocalAttentionSpec",
    "mla": "MLAAttentionSpec",
    # a DSA indexer's keys: an MLAAttentionSpec with cache_role INDEXER (deepseek_v2.py:658-666)
    "dsa_indexer": "MLAAttentionSpec",
    "cross_attention": "CrossAttentionSpec",
    "state": "MambaSpec",
}

#: Kinds whose layers of different page sizes vLLM runs in one block table: a kvcore
#: mixed-page group of them becomes one ``UniformTypeKVCacheSpecs`` (one block size, one
#: registered uniform-type base class: ``FullAttentionSpec`` for full attention and MLA, the
#: kind's own class for the others; ``vllm/v1/core/single_type_kv_cache_manager.py``,
#: ``register_all_kvcache_specs``). kvcore never puts state layers in a mixed-page group.
MIXED_PAGE_KINDS: frozenset[str] = frozenset(VLLM_SPEC_CLASSES) - {"state"}

#: Kinds whose layers vLLM's prefix caching runs on in a plan kvcore made: attention kinds, and
#: state layers as a ``MambaSpec`` in ``mamba_cache_mode`` ``'align'`` (what vLLM 0.33 gives
#: hybrids with prefix caching on, its default: ``MambaModelConfig.verify_and_update_config``);
#: vLLM itself turns prefix caching off for encoder-decoder models (``SchedulerConfig``), so
#: cross attention never runs with it.
PREFIX_CACHING_KINDS: frozenset[str] = frozenset(VLLM_SPEC_CLASSES) - {"cross_attention"}

#: The state cache modes vLLM runs (``CacheConfig.mamba_cache_mode``, ``Literal["align",
#: "none"]`` in 0.32 to 0.34): kvcore's ``all`` (a state per block) has no vLLM form.
VLLM_STATE_CACHE_MODES = ("none", "align")


def _vllm_state_cache_mode(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and value not in VLLM_STATE_CACHE_MODES:
        raise VllmIntegrationError(
            f"state_cache_mode {value!r}: vLLM keeps Mamba states in mamba_cache_mode 'none' (prefix caching "
            "off) or 'align' (on) only (CacheConfig.mamba_cache_mode); plan with state_cache_mode 'align'"
        )


@attrs.frozen(kw_only=True)
class VllmRules(EngineRules):
    """The scheduler settings of a vLLM engine that a KV-cache plan depends on.

    Attributes:
        max_model_len: vLLM's ``max_model_len``.
        max_num_batched_tokens: vLLM's ``max_num_batched_tokens`` (the chunked-prefill budget
            of one step; kvcore's default, 2048, unless given).
        async_scheduling: vLLM's ``async_scheduling`` (the default in 0.33): two batches in
            flight instead of one.
        max_encoder_tokens: the longest encoder output a request brings to cross-attention
            layers (an encoder-decoder model such as Whisper); ``0`` leaves each
            ``cross_attention`` spec's own (the model's, 1500 audio frames for Whisper). The
            plugin sets vLLM's ``max_num_encoder_input_tokens``, which vLLM sizes its
            ``CrossAttentionSpec`` with.
    """

    engine: ClassVar[str] = "vLLM"

    max_model_len: int = attrs.field(validator=positive_int)
    max_num_batched_tokens: int = attrs.field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS, validator=positive_int)
    async_scheduling: bool = attrs.field(default=True, validator=boolean)
    max_encoder_tokens: int = attrs.field(default=0, validator=non_negative_int)
    state_cache_mode: str | None = attrs.field(default=None, validator=_vllm_state_cache_mode)

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
        worst, which is what vLLM's admission cap and pool sizing count; a state layer the
        states of the rules' ``state_cache_mode``.
        """
        return SizingContext(
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_in_flight_tokens,
            max_encoder_tokens=self.max_encoder_tokens,
            state_cache_mode=self.state_cache_mode,
        )

    def state_specs(self, specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
        """``specs`` with every state layer vLLM keeps in ``'align'`` mode holding a state for
        each batch in flight beyond the first (``StateSpec.in_flight_slots``: one with async
        scheduling), which vLLM frees only once the batch is processed; the rest as given."""
        from kvcore.plugins.state import StateSpec

        context = self.context()
        slots = self.max_concurrent_batches - 1
        made: dict[int, KVCacheSpec] = {}

        def held(spec: KVCacheSpec) -> KVCacheSpec:
            if not isinstance(spec, StateSpec) or spec.sized_for(context).cache_mode != "align":
                return spec
            if id(spec) not in made:
                made[id(spec)] = attrs.evolve(spec, in_flight_slots=slots)
            return made[id(spec)]

        return {name: held(spec) for name, spec in specs.items()}

    def options(self, options: PlanOptions | None = None) -> PlanOptions:
        """``options`` (or the defaults) with the null block reserved, as vLLM's pool keeps it.
        Mixed-page groups stay as the options say (on by default): vLLM runs them
        (:data:`MIXED_PAGE_KINDS`)."""
        return attrs.evolve(options or PlanOptions(), reserve_null_block=True)


def encoder_tokens_of(specs: Mapping[str, KVCacheSpec]) -> int:
    """The longest encoder output ``specs``' cross-attention layers cache (their own
    ``max_encoder_tokens``, read from the model's config), ``0`` without any: what
    :class:`VllmRules` takes when vLLM's scheduler is not there to say."""
    from kvcore.plugins.cross_attention import CrossAttentionSpec

    return max(
        (spec.max_encoder_tokens for spec in specs.values() if isinstance(spec, CrossAttentionSpec)),
        default=0,
    )


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
    """Raise unless vLLM 0.33's one block pool can run ``plan``'s groups.

    Args:
        plan: a kvcore plan.

    Raises:
        VllmIntegrationError: the plan has several block pools (vLLM's ``KVCacheManager``
            draws every group's block ids from one ``BlockPool`` of one ``num_blocks``, and its
            workers view one backing allocation, so pools of their own counts and block bytes
            have no vLLM form), or a mixed-page group of a kind vLLM does not run in one block
            table (:data:`MIXED_PAGE_KINDS`), or a chunked local attention group whose block
            size is not the scheduler's block (the least common multiple of every group's):
            vLLM's prefix-cache lookup asserts it is
            (``ChunkedLocalAttentionManager.find_longest_cache_hit``), and prefix caching is on
            by default.
    """
    if not plan.runs_in_one_pool:
        raise VllmIntegrationError(
            f"policy {plan.policy!r} made a plan of {len(plan.pools)} block pools, but vLLM 0.33 has one "
            "block pool (one num_blocks, one block size in bytes) shared by every group; plan for vLLM "
            "with a policy of one pool (shared_buffer, uniform, equal_groups)"
        )
    off = chunks_off_scheduler_block(plan)
    if off:
        raise VllmIntegrationError(
            f"policy {plan.policy!r} gave chunked local attention group {off[0]} blocks of "
            f"{plan.groups[off[0]].spec.block_size} tokens, but vLLM 0.33's prefix cache looks such a group "
            f"up only when its block is the scheduler's ({scheduler_block(plan)} tokens, the least common "
            "multiple of every group's block size); plan with PlanOptions(uniform_block_size=True), as "
            "plan_for_vllm does for a model with chunked local attention"
        )
    for index, group in enumerate(plan.groups):
        odd = sorted({spec.kind for spec in group.specs} - MIXED_PAGE_KINDS) if group.layer_specs else []
        if odd:
            raise VllmIntegrationError(
                f"policy {plan.policy!r} made group {index} of {odd} layers with different page sizes; vLLM "
                f"runs a mixed-page group (UniformTypeKVCacheSpecs) of {sorted(MIXED_PAGE_KINDS)} layers "
                "only; plan with PlanOptions(mixed_pages=False)"
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


@takes_engine_request
def plan_for_vllm(request: PlanRequest, rules: VllmRules, *, registry: Registry) -> KVCachePlan:
    """Plan ``request`` with a kvcore policy so that vLLM runs the plan as kvcore counts it.

    The plan reserves the null block, is sized for vLLM's tokens in flight
    (:meth:`VllmRules.context`), gives every page one block id and admits one request by vLLM's
    per-group rule (see the module docstring); its ``max_concurrency()`` counts each request at
    its joint peak, which is what vLLM's ``KVCacheManager`` runs at once.

    Args:
        request: kvcore's specs (convert vLLM's with
            :func:`kvcore.integrations.vllm.convert.specs_from_vllm`), vLLM's KV-cache budget,
            the policy and its options (the null block is reserved whatever they say), and a
            forced block count (null block included), as ``num_gpu_blocks_override`` gives
            one; sized by the rules (:meth:`VllmRules.request` makes it).
        rules: vLLM's scheduler settings.
        registry: where the policy is looked up.

    Returns:
        The plan (``policy`` is the policy's name).

    Raises:
        InvalidInputError: a request not sized by ``rules`` (:meth:`VllmRules.check_request`).
        PolicyNotApplicableError: the policy cannot plan the specs, or no larger attention
            block size gives every page of its plan one block id.
        InsufficientMemoryError: the budget cannot hold one request of ``max_model_len``, or
            vLLM's per-group admission rule does not admit one (:func:`check_vllm_admits`).
        VllmIntegrationError: the policy's plan has several block pools or a mixed-page
            group, which vLLM cannot run (:func:`check_runnable`).
    """
    rules.check_request(request)
    options = rules.options(request.options)
    if any(spec.kind == "chunked_local_attention" for spec in request.specs.values()):
        # one block size: vLLM's prefix cache asserts a chunked group's block is the scheduler's
        options = attrs.evolve(options, uniform_block_size=True)
    request = attrs.evolve(request, specs=rules.state_specs(request.specs))
    chosen = attrs.evolve(request, options=options)

    def plan_at(layers: Mapping[str, KVCacheSpec], factor: int) -> KVCachePlan:
        scaled = layers if factor == 1 else scale_blocks(layers, factor)
        return planner.plan(attrs.evolve(chosen, specs=scaled), registry=registry).plans[0]

    specs = request.specs
    made = plan_at(specs, 1)
    check_runnable(made)
    if page_span(made) != 1:
        best = _page_sized(specs, plan_at)
        if best is None:
            raise PolicyNotApplicableError(
                f"policy {made.policy!r} gives a page {page_span(made)} block ids, and no larger "
                "attention block size gives every page one block id, which vLLM needs (its managers hand "
                "each group one block id per page); plan with another policy"
            )
        made = best
    check_vllm_admits(made, rules)
    return made


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


# -- the engine matrix ----------------------------------------------------------------------

_PROBE_LENGTH = 4096
_PROBE_BUDGET = 2**30


def _probes() -> dict[str, dict[str, KVCacheSpec]]:
    """Small models of each shape a policy may be asked to plan for vLLM: full attention,
    full + sliding, full + chunked, full + cross attention, an attention + state hybrid, and
    full attention of two page sizes (a mixed-page group where the policy makes one)."""
    from kvcore.plugins.chunked_local_attention import ChunkedLocalAttentionSpec
    from kvcore.plugins.cross_attention import CrossAttentionSpec
    from kvcore.plugins.full_attention import FullAttentionSpec
    from kvcore.plugins.sliding_window import SlidingWindowSpec
    from kvcore.plugins.state import StatePart, StateSpec

    geometry = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}
    full = FullAttentionSpec(**geometry)  # type: ignore[arg-type]
    narrow = FullAttentionSpec(**{**geometry, "num_kv_heads": 4})  # type: ignore[arg-type]
    sliding = SlidingWindowSpec(**geometry, sliding_window=1024)  # type: ignore[arg-type]
    chunked = ChunkedLocalAttentionSpec(**geometry, attention_chunk_size=2048)  # type: ignore[arg-type]
    cross = CrossAttentionSpec(**geometry, max_encoder_tokens=1500)  # type: ignore[arg-type]
    state = StateSpec(
        block_size=16,
        parts=(
            StatePart(name="conv", shape=(3, 1024), dtype="bfloat16"),
            StatePart(name="ssm", shape=(16, 64, 16), dtype="float32"),
        ),
    )

    def model(*kinds: KVCacheSpec) -> dict[str, KVCacheSpec]:
        return {f"model.layers.{i}": spec for i, spec in enumerate(kinds)}

    return {
        "full": model(full, full, full, full),
        "sliding": model(sliding, sliding, sliding, full, sliding, sliding, sliding, full),
        "chunked": model(chunked, chunked, chunked, full),
        "cross": model(full, cross, full, cross),
        "state": model(state, state, state, full),
        "mixed pages": model(full, narrow, full, narrow),
    }


def _vllm_runs(policy: str, specs: Mapping[str, KVCacheSpec], registry: Registry) -> bool | None:
    """Whether the adapter plans ``specs`` with ``policy`` into a plan vLLM runs; ``None``
    when the policy itself does not plan such layers (its ``why_not``)."""
    if registry.policy(policy).why_not(specs) is not None:
        return None
    rules = VllmRules(max_model_len=_PROBE_LENGTH)
    try:
        plan_for_vllm(rules.request(specs, _PROBE_BUDGET, policy=policy), rules, registry=registry)
    except KVCoreError:
        return False
    return True


@functools.cache
def capabilities(minor: int | None = None) -> EngineCapabilities:
    """What vLLM runs of kvcore's plans, read from this adapter (no vLLM needed): every supported
    release's (``minor`` None), or one release's (``minor`` 32, 33 or 34: its version and notes).

    The kinds are :data:`VLLM_SPEC_CLASSES`'s; a built-in policy counts when every probe
    model it plans (:func:`_probes`) comes out of :func:`plan_for_vllm` as a plan
    :func:`check_runnable` passes; several pools and mixed pages are what
    :func:`check_runnable` says of a ``kind_pools`` plan and of a mixed-page plan.
    """
    from kvcore.integrations.vllm.versions import RELEASE_NOTES, vllm_minor

    if minor is not None:
        vllm_minor(f"0.{minor}")  # refuses a release kvcore does not support, naming the range
    registry = Registry.default(autoload=False)  # kvcore's own kinds and policies
    probes = _probes()
    policies = []
    for name in registry.policies:
        runs = [_vllm_runs(name, specs, registry) for specs in probes.values()]
        if any(runs) and False not in runs:
            policies.append(name)
    rules = VllmRules(max_model_len=_PROBE_LENGTH)

    def passes(plan: KVCachePlan) -> bool:
        try:
            check_runnable(plan)
        except VllmIntegrationError:
            return False
        return True

    sliding = rules.request(probes["sliding"], _PROBE_BUDGET, policy="kind_pools", options=rules.options())
    pooled = planner.plan(sliding, registry=registry).plans[0]
    mixed_pages = rules.request(probes["mixed pages"], _PROBE_BUDGET, policy="shared_buffer")
    mixed = plan_for_vllm(mixed_pages, rules, registry=registry)
    return EngineCapabilities(
        engine="vllm",
        versions=VLLM_VERSIONS if minor is None else f">=0.{minor},<0.{minor + 1}",
        kinds=VLLM_SPEC_CLASSES,
        policies=policies,
        several_pools=not pooled.runs_in_one_pool and passes(pooled),
        mixed_pages=any(g.layer_specs for g in mixed.groups) and passes(mixed),
        prefix_caching=bool(PREFIX_CACHING_KINDS),
        speculative_decoding=False,
        notes=(
            "one block pool: a plan of several pools is refused (vLLM's KVCacheManager draws every "
            "group's block ids from one BlockPool)",
            "mixed-page groups run as UniformTypeKVCacheSpecs",
            "mla and dsa_indexer: MLAAttentionSpec, the packed latent as cache_dtype_str fp8_ds_mla "
            "(656 bytes a token), the indexer keys with cache_role INDEXER (132 uint8 bytes); "
            "nvfp4_ds_mla and DeepSeek-V4's compressed layouts are refused",
            "prefix caching on attention and state layers: a state layer in vLLM's mamba_cache_mode "
            "'align' holds 2 states a request, plus its prefill checkpoint blocks and, with async "
            "scheduling, one for the step in flight; kvcore's 'all' mode (a state per block) has no "
            "vLLM form and is refused",
            "speculative decoding: plans leave out vLLM's lookahead slots; Mamba speculative blocks "
            "are refused",
            *(RELEASE_NOTES[minor] if minor is not None else ()),
        ),
    )
