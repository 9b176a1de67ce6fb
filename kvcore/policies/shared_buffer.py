"""Built-in policy ``shared_buffer``: layers of different kinds in one buffer whose bytes the
groups share.

How it works (the picture is in ``docs/explanation/shared-buffer.md``):

- The buffer is ``num_blocks`` *rows* of ``W`` bytes. Block id ``b`` is row ``b``.
- A block id belongs to one group at a time, so every group lays its pages out in the same
  rows: a group of ``m`` layers puts page ``b`` of its layers side by side in row ``b``. Groups
  of different kinds therefore share bytes, and no layout can waste less than the part of a row
  a group leaves empty.
- Layers are first bucketed by spec (equal ``group_key``); each bucket is cut into groups.
- *Row width.* The policy tries every row width ``W = c x page`` that makes ``c`` layers of
  some bucket fill a row exactly, cuts every bucket for that width, and scores the result by
  its efficiency: useful bytes over allocated bytes for one request of ``max_model_len``.
  A bucket whose layer count does not divide evenly leaves a remainder group; that group gets
  a larger block size (``k x block_size``, up to ``max_block_size``) so that its fewer layers
  still fill the row. Among widths within ``grouping_tolerance`` of the best efficiency, the
  one with the fewest groups wins.
- *Pages of different sizes.* Each group fills a row with its own pages, whatever their size,
  so MLA beside full attention, or sliding layers with another head size, need no padding
  beyond the unfilled part of a row.
- *State pages* (SSM/linear-attention state, fixed per request) do not grow with the block
  size. All state layers of one spec form one group whose page is an aligned run of
  ``blocks_per_page`` rows, so attention keeps its small block size however large the state.
- Within a bucket, groups take layers strided through the model (layer ``i`` of a bucket goes
  to group ``i mod g``), so every pipeline stage holds a share of every group.
- *Mixed-page groups.* Layers whose specs differ only in their pages (one
  :attr:`~kvcore.spec.KVCacheSpec.retention_key`: full attention with other head counts, MLA
  beside an indexer cache) may also share one group, each layer keeping its own page in the
  group's row. The policy scores a second family of layouts in which every such retention kind
  is ONE mixed-page group (enlarged like a remainder group to fill the row; states stay aligned
  runs of rows) beside the usual one, by the same efficiency and rule, so it is taken where it is
  as good with fewer groups. On a full tie the usual layout wins.
- *Block multiples.* Blocks are enlarged by powers of two (what kernels usually take), or by
  any integer factor up to ``max_block_size`` with ``PlanOptions.block_multiples="any"``, which
  evens out page ratios such as 3:2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import NamedTuple

import attrs

from kvcore.hookspecs import hookimpl
from kvcore.plan import KVCacheGroup
from kvcore.policy import AllocationPolicy, BlockPlacement, PlanOptions, TensorPlacement
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, specs_by_group_key

#: Row widths tried per bucket: every layer count up to this, plus the divisors of the bucket
#: size. Keeps planning of 10,000-layer models fast without losing the exact fits.
_MAX_DENSE_CANDIDATES = 512


def _round_up(value: int, multiple: int) -> int:
    return cdiv(value, multiple) * multiple


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


@attrs.frozen(kw_only=True)
class _Shape:
    """``count`` groups of ``layers`` layers each, at ``factor`` x block size, ``span`` rows per page."""

    layers: int
    count: int
    factor: int = 1
    span: int = 1


class _Bucket:
    """Layers with one spec, and cached figures per block-size factor."""

    def __init__(
        self, spec: KVCacheSpec, layers: list[str], context: SizingContext, options: PlanOptions
    ) -> None:
        self.spec = spec
        self.layers = layers
        self.context = context
        self.scalable = spec.page_scales_with_block_size
        enlarge = self.scalable and not options.uniform_block_size
        limit = max(1, options.max_block_size // spec.block_size) if enlarge else 1
        #: block-size factors this bucket may use: powers of two (kernels take such block sizes),
        #: or every integer up to the limit with ``block_multiples="any"``
        self.factors = block_factors(limit, options)
        self._specs: dict[int, KVCacheSpec] = {}
        self._pages: dict[int, int] = {}
        self._per_request: dict[int, int] = {}

    def spec_at(self, factor: int) -> KVCacheSpec:
        spec = self._specs.get(factor)
        if spec is None:
            spec = self.spec if factor == 1 else self.spec.with_block_size(self.spec.block_size * factor)
            self._specs[factor] = spec
        return spec

    def page(self, factor: int = 1) -> int:
        """Page bytes at ``factor`` x block size, rounded up to the spec's alignment."""
        page = self._pages.get(factor)
        if page is None:
            spec = self.spec_at(factor)
            page = self._pages[factor] = _round_up(spec.page_size_bytes, spec.alignment_bytes)
        return page

    def pages_per_request(self, factor: int = 1) -> int:
        pages = self._per_request.get(factor)
        if pages is None:
            pages = self._per_request[factor] = self.spec_at(factor).max_num_blocks(self.context)
        return pages

    def cut(self, row: int) -> tuple[_Shape, ...]:
        """How this bucket is cut into groups when a row holds ``row`` bytes."""
        n = len(self.layers)
        page = self.page()
        if not self.scalable:
            return (_Shape(layers=n, count=1, span=cdiv(n * page, row)),)
        per_row = row // page
        if per_row == 0:  # a page larger than a row spans several rows
            return (_Shape(layers=1, count=n, span=cdiv(page, row)),)
        full, rest = divmod(n, per_row)
        if not rest:
            return (_Shape(layers=per_row, count=full),)
        remainder = _Shape(layers=rest, count=1, factor=self._remainder_factor(rest, row))
        return (_Shape(layers=per_row, count=full), remainder) if full else (remainder,)

    def _remainder_factor(self, rest: int, row: int) -> int:
        """The largest factor whose enlarged pages of ``rest`` layers still fit in a row."""
        return next((f for f in reversed(self.factors) if rest * self.page(f) <= row), 1)

    def tally(self, row: int) -> tuple[int, int]:
        """``(groups, rows one request holds)`` of :meth:`cut` ``(row)``, without making the
        shapes: every candidate row width is tallied, only the chosen one is cut."""
        n = len(self.layers)
        page = self.page()
        if not self.scalable:
            return 1, cdiv(n * page, row) * self.pages_per_request()
        per_row = row // page
        if per_row == 0:
            return n, n * cdiv(page, row) * self.pages_per_request()
        full, rest = divmod(n, per_row)
        if not rest:
            return full, full * self.pages_per_request()
        factor = self._remainder_factor(rest, row)
        return full + 1, full * self.pages_per_request() + self.pages_per_request(factor)

    def rows_per_request(self, shapes: Iterable[_Shape]) -> int:
        return sum(s.count * s.span * self.pages_per_request(s.factor) for s in shapes)


