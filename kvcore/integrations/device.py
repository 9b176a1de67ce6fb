"""What an engine ran on, in words, for the records a measurement keeps (``kvcore profile``)."""

from __future__ import annotations

import os
import platform


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_device() -> str:
    """The first CUDA GPU's name when torch sees one, else the CPU: its model, its cores and
    the cores this process may run on (``taskset`` narrows them)."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = torch.get_num_threads()
    return f"cpu: {_cpu_model()}, {os.cpu_count()} cores, {usable} usable, {threads} torch threads"
