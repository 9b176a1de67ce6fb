"""What prefix caching in the block pool keys its blocks by, and what it reports.

A request's leading tokens are named either by their token ids (a sequence of ints: an
engine's prompt) or by a :class:`PrefixKey` (an id shared by every request whose first
``num_tokens`` tokens are the same: what a simulator's trace knows). A group's block ``k``
holds tokens ``[k*B, (k+1)*B)``; only full blocks are keyed, and a key names everything before
the block too:

- token ids: ``key(k) = sha256(key(k - 1) + the block's token ids as 8-byte ints)`` (a chain,
  so two requests share block ``k`` only if they share every token up to its end);
- a :class:`PrefixKey`: ``(prefix_id, B, k)`` for the blocks that lie wholly inside its
  ``num_tokens`` (the rest of the request is its own and never cached).

The pool (:class:`~kvcore.runtime.block_pool.BlockPool` with ``prefix_caching=True``) keeps one
key-to-block table per group and counts lookups in :class:`PrefixCacheStats`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Sequence

import attrs

from kvcore.errors import InvalidInputError
from kvcore.validators import int_at_least


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


@attrs.frozen
class PrefixCacheStats:
    """What prefix caching found, counted when a looked-up request's first ``reserve`` succeeds.

    Attributes:
        enabled: whether the pool caches (``False`` when it was not asked to, or a group cannot
            cache; ``reason`` says which).
        reason: why caching is off, or ``""``.
        lookups: requests looked up (:meth:`~kvcore.runtime.block_pool.BlockPool.attach_prefix`).
        hits: lookups that found at least one cached token.
        queried_tokens: the tokens those requests had when looked up.
        hit_tokens: the tokens found cached (they need no computing).
        evictions: cached blocks evicted to hand their ids out again.
    """

    enabled: bool
    reason: str
    lookups: int
    hits: int
    queried_tokens: int
    hit_tokens: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / queried_tokens`` (0 before any lookup)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def token_block_keys(tokens: Sequence[int], block_size: int, keys: list[bytes], count: int) -> None:
    """Extend ``keys`` (the chained keys of ``tokens``' first blocks) to ``count`` blocks.

    Args:
        tokens: the token ids (at least ``count * block_size`` of them).
        block_size: tokens per block.
        keys: the keys so far, extended in place.
        count: blocks wanted.

    Raises:
        InvalidInputError: a token id is not an int that fits 8 bytes.
    """
    while len(keys) < count:
        k = len(keys)
        digest = hashlib.sha256(keys[-1] if keys else b"kvcore")
        try:
            digest.update(array("q", tokens[k * block_size : (k + 1) * block_size]).tobytes())
        except (TypeError, OverflowError) as exc:
            raise InvalidInputError(
                f"token ids must be ints that fit 8 bytes (block {k} of {block_size} tokens: {exc})"
            ) from None
        keys.append(digest.digest())
