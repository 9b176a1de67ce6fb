"""What the block pool knows of one request: its record, and the checks of its arguments.

A request's record holds one block table per group of the plan (group indices are the
plan's; a table's entries are ids of the group's pool, or :data:`NULL_PAGE` once freed), how
many leading entries of each were released, the tokens its tables cover and the tokens it
computed, and, with prefix caching, its content and what of it was cached. One record per
request, shared by every pool of the plan.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final

import attrs

from kvcore.errors import InvalidInputError
from kvcore.limits import shown
from kvcore.validators import check_int, int_at_least

#: Block-table entry of a page that was freed because no later token reads it.
NULL_PAGE: Final = -1


@attrs.frozen
class PrefixKey:
    """The first ``num_tokens`` tokens of a request, named by an id instead of token ids.

    Requests with equal ``prefix_id`` share their first ``num_tokens`` tokens (a system prompt,
    a few-shot preamble); two keys with one id and different lengths share the blocks both
    cover.

    Attributes:
        prefix_id: any hashable id (a trace's ``prefix_id``).
        num_tokens: tokens the id names (``>= 0``).
    """

    prefix_id: Hashable
    num_tokens: int = attrs.field(validator=int_at_least(0))


class RequestRecord:
    """One request's tables and counts (mutable: the pool changes it in place, millions of
    times in a simulation, so it is a plain slotted class).

    Attributes:
        tables: per group of the plan, the request's block table.
        released: per group, the entries before it are :data:`NULL_PAGE`.
        tokens: tokens the tables cover (the largest count reserved).
        computed: the largest ``num_computed_tokens`` released.
        content: the token ids or :class:`PrefixKey` it was attached with (prefix caching), else ``None``.
        chains: per tokens-per-page, the chained keys of its token ids so far.
        registered: per group, the blocks looked at for caching (prefix caching), else ``None``.
        due: computed tokens before which no block fills (nothing to cache before).
        pending: ``(tokens looked up, tokens hit, of them tokens the host tier gave, cached
            pages attached per group)`` of an attach not yet counted (counted at the first
            reserve), else ``None``.
    """

    __slots__ = (
        "chains",
        "computed",
        "content",
        "due",
        "pending",
        "registered",
        "released",
        "tables",
        "tokens",
    )

    def __init__(self, num_groups: int) -> None:
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.released = [0] * num_groups
        self.tokens = 0
        self.computed = 0
        self.content: Sequence[int] | PrefixKey | None = None
        self.chains: dict[int, list[bytes]] = {}
        self.registered: list[int] | None = None
        self.due = 0.0
        self.pending: tuple[int, int, int, tuple[int, ...]] | None = None


def check_hashable(request_id: object) -> None:
    """Refuse a request id that cannot key a dict (a list, a dict, a tuple holding a list).

    Raises:
        InvalidInputError: naming the id's type.
    """
    try:
        hash(request_id)
    except TypeError:
        raise InvalidInputError(
            f"request ids must be hashable, such as a str or an int (got a {type(request_id).__name__}: "
            f"{request_id!r:.60})"
        ) from None


def too_long(request_id: Hashable, num_tokens: int, max_model_len: int, what: str) -> InvalidInputError:
    """The error for a request of more tokens than the plan's ``max_model_len``."""
    return InvalidInputError(
        f"cannot {what} {shown(num_tokens)} tokens of request {request_id!r:.60}: the plan's max_model_len "
        f"is {max_model_len:,}, the most tokens one request holds; plan for a longer max_model_len or "
        "shorten the request"
    )


def check_reserve(request_id: Hashable, num_tokens: object, max_model_len: int) -> None:
    """Refuse a ``num_tokens`` that is not an int from 0 to the plan's ``max_model_len``."""
    check_int(num_tokens, "'num_tokens'", minimum=0)
    if num_tokens > max_model_len:  # type: ignore[operator]
        raise too_long(request_id, num_tokens, max_model_len, "reserve")  # type: ignore[arg-type]


def shrinking(request_id: Hashable, num_tokens: int, held: int) -> InvalidInputError:
    """The error of a :meth:`~kvcore.runtime.block_pool.BlockPool.reserve` of fewer tokens
    than the request covers."""
    return InvalidInputError(
        f"cannot reserve {num_tokens} tokens for request {request_id!r}: its tables already cover "
        f"{held}; reserve() only grows a request, truncate(request, {num_tokens}) shrinks it"
    )


def unknown(request_id: Hashable, live: int) -> InvalidInputError:
    """The error for a request the pool does not know."""
    return InvalidInputError(f"unknown request {request_id!r}; reserve() it first ({live} requests live)")
