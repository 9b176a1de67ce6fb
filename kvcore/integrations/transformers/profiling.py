"""Time transformers' continuous batching batch by batch, for ``kvcore profile --engine
transformers``.

``generate_batch`` runs its batches in a loop of its own: schedule a batch, run the model on
it, update the requests, schedule the next. :class:`TransformersStepEngine` registers, for the
length of one run, a subclass of the configured scheduler (as
:mod:`kvcore.integrations.transformers.measure` does) that notes the clock and what each batch
holds when it is scheduled (each request's query tokens, ``FutureRequestState.query_length``,
and its cached tokens once they are written, ``RequestState.position_offset`` plus them). A
batch's seconds run from its scheduling to the next batch's; the last batch's end is when its
last request finished (``Scheduler.finish_request``). Every request is given before the first
batch (``generate_batch`` takes them at once), so a scenario's arrival steps are not kept: mixed
batches come from a prompt longer than the batch's token budget left, finished in a chunk beside
the decoding requests; and every request generates the scenario's longest output. transformers
is imported only when a run starts.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import random
import time
from collections.abc import Mapping
from typing import Any

import attrs

from kvcore.integrations.transformers.rules import TransformersIntegrationError
from kvcore.simulation.profiling import EngineLimits, Scenario, ScheduledRequest, TimedStep

#: Token ids the profile's prompts are made of (every vocabulary has them).
_TOKENS = 100

_names = itertools.count()


@attrs.define(eq=False)
class TransformersStepEngine:
    """A model with transformers' continuous batching, timed one batch at a time.

    Attributes:
        model: a transformers model (``ContinuousMixin``: it has ``generate_batch``).
        config: the ``ContinuousBatchingConfig`` every run uses.
        max_model_len: the longest request the scenarios may send.
    """

    model: Any
    config: Any
    max_model_len: int
    _salt: itertools.count[int] = attrs.field(factory=itertools.count, init=False)

    def limits(self) -> EngineLimits:
        """The batch's token and request caps, the longest request and the KV tokens."""
        tokens = self.config.max_batch_tokens or 256
        requests = self.config.max_requests_per_batch or 32
        blocks = self.config.num_blocks or 0
        kv = blocks * self.config.page_size if blocks else 16 * tokens
        return EngineLimits(
            max_batched_tokens=tokens, max_num_seqs=requests, max_model_len=self.max_model_len, kv_tokens=kv
        )

    def settings(self) -> dict[str, Any]:
        """The continuous-batching settings a profile records."""
        fields = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)}
        settings = {k: v for k, v in fields.items() if isinstance(v, (bool, int, float, str)) or v is None}
        settings["dtype"] = str(getattr(self.model, "dtype", "")).removeprefix("torch.")
        settings["attn_implementation"] = getattr(self.model.config, "_attn_implementation", None)
        settings["max_model_len"] = self.max_model_len
        return settings

    def run(self, scenario: Scenario) -> list[TimedStep]:
        """``generate_batch`` of the scenario's requests, every batch timed."""
        import transformers
        from transformers.generation.continuous_batching import scheduler as schedulers

        base = schedulers.SCHEDULER_MAPPING.get(self.config.scheduler_type)
        if base is None:
            raise TransformersIntegrationError(
                f"scheduler_type {self.config.scheduler_type!r} is not one of transformers' "
                f"{sorted(schedulers.SCHEDULER_MAPPING)}"
            )
        starts: list[float] = []
        batches: list[tuple[ScheduledRequest, ...]] = []
        finished: list[float] = []

        class Timing(base):  # type: ignore[misc,valid-type]
            """The configured scheduler, noting when each batch is scheduled and what it holds."""

            def schedule_batch(self, token_budget: int, cache_budget: int) -> Any:
                if not starts and len(self.waiting_requests) + len(self.active_requests) < expected:
                    # generate_batch hands requests to a loop already running: the first batch
                    # waits for all of them, so every repeat schedules the same batches
                    return [], False, 0, 0
                now = time.perf_counter()
                result = super().schedule_batch(token_budget, cache_budget)
                scheduled = result[0]
                if scheduled:
                    starts.append(now)
                    batches.append(
                        tuple(
                            ScheduledRequest(
                                new_tokens=f.query_length,
                                context_tokens=f.state.position_offset + f.query_length,
                            )
                            for f in scheduled
                        )
                    )
                return result

            def finish_request(self, request_id: str) -> None:
                super().finish_request(request_id)
                finished.append(time.perf_counter())

        expected = len(scenario.requests)
        name = f"kvcore_profile_{next(_names)}"
        schedulers.SCHEDULER_MAPPING[name] = Timing
        prompts = []
        for request in scenario.requests:
            draw = random.Random(next(self._salt))
            prompts.append([draw.randint(1, _TOKENS) for _ in range(request.prompt_tokens)])
        lengths = {r.output_tokens for r in scenario.requests}
        # generate_batch's manager runs gc.collect() twice as it stops, each a walk over every
        # object alive (torch, transformers, the model): frozen, the walk sees only this run's
        gc.freeze()
        try:
            outputs = self.model.generate_batch(
                prompts,
                generation_config=transformers.GenerationConfig(  # type: ignore[no-untyped-call]
                    do_sample=False, eos_token_id=-1, pad_token_id=0
                ),
                continuous_batching_config=dataclasses.replace(self.config, scheduler_type=name),
                max_new_tokens=max(lengths),
                warmup=False,
            )
        finally:
            gc.unfreeze()
            del schedulers.SCHEDULER_MAPPING[name]
        failed = [r.request_id for r in outputs.values() if r.error is not None]
        if len(outputs) != len(prompts) or failed or not finished:
            raise TransformersIntegrationError(
                f"scenario {scenario.name!r}: generate_batch returned {len(outputs)} of {len(prompts)} "
                f"requests; failed: {failed}"
            )
        ends = [*starts[1:], finished[-1]]
        return [
            TimedStep(scheduled=batch, seconds=end - start)
            for batch, start, end in zip(batches, starts, ends, strict=True)
        ]


