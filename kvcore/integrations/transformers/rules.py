"""transformers' paged cache for continuous batching, in kvcore's terms (no torch, no transformers).

``generate_batch`` and ``ContinuousBatchingManager`` (transformers 5.x) keep every request's KV
cache in one ``PagedAttentionCache``. Its rules, read from transformers 5.24's
``generation/continuous_batching/cache.py`` and ``cache_allocators/``, are what this module
plans for:

1. **One allocator per attention type.** Layers are grouped by ``config.layer_types``:
   every full-attention layer in one allocator, every sliding-window layer in another
   (``group_layers_by_attn_type``). An allocator's block holds one page of ``page_size``
   tokens for each of its layers, so its block is ``layers x page bytes``.
2. **Sectors.** The cache is one byte tensor cut into sectors of
   ``lcm(every allocator's block bytes, 128)`` bytes; a free sector goes to whichever
   allocator needs blocks, which cuts it into ``sector / block`` blocks. Two more sectors
   lead the tensor as trash for padding tokens (never allocated).
3. **Blocks a request holds.** A full-attention allocator holds ``ceil(n / page_size)``
   blocks for a request of ``n`` tokens; a sliding-window allocator keeps a ring of
   ``ceil(min(n, window) / page_size)`` blocks (it reads the cached window before it
   writes the new tokens, so no tokens in flight are added).
4. **The size knob.** ``ContinuousBatchingConfig.num_blocks`` counts *whole-model* blocks
   (``num_hidden_layers`` full-attention pages of ``page_size`` tokens); the memory handler
   turns it into ``ceil(num_blocks x model block / sector)`` sectors
   (``PagedAttentionMemoryHandler.num_sectors_from_config``).

:func:`plan_for_transformers` plans a model with a kvcore policy at the page sizes
transformers accepts, converts each plan to that layout (:class:`PagedCacheLayout`: the
plan's bytes, trash included, become sectors) and keeps the page size whose layout holds
the most requests of ``max_model_len``; :meth:`PagedCacheLayout.config_fields` is what
``ContinuousBatchingConfig`` takes. :func:`own_layout` is transformers' own sizing of the
same budget, for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import attrs

from kvcore.errors import InvalidInputError, KVCoreError
from kvcore.integrations.capabilities import EngineCapabilities
from kvcore.integrations.engine_rules import EngineRules, takes_engine_request
from kvcore.plan import KVCachePlan
from kvcore.planning import planner
from kvcore.planning.registry import Registry
from kvcore.planning.request import PlanRequest
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.policy import PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, map_specs
from kvcore.validators import positive_int

#: The transformers versions the integration reads the rules of and is tested against.
TRANSFORMERS_VERSIONS = ">=5.24,<5.25"
#: transformers' allocator names (``cache_allocators.FULL_ATTENTION`` / ``SLIDING_ATTENTION``),
#: keyed by the kvcore kind each one runs.
ALLOCATOR_OF_KIND: Mapping[str, str] = {
    FullAttentionSpec.kind: "full_attention",
    SlidingWindowSpec.kind: "sliding_attention",
}
#: Built-in policies whose plans convert: one pool, attention groups of one kind each.
#: ``kind_pools`` keeps a pool per kind, which transformers' one sector pool cannot keep apart.
RUNNABLE_POLICIES: tuple[str, ...] = ("equal_groups", "shared_buffer", "uniform")
#: The smallest page transformers accepts (``initialization.BOUNDS["page_size"]``).
MIN_PAGE_SIZE = 4
#: ``ContinuousBatchingConfig.page_size``'s default.
DEFAULT_PAGE_SIZE = 256
#: Page sizes :func:`plan_for_transformers` tries: powers of two from the smallest to the default.
PAGE_SIZES: tuple[int, ...] = tuple(2**k for k in range(2, 9))
#: Every sector is a multiple of this many bytes (``PagedAttentionCache.bytes_per_sector``).
SECTOR_ALIGNMENT = 128
#: Sectors at the head of the cache tensor that padding tokens read and write, never allocated.
TRASH_SECTORS = 2


class TransformersIntegrationError(KVCoreError, ValueError):
    """Something kvcore and transformers' continuous batching cannot agree on: a layer kind its
    paged cache has no allocator for, a plan it cannot lay out, or a cache that came out other
    than planned."""


@attrs.frozen(kw_only=True)
class TransformersRules(EngineRules):
    """The continuous-batching settings a plan for transformers depends on.

    Attributes:
        max_model_len: the longest request (prompt plus new tokens) to size for.
        max_batch_tokens: ``ContinuousBatchingConfig.max_batch_tokens``, the tokens of one
            batch (kvcore's sliding and chunked kinds size for them per step).
    """

    engine: ClassVar[str] = "transformers"

    max_model_len: int = attrs.field(validator=positive_int)
    max_batch_tokens: int = attrs.field(default=256, validator=positive_int)

    def context(self) -> SizingContext:
        """The sizing context kvcore's policies plan with."""
        return SizingContext(max_model_len=self.max_model_len, max_num_batched_tokens=self.max_batch_tokens)

    def options(self, options: PlanOptions | None = None) -> PlanOptions:
        """``options`` (or the defaults) with one block size for every group, as transformers
        has one ``page_size``, and one page size per group."""
        return attrs.evolve(options or PlanOptions(), uniform_block_size=True, mixed_pages=False)


@attrs.frozen(kw_only=True)
class AllocatorShape:
    """One of transformers' cache allocators: the layers of one attention type.

    Attributes:
        attention: transformers' name for it (``"full_attention"`` or ``"sliding_attention"``).
        layer_names: its layers, in model order.
        layer_indices: their places among the model's cache layers (transformers' layer index).
        bytes_per_page: bytes of one layer's page of ``page_size`` tokens.
        page_size: tokens per page.
        sliding_window: the window of a sliding allocator; ``None`` for full attention.
    """

    attention: str
    layer_names: tuple[str, ...]
    layer_indices: tuple[int, ...]
    bytes_per_page: int = attrs.field(validator=positive_int)
    page_size: int = attrs.field(validator=positive_int)
    sliding_window: int | None = None

    @property
    def bytes_per_block(self) -> int:
        """One block: a page for each of the allocator's layers."""
        return len(self.layer_names) * self.bytes_per_page

    def blocks_per_request(self, num_tokens: int) -> int:
        """Blocks a request of ``num_tokens`` tokens holds at its longest (a sliding allocator's
        ring never grows past the window)."""
        kept = num_tokens if self.sliding_window is None else min(num_tokens, self.sliding_window)
        return cdiv(kept, self.page_size)


@attrs.frozen(kw_only=True)
class PagedCacheLayout:
    """transformers' ``PagedAttentionCache`` for one model: its allocators, sectors and size.

    Attributes:
        allocators: one per attention type, in the order transformers makes them.
        num_sectors: sectors requests can take (the trash sectors not counted).
        bytes_per_model_block: transformers' unit for ``num_blocks``: a full-attention page
            of every cache layer.
    """

    allocators: tuple[AllocatorShape, ...]
    num_sectors: int = attrs.field(validator=positive_int)
    bytes_per_model_block: int = attrs.field(validator=positive_int)

    @property
    def page_size(self) -> int:
        """Tokens per page (one for every allocator)."""
        return self.allocators[0].page_size

    @property
    def bytes_per_sector(self) -> int:
        """``lcm`` of every allocator's block bytes and the 128-byte alignment."""
        return math.lcm(*(a.bytes_per_block for a in self.allocators), SECTOR_ALIGNMENT)

    @property
    def cache_bytes(self) -> int:
        """The cache tensor: the requests' sectors and the trash sectors before them."""
        return (self.num_sectors + TRASH_SECTORS) * self.bytes_per_sector

    def sectors_for(self, count: int, num_tokens: int) -> int:
        """Sectors ``count`` requests of ``num_tokens`` tokens take together: each allocator
        cuts its sectors into blocks, so its blocks are rounded up to whole sectors once."""
        sector = self.bytes_per_sector
        return sum(
            cdiv(count * a.blocks_per_request(num_tokens), sector // a.bytes_per_block)
            for a in self.allocators
        )

    def sequences_held(self, num_tokens: int) -> int:
        """Requests of ``num_tokens`` tokens the cache holds at once (transformers' scheduler
        admits the next one only while its sectors are free).

        Raises:
            InvalidInputError: ``num_tokens`` is below 1.
        """
        if num_tokens < 1:
            raise InvalidInputError(f"a request holds at least one token (got {num_tokens})")

        def fits(count: int) -> bool:
            return self.sectors_for(count, num_tokens) <= self.num_sectors

        # sectors_for(k) <= k x sectors_for(1) (each allocator rounds once), so this many fit
        low = self.num_sectors // self.sectors_for(1, num_tokens)
        high = 2 * low + 1
        while fits(high):
            low, high = high, 2 * high
        while high - low > 1:  # low fits, high does not
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low

    @property
    def num_blocks(self) -> int:
        """The largest ``ContinuousBatchingConfig.num_blocks`` whose sectors
        (``ceil(num_blocks x model block / sector)``) do not exceed :attr:`num_sectors`."""
        return self.num_sectors * self.bytes_per_sector // self.bytes_per_model_block

    @property
    def configured_sectors(self) -> int:
        """The sectors transformers makes of :attr:`num_blocks` (its memory handler's rounding)."""
        return cdiv(self.num_blocks * self.bytes_per_model_block, self.bytes_per_sector)

    def config_fields(self) -> dict[str, int]:
        """What ``transformers.ContinuousBatchingConfig`` takes to build this cache."""
        return {"page_size": self.page_size, "num_blocks": self.num_blocks}


@attrs.frozen(kw_only=True)
class TransformersPlan:
    """A kvcore plan and the transformers cache it becomes.

    Attributes:
        plan: kvcore's plan (its policy, bytes and page size).
        layout: the ``PagedAttentionCache`` made of the plan's bytes.
        rules: the settings it was made for.
    """

    plan: KVCachePlan
    layout: PagedCacheLayout
    rules: TransformersRules

    @property
    def sequences_held(self) -> int:
        """Requests of ``max_model_len`` tokens transformers holds at once on this cache."""
        return self.layout.sequences_held(self.rules.max_model_len)

    def config_fields(self) -> dict[str, int]:
        """``ContinuousBatchingConfig`` fields: page size, ``num_blocks``, ``max_batch_tokens``."""
        return {**self.layout.config_fields(), "max_batch_tokens": self.rules.max_batch_tokens}


def check_specs(specs: Mapping[str, KVCacheSpec]) -> None:
    """Raise unless transformers' paged cache has an allocator for every layer of ``specs``.

    Raises:
        TransformersIntegrationError: a layer of a kind transformers' continuous batching has
            no allocator for (it runs full attention and one sliding window), layers of two
            windows, or layers whose tokens take different bytes (transformers sizes every page
            from the model's one KV-head count, head size and dtype).
    """
    if not specs:
        raise TransformersIntegrationError("the model has no cache-holding layers to plan")
    other = sorted({spec.kind for spec in specs.values() if spec.kind not in ALLOCATOR_OF_KIND})
    if other:
        raise TransformersIntegrationError(
            f"transformers' continuous batching has cache allocators for {sorted(ALLOCATOR_OF_KIND)} "
            f"layers only, and this model has {other} layers; serve it with kvcore's own runtime or vLLM"
        )
    windows = sorted({s.sliding_window for s in specs.values() if isinstance(s, SlidingWindowSpec)})
    if len(windows) > 1:
        raise TransformersIntegrationError(
            f"the model's sliding layers have windows {windows}, but transformers' continuous batching "
            "reads one window (config.sliding_window) for all of them"
        )
    widths = sorted({_bytes_per_token(spec) for spec in specs.values()})
    if len(widths) > 1:
        raise TransformersIntegrationError(
            f"the model's layers take {widths} bytes per token, but transformers' continuous batching "
            "sizes every page from one KV-head count, head size and dtype"
        )


def _bytes_per_token(spec: KVCacheSpec) -> int:
    return spec.page_size_bytes // spec.block_size


def check_runnable(plan: KVCachePlan) -> None:
    """Raise unless transformers' paged cache can be laid out from ``plan``.

    Raises:
        TransformersIntegrationError: the plan has several pools (transformers has one pool of
            sectors for all its allocators), shares layers' caches, or its groups have
            several block sizes (transformers has one ``page_size``), or a layer of a kind
            transformers cannot run (:func:`check_specs`).
    """
    if not plan.runs_in_one_pool:
        raise TransformersIntegrationError(
            f"policy {plan.policy!r} made a plan of {len(plan.pools)} block pools, but transformers' paged "
            f"cache has one pool of sectors for every allocator; plan with one of {list(RUNNABLE_POLICIES)}"
        )
    if plan.kv_sharing:
        raise TransformersIntegrationError(
            f"{len(plan.kv_sharing)} layer(s) reuse another layer's cache, which transformers' continuous "
            "batching does not do"
        )
    sizes = sorted({g.spec.block_size for g in plan.groups})
    if len(sizes) > 1:
        raise TransformersIntegrationError(
            f"policy {plan.policy!r} gave its groups block sizes {sizes}, but transformers' paged cache has "
            "one page_size; plan with one block size"
        )
    runs = sorted({g.blocks_per_page for g in plan.groups if g.blocks_per_page > 1})
    if runs:
        # unified_pool spreads a wide kind's page over a run of rows; transformers sizes its own
        # sectors to hold every allocator's page and takes one per page
        raise TransformersIntegrationError(
            f"policy {plan.policy!r} spreads pages over runs of {runs} block ids, but transformers' "
            f"allocators take one sector per page; plan with one of {list(RUNNABLE_POLICIES)}"
        )
    check_specs({name: g.spec_of(name) for g in plan.groups for name in g.layer_names})


def allocators_for(specs: Mapping[str, KVCacheSpec], page_size: int) -> tuple[AllocatorShape, ...]:
    """transformers' allocators for ``specs``: one per attention type, in the order its first
    layer appears (as ``group_layers_by_attn_type`` reads ``layer_types``).

    Raises:
        TransformersIntegrationError: as :func:`check_specs`.
    """
    check_specs(specs)
    layers: dict[str, list[tuple[int, str]]] = {}
    for index, (name, spec) in enumerate(specs.items()):
        layers.setdefault(ALLOCATOR_OF_KIND[spec.kind], []).append((index, name))
    shapes = []
    for attention, members in layers.items():
        spec = specs[members[0][1]]
        window = spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None
        shapes.append(
            AllocatorShape(
                attention=attention,
                layer_names=tuple(name for _, name in members),
                layer_indices=tuple(index for index, _ in members),
                bytes_per_page=_bytes_per_token(spec) * page_size,
                page_size=page_size,
                sliding_window=window,
            )
        )
    return tuple(shapes)


def layout_in(specs: Mapping[str, KVCacheSpec], cache_bytes: int, page_size: int) -> PagedCacheLayout:
    """The largest transformers cache of ``page_size`` whose tensor, trash sectors included,
    fits in ``cache_bytes``.

    Raises:
        TransformersIntegrationError: the bytes hold no sector beside the trash, or as
            :func:`check_specs`.
    """
    allocators = allocators_for(specs, page_size)
    model_block = sum(a.bytes_per_page for a in allocators for _ in a.layer_names)
    sector = math.lcm(*(a.bytes_per_block for a in allocators), SECTOR_ALIGNMENT)
    room = cache_bytes // sector - TRASH_SECTORS
    # transformers is told whole-model blocks and rounds them up to sectors: the sectors it
    # makes of the most blocks that fit (fewer than ``room`` when a model block is the larger)
    sectors = cdiv(room * sector // model_block * model_block, sector) if room > 0 else 0
    if sectors < 1:
        raise TransformersIntegrationError(
            f"{cache_bytes} bytes hold {max(0, room)} sector(s) of {sector} bytes beside transformers' "
            f"{TRASH_SECTORS} trash sectors at page size {page_size}, and a whole-model block of "
            f"{model_block} bytes needs more; give more memory"
        )
    return PagedCacheLayout(allocators=allocators, num_sectors=sectors, bytes_per_model_block=model_block)


def own_layout(
    specs: Mapping[str, KVCacheSpec], cache_bytes: int, page_size: int = DEFAULT_PAGE_SIZE
) -> PagedCacheLayout:
    """transformers' own sizing of a KV budget: ``num_blocks`` whole-model blocks of
    ``page_size`` in ``cache_bytes`` (its unit, ``num_hidden_layers`` full-attention pages),
    turned into sectors by its memory handler, which rounds up and adds the trash sectors
    beyond the budget (one sector at least, however small the budget).

    Raises:
        TransformersIntegrationError: as :func:`check_specs`.
    """
    allocators = allocators_for(specs, page_size)
    model_block = sum(a.bytes_per_page for a in allocators for _ in a.layer_names)
    num_blocks = cache_bytes // model_block
    sector = math.lcm(*(a.bytes_per_block for a in allocators), SECTOR_ALIGNMENT)
    return PagedCacheLayout(
        allocators=allocators,
        num_sectors=max(1, cdiv(num_blocks * model_block, sector)),
        bytes_per_model_block=model_block,
    )


@takes_engine_request
def plan_for_transformers(
    request: PlanRequest,
    rules: TransformersRules,
    *,
    registry: Registry,
    page_sizes: Sequence[int] = PAGE_SIZES,
) -> TransformersPlan:
    """Plan ``request`` with a kvcore policy for transformers' continuous batching.

    At each page size the policy plans the model in the request's budget; the plan's bytes
    become transformers' cache (:func:`layout_in`, trash sectors included), and the page size
    whose cache holds the most requests of ``rules.max_model_len`` wins (the larger page on a
    tie: fewer pages to index).

    Args:
        request: the specs in model order (from a front end; their block size is replaced by
            each page size tried), the KV-cache budget in bytes, the policy and its options
            (one block size and one page size per group are asked whatever they say:
            :meth:`TransformersRules.options`); sized by the rules
            (:meth:`TransformersRules.request` makes it).
        rules: the continuous-batching settings.
        registry: where the policy is looked up.
        page_sizes: the page sizes to try (each at least 4, transformers' smallest).

    Returns:
        The plan and the layout.

    Raises:
        InvalidInputError: a request not sized by ``rules`` (:meth:`TransformersRules.check_request`).
        TransformersIntegrationError: a layer transformers cannot run, a plan it cannot lay
            out, or no page size whose cache holds one request.
        PolicyNotApplicableError, InsufficientMemoryError: as kvcore's planner, at every page
            size.
    """
    rules.check_request(request)
    specs = request.specs
    chosen = attrs.evolve(request, options=rules.options(request.options))
    check_specs(specs)
    small = [size for size in page_sizes if size < MIN_PAGE_SIZE]
    if small or not page_sizes:
        raise TransformersIntegrationError(
            f"page sizes {list(page_sizes)}: transformers takes pages of at least {MIN_PAGE_SIZE} tokens"
        )
    best: TransformersPlan | None = None
    failure: KVCoreError | None = None
    for size in sorted(set(page_sizes)):
        resized = _with_block_size(specs, size)
        try:
            made = planner.plan(attrs.evolve(chosen, specs=resized), registry=registry).plans[0]
            check_runnable(made)
            layout = layout_in(resized, made.kv_cache_bytes, size)
        except KVCoreError as exc:
            failure = failure if isinstance(failure, TransformersIntegrationError) else exc
            continue
        candidate = TransformersPlan(plan=made, layout=layout, rules=rules)
        if candidate.sequences_held >= 1 and (
            best is None or candidate.sequences_held >= best.sequences_held
        ):
            best = candidate
    if best is None:
        if failure is not None:
            raise failure
        raise TransformersIntegrationError(
            f"at page sizes {sorted(set(page_sizes))}, {request.budgets[0]} bytes laid out as transformers' "
            f"paged cache hold no request of {rules.max_model_len} tokens; give more memory or a shorter "
            "max_model_len"
        )
    return best


def _with_block_size(specs: Mapping[str, KVCacheSpec], block_size: int) -> dict[str, KVCacheSpec]:
    """``specs`` at ``block_size`` (equal specs stay one object, as policies group by equality)."""
    return map_specs(specs, lambda spec: spec.with_block_size(block_size))


def capabilities() -> EngineCapabilities:
    """What kvcore's plans can run of transformers' continuous batching, from the tables above."""
    return EngineCapabilities(
        engine="transformers",
        versions=TRANSFORMERS_VERSIONS,
        kinds=tuple(ALLOCATOR_OF_KIND),
        policies=RUNNABLE_POLICIES,
        several_pools=False,
        mixed_pages=False,
        prefix_caching=True,
        speculative_decoding=False,
        notes=(
            "one allocator per attention type: kvcore's groups of one kind are merged into it; the plan sets "
            "the page size and the bytes (as sectors)",
            "sliding layers keep a ring of ceil(window / page) pages; one window per model",
            "prefix caching is transformers' own block sharing, which it runs on full-attention-only models",
            "several pools (kind_pools), pages over runs of block ids (unified_pool), mixed-page groups, "
            "KV sharing, chunked, MLA, state and cross-attention layers are refused",
        ),
    )
