"""Conformance checks for spec kinds and allocation policies, as plain functions.

Each check takes concrete objects and returns nothing when they conform. When they do not, it
raises :class:`AssertionError` with one sentence that names the rule, shows what it saw and says
what to fix. The pytest suites in :mod:`kvcore.testing.conformance` draw the objects with
hypothesis and call these functions; any test may call them directly.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

import attrs

from kvcore.dtypes import dtype_size
from kvcore.errors import (
    DuplicateRegistrationError,
    InvalidInputError,
    InvalidSpecError,
    KVCoreError,
    PolicyNotApplicableError,
)
from kvcore.plan import KVCacheGroup, KVCachePlan, KVCacheTensor, structural_problems
from kvcore.planning.capacity import Capacity
from kvcore.planning.invariants import plan_problems
from kvcore.planning.registry import Registry
from kvcore.planning.serialization import (
    plan_from_dict,
    plan_from_json,
    plan_to_json,
    spec_from_dict,
    spec_to_dict,
)
from kvcore.policy import AllocationPolicy
from kvcore.spec import KVCacheSpec, SizingContext, cdiv, describe_spec
from kvcore.testing.registries import build_registry
from kvcore.testing.strategies import PlanningProblem
from kvcore.validators import is_int

#: Block sizes and JSON values every spec kind must reject (``block_size`` is a base field).
BAD_BLOCK_SIZES: tuple[object, ...] = (0, -16, "16", 16.0, True, None)


def _fail(message: str) -> NoReturn:
    raise AssertionError(message)


def init_fields(spec: KVCacheSpec) -> dict[str, Any]:
    """The keyword arguments that rebuild ``spec`` (its ``init`` fields)."""
    return {a.name: getattr(spec, a.name) for a in attrs.fields(type(spec)) if a.init}


# -- spec kinds ----------------------------------------------------------------------------


def check_frozen_and_hashable(spec: KVCacheSpec) -> None:
    """A spec is a frozen attrs instance: no field can be assigned, and equal copies hash equal."""
    cls = type(spec)
    if not attrs.has(cls):
        _fail(f"{cls.__qualname__} is not an attrs class; decorate it with @attrs.frozen(kw_only=True)")
    for field in attrs.fields(cls):
        try:
            setattr(spec, field.name, getattr(spec, field.name))
        except attrs.exceptions.FrozenInstanceError:
            continue
        _fail(
            f"{cls.__qualname__} accepts assignments to {field.name!r}; specs are shared between "
            "layers, groups and plans, so they must be frozen: use @attrs.frozen(kw_only=True)"
        )
    copy = attrs.evolve(spec)
    if copy != spec:
        _fail(f"{describe_spec(spec)} differs from an identical copy of itself; keep eq=True")
    try:
        hashes = {hash(spec), hash(copy)}
    except TypeError as exc:
        _fail(f"{cls.__qualname__} is not hashable ({exc}); a frozen attrs class is")
    if len(hashes) != 1:
        _fail(f"{describe_spec(spec)} and an equal copy have different hashes")


def check_kind_registered(spec_cls: type[KVCacheSpec], registry: Registry) -> None:
    """``spec_cls.kind`` is a non-empty name that ``registry`` maps to ``spec_cls``."""
    kind = getattr(spec_cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        _fail(f"{spec_cls.__qualname__} needs a non-empty 'kind' class attribute (got {kind!r})")
    if kind not in registry.kinds:
        _fail(
            f"spec kind {kind!r} is not in the registry (it has {', '.join(registry.kinds)}); register "
            "the class from a kvcore_register_spec_kinds hook and list the plugin in kvcore_plugins"
        )
    if registry.spec_class(kind) is not spec_cls:
        _fail(f"spec kind {kind!r} is registered for {registry.spec_class(kind)!r}, not {spec_cls!r}")


def check_kind_unique(spec_cls: type[KVCacheSpec], plugins: Iterable[object]) -> None:
    """No installed plugin registers ``spec_cls.kind`` besides ``spec_cls`` itself."""
    try:
        installed = build_registry(*plugins, autoload=True)
    except DuplicateRegistrationError as exc:
        _fail(f"{exc}")
    check_kind_registered(spec_cls, installed)


def check_json_round_trip(spec: KVCacheSpec, registry: Registry) -> None:
    """A spec written as JSON through the registry's converter reads back equal, same class."""
    data = spec_to_dict(spec, registry)
    if data.get("kind") != spec.kind:
        _fail(f"{describe_spec(spec)} is written with kind {data.get('kind')!r}, not {spec.kind!r}")
    try:
        text = json.dumps(data)
    except TypeError as exc:
        _fail(f"{describe_spec(spec)} does not turn into JSON ({exc}); give its fields JSON types")
    back = spec_from_dict(json.loads(text), registry)
    if type(back) is not type(spec) or back != spec or hash(back) != hash(spec):
        _fail(f"{describe_spec(spec)} reads back from {text} as {describe_spec(back)}")


