"""The base of every KV-cache spec kind, and the sizing context specs are measured against.

A *spec* says what cache one layer needs: how many bytes one block of ``block_size`` tokens
takes (:attr:`KVCacheSpec.page_size_bytes`), which pages of its block table a request holds
after a number of tokens (:meth:`KVCacheSpec.live_pages`, what a block pool takes and frees)
and how many pages one request holds at most (:meth:`KVCacheSpec.max_num_blocks`, by default
read off ``live_pages``). A planner sizes for the most a request's layers hold together at one
moment, read off ``live_pages`` at the steps :meth:`KVCacheSpec.growth_steps` names
(:mod:`kvcore.peaks`). Concrete kinds (full attention, sliding
window, MLA, SSM state, third-party kinds) are plugins; nothing here knows their names.

Specs are frozen, keyword-only attrs classes. Input is validated when a spec is built and every
problem raises :class:`~kvcore.errors.InvalidSpecError`, never ``assert``; that includes the
page itself (:func:`check_page_geometry`: a positive page size that is a whole number of its
alignment). The field validators
kinds use, :func:`~kvcore.validators.positive_int` and :func:`~kvcore.validators.non_negative_int`,
live in :mod:`kvcore.validators` and are importable from here too.
"""

from __future__ import annotations

import abc
import inspect
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import ClassVar, TypeVar, get_origin

import attrs

from kvcore.dtypes import DType, dtype_name, is_torch_dtype
from kvcore.errors import InvalidSpecError, SpecMismatchError
from kvcore.limits import MAX_TOKENS, check_at_most, check_layer_count, check_layer_name
from kvcore.validators import is_int, non_negative_int as non_negative_int, positive_int as positive_int

#: Default tokens scheduled per engine step (chunked prefill), the ``T`` that a sliding
#: window's or a chunk's worst case depends on. 2048 is the long-standing chunked-prefill
#: default of vLLM; pass the engine's real value when it differs.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

_S = TypeVar("_S", bound="KVCacheSpec")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


def page_boundary_steps(per_page: int, context: SizingContext) -> range:
    """The step starts ``c >= 1`` at which ``ceil(min(c + T, L) / per_page)`` grows: the new
    tokens reach into one more page (``c + T - 1`` a multiple of ``per_page``, ``c + T <= L``)."""
    per_step, length = context.max_tokens_per_step, context.max_model_len
    first = (1 - per_step) % per_page or per_page
    return range(first, length - per_step + 1, per_page)


