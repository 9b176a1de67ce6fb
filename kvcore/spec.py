"""The base of every KV-cache spec kind, and the sizing context specs are measured against.

A *spec* says what cache one layer needs: how many bytes one block of ``block_size`` tokens
takes (:attr:`KVCacheSpec.page_size_bytes`) and how many blocks one request holds at most
(:meth:`KVCacheSpec.max_num_blocks`). Concrete kinds (full attention, sliding window, MLA, SSM
state, third-party kinds) are plugins; nothing here knows their names.

Specs are frozen, keyword-only attrs classes. Input is validated when a spec is built and every
problem raises :class:`~kvcore.errors.InvalidSpecError`, never ``assert``. The field validators
kinds use, :func:`~kvcore.validators.positive_int` and :func:`~kvcore.validators.non_negative_int`,
live in :mod:`kvcore.validators` and are importable from here too.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Mapping, Sequence
from typing import ClassVar, TypeVar

import attrs

from kvcore.dtypes import DType, dtype_name, is_torch_dtype
from kvcore.errors import InvalidSpecError, SpecMismatchError
from kvcore.validators import non_negative_int as non_negative_int
from kvcore.validators import positive_int as positive_int

#: Default tokens scheduled per engine step (chunked prefill), the ``T`` that a sliding
#: window's or a chunk's worst case depends on. 2048 is the long-standing chunked-prefill
#: default of vLLM; pass the engine's real value when it differs.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

_S = TypeVar("_S", bound="KVCacheSpec")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


@attrs.frozen(kw_only=True)
class SizingContext:
    """What a request's worst-case cache need depends on, besides the spec itself.

    Attributes:
        max_model_len: the longest request (prompt plus output) the engine admits, in tokens.
        max_num_batched_tokens: tokens one engine step may schedule (the chunked-prefill
            budget). A sliding-window layer must keep ``window - 1`` earlier tokens for each of
            these, so its worst case grows with it.
    """

    max_model_len: int = attrs.field(validator=positive_int)
    max_num_batched_tokens: int = attrs.field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS, validator=positive_int)

    @property
    def max_tokens_per_step(self) -> int:
        """Tokens one request can add in one step: the smaller of the two limits."""
        return min(self.max_num_batched_tokens, self.max_model_len)

    def with_max_model_len(self, max_model_len: int) -> SizingContext:
        """A copy of this context for another request length."""
        return attrs.evolve(self, max_model_len=max_model_len)


@attrs.frozen(kw_only=True)
class KVCacheSpec(abc.ABC):
    """Base class of every spec kind.

    Subclasses set :attr:`kind`, add their own validated fields, and implement
    :attr:`page_size_bytes` and :meth:`max_num_blocks`. Register them from a
    ``kvcore_register_spec_kinds`` hook implementation.

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

    block_size: int = attrs.field(validator=positive_int)

    @property
    @abc.abstractmethod
    def page_size_bytes(self) -> int:
        """Bytes one block of this layer takes (one *page*)."""

    @abc.abstractmethod
    def max_num_blocks(self, context: SizingContext) -> int:
        """Blocks one request of ``context.max_model_len`` tokens holds at once, worst case.

        A full-attention layer holds every token's block; a sliding-window layer only the
        blocks its window (plus one step of new tokens) touches; a state layer one page.
        """

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

        The default, ``0``, keeps every token (full attention, MLA, per-request states).

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


def format_value(value: object) -> str:
    """A field value as shown in messages and tables (dtypes by their torch name)."""
    if isinstance(value, DType) or is_torch_dtype(value):
        return dtype_name(value)
    return repr(value)


def describe_spec(spec: KVCacheSpec) -> str:
    """A one-line description such as ``full_attention(block_size=16, num_kv_heads=8, ...)``."""
    fields = ", ".join(f"{a.name}={format_value(getattr(spec, a.name))}" for a in attrs.fields(type(spec)))
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


def resize_blocks(specs: Mapping[str, KVCacheSpec], block_size: int) -> dict[str, KVCacheSpec]:
    """Give every spec whose page grows with its block size the block size ``block_size``
    (per-request states keep theirs)."""
    return {
        name: spec.with_block_size(block_size) if spec.page_scales_with_block_size else spec
        for name, spec in specs.items()
    }


def check_layer_specs(specs: Mapping[str, KVCacheSpec]) -> None:
    """Check that ``specs`` maps non-empty layer names to spec instances.

    Raises:
        InvalidSpecError: naming the first offending entry.
    """
    if not isinstance(specs, Mapping):
        raise InvalidSpecError(
            f"layer specs must be a mapping of layer name to spec (got a {type(specs).__name__})"
        )
    if not specs:
        raise InvalidSpecError("there are no layers to plan a KV cache for (got an empty mapping)")
    for name, spec in specs.items():
        if not isinstance(name, str) or not name:
            raise InvalidSpecError(f"layer names must be non-empty strings (got {name!r})")
        if not isinstance(spec, KVCacheSpec):
            raise InvalidSpecError(
                f"layer {name!r}: expected a KVCacheSpec (got {spec!r} that is a {type(spec).__name__})"
            )