def check_page_size(spec: KVCacheSpec) -> None:
    """``page_size_bytes`` is a positive ``int`` (bytes are counted in whole integers)."""
    page = spec.page_size_bytes
    if not is_int(page) or page < 1:
        _fail(f"{describe_spec(spec)}: page_size_bytes must be an int >= 1 (got {page!r})")


#: How many times its block size a page padded to an alignment may take to grow: a kind that pads
#: its page up to a multiple of some bytes (vLLM pads DeepSeek-V4's pages to 576) keeps one page
#: size over a run of block sizes, but a page of 4096 times the tokens outgrows any such padding.
PADDED_GROWTH_FACTOR = 4096


def check_page_size_vs_block_size(spec: KVCacheSpec, larger_block_size: int) -> None:
    """A larger block size never gives a smaller page, and gives a larger one unless the page is
    padded (then one :data:`PADDED_GROWTH_FACTOR` times larger does), or the same page for a
    per-request state."""
    if larger_block_size <= spec.block_size:
        raise InvalidInputError(f"larger_block_size must exceed {spec.block_size} (got {larger_block_size})")
    other = spec.with_block_size(larger_block_size)
    small, large = spec.page_size_bytes, other.page_size_bytes
    if spec.page_scales_with_block_size and large < small:
        _fail(
            f"{describe_spec(spec)}: the page must not shrink as the block size grows (block "
            f"{spec.block_size} -> {small} bytes, block {larger_block_size} -> {large} bytes)"
        )
    far = spec.block_size * PADDED_GROWTH_FACTOR
    flat = large == small and spec.with_block_size(far).page_size_bytes <= small
    if spec.page_scales_with_block_size and flat:
        _fail(
            f"{describe_spec(spec)}: the page must grow with the block size (block {spec.block_size} "
            f"-> {small} bytes, block {larger_block_size} and even {far} -> the same); if it is a fixed "
            "state, set page_scales_with_block_size = False"
        )
    if not spec.page_scales_with_block_size and large != small:
        _fail(
            f"{describe_spec(spec)} sets page_scales_with_block_size = False but its page changes "
            f"with the block size ({small} bytes at {spec.block_size}, {large} at {larger_block_size})"
        )


def check_with_block_size(spec: KVCacheSpec, block_size: int) -> None:
    """``with_block_size`` returns the same class with only ``block_size`` changed."""
    other = spec.with_block_size(block_size)
    if type(other) is not type(spec) or other.block_size != block_size:
        _fail(f"{describe_spec(spec)}.with_block_size({block_size}) gave {describe_spec(other)}")
    before, after = init_fields(spec), init_fields(other)
    changed = [name for name in before if name != "block_size" and before[name] != after[name]]
    if changed:
        _fail(f"{describe_spec(spec)}.with_block_size({block_size}) also changed {changed}")


def check_max_usage_monotone(spec: KVCacheSpec, shorter: SizingContext, longer: SizingContext) -> None:
    """A request of at least one token holds at least one block, and a longer one never needs less."""
    if shorter.max_model_len > longer.max_model_len:
        raise InvalidInputError("'shorter' must not be longer than 'longer'")
    for context in (shorter, longer):
        blocks = spec.max_num_blocks(context)
        if not is_int(blocks) or blocks < 1:
            _fail(
                f"{describe_spec(spec)}: max_num_blocks must be an int >= 1 for a request of "
                f"{context.max_model_len} tokens (got {blocks!r})"
            )
    short, long = spec.max_memory_usage_bytes(shorter), spec.max_memory_usage_bytes(longer)
    if long < short:
        _fail(
            f"{describe_spec(spec)}: a request of {longer.max_model_len} tokens needs {long} bytes but "
            f"one of {shorter.max_model_len} tokens needs {short}; the worst case must not shrink "
            "as requests grow"
        )


