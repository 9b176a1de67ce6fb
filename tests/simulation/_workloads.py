"""The random workloads the simulation's hypothesis tests draw from a seed."""

from __future__ import annotations

from kvcore.simulation.workload import Workload, parse_length, synthetic


def random_workload(
    seed: int,
    count: int,
    prompts: str,
    outputs: str,
    *,
    rate: float | None = None,
    prefix_share: float = 0.0,
    max_model_len: int = 512,
) -> Workload:
    """``count`` requests of at most ``max_model_len`` tokens, lengths drawn from the length specs
    ``prompts`` and ``outputs`` (``"uniform:16:300"``), arriving at ``rate`` a step (``None``: all
    at once); ``prefix_share`` of them lead with a shared 64-token prefix (none when 0)."""
    return synthetic(
        count,
        parse_length(prompts),
        parse_length(outputs),
        rate=rate,
        seed=seed,
        max_model_len=max_model_len,
        prefix_share=prefix_share,
        prefix_tokens=64 if prefix_share else 0,
    )
