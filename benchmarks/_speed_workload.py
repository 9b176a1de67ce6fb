"""The synthetic traffic the simulator speed benchmarks replay (``simulation_speed.py``,
``reference_speed.py``, ``speed_paths.py``), written once so their figures stay comparable."""

from __future__ import annotations

from kvcore.simulation.workload import Workload, parse_length, synthetic

MAX_MODEL_LEN = 32768
#: Requests per step: about what the plans serve at this mix (the queue neither empties nor grows).
RATE = 0.6


def speed_workload(count: int, shared: bool = False) -> Workload:
    """``count`` requests of lognormal lengths (prompts about 1,024 tokens, outputs about 200)
    arriving at :data:`RATE` a step; with ``shared``, half of them lead with one 512-token prefix."""
    prompt, output = parse_length("lognormal:1024:1.0"), parse_length("lognormal:200:1.0")
    return synthetic(
        count,
        prompt,
        output,
        rate=RATE,
        seed=0,
        max_model_len=MAX_MODEL_LEN,
        prefix_share=0.5 if shared else 0.0,
        prefix_tokens=512 if shared else 0,
    )