def check_group_key_stable(spec: KVCacheSpec, registry: Registry) -> None:
    """Equal specs (a copy, a JSON round trip, the same block size again) have one hashable key."""
    key = spec.group_key
    try:
        hash(key)
    except TypeError as exc:
        _fail(f"{describe_spec(spec)}: group_key {key!r} is not hashable ({exc})")
    copies = {
        "a second read": spec,
        "an equal copy": attrs.evolve(spec),
        "a JSON round trip": spec_from_dict(spec_to_dict(spec, registry), registry),
        "with_block_size(block_size)": spec.with_block_size(spec.block_size),
    }
    for how, copy in copies.items():
        if copy.group_key != key:
            _fail(f"{describe_spec(spec)}: group_key changes after {how} ({key!r} vs {copy.group_key!r})")


def check_merge_of_equal_specs(spec: KVCacheSpec) -> None:
    """Merging the equal specs several workers report for one layer gives an equal spec."""
    merged = type(spec).merge([spec, attrs.evolve(spec)])
    if not isinstance(merged, type(spec)) or merged.group_key != spec.group_key:
        _fail(f"merging two copies of {describe_spec(spec)} gave {merged!r}")


def check_rejects_arguments(spec: KVCacheSpec, overlay: Mapping[str, Any]) -> None:
    """Building ``type(spec)`` from ``spec``'s fields updated with ``overlay`` raises InvalidSpecError."""
    fields = init_fields(spec)
    unknown = sorted(set(overlay) - set(fields))
    if unknown:
        raise InvalidInputError(
            f"invalid kwargs {dict(overlay)} name fields {type(spec).__name__} lacks: {unknown}"
        )
    kwargs = {**fields, **overlay}
    try:
        built = type(spec)(**kwargs)
    except InvalidSpecError:
        return
    except Exception as exc:
        _fail(
            f"{type(spec).__qualname__}(**{kwargs!r}) raised {type(exc).__name__}: {exc}; bad arguments "
            "must raise kvcore.InvalidSpecError (use the validators in kvcore.spec, never assert)"
        )
    _fail(
        f"{type(spec).__qualname__} accepted bad arguments {dict(overlay)} and built {describe_spec(built)}"
    )


def check_bad_json_rejected(spec: KVCacheSpec, registry: Registry) -> None:
    """A spec file entry with a missing field, an unknown key or a bad block size raises InvalidSpecError."""
    data = spec_to_dict(spec, registry)
    cases: dict[str, dict[str, Any]] = {}
    for field in attrs.fields(type(spec)):
        if field.init and field.default is attrs.NOTHING and field.name in data:
            cases[f"without {field.name!r}"] = {k: v for k, v in data.items() if k != field.name}
    cases["with an unknown key 'bogus_field'"] = {**data, "bogus_field": 1}
    for value in BAD_BLOCK_SIZES:
        cases[f"with block_size {value!r}"] = {**data, "block_size": value}
    for how, entry in cases.items():
        try:
            read = spec_from_dict(entry, registry)
        except InvalidSpecError:
            continue
        except Exception as exc:
            _fail(
                f"{spec.kind}: reading {entry} ({how}) raised {type(exc).__name__}: {exc}; it must raise "
                "kvcore.InvalidSpecError"
            )
        _fail(f"{spec.kind}: the entry {entry} ({how}) was accepted as {describe_spec(read)}")


def _one_group_plan(spec: KVCacheSpec, context: SizingContext, num_blocks: int) -> KVCachePlan:
    """A plan of one layer of ``spec`` over ``num_blocks`` pages: what a block pool needs."""
    page = spec.page_size_bytes
    return KVCachePlan(
        policy="conformance",
        num_blocks=num_blocks,
        bytes_per_block=page,
        single_buffer=True,
        groups=(KVCacheGroup(layer_names=("layer",), spec=spec),),
        tensors=(KVCacheTensor(size=num_blocks * page, page_stride=page, shared_by=("layer",)),),
        context=context,
        available_memory_bytes=num_blocks * page,
    )


