"""What ``kvcore simulate`` and ``kvcore compare --trace`` share: the candidates replayed
through a workload, and their figures as table cells and JSON."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.cli.progress import eta, progress
from kvcore.dtypes import dtype_name
from kvcore.planning.compare import Candidate

if TYPE_CHECKING:  # the simulation layer loads only when a command simulates
    from kvcore.cli.timing import StepTimeFactory
    from kvcore.simulation.simulator import SimulationResult
    from kvcore.simulation.workload import Workload

#: Workloads of at least this many requests show a progress line (on stderr) per plan.
PROGRESS_MIN_REQUESTS = 10_000


def variant_cells(candidate: Candidate) -> list[object]:
    """The first cells of a table row: policy, block size, KV dtype (``as specs`` where the
    specs decide)."""
    return [
        candidate.policy,
        candidate.block_size or "as specs",
        dtype_name(candidate.kv_cache_dtype) if candidate.kv_cache_dtype else "as specs",
    ]


@attrs.frozen
class Simulated:
    """One candidate plan and how it served the workload."""

    candidate: Candidate
    result: SimulationResult


def simulate_candidates(
    candidates: Sequence[Candidate],
    workload: Workload,
    *,
    prefix_caching: bool = False,
    step_time: StepTimeFactory | None = None,
    scheduler: Any = "vllm",
) -> list[Simulated]:
    """Replay ``workload`` through every candidate that has a plan, in order, as ``scheduler``
    (a profile or its name) schedules it (with ``prefix_caching``, each pool caches blocks as
    that scheduler does; with ``step_time``, each plan's steps are timed by the model it makes
    for the plan).

    Each plan's own ``max_num_batched_tokens`` (``--max-num-batched-tokens``) is the step
    budget. Workloads of :data:`PROGRESS_MIN_REQUESTS` requests or more show a progress line
    per plan on stderr.

    Raises:
        InvalidInputError: a request longer than the plan's ``max_model_len``.
    """
    from kvcore.simulation.simulator import simulate

    total = len(workload.requests)
    out: list[Simulated] = []
    for candidate in candidates:
        if candidate.plan is None:
            continue
        timer = step_time(candidate.plan) if step_time is not None else None
        if total < PROGRESS_MIN_REQUESTS:
            result = simulate(
                candidate.plan,
                workload,
                prefix_caching=prefix_caching,
                step_time=timer,
                scheduler=scheduler,
            )
            out.append(Simulated(candidate, result))
            continue
        count = FinishedCount(total)
        label = f"simulating {total:,} requests on {plan_label(candidate)}"
        with progress(label, detail=count.text):
            result = simulate(
                candidate.plan,
                workload,
                on_step=count.on_step,
                prefix_caching=prefix_caching,
                step_time=timer,
                scheduler=scheduler,
            )
            out.append(Simulated(candidate, result))
    return out


class FinishedCount:
    """The simulator's ``on_step`` callback, and the progress line's text: requests finished and
    the time left at the pace so far (``"1,200/5,000 finished, ETA 9 s"``).

    Args:
        total: the workload's requests.
        clock: seconds, for the pace (a test passes its own).
    """

    def __init__(self, total: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.total = total
        self.finished = 0
        self._clock = clock
        self._start = clock()

    def on_step(self, _step: int, finished: int) -> None:
        self.finished = finished

    def text(self) -> str:
        left = eta(self.finished, self.total, self._clock() - self._start)
        return f"{self.finished:,}/{self.total:,} finished" + (f", {left}" if left else "")


def plan_label(candidate: Candidate) -> str:
    """``shared_buffer``, ``shared_buffer block 32 fp8``: the policy and the variant asked for."""
    policy, block, dtype = variant_cells(candidate)
    parts = [str(policy)]
    if candidate.block_size is not None:
        parts.append(f"block {block}")
    if candidate.kv_cache_dtype is not None:
        parts.append(str(dtype))
    return " ".join(parts)


def workload_row(workload: Workload) -> dict[str, Any]:
    """The workload as JSON: its name, request count and length figures."""
    prompts = [r.prompt_tokens for r in workload.requests]
    outputs = [r.output_tokens for r in workload.requests]
    count = max(len(workload.requests), 1)
    return {
        "name": workload.name,
        "num_requests": len(workload.requests),
        "mean_prompt_tokens": sum(prompts) / count,
        "max_prompt_tokens": max(prompts, default=0),
        "mean_output_tokens": sum(outputs) / count,
        "max_output_tokens": max(outputs, default=0),
        "rejected_requests": len(workload.rejected),
        "last_arrival_step": max((r.arrival_step for r in workload.requests), default=0),
        **(
            {"last_arrival_time": max(r.arrival_time or 0.0 for r in workload.requests)}
            if workload.requests and workload.requests[0].arrival_time is not None
            else {}
        ),
    }


def simulation_row(result: SimulationResult, *, series: bool = False) -> dict[str, Any]:
    """A :class:`SimulationResult` as JSON: every figure, and with ``series`` the per-step
    ``running`` and ``pool_usage`` lists."""
    from kvcore.simulation.series import StepSeries

    row: dict[str, Any] = {
        key: list(value) if isinstance(value, (tuple, StepSeries)) else value
        for key, value in attrs.asdict(result).items()
    }
    row.pop("timeline", None)  # the seconds are reported by the latency figures
    if row.get("host_tier") is None:  # no host tier: the figures of a run without one, as before
        row.pop("host_tier", None)
        row.pop("host_transfer_seconds", None)
    row["scheduler_settings"] = dict(result.scheduler_settings)
    row.pop("prefix_hits_by_kind", None)
    if result.prefix_hits_by_kind:  # {kind: {"hits": lookups served, "pages": cached pages used}}
        row["prefix_hits_by_kind"] = {
            k.kind: {"hits": k.hits, "pages": k.pages} for k in result.prefix_hits_by_kind
        }
    row["served_tokens_per_step"] = served_tokens_per_step(result)
    row["load"] = result.load.to_dict() if result.load is not None else None
    if not series:
        row.pop("running", None)
        row.pop("pool_usage", None)
    return row


def overload_lines(pairs: Sequence[tuple[str, SimulationResult]]) -> list[str]:
    """``  LABELS: overloaded: requests arrive at ... but are served at ...`` for the plans whose
    runs the arrivals outpace (:class:`~kvcore.simulation.load.ArrivalLoad`): one line for the
    plans of one figure (usually every plan: one line), none for the plans that keep up."""
    alike: dict[str, list[str]] = {}
    for label, result in pairs:
        if result.load is not None and (line := result.load.line()):
            alike.setdefault(line, []).append(label)
    return [f"  {', '.join(labels)}: {line}" for line, labels in alike.items()]


def rejected_line(workload: Workload, max_model_len: int) -> str:
    """One line naming the requests refused for being longer than ``max_model_len``
    (:meth:`~kvcore.simulation.workload.Workload.admit`); ``""`` when none was."""
    refused = workload.rejected
    if not refused:
        return ""
    named = ", ".join(
        f"{r.label.removeprefix('the ')} ({r.prompt_tokens:,} + {r.output_tokens:,} tokens)"
        for r in refused[:3]
    )
    more = f" and {len(refused) - 3:,} more" if len(refused) > 3 else ""
    total = len(refused) + len(workload.requests)
    return (
        f"rejected {len(refused):,} of {total:,} requests, longer than max_model_len {max_model_len:,} "
        f"(vLLM refuses such a request with an error and serves the rest): {named}{more}"
    )


def kind_hits_line(result: SimulationResult) -> str:
    """``state 120 (120 pages), full_attention 120 (2,400 pages)``: per group kind, the lookups
    its cached pages served and the pages they used; ``""`` without per-kind figures."""
    return ", ".join(f"{k.kind} {k.hits:,} ({k.pages:,} pages)" for k in result.prefix_hits_by_kind)


def served_tokens_per_step(result: SimulationResult) -> float:
    """The workload's own tokens per step (:attr:`SimulationResult.served_tokens_per_step`)."""
    return result.served_tokens_per_step