def block_factors(limit: int, options: PlanOptions) -> list[int]:
    """Block-size factors up to ``limit`` that ``options.block_multiples`` allows."""
    if options.block_multiples == "any":
        return list(range(1, limit + 1))
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


class MixedBucket:
    """The layers of one retention kind whose pages differ: ONE mixed-page group, its layers'
    pages side by side in a row, the whole group enlarged by one factor (like a remainder
    group) so that it fills the row, or its page spread over an aligned run of rows."""

    def __init__(
        self,
        specs: Mapping[str, KVCacheSpec],
        layers: list[str],
        context: SizingContext,
        options: PlanOptions,
        *,
        scalable: bool = True,
    ) -> None:
        self.layers = layers
        self.context = context
        self.specs = {name: specs[name] for name in layers}
        self.spec = self.specs[layers[0]]
        #: shared_buffer mixes only attention-like kinds (states stay aligned runs of their own
        #: spec); ``unified_pool`` also passes a state kind, whose page keeps its size
        self.scalable = scalable
        enlarge = scalable and not options.uniform_block_size
        limit = max(1, options.max_block_size // self.spec.block_size) if enlarge else 1
        self.factors = block_factors(limit, options)
        self._sized: dict[int, dict[str, KVCacheSpec]] = {}
        self._pages: dict[int, int] = {}
        self._per_request: dict[int, int] = {}

    def specs_at(self, factor: int) -> dict[str, KVCacheSpec]:
        """Every layer's spec at ``factor`` x block size (equal specs stay one object)."""
        sized = self._sized.get(factor)
        if sized is None:
            made: dict[int, KVCacheSpec] = {}
            sized = {}
            for name, spec in self.specs.items():
                new = made.get(id(spec))
                if new is None:
                    new = spec if factor == 1 else spec.with_block_size(spec.block_size * factor)
                    made[id(spec)] = new
                sized[name] = new
            self._sized[factor] = sized
        return sized

    def page(self, factor: int = 1) -> int:
        """Bytes the group's pages take side by side in a row, as :meth:`SharedBufferPolicy.layout`
        places them (each layer on a multiple of its alignment)."""
        page = self._pages.get(factor)
        if page is None:
            page = self._pages[factor] = row_end(self.specs_at(factor).values())
        return page

    def pages_per_request(self, factor: int = 1) -> int:
        pages = self._per_request.get(factor)
        if pages is None:
            distinct = {id(s): s for s in self.specs_at(factor).values()}.values()
            pages = self._per_request[factor] = max(s.max_num_blocks(self.context) for s in distinct)
        return pages

    def _factor(self, row: int) -> int:
        return next((f for f in reversed(self.factors) if self.page(f) <= row), 1)

    def cut(self, row: int) -> tuple[_Shape, ...]:
        page = self.page()
        if page > row:
            return (_Shape(layers=len(self.layers), count=1, span=cdiv(page, row)),)
        return (_Shape(layers=len(self.layers), count=1, factor=self._factor(row)),)

    def tally(self, row: int) -> tuple[int, int]:
        page = self.page()
        if page > row:
            return 1, cdiv(page, row) * self.pages_per_request()
        return 1, self.pages_per_request(self._factor(row))

    def group(self, shape: _Shape) -> KVCacheGroup:
        sized = self.specs_at(shape.factor)
        first = sized[self.layers[0]]
        differ = {name: spec for name, spec in sized.items() if spec is not first and spec != first}
        return KVCacheGroup(
            layer_names=tuple(self.layers), spec=first, blocks_per_page=shape.span, layer_specs=differ
        )


def row_end(specs: Iterable[KVCacheSpec]) -> int:
    """Where the last of ``specs``' pages ends when each starts on a multiple of its alignment
    right after the previous one's slot (its page rounded up to its alignment)."""
    end = 0
    for spec in specs:
        align = spec.alignment_bytes
        end = _round_up(end, align) + _round_up(spec.page_size_bytes, align)
    return end


_AnyBucket = _Bucket | MixedBucket


def _buckets(specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions) -> list[_Bucket]:
    return [_Bucket(spec, layers, context, options) for spec, layers in specs_by_group_key(specs)]


def _mixed_buckets(
    specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
) -> list[_AnyBucket] | None:
    """The buckets of the mixed-page family: each retention kind of attention-like layers whose
    pages differ is one :class:`MixedBucket`; every other layer bucketed as usual. ``None``
    when no retention kind has layers of different pages (the family is the usual one)."""
    by_retention: dict[Hashable, list[str]] = {}
    keys: dict[int, Hashable] = {}
    for name, spec in specs.items():
        if not spec.page_scales_with_block_size:
            continue
        key = keys.get(id(spec))
        if key is None:
            key = keys[id(spec)] = (spec.retention_key, spec.block_size)
        by_retention.setdefault(key, []).append(name)
    mixed: dict[str, list[str]] = {}  # first layer -> the kind's layers
    for layers in by_retention.values():
        first = specs[layers[0]]
        if any(specs[name] is not first and specs[name] != first for name in layers):
            mixed[layers[0]] = layers
    if not mixed:
        return None
    in_mixed = {name for layers in mixed.values() for name in layers}
    rest = {name: spec for name, spec in specs.items() if name not in in_mixed}
    buckets: list[_AnyBucket] = [MixedBucket(specs, layers, context, options) for layers in mixed.values()]
    buckets.extend(_buckets(rest, context, options))
    return buckets


def _candidate_rows(buckets: Sequence[_AnyBucket], enlarged: bool = False) -> list[int]:
    """Row widths worth scoring: ``c`` pages of a bucket for the layer counts ``c`` it may put
    in a row, a mixed bucket's row at each factor, and with ``enlarged`` (any block multiple)
    also one enlarged page of each bucket (a row that an enlarged group fills)."""
    rows: set[int] = set()
    for bucket in buckets:
        if isinstance(bucket, MixedBucket):
            rows.update(bucket.page(f) for f in bucket.factors)
            continue
        n = len(bucket.layers)
        counts = {*range(1, min(n, _MAX_DENSE_CANDIDATES) + 1), *_divisors(n)}
        page = bucket.page()
        rows.update(c * page for c in counts)
        if enlarged and bucket.scalable:
            rows.update(bucket.page(f) for f in bucket.factors)
    return sorted(rows)


class _Score(NamedTuple):
    """One candidate row width, scored (a named tuple: there are hundreds per plan)."""

    row: int
    groups: int
    efficiency: float
    #: the family of buckets: 0 the usual (one spec per group), 1 mixed-page groups
    family: int = 0


def _score(buckets: Sequence[_AnyBucket], row: int, need: int, family: int = 0) -> _Score:
    rows = groups = 0
    for bucket in buckets:
        bucket_groups, bucket_rows = bucket.tally(row)
        groups += bucket_groups
        rows += bucket_rows
    return _Score(row=row, groups=groups, efficiency=need / (row * rows) if rows else 1.0, family=family)


def _assign(layers: list[str], shapes: Sequence[_Shape]) -> list[tuple[list[str], _Shape]]:
    """Distribute a bucket's layers (model order) over its groups.

    The remainder group (fewer layers) takes evenly spaced layers; the equal groups take the rest
    strided (``i mod count``), so each group reaches across the whole model.
    """
    remaining = list(layers)
    out: list[tuple[list[str], _Shape]] = []
    for shape in sorted(shapes, key=lambda s: s.layers):
        if shape.count == 1 and shape.layers < len(remaining):
            n = len(remaining)
            picks = sorted({(2 * i + 1) * n // (2 * shape.layers) for i in range(shape.layers)})
            picked = set(picks)
            chosen = [remaining[i] for i in picks]
            remaining = [name for i, name in enumerate(remaining) if i not in picked]
            out.append((chosen, shape))
        else:
            for j in range(shape.count):
                out.append((remaining[j :: shape.count], shape))
            remaining = []
    return out


class SharedBufferPolicy:
    """Groups of any kinds in one buffer; groups share bytes, rows are filled evenly."""

    name = "shared_buffer"
    description = "hybrid models: one buffer, groups share its bytes; row width chosen for capacity"
    #: ``auto`` asks it after ``uniform``: it plans any mix of kinds.
    auto_priority = 100

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        return None

    def group(
        self, specs: Mapping[str, KVCacheSpec], context: SizingContext, options: PlanOptions
    ) -> Sequence[KVCacheGroup]:
        buckets = _buckets(specs, context, options)
        need = sum(len(b.layers) * b.spec.max_memory_usage_bytes(context) for b in buckets)
        enlarged = options.block_multiples == "any"
        scores = [_score(buckets, row, need) for row in _candidate_rows(buckets, enlarged)]
        families: list[Sequence[_AnyBucket]] = [buckets]
        mixed = _mixed_buckets(specs, context, options) if options.mixed_pages else None
        if mixed is not None:
            families.append(mixed)
            scores.extend(_score(mixed, row, need, family=1) for row in _candidate_rows(mixed, enlarged))
        floor = max(s.efficiency for s in scores) * (1.0 - options.grouping_tolerance)
        if options.max_groups is not None:
            # the widest candidate row holds every bucket in one group: the fewest there are
            options.check_group_count(self.name, min(s.groups for s in scores))
            scores = [s for s in scores if s.groups <= options.max_groups]
            # a bound the usual choice keeps changes nothing; else the tolerance is counted
            # from the best layout within the bound
            within = max(s.efficiency for s in scores)
            if within < floor:
                floor = within * (1.0 - options.grouping_tolerance)
        chosen = min(
            (s for s in scores if s.efficiency >= floor),
            key=lambda s: (s.groups, -s.efficiency, s.family, s.row),
        )
        position = {name: i for i, name in enumerate(specs)}
        groups: list[KVCacheGroup] = []
        for bucket in families[chosen.family]:
            if isinstance(bucket, MixedBucket):
                groups.extend(bucket.group(shape) for shape in bucket.cut(chosen.row))
                continue
            for names, shape in _assign(bucket.layers, bucket.cut(chosen.row)):
                groups.append(
                    KVCacheGroup(
                        layer_names=tuple(names),
                        spec=bucket.spec_at(shape.factor),
                        blocks_per_page=shape.span,
                    )
                )
        groups.sort(key=lambda g: position[g.layer_names[0]])
        return tuple(groups)

    def layout(self, groups: Sequence[KVCacheGroup]) -> BlockPlacement:
        return rows_layout(groups)


def rows_layout(groups: Sequence[KVCacheGroup]) -> BlockPlacement:
    """One pool of rows for ``groups``: each group's pages side by side in a row (a page wider
    than a row over an aligned run of ``blocks_per_page`` rows); the row is as wide as the widest
    page needs per row of its run, rounded up to every layer's alignment. Shared by
    ``shared_buffer`` and ``unified_pool``."""
    # A group puts its layers' pages side by side, each on a multiple of its alignment;
    # layer i of a group starts at i x (page rounded up to the alignment).
    # A mixed-page group places each layer after the previous one's slot, on a multiple
    # of its own alignment.
    align = 1
    row = 0
    for group in groups:
        for spec in group.specs:
            align = math.lcm(align, spec.alignment_bytes)
        count = len(group.layer_names)
        if count and group.layer_specs:
            end = row_end(group.spec_of(name) for name in group.layer_names)
            row = max(row, cdiv(end, group.blocks_per_page))
        elif count:
            spec = group.spec
            slot = _round_up(spec.page_size_bytes, spec.alignment_bytes)
            end = (count - 1) * slot + spec.page_size_bytes
            row = max(row, cdiv(end, group.blocks_per_page))
    row = _round_up(row, align)
    # one tensor per (offset, stride): the layers of different groups at the same place,
    # in the order the places first appear
    lanes: list[tuple[int, int, list[str]]] = []
    at: dict[int, dict[int, list[str]]] = {}  # stride -> offset -> the lane's layers
    for group in groups:
        stride = row * group.blocks_per_page
        by_offset = at.setdefault(stride, {})
        for offset, name in _offsets(group):
            lane = by_offset.get(offset)
            if lane is None:
                lane = by_offset[offset] = [name]
                lanes.append((offset, stride, lane))
            else:
                lane.append(name)
    tensors = tuple(TensorPlacement(offset, stride, names) for offset, stride, names in lanes)
    return BlockPlacement(bytes_per_block=row, single_buffer=True, tensors=tensors)


def _offsets(group: KVCacheGroup) -> Iterable[tuple[int, str]]:
    """``(offset in the row, layer)`` of each of the group's layers: side by side, each on a
    multiple of its alignment (layer ``i`` of a one-spec group at ``i`` x its slot)."""
    if not group.layer_specs:
        spec = group.spec
        slot = _round_up(spec.page_size_bytes, spec.alignment_bytes)
        return [(i * slot, name) for i, name in enumerate(group.layer_names)]
    out = []
    end = 0
    for name in group.layer_names:
        spec = group.spec_of(name)
        start = _round_up(end, spec.alignment_bytes)
        out.append((start, name))
        end = start + _round_up(spec.page_size_bytes, spec.alignment_bytes)
    return out


@hookimpl
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    register(SharedBufferPolicy())