def check_sized_for(spec: KVCacheSpec, context: SizingContext) -> KVCacheSpec:
    """``spec.sized_for(context)`` is what the planner plans: idempotent, and its worst case is
    the one ``spec.max_num_blocks(context)`` already counts.

    Args:
        spec: the spec.
        context: a sizing context, serving options included.

    Returns:
        The sized spec (for :func:`check_pool_follows_spec`).

    Raises:
        AssertionError: ``sized_for`` is not idempotent, returns a spec of another kind, or a
            worst case other than ``max_num_blocks`` counts.
    """
    sized = spec.sized_for(context)
    if type(sized) is not type(spec):
        got, wanted = type(sized).__name__, type(spec).__name__
        _fail(f"{describe_spec(spec)}: sized_for returned a {got}, not a {wanted}")
    again = sized.sized_for(context)
    if again != sized:
        _fail(
            f"{describe_spec(spec)}: sized_for is not idempotent: {describe_spec(sized)} becomes "
            f"{describe_spec(again)} when sized again"
        )
    planned, held = spec.max_num_blocks(context), sized.max_num_blocks(context)
    if planned != held:
        _fail(
            f"{describe_spec(spec)}: max_num_blocks counts {planned} pages per request but the spec the "
            f"planner plans ({describe_spec(sized)}) counts {held}; max_num_blocks must size the spec "
            "as sized_for(context) returns it"
        )
    return sized


@attrs.frozen(kw_only=True)
class _EveryToken(KVCacheSpec):
    """A kind that keeps every token (the defaults), one byte a token: the companion whose
    count grows at the end of a request, beside which a kind's peak is checked."""

    kind = "kvcore.testing.every_token"

    @property
    def page_size_bytes(self) -> int:
        return self.block_size


def check_joint_peak(spec: KVCacheSpec, context: SizingContext) -> None:
    """The joint peak never counts less than a request of the kind holds at some step, alone and
    beside a layer that keeps every token (:func:`kvcore.peaks.joint_peak` against a walk of every step
    start ``c``, each a step to ``min(c + T, L)``): a ``growth_steps`` that leaves out a step
    where the kind's count grows makes a plan reserve too little.

    Args:
        spec: the spec, as sized for ``context`` (:func:`check_sized_for`).
        context: a short request (the walk visits every token position).

    Raises:
        AssertionError: naming the step start the joint peak missed.
    """
    from kvcore.peaks import joint_peak

    companion = _EveryToken(block_size=spec.block_size)
    length, per_step = context.max_model_len, context.max_tokens_per_step
    for weighted in ([(spec, 1)], [(spec, 1), (companion, 1)]):
        counted = joint_peak(weighted, context)
        for c in range(length):
            n = min(c + per_step, length)
            held = sum(w * len(s.live_pages(n, c)) for s, w in weighted)
            if held > counted:
                names = " + ".join(describe_spec(s) for s, _ in weighted)
                _fail(
                    f"{names}: a step from {c} to {n} tokens holds {held} pages but the joint peak counts "
                    f"{counted} for a request of {length} tokens; growth_steps({context!r}) must list every "
                    f"step start where len(live_pages(min(c + T, L), c)) grows (here {c}), or return None"
                )


