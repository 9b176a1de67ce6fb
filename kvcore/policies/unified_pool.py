"""Built-in policy ``unified_pool``: one block table per retention kind, every kind's pages in
one pool whose rows any kind may take.

``kind_pools`` gives each retention kind a pool of its own, so a split fixed when the plan is
made decides how much of the budget sliding-window pages may hold and how much full-attention
pages may. Demand does not stay at one split: a request being admitted holds its whole window
(and, under vLLM's admission gate, the window plus the tokens in flight) while one decoding holds
far less, and the full-attention pages grow with every request. A static split leaves one
pool idle while the other turns requests away (``benchmarks/pool_split_grid.py``: the best
static split of Gemma-3-27B on long documents served 0.94x what ``shared_buffer`` serves).

This policy keeps ``kind_pools``' groups (one mixed-page group per retention kind, so one
block table per kind) and lends the bytes instead of splitting them: all groups draw block ids
from **one pool of rows** of ``W`` bytes. A kind whose page (its layers' pages side by side)
is wider than a row takes an aligned run of ``blocks_per_page`` rows per page. The runtime
hands single rows out from the low end of the id space and runs from the high end, and in a
pool of runs only, the shortest runs from the low end (:mod:`kvcore.runtime.free_blocks`), so
the kinds grow towards each other inside one buffer, as SGLang's unified memory pool
(``--enable-unified-memory``, two sub-pools growing from the two ends of one byte buffer:
``python/sglang/srt/mem_cache/unified_memory_pool.py``) does.

What it costs is the part of a run a kind's page leaves empty. The policy chooses the row and
each kind's block size (by the factors :attr:`PlanOptions.block_multiples` allows, up to
``max_block_size``; a state's page keeps its size) to minimise the bytes one request of
``max_model_len`` holds (:func:`choose_rows`): every kind's page at every allowed block size
is tried as the row, and so is every common divisor of two kinds' pages (every kind a run,
none wasting a byte, at most :data:`MAX_RUN` rows a page); each kind then takes the block size
whose run wastes least. Gemma-3-27B's 52 sliding-window layers beside its 10 full-attention
layers, all of one page, share a row of two pages: a sliding page is a run of 26 rows, a
full-attention page a run of 5, and nothing is padded (with the full-attention page as the row,
the sliding layers would need block 64 and a run of 21, 1% of it empty, and served 0.98 of
``shared_buffer`` instead of 1.02).

Against ``shared_buffer``, which cuts a kind into several groups so that every group fills a
row exactly, it has fewer block tables (one per kind; Gemma-3-27B: 2 instead of 7). vLLM cannot
run it (its managers take one block id per page), and the prefix cache does not keep pages over
runs. ``auto`` never picks it; ``kvcore compare`` and ``kvcore tune`` show when it wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from kvcore.hookspecs import hookimpl
from kvcore.plan import KVCacheGroup
from kvcore.policies.kind_pools import retention_buckets
from kvcore.policies.shared_buffer import MixedBucket, rows_layout
from kvcore.policy import AllocationPolicy, BlockPlacement, PlanOptions
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, specs_by_group_key


def kind_buckets(
    specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
) -> list[MixedBucket]:
    """One bucket per retention kind (per spec without ``mixed_pages``), in model order; a kind
    of states keeps its block size."""
    layers = (
        retention_buckets(specs) if options.mixed_pages else [names for _, names in specs_by_group_key(specs)]
    )
    return [
        MixedBucket(
            specs,
            names,
            context,
            options,
            scalable=all(specs[name].page_scales_with_block_size for name in names),
        )
        for names in layers
    ]


#: The most rows a page may span when the row is narrower than every kind's page (a common
#: divisor of two kinds' pages): keeps the pool's ids few enough for the runtime's free lists.
MAX_RUN = 64


def candidate_rows(buckets: Sequence[MixedBucket]) -> tuple[list[int], list[int]]:
    """The rows :func:`choose_rows` tries: every page of every bucket at every allowed factor, and
    the greatest common divisor of every two pages of different buckets (rows no page is as
    wide as: every kind's page a run, none wasting a byte; Gemma-3-27B's 52 sliding and 10
    full-attention pages side by side share a row of 2 pages) that every layer's alignment
    divides.

    Returns:
        The pages, and the divisors that are not pages.
    """
    align = math.lcm(*(spec.alignment_bytes for bucket in buckets for spec in bucket.specs.values()))
    pages = sorted({bucket.page(f) for bucket in buckets for f in bucket.factors if bucket.page(f)})
    divisors: set[int] = set()
    for i, one in enumerate(buckets):
        for other in buckets[i + 1 :]:
            for a in one.factors:
                for b in other.factors:
                    common = math.gcd(one.page(a), other.page(b))
                    if common and common % align == 0:
                        divisors.add(common)
    return pages, sorted(divisors - set(pages))


def choose_rows(buckets: Sequence[MixedBucket]) -> list[tuple[int, int]]:
    """Each bucket's ``(block-size factor, rows per page)`` for the row that makes one request of
    the context's length cheapest (rows per request of every bucket, times the row).

    For each of :func:`candidate_rows`, each bucket takes the factor of the fewest rows per
    request (pages times ``ceil(page / row)``), the smaller factor on a tie; a divisor row is
    tried only where every bucket has a factor whose page spans at most :data:`MAX_RUN` rows.
    Among rows of equal bytes per request the smaller factors win, then the wider row (fewer
    ids for the same bytes).
    """
    pages, divisors = candidate_rows(buckets)
    if not pages:  # no bytes to place: one row per page, as planned
        return [(1, 1) for _ in buckets]
    best: tuple[tuple[int, int, int], list[tuple[int, int]]] | None = None
    for row in (*pages, *divisors):
        limit = MAX_RUN if row in divisors else None
        choice: list[tuple[int, int]] = []
        held = 0
        for bucket in buckets:
            fits = [
                (bucket.pages_per_request(f) * span, f, span)
                for f in bucket.factors
                for span in (max(1, cdiv(bucket.page(f), row)),)
                if limit is None or span <= limit
            ]
            if not fits:
                break
            cost, factor, span = min(fits)
            held += cost
            choice.append((factor, span))
        else:
            key = (row * held, sum(f for f, _ in choice), -row)
            if best is None or key < best[0]:
                best = (key, choice)
    assert best is not None  # a page row always fits
    return best[1]


class UnifiedPoolPolicy:
    """A mixed-page group per retention kind, every group's pages in one pool of rows (a wide
    page over an aligned run of rows)."""

    name = "unified_pool"
    description = (
        "one block table per retention kind, all kinds' pages in one pool of rows they lend each other"
    )
    #: ``auto`` never picks it: ``shared_buffer`` fills its rows exactly; this one trades the
    #: empty part of a run for fewer block tables (``kvcore compare`` shows when it wins)
    auto_priority = None

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        return None

    def group(
        self, specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
    ) -> Sequence[KVCacheGroup]:
        buckets = kind_buckets(specs, context, options)
        options.check_group_count(self.name, len(buckets))
        groups = []
        for bucket, (factor, span) in zip(buckets, choose_rows(buckets), strict=True):
            sized = bucket.specs_at(factor)
            first = sized[bucket.layers[0]]
            differ = {name: spec for name, spec in sized.items() if spec is not first and spec != first}
            groups.append(
                KVCacheGroup(
                    layer_names=tuple(bucket.layers), spec=first, blocks_per_page=span, layer_specs=differ
                )
            )
        return tuple(groups)

    def layout(self, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
        return rows_layout(groups)


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(UnifiedPoolPolicy())