def _at_most_tokens(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    check_at_most(
        value, MAX_TOKENS, f"{attribute.name!r}", "no model serves requests that long", error=InvalidSpecError
    )


#: How a state kind (SSM, linear attention) keeps states for prefix caching, vLLM's
#: ``mamba_cache_mode``: ``none`` one running state per request, ``align`` the running state
#: and the last one at a block boundary (``2 + S``, plus a layer's prefill checkpoint slots),
#: ``all`` one state per block of the request.
STATE_CACHE_MODES = ("none", "align", "all")
#: How a kind's pages may go to a host tier and come back (:attr:`KVCacheSpec.offload_unit`):
#: ``none`` they never leave the device (a block pool drops them instead), ``block`` each page
#: alone (page ``k`` holds tokens ``[k*T, (k+1)*T)`` and depends on no later token, so it serves
#: any request sharing the prefix through it), ``checkpoint`` a page is a whole state after a
#: prefix that ends at a block boundary (it serves a request whose prefix ends exactly there),
#: ``request`` a request's pages go and come back together (they hold what the request brings,
#: such as its encoder output, not its tokens).
OFFLOAD_UNITS = ("none", "block", "checkpoint", "request")
#: Metadata key of a spec field that JSON leaves out while it holds its default: a field a kind
#: gained later, so that plans and spec files written before read and write the same.
OMIT_IF_DEFAULT = "kvcore.omit_if_default"


def _state_cache_mode(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and value not in STATE_CACHE_MODES:
        raise InvalidSpecError(
            f"{attribute.name!r} must be one of {', '.join(STATE_CACHE_MODES)} (got {value!r})"
        )


@attrs.frozen(kw_only=True)
class SizingContext:
    """What a request's worst-case cache need depends on, besides the spec itself.

    Attributes:
        max_model_len: the longest request (prompt plus output) the engine admits, in tokens.
        max_num_batched_tokens: tokens one engine step may schedule (the chunked-prefill
            budget). A sliding-window layer must keep ``window - 1`` earlier tokens for each of
            these, so its worst case grows with it.
        num_speculative_tokens: draft tokens proposed per step (speculative decoding, ``S``).
            A step reserves ``S`` lookahead slots beyond its scheduled tokens, capped at
            ``max_model_len`` as vLLM caps them, so window and chunk kinds hold ``S`` more
            tokens (:attr:`max_tokens_per_step`); state kinds hold ``S`` more states per
            request. ``0``: no speculative decoding.
        state_cache_mode: how state kinds keep states for prefix caching
            (:data:`STATE_CACHE_MODES`); ``None`` leaves each state spec's own (``none``).
        max_encoder_tokens: the longest encoder output a request brings (audio frames, image
            tokens) that cross-attention layers cache; ``0`` leaves each cross-attention
            spec's own, which its model family read from the config.
    """

    max_model_len: int = attrs.field(validator=[positive_int, _at_most_tokens])
    max_num_batched_tokens: int = attrs.field(
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS, validator=[positive_int, _at_most_tokens]
    )
    num_speculative_tokens: int = attrs.field(default=0, validator=[non_negative_int, _at_most_tokens])
    state_cache_mode: str | None = attrs.field(default=None, validator=_state_cache_mode)
    max_encoder_tokens: int = attrs.field(default=0, validator=[non_negative_int, _at_most_tokens])

    @property
    def max_tokens_per_step(self) -> int:
        """Tokens one request's table can grow by in one step: the scheduled tokens and the
        speculative lookahead slots, ``min(max_num_batched_tokens + num_speculative_tokens,
        max_model_len)``."""
        return min(self.max_num_batched_tokens + self.num_speculative_tokens, self.max_model_len)

    @property
    def is_plain(self) -> bool:
        """Whether no serving option is set beyond the lengths: no speculative tokens, state
        cache mode or encoder length, so every spec is served as it is (:meth:`KVCacheSpec.sized_for`)."""
        return (
            not self.num_speculative_tokens and self.state_cache_mode is None and not self.max_encoder_tokens
        )

    def with_max_model_len(self, max_model_len: int) -> SizingContext:
        """A copy of this context for another request length."""
        return attrs.evolve(self, max_model_len=max_model_len)


@attrs.frozen(kw_only=True)
class KVCacheSpec(abc.ABC):
    """Base class of every spec kind.

    Subclasses set :attr:`kind`, add their own validated fields, and implement
    :attr:`page_size_bytes`. What a request holds comes from :meth:`live_pages` (by default
    every page of its tokens, as full attention keeps, freed as :meth:`first_retained_token`
    says); a kind that holds something else overrides it, and a kind that frees pages as
    decoding moves on overrides :meth:`max_num_blocks` with its worst case. Register them from
    a ``kvcore_register_spec_kinds`` hook implementation.

    Every subclass that adds fields must itself be a frozen attrs class
    (``@attrs.frozen(kw_only=True)``); registration refuses one that is not.

    Attributes:
        block_size: tokens per block. Layers in one group share a block table, so they share
            this value.
    """

    #: Unique name of the kind, used as the ``"kind"`` tag in JSON. Third-party kinds should be
    #: namespaced (``"acme.sparse_attention"``); built-ins own the bare names.
    kind: ClassVar[str] = ""
    #: Whether :attr:`page_size_bytes` is proportional to :attr:`block_size`. Planners may give
    #: such a spec a larger block size to even out page sizes; a spec whose page is a fixed
    #: per-request state (SSM) sets this to ``False``.
    page_scales_with_block_size: ClassVar[bool] = True
    #: Fields that change only the bytes of a page, not which pages a request holds (an
    #: attention kind's heads, head size and dtype): layers whose specs differ only in these
    #: have one :attr:`retention_key` and may share a block table with mixed page sizes.
    page_fields: ClassVar[tuple[str, ...]] = ()
    #: Whether and how this kind's pages may be moved to a host tier and brought back
    #: (:data:`OFFLOAD_UNITS`). The default, ``"none"``, is the safe answer for a kind kvcore
    #: knows nothing of: its pages stay on the device and a pool that runs out drops them, as
    #: without a tier. A kind opts in by naming its unit; the conformance check
    #: ``check_offload_unit`` holds the answer to what :meth:`live_pages` says.
    offload_unit: ClassVar[str] = "none"

    block_size: int = attrs.field(validator=positive_int)

    @property
    @abc.abstractmethod
    def page_size_bytes(self) -> int:
        """Bytes one block of this layer takes (one *page*)."""

    def __attrs_post_init__(self) -> None:
        check_page_geometry(self)

    def live_pages(self, num_tokens: int, num_computed_tokens: int = 0) -> range:
        """The entries of a request's block table that hold pages while it grows to ``num_tokens``.

        This one method is what a request holds: a block pool
        (:class:`~kvcore.runtime.block_pool.BlockPool`) grows the table to ``.stop`` entries
        and frees the entries before ``.start``, and the planner's worst case
        (:meth:`max_num_blocks`) is the largest ``len()`` it takes.

        A scheduler step has ``num_computed_tokens`` tokens cached (positions
        ``0 .. num_computed_tokens - 1``) and computes positions up to ``num_tokens - 1``. The
        default (full attention, MLA, per-request states; every kind whose pages hold its
        tokens in order) is: entry ``k`` holds tokens ``[k*T, (k+1)*T)`` (``T`` =
        :attr:`tokens_per_page`), every entry up to the one of token ``num_tokens - 1`` is
        needed, and the entries that hold only tokens before
        ``first_retained_token(num_computed_tokens)`` are not; a state
        (``tokens_per_page is None``) holds its one entry as soon as the request has a token.

        A kind that holds something else overrides it, e.g. cross attention over a fixed
        encoder output holds all its pages from the first token on. The result must never
        lose an entry a later step needs: ``.start`` never decreases as
        ``num_computed_tokens`` grows, and ``.stop`` never decreases as ``num_tokens`` grows.

        Args:
            num_tokens: tokens the request covers once the step is done (``>= 0``).
            num_computed_tokens: tokens already cached before the step (``0 <= ... <=
                num_tokens``); ``0`` frees nothing.

        Returns:
            ``range(first live entry, number of entries)``.
        """
        per_page = self.tokens_per_page
        if per_page is None:
            return range(1 if num_tokens > 0 else 0)
        return range(self.first_retained_token(num_computed_tokens) // per_page, cdiv(num_tokens, per_page))

    def sized_for(self, context: SizingContext) -> KVCacheSpec:
        """This spec as an engine serving with ``context``'s options holds it.

        The block pool sees specs only (:meth:`live_pages` takes no context), so a kind whose
        pages depend on a serving option of the context (speculative tokens, a state cache
        mode, the encoder length) writes the option into a field of its own here; the
        planner calls it on every spec before planning, and the plan's groups keep the
        result. The default returns ``self``: the kind depends on no such option. It must be
        idempotent and return ``self`` when nothing changes, and :meth:`max_num_blocks` must
        agree with it: ``spec.max_num_blocks(c) == spec.sized_for(c).max_num_blocks(c)``.

        Args:
            context: the sizing context.

        Returns:
            The spec to plan and to drive a block pool with.
        """
        return self

    def max_num_blocks(self, context: SizingContext) -> int:
        """Pages one request of ``context.max_model_len`` tokens holds at once, worst case.

        The default is ``len(live_pages(max_model_len))``: every entry of the longest request,
        nothing freed. That is the exact worst case of a kind that frees nothing (full
        attention holds ``ceil(L / block_size)`` pages, a state one page, a fixed encoder
        output its own pages). A kind that frees pages (:meth:`first_retained_token`) may
        override it with a closed form of its tighter worst case over every step of at most
        ``context.max_tokens_per_step`` tokens: a sliding-window layer holds only the blocks
        its window plus one step of new tokens touches. The conformance check
        ``check_pool_follows_spec`` drives a block pool to hold an override to that.
        """
        return len(self.live_pages(context.max_model_len))

    def growth_steps(self, context: SizingContext) -> range | None:
        """Where the pages a request holds may grow: the joint peak's candidate step starts.

        A step that starts with ``c`` tokens cached computes up to ``n = min(c + T, L)``
        (``T`` = ``context.max_tokens_per_step``, ``L`` = ``context.max_model_len``) and holds
        ``len(live_pages(n, c))`` pages. Across a model's groups a request holds the sum of
        those at one moment, and the largest such sum (:func:`~kvcore.peaks.joint_peak`)
        is what a request needs. That sum is largest at ``c = 0`` or at a ``c`` where some kind's
        count is larger than at ``c - 1``; this method lists those ``c`` for this kind (any
        superset is fine: more candidates cost time, never exactness).

        The default serves the default :meth:`live_pages` whatever :meth:`first_retained_token`
        frees (``.start`` only grows with ``c``, so only ``.stop = ceil(n / B)`` raises the
        count): the ``c`` in ``1 .. L - T`` where ``c + T - 1`` is a multiple of ``B``; a state
        of the default rule holds one page throughout (an empty range). A kind that overrides
        :meth:`live_pages` and not this method gets ``None``: the joint peak then counts its
        :meth:`max_num_blocks` at every moment, an upper bound that is exact for a kind whose
        page count never changes over a request (cross attention, a per-request state).

        Args:
            context: the sizing context (as :meth:`sized_for` served the spec).

        Returns:
            The candidate step starts, ``0`` implied; ``None`` when unknown.
        """
        if type(self).live_pages is not KVCacheSpec.live_pages:
            return None
        per_page = self.tokens_per_page
        if per_page is None:
            return range(0)
        return page_boundary_steps(per_page, context)

    def max_memory_usage_bytes(self, context: SizingContext) -> int:
        """Bytes one request of ``context.max_model_len`` tokens needs at most in this layer."""
        return self.max_num_blocks(context) * self.page_size_bytes

    def first_retained_token(self, num_tokens: int) -> int:
        """The first token position this layer may still read once ``num_tokens`` are cached.

        ``num_tokens`` counts the tokens of a request whose K/V are already in the cache
        (positions ``0 .. num_tokens - 1``); the next token to be computed is at position
        ``num_tokens``, and every later step only computes later positions. The layer never
        reads a token before the returned position again for the rest of the request, so a
        page that holds only such tokens can be freed (a block pool does that as decoding moves
        on). The result is at most ``num_tokens`` and never decreases as ``num_tokens`` grows.

        The default, ``0``, keeps every token (full attention, MLA, per-request states). The
        default :meth:`live_pages` frees the pages before it.

        Args:
            num_tokens: tokens of the request already in the cache (``>= 0``).

        Returns:
            The position of the earliest token that must stay cached.
        """
        return 0

    @property
    def tokens_per_page(self) -> int | None:
        """Tokens one page holds, or ``None`` for a per-request state that does not grow."""
        return self.block_size

    @property
    def alignment_bytes(self) -> int:
        """Byte alignment a page of this spec needs inside a shared buffer (its element size)."""
        return 1

    @property
    def group_key(self) -> Hashable:
        """Specs with equal keys may share one block table (be in one group).

        The default is the spec itself (a frozen value compared by type and every field), i.e.
        equal specs group together. An override must depend on the spec's fields only: planners
        compute it once per distinct spec, not once per layer.
        """
        return self

    @property
    def retention_key(self) -> Hashable:
        """Specs with equal keys hold the same block-table entries for every request, whatever
        their page sizes, so they may share one block table with pages of different sizes (a
        *mixed-page* group: each layer keeps its own page in the group's row).

        A kind that keeps every token in order (it overrides none of :meth:`live_pages`,
        :meth:`max_num_blocks` and :meth:`first_retained_token`) keys on its tokens per page
        alone, so full attention and MLA of one block size share a key. Another kind keys on
        its class and every field but those named in :attr:`page_fields` (the fields that only
        change the bytes of a page); with no ``page_fields`` that is its :attr:`group_key`.
        An override must depend on the spec's fields only.
        """
        cls = type(self)
        if (
            cls.live_pages is KVCacheSpec.live_pages
            and cls.max_num_blocks is KVCacheSpec.max_num_blocks
            and cls.first_retained_token is KVCacheSpec.first_retained_token
        ):
            return ("keeps every token", self.tokens_per_page)
        if not cls.page_fields:
            return self.group_key
        return (cls, *(getattr(self, f.name) for f in attrs.fields(cls) if f.name not in cls.page_fields))

    def with_block_size(self: _S, block_size: int) -> _S:
        """A copy with another block size (page size changes accordingly)."""
        return attrs.evolve(self, block_size=block_size)

    @classmethod
    def merge(cls: type[_S], specs: Sequence[_S]) -> _S:
        """Merge the specs several workers report for one layer into one.

        The default requires every spec to have the same :attr:`group_key` and returns the
        first one.

        Raises:
            SpecMismatchError: the specs differ; the message names the differing fields.
        """
        if not specs:
            raise SpecMismatchError("cannot merge an empty list of specs")
        first = specs[0]
        for other in specs[1:]:
            if other.group_key != first.group_key:
                raise SpecMismatchError(
                    f"specs cannot be merged: {describe_spec(first)} differs from "
                    f"{describe_spec(other)} in {', '.join(spec_differences(first, other))}"
                )
        return first


_CLASS_VAR = re.compile(r"^\s*(typing\.|t\.)?ClassVar\b")


def _is_class_var(annotation: object) -> bool:
    if isinstance(annotation, str):
        return bool(_CLASS_VAR.match(annotation))
    return annotation is ClassVar or get_origin(annotation) is ClassVar


def spec_class_problems(cls: type[KVCacheSpec]) -> list[str]:
    """What keeps a spec class from being a frozen attrs value, one sentence per problem.

    Every class of ``cls``'s MRO (below :class:`KVCacheSpec`) that adds fields must be an attrs
    class itself, or attrs never sees those fields: they are not built by ``__init__``, compared,
    hashed or written to JSON. And every attrs class among them must be frozen (attrs'
    ``__setattr__``, which a frozen base passes on). A subclass that adds no fields (it only
    sets ``kind`` or overrides methods) needs no decorator. Its :attr:`~KVCacheSpec.offload_unit`
    must be one of :data:`OFFLOAD_UNITS`.

    Args:
        cls: the spec class, as a plugin registers it.

    Returns:
        The problems (empty when there are none).
    """
    problems = []
    if cls.offload_unit not in OFFLOAD_UNITS:
        problems.append(
            f"{cls.__qualname__}.offload_unit is {cls.offload_unit!r}; it must be one of "
            f'{", ".join(OFFLOAD_UNITS)} ("none" keeps its pages on the device)'
        )
    for klass in cls.__mro__:
        if klass is KVCacheSpec or not issubclass(klass, KVCacheSpec):
            continue
        if "__attrs_attrs__" not in vars(klass):
            added = [n for n, a in inspect.get_annotations(klass).items() if not _is_class_var(a)]
            if added:
                problems.append(
                    f"{klass.__qualname__} adds the fields {', '.join(added)} but is not an attrs class, so "
                    "they would be neither built, compared nor written to JSON; decorate it with "
                    "@attrs.frozen(kw_only=True)"
                )
        elif klass.__setattr__ is not KVCacheSpec.__setattr__:
            problems.append(
                f"{klass.__qualname__} is not frozen (it replaces __setattr__); specs are shared between "
                "layers, groups and plans: decorate it with @attrs.frozen(kw_only=True)"
            )
    return problems


def check_page_geometry(spec: KVCacheSpec) -> None:
    """Check that a spec's page can be laid out: a positive ``int`` size that is a whole number
    of its positive ``int`` alignment.

    Every spec runs it when it is built (:class:`KVCacheSpec` calls it after the field
    validators), so a kind whose page is empty or negative fails where the spec is made, not
    later in a policy that lays pages side by side.

    Args:
        spec: the spec to check.

    Raises:
        InvalidSpecError: naming the kind, its class (and so its plugin module) and the value.
    """
    page, alignment = spec.page_size_bytes, spec.alignment_bytes
    ints = type(page) is int and type(alignment) is int  # the usual case, checked once per spec
    if ints and page >= 1 and alignment >= 1 and page % alignment == 0:
        return
    cls = type(spec)
    where = f"spec kind {cls.kind or cls.__qualname__!r} ({cls.__module__}:{cls.__qualname__})"
    if not is_int(alignment) or alignment < 1:
        raise InvalidSpecError(
            f"{where}: alignment_bytes must be an int >= 1 (got {alignment!r}); fix the kind's "
            "alignment_bytes (its element size in bytes)"
        )
    if not is_int(page) or page < 1:
        raise InvalidSpecError(
            f"{where}: page_size_bytes must be an int >= 1 (got {page!r} for {describe_spec(spec)}); "
            "fix the kind's page_size_bytes"
        )
    raise InvalidSpecError(
        f"{where}: page_size_bytes {page} is not a multiple of alignment_bytes {alignment} (for "
        f"{describe_spec(spec)}); pad the page to a multiple of {alignment} bytes"
    )


def format_value(value: object) -> str:
    """A field value as shown in messages and tables (dtypes by their torch name)."""
    if isinstance(value, DType) or is_torch_dtype(value):
        return dtype_name(value)
    return repr(value)


def shown_fields(spec: KVCacheSpec) -> list[attrs.Attribute[object]]:
    """The fields descriptions show: all but those marked :data:`OMIT_IF_DEFAULT` that hold
    their default."""
    return [
        a
        for a in attrs.fields(type(spec))
        if not (a.metadata.get(OMIT_IF_DEFAULT) and getattr(spec, a.name) == a.default)
    ]


def describe_spec(spec: KVCacheSpec) -> str:
    """A one-line description such as ``full_attention(block_size=16, num_kv_heads=8, ...)``."""
    fields = ", ".join(f"{a.name}={format_value(getattr(spec, a.name))}" for a in shown_fields(spec))
    return f"{spec.kind or type(spec).__name__}({fields})"


def spec_differences(a: KVCacheSpec, b: KVCacheSpec) -> list[str]:
    """Names (with both values) of the fields where two specs differ."""
    if type(a) is not type(b):
        return [f"kind ({a.kind!r} vs {b.kind!r})"]
    out = []
    for field in attrs.fields(type(a)):
        va, vb = getattr(a, field.name), getattr(b, field.name)
        if va != vb:
            out.append(f"{field.name} ({format_value(va)} vs {format_value(vb)})")
    return out or ["group key"]


def is_kv_cache_type_uniform(specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether every layer's spec can share one block table (all group keys are equal).

    An empty mapping counts as uniform.
    """
    return len(specs_by_group_key(specs)) <= 1


def specs_by_group_key(specs: Mapping[str, KVCacheSpec]) -> list[tuple[KVCacheSpec, list[str]]]:
    """Bucket layers by :attr:`KVCacheSpec.group_key`: ``[(spec, [layer, ...]), ...]``.

    Buckets come in the order their first layer appears, layers in model order; the spec is the
    first layer's. Policies start from these buckets.
    """
    by_key: dict[Hashable, tuple[KVCacheSpec, list[str]]] = {}
    by_id: dict[int, list[str]] = {}  # the layers of each spec object's bucket: one key per object
    for name, spec in specs.items():
        layers = by_id.get(id(spec))
        if layers is None:
            layers = by_id[id(spec)] = by_key.setdefault(spec.group_key, (spec, []))[1]
        layers.append(name)
    return list(by_key.values())


def map_specs(
    specs: Mapping[str, KVCacheSpec], change: Callable[[KVCacheSpec], KVCacheSpec]
) -> dict[str, KVCacheSpec]:
    """``change`` of every spec, asked once per distinct spec object, so that layers that shared
    one spec object still share one (grouping compares specs; one object compares at once).

    Returns:
        ``{layer name: changed spec}`` in ``specs``' order.
    """
    done: dict[int, KVCacheSpec] = {}
    out: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        changed = done.get(id(spec))
        if changed is None:
            changed = done[id(spec)] = change(spec)
        out[name] = changed
    return out


def resize_blocks(specs: Mapping[str, KVCacheSpec], block_size: int) -> dict[str, KVCacheSpec]:
    """Give every spec whose page grows with its block size the block size ``block_size``
    (per-request states keep theirs)."""
    return map_specs(
        specs, lambda spec: spec.with_block_size(block_size) if spec.page_scales_with_block_size else spec
    )


def sized_specs(specs: Mapping[str, KVCacheSpec], context: SizingContext) -> Mapping[str, KVCacheSpec]:
    """Every spec as served with ``context`` (:meth:`KVCacheSpec.sized_for`), asked once per
    distinct spec object; ``specs`` itself when nothing changes (a plain context, or kinds that
    depend on no serving option).

    Args:
        specs: ``{layer name: spec}``.
        context: the sizing context.

    Returns:
        The specs, layers that shared a spec object still sharing one.
    """
    if context.is_plain:
        return specs
    out = map_specs(specs, lambda spec: spec.sized_for(context))
    return out if any(out[name] is not spec for name, spec in specs.items()) else specs


def check_layer_specs(specs: Mapping[str, KVCacheSpec]) -> None:
    """Check that ``specs`` maps layer names to spec instances: at most
    :data:`~kvcore.limits.MAX_LAYERS` of them, each name valid by
    :func:`~kvcore.limits.check_layer_name` (the rule binding relies on).

    Raises:
        InvalidSpecError: naming the first offending entry.
    """
    if not isinstance(specs, Mapping):
        raise InvalidSpecError(
            f"layer specs must be a mapping of layer name to spec (got a {type(specs).__name__})"
        )
    if not specs:
        raise InvalidSpecError("there are no layers to plan a KV cache for (got an empty mapping)")
    check_layer_count(len(specs), "the specs")
    spec_types: set[type] = set()  # an isinstance check per class, not per layer
    for name, spec in specs.items():
        check_layer_name(name)
        if type(spec) in spec_types:
            continue
        if isinstance(spec, KVCacheSpec):
            spec_types.add(type(spec))
        else:
            raise InvalidSpecError(
                f"layer {name!r}: expected a KVCacheSpec (got {spec!r} that is a {type(spec).__name__})"
            )
