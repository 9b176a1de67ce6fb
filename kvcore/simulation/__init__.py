"""Simulation: a workload replayed through a plan's block pool, step by step, as an engine would.

:mod:`~kvcore.simulation.workload` holds the requests (a JSON-lines trace, or a synthetic mix of
prompt and output lengths with Poisson arrivals); :mod:`~kvcore.simulation.simulator` schedules
them like vLLM's scheduler (a token budget per step, decodes first, chunked prefill, admission
first-come-first-served while the pool holds the next tokens, preemption of the most recently
admitted request) through :class:`~kvcore.runtime.block_pool.BlockPool`, and reports what the plan
serves: running requests, tokens per step, preemptions, queueing delay and pool usage.
:mod:`~kvcore.simulation.timing` turns the steps into seconds (a roofline of the model on a GPU
of :mod:`~kvcore.simulation.gpus`, or a measured step-time profile) and reports latencies;
:mod:`~kvcore.simulation.steps` holds what a step records for it.

This layer sits between the runtime and the engine: it imports the contract, planning and the
block pool (which is torch-free), and never imports torch.
"""
