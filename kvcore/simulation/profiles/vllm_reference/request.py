"""What vLLM's scheduler keeps of one request (``vllm/v1/request.py``, ``Request``), for the
reference: its counts and status, beside the trace's request."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcore.simulation.workload import Request


class RequestStatus(enum.Enum):
    """``RequestStatus``: the states a request passes through here."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class RequestState:
    """One request as the scheduler sees it.

    Attributes:
        index: its index in the workload (what the hashes of its own blocks name).
        request: the trace's request (lengths, shared prefix).
        num_tokens: ``Request.num_tokens``: its known tokens (prompt and tokens generated so far).
        num_computed_tokens: tokens whose KV the engine has computed or is computing.
        num_output_placeholders: async scheduling: tokens sampled but not back yet.
        num_in_flight_tokens: tokens scheduled whose step's output is not back yet.
        num_stale_output_tokens: a preempted request's tokens still in flight (their output is
            dropped, and the request waits until it is back).
        status: where it is.
        shared_prefix_boundary: with align-mode state groups, where the longest hit one attention
            type found ends when the hit every group agrees on is shorter, as its last lookup
            found it (a prefill chunk stops there, so that the state there is cached), else 0.
    """

    __slots__ = (
        "index",
        "num_computed_tokens",
        "num_in_flight_tokens",
        "num_output_placeholders",
        "num_stale_output_tokens",
        "num_tokens",
        "request",
        "shared_prefix_boundary",
        "status",
    )

    def __init__(self, index: int, request: Request) -> None:
        self.index = index
        self.request = request
        self.num_tokens = request.prompt_tokens
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.status = RequestStatus.WAITING
        self.shared_prefix_boundary = 0

    @property
    def num_total_tokens(self) -> int:
        """Its prompt and every output token: it finishes once it knows them all."""
        return self.request.total_tokens
