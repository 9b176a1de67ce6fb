"""Fake memory probes: a CUDA-like device and host memory whose numbers a test sets."""

from __future__ import annotations

import torch

from kvcore.runtime.memory import MemorySample


class FakeGpu:
    """A CUDA-like device: other processes hold ``other``; torch holds ``allocated`` (weights)
    inside ``reserved``; ``run(n)`` is a forward pass with ``n`` bytes of activations."""

    cap_of_total = True

    def __init__(self, total, other, weights, cached=0, fragmentation=0):
        self.device = torch.device("cuda", 0)
        self.total, self.other = total, other
        self.allocated = weights
        self.reserved = weights + cached
        self.fragmentation = fragmentation
        self.peak = weights
        self.calls = []

    def sample(self):
        self.calls.append("sample")
        free = self.total - self.other - self.reserved
        return MemorySample(
            total_bytes=self.total,
            free_bytes=free,
            torch_reserved_bytes=self.reserved,
            process_bytes=self.allocated,
        )

    def reset_peak(self):
        self.calls.append("reset_peak")
        self.peak = self.allocated

    def peak_bytes(self):
        return self.peak

    def settle(self):
        self.calls.append("settle")
        self.reserved = self.allocated + self.fragmentation  # empty_cache keeps only fragmented segments

    def run(self, activations, other_grows_by=0):
        self.calls.append("run")
        self.allocated += activations
        self.reserved = max(self.reserved, self.allocated)
        self.peak = max(self.peak, self.allocated)
        self.allocated -= activations
        self.other += other_grows_by


class FakeHost:
    """Host memory: ``available`` now; the run grows the resident set by ``growth`` at peak."""

    cap_of_total = False

    def __init__(self, total, available, rss):
        self.device = torch.device("cpu")
        self.total, self.available, self.rss = total, available, rss
        self.peak = rss

    def sample(self):
        return MemorySample(
            total_bytes=self.total, free_bytes=self.available, torch_reserved_bytes=0, process_bytes=self.rss
        )

    def reset_peak(self):
        self.peak = self.rss

    def peak_bytes(self):
        return self.peak

    def settle(self):
        pass

    def run(self, growth, kept=0):
        self.peak = max(self.peak, self.rss + growth)
        self.rss += kept
        self.available -= kept