def transformers_engine(
    model: Any, *, max_model_len: int, options: Mapping[str, Any] | None = None
) -> TransformersStepEngine:
    """A :class:`TransformersStepEngine` of ``model`` with ``ContinuousBatchingConfig(**options)``
    (no flash kernels, no CUDA graphs unless asked: what runs on a CPU)."""
    import transformers

    # no flash kernels or CUDA graphs unless asked (what runs on a CPU); no prefix sharing, which
    # would make a repeat's batches differ
    fields = {
        "auto_switch_to_flash": False,
        "use_cuda_graph": False,
        "allow_block_sharing": False,
        **(options or {}),
    }
    return TransformersStepEngine(
        model=model, config=transformers.ContinuousBatchingConfig(**fields), max_model_len=max_model_len
    )


def open_transformers(
    model: str, options: Mapping[str, Any], *, max_model_len: int, dtype: str
) -> TransformersStepEngine:
    """Load ``model`` (a local directory or a name already in the Hugging Face cache) with
    ``AutoModelForCausalLM`` in ``dtype``, eager attention, and wrap it."""
    import torch
    from transformers import AutoModelForCausalLM

    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise TransformersIntegrationError(f"dtype {dtype!r} is not a torch dtype (bfloat16, float32, ...)")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise TransformersIntegrationError(f"transformers cannot load the model {model!r}: {exc}") from None
    loaded.set_attn_implementation("eager")
    loaded.eval()  # type: ignore[no-untyped-call]
    return transformers_engine(loaded, max_model_len=max_model_len, options=options)


def transformers_versions() -> dict[str, str]:
    """The releases of transformers and torch this process runs."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("transformers", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out
