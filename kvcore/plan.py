"""The plan: how many blocks there are, which layers share a block table, and where bytes live.

A :class:`KVCachePlan` is what a policy produces and what allocation consumes. It is a frozen
value: it can be logged, compared, serialized (:mod:`kvcore.planning.serialization`) and checked
(:mod:`kvcore.planning.invariants`) without any device.

The block model: there is one pool of ``num_blocks`` block ids shared by every group. A block id
belongs to one group at a time, so layers of different groups may place their pages on the same
bytes. A group's page normally takes one block id; a group whose page is a large fixed state
(SSM) may take an aligned run of ``blocks_per_page`` ids instead, so attention keeps its small
block size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import attrs

from kvcore.errors import PlanValidationError
from kvcore.spec import KVCacheSpec, SizingContext
from kvcore.validators import non_negative_int, positive_int


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _null_block(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (type(value) is not int or value != 0):
        raise PlanValidationError(
            [f"'null_block' must be 0 (block id 0 reserved) or None (got {value!r})"]
        )


def _groups(value: Iterable[KVCacheGroup]) -> tuple[KVCacheGroup, ...]:
    return tuple(value)


def _tensors(value: Iterable[KVCacheTensor]) -> tuple[KVCacheTensor, ...]:
    return tuple(value)


def _sharing(value: Mapping[str, str] | None) -> dict[str, str]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class KVCacheGroup:
    """Layers that share one block table, and so one spec.

    Attributes:
        layer_names: the layers, in model order.
        spec: the spec every layer of the group has (its block size is the group's).
        blocks_per_page: pool block ids one page of this group takes (an aligned run).
    """

    layer_names: tuple[str, ...] = attrs.field(converter=_names)
    spec: KVCacheSpec
    blocks_per_page: int = attrs.field(default=1, validator=positive_int)

    def pages_per_request(self, context: SizingContext) -> int:
        """Pages one request of ``context.max_model_len`` tokens holds at most in this group."""
        return self.spec.max_num_blocks(context)

    def blocks_per_request(self, context: SizingContext) -> int:
        """Pool block ids one request of ``context.max_model_len`` tokens holds at most."""
        return self.pages_per_request(context) * self.blocks_per_page


@attrs.frozen(kw_only=True)
class KVCacheTensor:
    """A strided byte region that one or more layers view.

    Page ``j`` of every layer in ``shared_by`` starts at byte ``offset + j * page_stride`` of
    the backing memory (the shared buffer, or this tensor's own allocation). Layers that share
    a tensor belong to different groups; they never use the same page at the same time.

    Attributes:
        size: bytes from ``offset`` to the end of the last page.
        offset: where page 0 starts.
        page_stride: bytes from one page to the next.
        shared_by: the layers that view this region.
    """

    size: int
    offset: int = 0
    page_stride: int
    shared_by: tuple[str, ...] = attrs.field(converter=_names)

    def __attrs_post_init__(self) -> None:
        # one check for the usual case (a plan has a tensor per layer, so this is hot); the
        # validators word the problem otherwise
        size, offset, stride = self.size, self.offset, self.page_stride
        ints = type(size) is type(offset) is type(stride) is int
        if ints and size >= 0 and offset >= 0 and stride >= 1:
            return
        fields = attrs.fields(KVCacheTensor)
        non_negative_int(self, fields.size, size)
        non_negative_int(self, fields.offset, offset)
        positive_int(self, fields.page_stride, stride)


@attrs.frozen(kw_only=True)
class KVCachePlan:
    """A complete KV-cache plan for one worker.

    Attributes:
        policy: name of the policy that made it.
        num_blocks: size of the block-id pool shared by all groups.
        bytes_per_block: device bytes each block id accounts for; the plan uses
            ``num_blocks * bytes_per_block`` bytes in all.
        single_buffer: ``True`` when every tensor is a view into one buffer of
            ``kv_cache_bytes``; ``False`` when each tensor is its own allocation of ``size``.
        groups: the block-table groups.
        tensors: the byte regions, each shared by one or more layers.
        context: the request length (and step size) the plan was sized for.
        available_memory_bytes: the byte budget the plan was made for.
        kv_sharing: ``{layer: target layer}`` for layers that reuse another layer's cache
            (KV sharing across layers). A sharing layer is in no group's ``layer_names`` and
            no tensor's ``shared_by``: it takes no memory, views its target's tensor and reads
            its target's block table (:meth:`group_of`, :meth:`tensor_of` and
            :meth:`block_table_layers` answer for it, as vLLM puts it in its target's group).
        null_block: ``0`` when block id 0 is reserved as the *null block*: an engine pads its
            block tables with it (vLLM's convention), so it is never handed to a request and
            the capacity figures count :attr:`usable_blocks`, not :attr:`num_blocks`. ``None``
            (the default): every block id serves requests. The null block's pages are still
            allocated, so :attr:`kv_cache_bytes` is unchanged.
    """

    policy: str
    num_blocks: int = attrs.field(validator=non_negative_int)
    bytes_per_block: int = attrs.field(validator=non_negative_int)
    single_buffer: bool
    groups: tuple[KVCacheGroup, ...] = attrs.field(converter=_groups)
    tensors: tuple[KVCacheTensor, ...] = attrs.field(converter=_tensors)
    context: SizingContext
    available_memory_bytes: int = attrs.field(validator=non_negative_int)
    kv_sharing: Mapping[str, str] = attrs.field(factory=dict, converter=_sharing, hash=False)
    null_block: int | None = attrs.field(default=None, validator=_null_block)

    def __attrs_post_init__(self) -> None:
        problems = list(structural_problems(self))
        if problems:
            raise PlanValidationError(problems, policy=self.policy)

    # -- lookups ---------------------------------------------------------------------------

    @property
    def layer_names(self) -> tuple[str, ...]:
        """Every planned layer, group by group."""
        return tuple(name for group in self.groups for name in group.layer_names)

    def group_of(self, layer_name: str) -> KVCacheGroup:
        """The group a layer belongs to, or a sharing layer's target belongs to (``KeyError``
        if it is not planned)."""
        return self._group_index()[self.kv_sharing.get(layer_name, layer_name)]

    def tensor_of(self, layer_name: str) -> KVCacheTensor:
        """The tensor a layer views, or a sharing layer's target views (``KeyError`` if it is
        not planned)."""
        return self._tensor_index()[self.kv_sharing.get(layer_name, layer_name)]

    def block_table_layers(self, group: int | KVCacheGroup) -> tuple[str, ...]:
        """Every layer that reads ``group``'s block table: its own layers, then the layers
        that share their cache (``kv_sharing``), in that order.

        Args:
            group: the group, or its index in :attr:`groups`.

        Returns:
            The layer names; a runner gives each of them the group's block table.
        """
        chosen = self.groups[group] if isinstance(group, int) else group
        if not self.kv_sharing:
            return chosen.layer_names
        own = set(chosen.layer_names)
        return (*chosen.layer_names, *(name for name, target in self.kv_sharing.items() if target in own))

    def with_kv_sharing(self, kv_sharing: Mapping[str, str]) -> KVCachePlan:
        """This plan with ``kv_sharing`` (``{layer: target layer}``) recorded; checked like any plan.

        Raises:
            PlanValidationError: a sharing layer has a cache of its own, or a target has none.
        """
        return attrs.evolve(self, kv_sharing={**self.kv_sharing, **kv_sharing})

    def _group_index(self) -> dict[str, KVCacheGroup]:
        return {name: g for g in self.groups for name in g.layer_names}

    def _tensor_index(self) -> dict[str, KVCacheTensor]:
        return {name: t for t in self.tensors for name in t.shared_by}

    def num_pages(self, group: KVCacheGroup) -> int:
        """Pages a layer of ``group`` has: block ids divided into runs of ``blocks_per_page``."""
        return self.num_blocks // group.blocks_per_page

    # -- figures ---------------------------------------------------------------------------

    @property
    def reserved_blocks(self) -> int:
        """Block ids that never serve a request: none, or (with a :attr:`null_block`) the
        aligned run that holds block 0, one id unless a group's page spans several."""
        if self.null_block is None or not self.num_blocks:
            return 0
        return min(self.num_blocks, max((g.blocks_per_page for g in self.groups), default=1))

    @property
    def usable_blocks(self) -> int:
        """Block ids requests can hold: :attr:`num_blocks` less :attr:`reserved_blocks`."""
        return self.num_blocks - self.reserved_blocks

    @property
    def kv_cache_bytes(self) -> int:
        """Device bytes the plan allocates."""
        return self.num_blocks * self.bytes_per_block

    def blocks_per_request(self, max_model_len: int | None = None) -> int:
        """Block ids one request of ``max_model_len`` tokens holds at most, over all groups."""
        context = self._context_for(max_model_len)
        return sum(group.blocks_per_request(context) for group in self.groups)

    def max_concurrency(self, max_model_len: int | None = None) -> float:
        """Requests of ``max_model_len`` tokens (default: the plan's) the pool holds at once."""
        need = self.blocks_per_request(max_model_len)
        return self.usable_blocks / need if need else float("inf")

    def tokens_held(self, group: KVCacheGroup) -> int | None:
        """Tokens the whole pool could hold for ``group``'s layers, or ``None`` for a state."""
        per_page = group.spec.tokens_per_page
        return None if per_page is None else self.usable_blocks // group.blocks_per_page * per_page

    def fits(self, max_model_len: int | None = None) -> bool:
        """Whether one request of ``max_model_len`` tokens fits in the pool."""
        return self.blocks_per_request(max_model_len) <= self.usable_blocks

    def largest_fitting_len(self, upper: int | None = None) -> int:
        """The largest request length (up to ``upper``, default the plan's) that fits; 0 if none."""
        hi = upper if upper is not None else self.context.max_model_len
        if self.fits(hi):
            return hi
        lo = 0  # invariant: lo fits (0 trivially), hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _context_for(self, max_model_len: int | None) -> SizingContext:
        if max_model_len is None or max_model_len == self.context.max_model_len:
            return self.context
        return self.context.with_max_model_len(max_model_len)

    def iter_layers(self) -> Iterator[tuple[str, KVCacheGroup, KVCacheTensor]]:
        """``(layer name, group, tensor)`` for every planned layer, group by group; a sharing
        layer (``kv_sharing``) comes after its group's own layers, with its target's tensor."""
        tensors = self._tensor_index()
        sharing = self.kv_sharing
        for group in self.groups:
            for name in group.layer_names:
                yield name, group, tensors[name]
            if sharing:
                own = set(group.layer_names)
                for name, target in sharing.items():
                    if target in own:
                        yield name, group, tensors[target]


#: vLLM's (and kvcore 0.1's) name for a plan, kept for engine integrators who know it.
KVCacheConfig = KVCachePlan


def structural_problems(plan: KVCachePlan) -> Iterator[str]:
    """Cheap checks that every plan must pass; the byte-overlap check is in kvcore.planning.invariants.

    A plan checks these when it is built; this re-checks a plan however it was obtained.

    Args:
        plan: the plan to check.

    Yields:
        One sentence per broken rule (a layer in two groups or tensors, two layers of one
        group in one tensor, a page outside its tensor, a tensor outside its memory, a
        sharing layer with a cache of its own or a target without one); nothing for a sound
        plan.
    """
    grouped: dict[str, int] = {}
    for index, group in enumerate(plan.groups):
        for name in group.layer_names:
            if name in grouped:
                yield f"layer {name!r} is in groups {grouped[name]} and {index}"
            grouped[name] = index
    placed: dict[str, int] = {}
    buffer_bytes = plan.kv_cache_bytes
    for index, tensor in enumerate(plan.tensors):
        for name in tensor.shared_by:
            if name in placed:
                yield f"layer {name!r} is in tensors {placed[name]} and {index}"
            placed[name] = index
            if name not in grouped:
                yield f"tensor {index} is shared by {name!r}, which is in no group"
        if len(tensor.shared_by) > 1:
            yield from _same_group_sharers(index, tensor, grouped)
        if plan.single_buffer:
            if tensor.size and tensor.offset + tensor.size > buffer_bytes:
                yield (
                    f"tensor {index} spans bytes {tensor.offset}..{tensor.offset + tensor.size} "
                    f"but the buffer has {buffer_bytes} bytes"
                )
        elif tensor.offset != 0:
            yield f"tensor {index} is its own allocation but has offset {tensor.offset}"
    # (page bytes, pages) per group, computed once rather than per layer
    figures = [(g.spec.page_size_bytes, plan.num_blocks // g.blocks_per_page) for g in plan.groups]
    for name, gi in grouped.items():
        if name not in placed:
            yield f"layer {name!r} (group {gi}) is not covered by any tensor"
            continue
        tensor = plan.tensors[placed[name]]
        page, pages = figures[gi]
        if pages and page > tensor.page_stride:
            yield (
                f"layer {name!r}: its page of {page} bytes is larger than the tensor's page "
                f"stride of {tensor.page_stride} bytes, so its pages would overlap"
            )
        if pages and (pages - 1) * tensor.page_stride + page > tensor.size:
            yield (
                f"layer {name!r}: {pages} pages of {page} bytes at stride {tensor.page_stride} "
                f"do not fit in the tensor's {tensor.size} bytes"
            )
    if not plan.single_buffer:
        total = sum(t.size for t in plan.tensors)
        if total > buffer_bytes:
            yield f"the tensors take {total} bytes but the plan accounts for {buffer_bytes}"
    for name, target in plan.kv_sharing.items():
        if name in grouped or name in placed:
            yield (
                f"layer {name!r} shares {target!r}'s cache (kv_sharing) but also has a cache of its own; "
                "a sharing layer is in no group and no tensor"
            )
        if target not in grouped:
            why = "itself shares another layer's cache" if target in plan.kv_sharing else "is not planned"
            yield f"layer {name!r} shares the cache of {target!r}, which {why}"


def _same_group_sharers(index: int, tensor: KVCacheTensor, grouped: Mapping[str, int]) -> Iterator[str]:
    """Layers of one group that share ``tensor``: they would write the same bytes at once."""
    first: dict[int, str] = {}
    for name in tensor.shared_by:
        group = grouped.get(name)
        if group is None:
            continue
        other = first.setdefault(group, name)
        if other != name:
            yield (
                f"layers {other!r} and {name!r} are both in group {group} and share tensor {index}; "
                "layers that share a tensor must be in different groups (one block table means "
                "their pages are live at once)"
            )
