"""Built-in kind ``state``: a fixed per-request state (SSM / linear-attention layers).

A Mamba-1, Mamba-2 or gated-delta-net layer keeps no per-token cache. Each request holds one
state of fixed shapes (a short convolution window and a recurrent state), whatever its length.
Its page is that whole state, so the page does not grow with the block size, a request holds
one page (more with speculative decoding or a prefix-caching cache mode, see
:class:`StateSpec`), and the page holds no tokens.

How the page sits beside attention pages is the policy's business: ``shared_buffer`` gives all
state layers of one spec one group whose page spans an aligned run of ``blocks_per_page`` block
ids, so attention layers keep their own small block size (``docs/reference/models.md``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from kvcore.cache_layout import CacheLayout, PagePart
from kvcore.dtypes import DType, dtype_name, dtype_size, to_dtype
from kvcore.errors import InvalidSpecError
from kvcore.hookspecs import hookimpl
from kvcore.plugins.kind_hooks import kind_hooks
from kvcore.spec import (
    OMIT_IF_DEFAULT,
    STATE_CACHE_MODES,
    KVCacheSpec,
    SizingContext,
    cdiv,
    non_negative_int,
    page_boundary_steps,
    shown_fields,
)
from kvcore.validators import is_int

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


def _shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not value:
        raise InvalidSpecError(f"state: a part's 'shape' must be a non-empty list of ints (got {value!r})")
    for dim in value:
        if not is_int(dim) or dim < 1:
            raise InvalidSpecError(
                f"state: every dimension of a part's 'shape' must be an int >= 1 (got {value!r})"
            )
    return tuple(value)


def _name(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidSpecError(f"state: a part's 'name' must be a non-empty string (got {value!r})")


@attrs.frozen(kw_only=True, repr=False)
class StatePart:
    """One tensor of a layer's per-request state.

    Attributes:
        name: a label, unique within the spec (``"conv"``, ``"ssm"``, ``"recurrent"``).
        shape: the tensor's shape for one request.
        dtype: its element type (a name or a torch dtype is converted).
    """

    name: str = attrs.field(validator=_name)
    shape: tuple[int, ...] = attrs.field(converter=_shape)
    dtype: DType = attrs.field(converter=to_dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of this tensor for one request."""
        return math.prod(self.shape) * dtype_size(self.dtype)

    def __repr__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"{self.name}[{dims} {dtype_name(self.dtype)}]"