def check_pool_follows_spec(spec: KVCacheSpec, context: SizingContext, steps: Sequence[int]) -> None:
    """A block pool holds what the spec says a request holds, and never more than the plan counts.

    Drives one request through a :class:`~kvcore.BlockPool` as a scheduler does: each step
    frees what it no longer reads (``release_stale`` with the tokens cached), then grows the
    table (``reserve`` with the tokens the step brings it to). The steps compute ``steps``
    tokens, then as many as a step may (``context.max_tokens_per_step``) until the request
    reaches ``context.max_model_len``. After every step the pool must hold every entry of
    ``spec.live_pages(tokens, cached)`` (never fewer pages than the spec needs) and no more
    pages than the plan's worst case, ``spec.max_num_blocks(context)``.

    Args:
        spec: the spec whose group the pool serves.
        context: the request length and step size the plan is sized for.
        steps: tokens computed by each of the first steps (each between 1 and
            ``context.max_tokens_per_step``).

    Raises:
        AssertionError: the pool holds more pages than the plan counts, or lost a page the spec
            still needs (``live_pages`` took back an entry it had freed).
    """
    from kvcore.runtime.block_pool import NULL_PAGE, BlockPool

    length, per_step = context.max_model_len, context.max_tokens_per_step
    if any(not is_int(step) or not 1 <= step <= per_step for step in steps):
        raise InvalidInputError(f"every step must be an int from 1 to {per_step} (got {list(steps)})")
    planned = spec.max_num_blocks(context)
    bounds, done = [], 0
    for step in [*steps, *[per_step] * cdiv(length, per_step)]:
        if done >= length:
            break
        bounds.append((done, min(done + step, length)))
        done = bounds[-1][1]
    most = max(spec.live_pages(target, start).stop for start, target in bounds)
    pool = BlockPool(_one_group_plan(spec, context, max(1, planned, most)))
    pool.reserve("r", 0)
    for start, target in bounds:
        pool.release_stale("r", start)
        pool.reserve("r", target)
        table = pool.block_table("r", 0)
        held = sum(page != NULL_PAGE for page in table)
        live = spec.live_pages(target, start)
        what = f"a step from {start} to {target} tokens (a step may compute {per_step})"
        if held > planned:
            _fail(
                f"{describe_spec(spec)}: after {what} a request holds {held} pages (live_pages is "
                f"{live}) but the plan counts at most {planned} per request of {length} tokens "
                "(max_num_blocks): the pool would run out of pages the plan said fit; max_num_blocks "
                "must be the largest len(live_pages(n, c)) over steps, or live_pages must cap what a "
                "request holds"
            )
        lost = [k for k in live if k >= len(table) or table[k] == NULL_PAGE]
        if lost:
            _fail(
                f"{describe_spec(spec)}: after {what} the block pool lacks the entries {lost[:5]} of "
                f"live_pages = {live}, which an earlier step's live_pages had freed: a request would "
                "read pages it no longer holds; live_pages' start must never decrease as tokens are cached"
            )
    pool.free_request("r")
    if pool.num_free_blocks != pool.num_blocks:
        taken = pool.num_blocks - pool.num_free_blocks
        _fail(f"{describe_spec(spec)}: freeing the request left {taken} blocks taken")


def check_offload_unit(spec: KVCacheSpec, lengths: Sequence[int]) -> None:
    """The kind's :attr:`~kvcore.KVCacheSpec.offload_unit` is one kvcore knows and says what
    :meth:`~kvcore.KVCacheSpec.live_pages` says of its pages: a ``block`` kind's entry ``k``
    holds tokens ``[k*T, (k+1)*T)`` (``T = tokens_per_page``, so a request of ``n`` tokens has
    ``ceil(n / T)`` entries), a ``checkpoint`` kind holds states, not tokens
    (``tokens_per_page is None``), a ``request`` kind holds the same entries whatever the
    request's length. A kind that names the wrong unit would have a pool bring back pages that
    do not hold what a hit needs.

    Args:
        spec: the spec.
        lengths: request lengths (``>= 1``) to read ``live_pages`` at.

    Raises:
        AssertionError: an unknown unit, or one that ``live_pages`` contradicts.
    """
    from kvcore.spec import OFFLOAD_UNITS

    unit = spec.offload_unit
    name = describe_spec(spec)
    if unit not in OFFLOAD_UNITS:
        _fail(f"{name}: offload_unit is {unit!r}; it must be one of {', '.join(OFFLOAD_UNITS)}")
    per_page = spec.tokens_per_page
    if unit == "block":
        if per_page is None:
            _fail(
                f"{name}: offload_unit 'block' needs pages of tokens, but tokens_per_page is None; "
                "say 'checkpoint'"
            )
        for n in lengths:
            entries = spec.live_pages(n).stop
            if entries != cdiv(n, per_page):
                _fail(
                    f"{name}: offload_unit 'block' says entry k holds tokens [k*{per_page}, "
                    f"(k+1)*{per_page}), but a request of {n} tokens has {entries} entries, not "
                    f"{cdiv(n, per_page)}; say 'request' or 'none'"
                )
    elif unit == "checkpoint" and per_page is not None:
        _fail(
            f"{name}: offload_unit 'checkpoint' is for states (tokens_per_page None), but a page holds "
            f"{per_page} tokens"
        )
    elif unit == "request":
        held = {n: spec.live_pages(n) for n in lengths}
        if len(set(held.values())) > 1:
            seen = ", ".join(f"{n}: {r}" for n, r in list(held.items())[:3])
            _fail(
                f"{name}: offload_unit 'request' says a request's pages do not follow its tokens, but "
                f"live_pages differs with the length ({seen}); say 'block'"
            )


