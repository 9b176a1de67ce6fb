"""Greedy decoding of several requests at once on a reference runner, scheduled like an engine.

:func:`decode_greedy` is a small continuous-batching scheduler:

- **admission**: requests are admitted in arrival order while the pool can hold every admitted
  request at its worst (:meth:`kvcore.BlockPool.blocks_needed` for prompt plus output, per
  group: a sliding-window group counts its window, not the whole request); a request that does
  not fit waits until running ones finish and give their blocks back (with several block
  pools, every pool must hold them);
- **steps**: each step gives every decoding request one token, then fills the rest of the
  step budget (the plan's ``max_num_batched_tokens``) with prompt chunks (chunked prefill), so
  requests in different phases share steps and their pages interleave in the pool;
- **sampling**: the argmax of the last token's logits, as greedy ``generate()`` does.

Admission by worst case means the pool is never exhausted mid-request (no preemption needed);
if it is, the pool or a spec's sizing is wrong and the error surfaces.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

import attrs
import torch

from kvcore.errors import InsufficientMemoryError, InvalidInputError
from kvcore.testing.reference.requests import DecodeRequest, ScheduledRequest
from kvcore.testing.reference.runner import PagedAttentionRunner


@attrs.frozen(kw_only=True, eq=False)
class Generation:
    """What one request produced.

    Attributes:
        request_id: the request.
        tokens: the generated token ids.
        logits: ``(max_new_tokens, vocab)``: the logits each token was picked from.
        admitted_step: the runner step of its first chunk.
        finished_step: the runner step that produced its last token.
    """

    request_id: Hashable
    tokens: tuple[int, ...]
    logits: torch.Tensor
    admitted_step: int
    finished_step: int


@attrs.define
class _Running:
    request: DecodeRequest
    need: tuple[int, ...]  # block ids per pool at its worst
    admitted_step: int
    computed: int = 0
    tokens: list[int] = attrs.Factory(list)
    logits: list[torch.Tensor] = attrs.Factory(list)

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.request.prompt)

    def next_tokens(self, budget: int) -> tuple[int, ...]:
        if self.prefilling:
            return self.request.prompt[self.computed : self.computed + budget]
        return (self.tokens[-1],)


def decode_greedy(
    runner: PagedAttentionRunner,
    requests: Sequence[DecodeRequest],
    *,
    max_num_batched_tokens: int | None = None,
) -> dict[Hashable, Generation]:
    """Decode every request greedily, interleaved step by step.

    Args:
        runner: the runner (its pool must be empty of these requests).
        requests: the requests, in arrival order.
        max_num_batched_tokens: tokens per step; default the plan's ``max_num_batched_tokens``
            (larger would break the plan's sizing of sliding-window groups).

    Returns:
        ``{request: Generation}``.

    Raises:
        InvalidInputError: duplicate request ids, or a step budget above the plan's.
        InsufficientMemoryError: a request needs more blocks than the whole pool has.
    """
    plan_budget = runner.plan.context.max_num_batched_tokens
    budget = plan_budget if max_num_batched_tokens is None else max_num_batched_tokens
    if not 1 <= budget <= plan_budget:
        raise InvalidInputError(
            f"'max_num_batched_tokens' must be in 1..{plan_budget} (the plan's step size; got {budget})"
        )
    if len({r.request_id for r in requests}) != len(requests):
        raise InvalidInputError(f"request ids must be unique (got {[r.request_id for r in requests]})")
    waiting = deque(requests)
    running: list[_Running] = []
    done: dict[Hashable, Generation] = {}
    plan = runner.plan
    committed = [0] * len(plan.pools)
    while waiting or running:
        committed = _admit(runner, waiting, running, committed)
        batch: list[tuple[_Running, tuple[int, ...]]] = []
        left = budget
        for state in sorted(running, key=lambda s: s.prefilling):  # decodes first, then prefill chunks
            if left == 0:
                break
            tokens = state.next_tokens(left)
            batch.append((state, tokens))
            left -= len(tokens)
        logits = runner.step(
            [
                ScheduledRequest(request_id=s.request.request_id, token_ids=tokens, num_computed=s.computed)
                for s, tokens in batch
            ]
        )
        for state, tokens in batch:
            state.computed += len(tokens)
            if state.prefilling:
                continue
            row = logits[state.request.request_id]
            state.logits.append(row.float().cpu())
            state.tokens.append(int(torch.argmax(row)))
            if len(state.tokens) == state.request.max_new_tokens:
                runner.finish(state.request.request_id)
                running.remove(state)
                committed = [c - n for c, n in zip(committed, state.need, strict=True)]
                done[state.request.request_id] = Generation(
                    request_id=state.request.request_id,
                    tokens=tuple(state.tokens),
                    logits=torch.stack(state.logits),
                    admitted_step=state.admitted_step,
                    finished_step=runner.num_steps - 1,
                )
    return done


def _admit(
    runner: PagedAttentionRunner, waiting: deque[DecodeRequest], running: list[_Running], committed: list[int]
) -> list[int]:
    """Admit waiting requests in order while each pool can still hold every admitted request's
    worst case; returns the blocks committed per pool.

    Raises:
        InsufficientMemoryError: a request needs more blocks than the whole pool has.
    """
    plan = runner.plan
    capacity = [pool.num_blocks for pool in plan.pools]
    while waiting:
        request = waiting[0]
        length = len(request.prompt) + request.max_new_tokens
        need = runner.pool.request_blocks_needed(length)
        short = [p for p, n in enumerate(need) if n > capacity[p]]
        if short:
            p = short[0]
            where = "" if len(capacity) == 1 else f" (pool {p})"
            raise InsufficientMemoryError(
                f"request {request.request_id!r} of {length} tokens needs {need[p]} blocks{where} at its "
                f"worst but the pool has {capacity[p]}; plan more blocks or shorten the request",
                required_bytes=sum(n * plan.pools[q].bytes_per_block for q, n in enumerate(need)),
                available_bytes=plan.kv_cache_bytes,
                max_model_len=length,
                largest_fitting_len=plan.largest_fitting_len(length),
            )
        if any(committed[p] + n > capacity[p] for p, n in enumerate(need)):
            break
        waiting.popleft()
        committed = [c + n for c, n in zip(committed, need, strict=True)]
        if request.encoder_inputs is not None:
            runner.encode(request.request_id, request.encoder_inputs)
        running.append(_Running(request=request, need=need, admitted_step=runner.num_steps))
    return committed
