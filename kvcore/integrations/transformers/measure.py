"""Run ``generate_batch`` and watch its paged cache: how many requests held cache at once.

transformers' scheduler is chosen by name (``ContinuousBatchingConfig.scheduler_type``, looked
up in ``scheduler.SCHEDULER_MAPPING``) and is handed the ``PagedAttentionCache`` when the
manager builds it. :func:`generate_and_watch` registers, for the length of one run, a
subclass of the configured scheduler under its own name that counts, after every batch it
schedules, the requests that hold blocks in the cache, and keeps the cache to check it
against a plan. Nothing else of transformers is touched.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.integrations.transformers.rules import TransformersIntegrationError

if TYPE_CHECKING:
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache


@attrs.frozen(kw_only=True, eq=False)
class WatchedRun:
    """One ``generate_batch`` run and what its cache held.

    Attributes:
        tokens: each request's generated tokens, in the order of the prompts.
        peak_held: the most requests that held cache blocks at once, after any batch.
        starved_batches: batches in which a running request found no room for its next tokens
            (transformers then preempts a request, or the starved one waits).
        cache: the paged cache transformers built for the run.
    """

    tokens: tuple[tuple[int, ...], ...]
    peak_held: int
    starved_batches: int
    cache: PagedAttentionCache


_names = itertools.count()


def generate_and_watch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    generation_config: GenerationConfig,
    continuous_batching_config: ContinuousBatchingConfig,
) -> WatchedRun:
    """``model.generate_batch(prompts, ...)`` with a scheduler that counts the requests holding
    cache (the configured scheduler type, subclassed).

    Raises:
        TransformersIntegrationError: the configured scheduler type is unknown, or a request
            failed or came back without its tokens (transformers logs why).
    """
    import dataclasses

    from transformers.generation.continuous_batching import scheduler as schedulers

    base = schedulers.SCHEDULER_MAPPING.get(continuous_batching_config.scheduler_type)
    if base is None:
        raise TransformersIntegrationError(
            f"scheduler_type {continuous_batching_config.scheduler_type!r} is not one of transformers' "
            f"{sorted(schedulers.SCHEDULER_MAPPING)}"
        )
    seen: dict[str, Any] = {"peak": 0, "starved": 0, "cache": None}

    class Watching(base):  # type: ignore[misc,valid-type]
        """The configured scheduler, counting after each batch the requests with cache blocks
        and whether one was starved."""

        def __init__(self, cache: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(cache, *args, **kwargs)
            seen["cache"] = cache

        def schedule_batch(self, token_budget: int, cache_budget: int) -> Any:
            scheduled = super().schedule_batch(token_budget, cache_budget)
            holders = {
                rid for a in self.cache.cache_allocators.values() for rid, b in a.block_table.items() if b
            }
            seen["peak"] = max(seen["peak"], len(holders))
            seen["starved"] += bool(self.starved_requests)
            return scheduled

    name = f"kvcore_watch_{next(_names)}"
    schedulers.SCHEDULER_MAPPING[name] = Watching
    try:
        watched = dataclasses.replace(continuous_batching_config, scheduler_type=name)
        outputs = model.generate_batch(
            [list(p) for p in prompts],
            generation_config=generation_config,
            continuous_batching_config=watched,
            max_new_tokens=max_new_tokens,
            warmup=False,
        )
    finally:
        del schedulers.SCHEDULER_MAPPING[name]
    results = list(outputs.values())
    failed = [
        r.request_id for r in results if r.error is not None or len(r.generated_tokens) != max_new_tokens
    ]
    if len(results) != len(prompts) or failed or seen["cache"] is None:
        raise TransformersIntegrationError(
            f"generate_batch returned {len(results)} of {len(prompts)} requests; failed or short: {failed}"
        )
    return WatchedRun(
        tokens=tuple(tuple(r.generated_tokens) for r in results),
        peak_held=seen["peak"],
        starved_batches=seen["starved"],
        cache=seen["cache"],
    )