def check_offload_round_trip(spec: KVCacheSpec, registry: Registry, pages: Sequence[int]) -> None:
    """Pages of a kind that may go to a host tier come back byte for byte.

    Allocates a one-layer plan on the CPU with a host tier, fills it with random bytes, sends
    ``pages`` out in one batch (:class:`~kvcore.runtime.host_tier.HostTier`), overwrites the whole
    layer, brings them back into the same pages and compares every element of every part of
    them, bit for bit (padding between parts holds nothing and need not come back); a kind whose
    :attr:`~kvcore.KVCacheSpec.offload_unit` is ``none`` must be refused instead.

    Args:
        spec: the spec.
        registry: whose layout hook views the layer.
        pages: distinct page indices from 0 to 7.

    Raises:
        AssertionError: a byte did not come back, or a ``none`` kind was taken.
    """
    import torch

    from kvcore.errors import HostTierError
    from kvcore.plan import OffloadTier
    from kvcore.runtime.allocation import allocate
    from kvcore.runtime.host_tier import HostTier

    context = SizingContext(max_model_len=spec.block_size)
    # the plan must hold one request (cross attention: all its pages)
    count = max(8, spec.max_num_blocks(context))
    plan = _one_group_plan(spec, context, count)
    plan = plan.with_offload_tier(OffloadTier(pool_bytes=(count * spec.page_size_bytes,)))
    views = allocate(plan, "cpu", registry=registry)
    view = views["layer"]
    tensors = (view,) if isinstance(view, torch.Tensor) else tuple(view)
    buffer = torch.empty(0, dtype=torch.uint8).set_(tensors[0].untyped_storage())
    buffer.copy_(
        torch.randint(0, 256, buffer.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    )
    layout = registry.cache_layout(spec)
    index = torch.tensor(list(pages))

    def held() -> list[torch.Tensor]:
        # each part's pages as bytes: random bits hold NaNs, which compare unequal as floats
        return [
            t.index_select(part.block_dim, index).contiguous().view(torch.uint8)
            for t, part in zip(tensors, layout.parts, strict=True)
        ]

    before = held()
    tier = HostTier(plan, views, registry=registry)
    if spec.offload_unit == "none":
        try:
            tier.offload(0, list(pages))
        except HostTierError:
            return
        _fail(f"{describe_spec(spec)}: offload_unit is 'none' but the host tier took its pages")
    slots = tier.offload(0, list(pages))
    buffer.fill_(0xA5)
    tier.restore(0, slots, list(pages))
    for part, old, new in zip(layout.parts, before, held(), strict=True):
        if not torch.equal(old, new):
            _fail(
                f"{describe_spec(spec)}: part {part.name!r} of pages {list(pages)} came back from the host "
                "tier changed; its kvcore_cache_layout must view each page where the plan put it"
            )


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def check_cache_layout(spec: KVCacheSpec, registry: Registry, *, pages: int = 2) -> None:
    """The ``kvcore_cache_layout`` answer for ``spec`` can be viewed over pages, each part in its page.

    Builds the layer view of every part over ``pages`` real pages of a CPU byte buffer (the
    ``num_pages`` dimension inserted at ``block_dim``), and checks that page ``j`` of every part
    lies inside page ``j`` and that no two parts share a byte.

    Args:
        spec: the spec whose layout is checked.
        registry: whose ``kvcore_cache_layout`` implementations answer.
        pages: how many pages the views span.

    Raises:
        AssertionError: no plugin gives a layout, a part leaves its page, two parts overlap, or
            the page is not a whole number of a part's elements.
    """
    try:
        layout = registry.cache_layout(spec)
    except KVCoreError as exc:
        _fail(f"{describe_spec(spec)}: {exc}")
    if not layout.parts:
        _fail(f"{describe_spec(spec)}: the cache layout has no parts")
    import torch  # the testing kit imports torch only for the checks that make tensors

    from kvcore.runtime.torch_dtypes import torch_dtype

    page = spec.page_size_bytes
    buffer = torch.zeros(pages * page, dtype=torch.uint8)
    owner = torch.full((pages * page,), -1, dtype=torch.int16)
    for index, part in enumerate(layout.parts):
        size = dtype_size(part.dtype)
        if page % size:
            _fail(
                f"{describe_spec(spec)}: its page of {page} bytes is not a whole number of "
                f"{part.dtype} elements (part {part.name!r}); pad page_size_bytes to a multiple of {size}"
            )
        strides = _contiguous_strides(part.shape)
        view_shape = [*part.shape[: part.block_dim], pages, *part.shape[part.block_dim :]]
        view_strides = [*strides[: part.block_dim], page // size, *strides[part.block_dim :]]
        try:
            view = torch.as_strided(
                buffer.view(torch_dtype(part.dtype)), view_shape, view_strides, part.offset_bytes // size
            )
        except RuntimeError as exc:
            _fail(f"{describe_spec(spec)}: part {part.name!r} cannot be viewed over {pages} pages: {exc}")
        for j in range(pages):
            block = view.select(part.block_dim, j)
            start = block.data_ptr() - buffer.data_ptr()
            end = start + size * (
                1 + sum((d - 1) * s for d, s in zip(block.shape, block.stride(), strict=True))
            )
            if start < j * page or end > (j + 1) * page:
                _fail(
                    f"{describe_spec(spec)}: page {j} of part {part.name!r} spans bytes {start}..{end}, "
                    f"outside its page {j * page}..{(j + 1) * page}"
                )
            taken = owner[start:end]
            clash = taken[taken >= 0]
            if clash.numel():
                other = layout.parts[int(clash[0])].name
                _fail(f"{describe_spec(spec)}: parts {other!r} and {part.name!r} overlap in page {j}")
            taken.fill_(index)


# -- policies ------------------------------------------------------------------------------


def check_refusal(policy: AllocationPolicy, problem: PlanningProblem, registry: Registry) -> bool:
    """``why_not`` is ``None`` or one sentence, and planning a refused problem raises with it.

    Returns:
        ``True`` when the policy accepts the problem.
    """
    reason = policy.why_not(problem.specs)
    if reason is None:
        return True
    if not isinstance(reason, str) or not reason.strip():
        _fail(f"policy {policy.name!r}: why_not must return None or a non-empty sentence (got {reason!r})")
    try:
        problem.plan(policy.name, registry)
    except PolicyNotApplicableError as exc:
        if reason not in str(exc):
            _fail(f"policy {policy.name!r}: the refusal {exc} does not give why_not's reason {reason!r}")
        return False
    _fail(f"policy {policy.name!r} planned specs its why_not refused ({reason})")


def check_within_budget(plan: KVCachePlan, problem: PlanningProblem) -> None:
    """The plan allocates no more bytes than the budget it was given."""
    if plan.available_memory_bytes != problem.available_bytes:
        _fail(
            f"the plan records a budget of {plan.available_memory_bytes} bytes, not {problem.available_bytes}"
        )
    if plan.kv_cache_bytes > problem.available_bytes:
        _fail(
            f"policy {plan.policy!r} allocates {plan.kv_cache_bytes} bytes ("
            + " + ".join(f"{p.num_blocks} blocks of {p.bytes_per_block}" for p in plan.pools)
            + f") but the budget is {problem.available_bytes}"
        )


def check_every_layer_placed_once(plan: KVCachePlan, problem: PlanningProblem) -> None:
    """Every layer is in exactly one group and viewed through exactly one tensor."""
    wanted = Counter(list(problem.specs))
    for what, names in (
        ("groups", [n for g in plan.groups for n in g.layer_names]),
        ("tensors", [n for t in plan.tensors for n in t.shared_by]),
    ):
        seen = Counter(names)
        if seen != wanted:
            missing = sorted(wanted - seen)[:5]
            extra = sorted(seen - wanted)[:5]
            _fail(f"policy {plan.policy!r}: the {what} miss layers {missing} or repeat/invent {extra}")


def check_ranges_in_bounds(plan: KVCachePlan) -> None:
    """Every page of every layer lies inside its tensor, and every tensor inside its memory.

    These are the plan's own structural invariants (a :class:`~kvcore.KVCachePlan` checks
    them when it is built); this re-checks a plan however it was obtained.
    """
    problems = list(structural_problems(plan))
    if problems:
        _fail(f"policy {plan.policy!r} made a plan whose ranges break: {'; '.join(problems[:3])}")


def check_no_live_overlap(plan: KVCachePlan) -> None:
    """No two pages that can be live at once share a byte.

    See :func:`kvcore.planning.invariants.plan_problems`.
    """
    problems = plan_problems(plan, capacity=False)  # conformance plans may be past the fit
    if problems:
        _fail(f"policy {plan.policy!r} overlaps live pages: {'; '.join(problems[:3])}")


def check_not_above_ideal(plan: KVCachePlan, problem: PlanningProblem) -> None:
    """The plan never claims more concurrency than the ideal bound allows (an accounting bug)."""
    capacity = Capacity.of(plan, problem.specs)  # for the plan's budget, which is the problem's
    if plan.num_blocks and capacity.max_concurrency > capacity.ideal_concurrency * (1 + 1e-9):
        _fail(
            f"policy {plan.policy!r} claims {capacity.max_concurrency:.4f} requests at once but no layout "
            f"can hold more than {capacity.ideal_concurrency:.4f}; its blocks_per_request or "
            "bytes_per_block undercount"
        )


def check_same_plan(first: KVCachePlan, second: KVCachePlan) -> None:
    """Planning equal inputs twice gives equal plans."""
    if first != second:
        _fail(f"policy {first.policy!r} made two different plans from equal inputs: {first} vs {second}")


def check_more_memory_not_worse(small: KVCachePlan, large: KVCachePlan) -> None:
    """A larger budget never gives fewer blocks or less concurrency.

    For a plan of several pools, whose budget is split between them
    (:func:`~kvcore.planning.capacity.split_budget`), what never drops is the concurrency,
    the requests the fullest pool holds. One pool's count (and so the total) may: the bytes
    left after whole requests go to whichever pool can use them, and a larger budget may hand
    them to another pool.
    """
    if len(small.pools) > 1 or len(large.pools) > 1:
        if large.max_concurrency() < small.max_concurrency():
            _fail(
                f"policy {small.policy!r}: {large.available_memory_bytes} bytes hold "
                f"{large.max_concurrency():.3f} requests at once (pools of "
                f"{[p.num_blocks for p in large.pools]} blocks) but {small.available_memory_bytes} bytes "
                f"hold {small.max_concurrency():.3f} ({[p.num_blocks for p in small.pools]} blocks)"
            )
        return
    if large.num_blocks < small.num_blocks or large.max_concurrency() < small.max_concurrency():
        _fail(
            f"policy {small.policy!r}: {large.available_memory_bytes} bytes give {large.num_blocks} blocks "
            f"({large.max_concurrency():.3f} requests) but {small.available_memory_bytes} bytes give "
            f"{small.num_blocks} ({small.max_concurrency():.3f})"
        )


def check_plan_json_round_trip(plan: KVCachePlan, registry: Registry) -> None:
    """A plan written as JSON reads back equal (unchecked, for a plan that holds no request,
    which the checked read refuses)."""
    text = plan_to_json(plan, registry)
    if plan.fits():
        back = plan_from_json(text, registry)
    else:
        back = plan_from_dict(json.loads(text), registry, check=False)
    if back != plan:
        _fail(f"policy {plan.policy!r}: the plan reads back from JSON as a different plan: {text[:300]}")
