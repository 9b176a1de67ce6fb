"""What an allocation policy is: the protocol plugins implement, and the options they get.

A policy turns layer specs into a plan in two steps, so that the core (not each policy) owns
the byte budget, forced block counts, admission checks and multi-rank agreement:

1. :meth:`AllocationPolicy.group` decides which layers share a block table (memory does not
   enter: grouping is judged by the *ratio* of useful bytes to allocated bytes);
2. :meth:`AllocationPolicy.layout` places the groups' pages in memory for a block count.

The core then picks ``num_blocks`` from the budget and ``layout(groups, 1).bytes_per_block``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from kvcore.errors import InvalidInputError
from kvcore.plan import KVCacheGroup, KVCacheTensor, _tensors
from kvcore.spec import KVCacheSpec, SizingContext, positive_int


def _tolerance(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise InvalidInputError(f"'{attribute.name}' must be a number in [0, 1) (got {value!r})")


@attrs.frozen(kw_only=True)
class PlanOptions:
    """Knobs a policy may honour.

    Attributes:
        grouping_tolerance: the fraction of capacity a policy may give up, relative to the best
            layout it found, in exchange for fewer groups (block tables). ``0`` asks for the
            highest capacity whatever the number of groups; the default ``0.005`` (0.5 %)
            usually halves the group count or better at no visible cost.
        max_block_size: the largest block size a policy may give a group when it enlarges
            blocks to even out page sizes (the built-in policy multiplies by powers of two
            only). The block size of the specs themselves is never changed otherwise.
    """

    grouping_tolerance: float = attrs.field(default=0.005, validator=_tolerance)
    max_block_size: int = attrs.field(default=128, validator=positive_int)


@attrs.frozen(kw_only=True)
class Layout:
    """Where a policy puts the pages of a set of groups, for one block count.

    Attributes:
        bytes_per_block: device bytes each block id accounts for.
        single_buffer: whether the tensors are views into one buffer (of
            ``num_blocks * bytes_per_block`` bytes) or separate allocations.
        tensors: the byte regions and the layers that view them.
    """

    bytes_per_block: int
    single_buffer: bool
    tensors: tuple[KVCacheTensor, ...] = attrs.field(converter=_tensors)


@runtime_checkable
class AllocationPolicy(Protocol):
    """The protocol of an allocation policy (register instances from ``kvcore_register_policies``).

    Attributes:
        name: unique name used to select the policy (``--policy NAME``).
        description: one line for ``kvcore plugins``.
    """

    name: str
    description: str

    def why_not(self, specs: Mapping[str, KVCacheSpec]) -> str | None:
        """``None`` if this policy can plan ``specs``, else one sentence saying why not."""
        ...

    def group(
        self,
        specs: Mapping[str, KVCacheSpec],
        context: SizingContext,
        options: PlanOptions,
    ) -> Sequence[KVCacheGroup]:
        """Partition the layers (in model order) into block-table groups.

        Every layer must appear in exactly one group. A group's spec may differ from its
        layers' specs only in ``block_size`` (a policy may enlarge blocks, up to
        ``options.max_block_size``).
        """
        ...

    def layout(self, groups: Sequence[KVCacheGroup], num_blocks: int) -> Layout:
        """Place the pages of ``groups`` for ``num_blocks`` block ids.

        ``bytes_per_block`` must not depend on ``num_blocks``. The groups may be a projection
        of the policy's own grouping onto one worker's layers (layers removed, possibly empty).
        """
        ...
