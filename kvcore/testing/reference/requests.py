"""What the reference runner and its scheduler are asked to compute: requests and their steps."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import attrs

from kvcore.errors import InvalidInputError
from kvcore.validators import int_at_least


def _token_ids(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(token) for token in value)


def _non_empty(instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
    if not value:
        raise InvalidInputError(f"{attribute.name!r} must hold at least one token (got none)")


@attrs.frozen(kw_only=True)
class DecodeRequest:
    """A request to decode greedily.

    Attributes:
        request_id: its name.
        prompt: the prompt's token ids.
        max_new_tokens: tokens to generate (no stop token: exactly this many).
        encoder_inputs: for an encoder-decoder model, the encoder's keyword arguments
            (``{"input_features": ...}`` for Whisper); the prompt is then the decoder's.
    """

    request_id: Hashable
    prompt: tuple[int, ...] = attrs.field(converter=_token_ids, validator=_non_empty)
    max_new_tokens: int = attrs.field(validator=int_at_least(1))
    encoder_inputs: Mapping[str, Any] | None = attrs.field(default=None, eq=False)


@attrs.frozen(kw_only=True)
class ScheduledRequest:
    """One request's share of an engine step.

    Attributes:
        request_id: the request.
        token_ids: the tokens computed this step (a prompt chunk, or the last sampled token).
        num_computed: tokens of the request already in the cache; the step's tokens take
            positions ``num_computed ..``.
    """

    request_id: Hashable
    token_ids: tuple[int, ...] = attrs.field(converter=_token_ids, validator=_non_empty)
    num_computed: int = attrs.field(validator=int_at_least(0))
