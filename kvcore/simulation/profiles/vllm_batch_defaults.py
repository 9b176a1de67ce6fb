"""vLLM's own ``max_num_seqs`` and ``max_num_batched_tokens`` defaults, per device, as ``kvcore
tune`` states them beside its default candidate.

vLLM fills both when a user gives neither (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``
with ``EngineArgs.get_batch_defaults`` in ``vllm/engine/arg_utils.py``, read in vLLM 0.32's CPU
build), from the device and from how the engine is started: ``vllm serve`` (the OpenAI server's
usage context) or the offline ``vllm.LLM`` class. Per device, ``max_num_seqs`` /
``max_num_batched_tokens``:

============================================  ==============  ==============
device                                        ``vllm serve``  ``vllm.LLM``
============================================  ==============  ==============
CPU (times the tensor x pipeline ranks)       128 / 2,048     256 / 4,096
GPU under 70 GiB, or any A100                 256 / 2,048     256 / 8,192
GPU of 70 to 160 GiB (H100, H200)             1,024 / 8,192   1,024 / 16,384
GPU of 160 GiB or more (B200)                 1,024 / 16,384  1,024 / 16,384
============================================  ==============  ==============

Where no usage context applies, ``SchedulerConfig``'s class defaults are 128 / 2,048
(``DEFAULT_MAX_NUM_SEQS``, ``DEFAULT_MAX_NUM_BATCHED_TOKENS`` in ``vllm/config/scheduler.py``):
the CPU's ``vllm serve`` figures, which are kvcore's default candidate.
"""

from __future__ import annotations

from typing import Final

import attrs

from kvcore.simulation.gpus import Gpu

#: Where the figures are read.
SOURCE: Final = "vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults"

_GIB = 2**30


@attrs.frozen(kw_only=True)
class BatchDefaults:
    """What ``vllm serve`` starts with on a device when neither setting is given.

    Attributes:
        device: the device as the rule reads it (``CPU``, ``H100-SXM (80 GiB)``).
        max_num_seqs: its ``max_num_seqs``.
        max_num_batched_tokens: its ``max_num_batched_tokens``.
    """

    device: str
    max_num_seqs: int
    max_num_batched_tokens: int

    def line(self) -> str:
        """``vLLM serve's defaults on CPU: max_num_seqs 128, max_num_batched_tokens 2,048
        (vllm/engine/arg_utils.py, ...)``."""
        return (
            f"vllm serve's defaults on {self.device}: max_num_seqs {self.max_num_seqs:,}, "
            f"max_num_batched_tokens {self.max_num_batched_tokens:,} ({SOURCE})"
        )


def serve_defaults(gpu: Gpu | None, world_size: int = 1) -> BatchDefaults:
    """``vllm serve``'s defaults on ``gpu`` (``None``: on a CPU, for ``world_size`` ranks)."""
    if gpu is None:
        return BatchDefaults(
            device="CPU" if world_size == 1 else f"CPU x {world_size} ranks",
            max_num_seqs=128 * world_size,
            max_num_batched_tokens=2048 * world_size,
        )
    memory = gpu.memory_bytes
    device = f"{gpu.name} ({memory / _GIB:g} GiB)"
    if memory >= 160 * _GIB:
        return BatchDefaults(device=device, max_num_seqs=1024, max_num_batched_tokens=16384)
    if memory >= 70 * _GIB and "a100" not in gpu.name.lower():
        return BatchDefaults(device=device, max_num_seqs=1024, max_num_batched_tokens=8192)
    return BatchDefaults(device=device, max_num_seqs=256, max_num_batched_tokens=2048)