def _parts(value: object) -> tuple[StatePart, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidSpecError(f"state: 'parts' must be a list of state tensors (got {value!r})")
    parts = tuple(value)
    if not parts:
        raise InvalidSpecError("state: 'parts' must list at least one state tensor (got none)")
    for part in parts:
        if not isinstance(part, StatePart):
            raise InvalidSpecError(f"state: every entry of 'parts' must be a StatePart (got {part!r})")
    names = [part.name for part in parts]
    if len(set(names)) != len(names):
        raise InvalidSpecError(f"state: part names must be unique (got {names})")
    return parts


def _cache_mode(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in STATE_CACHE_MODES:
        modes = ", ".join(STATE_CACHE_MODES)
        raise InvalidSpecError(f"state: 'cache_mode' must be one of {modes} (got {value!r})")


def _checkpointed(instance: StateSpec, attribute: attrs.Attribute[int], value: int) -> None:
    if value and not instance.checkpoint_slots:
        raise InvalidSpecError(
            f"state: 'checkpoint_alignment' ({value}) places prefill checkpoints, but 'checkpoint_slots' "
            "is 0, so no checkpoint is kept; give checkpoint_slots >= 1 or leave checkpoint_alignment at 0"
        )


def _align(offset: int, alignment: int) -> int:
    return cdiv(offset, alignment) * alignment


@functools.lru_cache(maxsize=256)
def _page_layout(parts: tuple[StatePart, ...]) -> tuple[tuple[int, ...], int, int]:
    """``(offset of each part, page bytes, alignment)`` of a state of ``parts``: worked out once
    per shape (planners read a state's page size per layer, thousands of times a plan)."""
    offsets = []
    offset = 0
    for part in parts:
        offset = _align(offset, dtype_size(part.dtype))
        offsets.append(offset)
        offset += part.nbytes
    align = max(dtype_size(part.dtype) for part in parts)
    return tuple(offsets), _align(offset, align), align


@attrs.frozen(kw_only=True, repr=False)
class StateSpec(KVCacheSpec):
    """A fixed per-request state: one page per state, independent of the request's length.

    Page size: the parts laid end to end, each at an offset that is a multiple of its element
    size, the total rounded up to the largest element size (:attr:`alignment_bytes`). A Mamba
    state of a conv part ``(3, 8192)`` and an SSM part ``(8192, 16)``, both bfloat16, takes
    ``3*8192*2 + 8192*16*2 = 311,296`` bytes.

    ``block_size`` is kept so that a state layer can be written in a spec file like any other
    and so that its group reports the model's block size; the page does not depend on it,
    but the ``all`` cache mode keeps one state per block of it.

    States per request (vLLM's ``mamba_cache_mode``, with ``S`` speculative slots, ``K``
    checkpoint slots and ``F`` in-flight slots): ``none`` ``1 + S`` (the running state, and one
    per draft token), ``align`` ``2 + S + K + F`` (also the state at the last block boundary,
    for prefix caching, the checkpoints a prefill exports from inside a step, and the states of
    steps scheduled but not yet processed), ``all`` ``ceil(L / block_size) + S`` (one per block
    of the request). vLLM 0.33 sizes an align-mode ``MambaSpec`` so:
    ``page x (2 + num_speculative_blocks + num_prefill_checkpoint_blocks)``
    (``vllm/v1/kv_cache_interface.py``, ``MambaSpec.max_memory_usage_bytes``); its Mamba-2 and
    Qwen gated-delta-net mixers ask for one checkpoint block (``mamba_mixer2.py``,
    ``qwen_gdn_linear_attn.py``), Mamba-1 (Jamba) for none, and only align mode holds it. A
    sizing context's ``num_speculative_tokens`` and ``state_cache_mode`` are written into the
    spec when it is planned (:meth:`sized_for`); the checkpoint fields are the layer's own.

    In-flight slots are the engine's: in align mode the state a step replaced is freed only once
    that step is processed (vLLM 0.33's ``MambaManager.remove_skipped_blocks`` frees by the
    processed tokens), so with the next step scheduled before the last one returns (vLLM's
    async scheduling, its default) a request crossing block boundaries each step holds one more
    state; measured on vLLM 0.33's ``KVCacheManager``: Jamba at 8,192 tokens holds 3 states a
    Mamba layer at its peak with async scheduling, 2 without. vLLM's own pool sizing counts 2.

    Attributes:
        parts: the state tensors, in page order.
        cache_mode: ``none`` (default), ``align`` or ``all``.
        speculative_slots: ``S``, extra states for the draft tokens of speculative decoding.
        checkpoint_slots: ``K``, states a request holds in ``align`` mode for the prefix
            checkpoints a prefill exports from inside one step (vLLM's
            ``num_prefill_checkpoint_blocks``); ``none`` and ``all`` hold none, whatever it says.
        checkpoint_alignment: tokens a checkpoint's position is a multiple of (vLLM's
            ``prefill_checkpoint_alignment``; ``0``: the layer gives none). It sizes nothing:
            it is kept so that the spec converts back to the engine's, whose block size must
            be a multiple of it in align mode.
        in_flight_slots: ``F``, states held in ``align`` mode for steps scheduled but not yet
            processed (``1`` under vLLM's async scheduling: kvcore's vLLM rules set it,
            :func:`~kvcore.integrations.vllm.rules.plan_for_vllm`); ``none`` and ``all``
            hold none.
    """

    kind = "state"
    page_scales_with_block_size = False
    #: the parts size a page; which states a request holds depends on the other fields
    page_fields = ("parts",)
    #: a page is a whole state: it goes to host as the checkpoint of a prefix at a block boundary
    offload_unit = "checkpoint"

    parts: tuple[StatePart, ...] = attrs.field(converter=_parts)
    cache_mode: str = attrs.field(default="none", validator=_cache_mode, metadata={OMIT_IF_DEFAULT: True})
    speculative_slots: int = attrs.field(
        default=0, validator=non_negative_int, metadata={OMIT_IF_DEFAULT: True}
    )
    checkpoint_slots: int = attrs.field(
        default=0, validator=non_negative_int, metadata={OMIT_IF_DEFAULT: True}
    )
    checkpoint_alignment: int = attrs.field(
        default=0, validator=[non_negative_int, _checkpointed], metadata={OMIT_IF_DEFAULT: True}
    )
    in_flight_slots: int = attrs.field(
        default=0, validator=non_negative_int, metadata={OMIT_IF_DEFAULT: True}
    )

    def __repr__(self) -> str:
        # attrs' repr, without the fields that hold their defaults since they were added
        fields = ", ".join(f"{a.name}={getattr(self, a.name)!r}" for a in shown_fields(self))
        return f"{type(self).__qualname__}({fields})"

    @property
    def part_offsets(self) -> tuple[int, ...]:
        """Byte offset of each part inside the page."""
        return _page_layout(self.parts)[0]

    @property
    def state_bytes(self) -> int:
        """Bytes of the state itself: the parts without alignment padding."""
        return sum(part.nbytes for part in self.parts)

    @property
    def page_size_bytes(self) -> int:
        return _page_layout(self.parts)[1]

    @property
    def alignment_bytes(self) -> int:
        return _page_layout(self.parts)[2]

    @property
    def tokens_per_page(self) -> None:
        return None

    def live_pages(self, num_tokens: int, num_computed_tokens: int = 0) -> range:
        """From the request's first token on, never freed: ``1 + S`` states (``none``),
        ``2 + S + K + F`` (``align``) or ``ceil(num_tokens / block_size) + S`` (``all``)."""
        if num_tokens <= 0:
            return range(0)
        if self.cache_mode == "none":
            return range(1 + self.speculative_slots)
        if self.cache_mode == "align":
            return range(2 + self.speculative_slots + self.checkpoint_slots + self.in_flight_slots)
        return range(cdiv(num_tokens, self.block_size) + self.speculative_slots)

    def growth_steps(self, context: SizingContext) -> range:
        """A fixed count of states throughout (``none``, ``align``); one more per block of the
        request in ``all``, as a full-attention table grows (see
        :meth:`~kvcore.KVCacheSpec.growth_steps`)."""
        if self.cache_mode != "all":
            return range(0)
        return page_boundary_steps(self.block_size, context)

    def sized_for(self, context: SizingContext) -> StateSpec:
        """The context's ``state_cache_mode`` and ``num_speculative_tokens`` (where set) written
        into the spec."""
        mode = context.state_cache_mode or self.cache_mode
        slots = context.num_speculative_tokens or self.speculative_slots
        if mode == self.cache_mode and slots == self.speculative_slots:
            return self
        return attrs.evolve(self, cache_mode=mode, speculative_slots=slots)

    def max_num_blocks(self, context: SizingContext) -> int:
        """States one request holds (``len(live_pages(L))`` of the spec as served with ``context``)."""
        return len(self.sized_for(context).live_pages(context.max_model_len))


@hookimpl(trylast=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """One part per state tensor, at its aligned offset; the page dimension comes first."""
    if not isinstance(spec, StateSpec):
        return None
    return CacheLayout(
        parts=tuple(
            PagePart(name=part.name, shape=part.shape, dtype=part.dtype, offset_bytes=offset, block_dim=0)
            for part, offset in zip(spec.parts, spec.part_offsets, strict=True)
        )
    )


def state_specs(
    *,
    block_sizes: SearchStrategy[int],
    dtypes: SearchStrategy[DType],
    max_parts: int = 3,
    max_dim: int = 32,
) -> SearchStrategy[StateSpec]:
    """A :class:`~kvcore.plugins.kind_hooks.SpecStrategy` for ``state`` specs, each part's
    dtype drawn on its own (parts of different dtypes need alignment).

    Args:
        max_parts: most state tensors (``conv``, ``ssm``, ``extra``), at least one.
        max_dim: largest dimension of a part's shape (one to three dimensions).
    """
    from hypothesis import strategies as st

    def part(name: str) -> SearchStrategy[StatePart]:
        shape = st.lists(st.integers(1, max_dim), min_size=1, max_size=3).map(tuple)
        return st.builds(StatePart, name=st.just(name), shape=shape, dtype=dtypes)

    names = ("conv", "ssm", "extra")[: max(1, max_parts)]
    parts = st.integers(1, len(names)).flatmap(lambda count: st.tuples(*(part(n) for n in names[:count])))
    # a checkpoint alignment only beside checkpoint slots (the validator refuses it alone); often
    # one a block is a multiple of (Mamba-2's is 1), so that prefill checkpoints are taken
    alignments = st.one_of(st.sampled_from([0, 1, 1, 2, 4, 8, 16]), st.integers(0, 64))
    checkpoints = st.integers(0, 2).flatmap(
        lambda slots: st.tuples(st.just(slots), alignments if slots else st.just(0))
    )
    return st.builds(
        lambda checkpoint, **fields: StateSpec(
            **fields, checkpoint_slots=checkpoint[0], checkpoint_alignment=checkpoint[1]
        ),
        checkpoints,
        block_size=block_sizes,
        parts=parts,
        cache_mode=st.sampled_from(STATE_CACHE_MODES),
        speculative_slots=st.integers(0, 3),
        in_flight_slots=st.integers(0, 1),
    )


kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(StateSpec, state_specs)
