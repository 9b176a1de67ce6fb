"""How many bytes the KV cache may take on a device: profile a forward pass, apply the cap.

Profiling reads a device through a small probe (:class:`DeviceMemory`): :class:`CudaMemory`
asks the CUDA driver and torch's caching allocator, :class:`HostMemory` asks the kernel about
system memory and this process's resident set. :func:`determine_available_memory` does the
arithmetic on what the probe reports, so the same code runs (and is tested) with any probe.

The budget, on a CUDA device (the cap is a share of the whole device)::

    cap       = total x utilization
    non_torch = device memory in use - torch reserved     (other processes, CUDA context, NCCL)
    budget    = cap - (non_torch + torch peak during the profile run)

The torch peak includes what the model already holds (weights) plus the profile run's
activations. On the CPU the cap is a share of what the system has available now, which
already excludes this process (weights included) and every other one::

    budget    = available x utilization - resident-set growth during the profile run

A fixed ``kv_cache_bytes`` bypasses profiling and the cap.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

import attrs
import torch

from kvcore.errors import DeviceUnavailableError, InvalidInputError, MemoryProfilingError
from kvcore.runtime import DEFAULT_UTILIZATION
from kvcore.units import format_bytes
from kvcore.validators import check_int, is_number


@attrs.frozen(kw_only=True)
class MemorySample:
    """What a probe reports at one moment.

    Attributes:
        total_bytes: the device's memory (for the host: physical memory, or the cgroup limit).
        free_bytes: memory free for this process to allocate (host: ``MemAvailable``).
        torch_reserved_bytes: what torch's caching allocator holds (0 where there is none).
        process_bytes: this process's own footprint as the probe sees it (CUDA: torch allocated
            bytes; host: resident set size).
    """

    total_bytes: int
    free_bytes: int
    torch_reserved_bytes: int
    process_bytes: int


@runtime_checkable
class DeviceMemory(Protocol):
    """A probe of one device's memory, as :func:`determine_available_memory` needs it.

    Attributes:
        device: the device probed.
        cap_of_total: ``True`` when the cap is a share of the whole device and memory outside
            torch counts against it (CUDA); ``False`` when it is a share of what is available
            now (host memory, shared with the operating system).
    """

    device: torch.device
    cap_of_total: bool

    def sample(self) -> MemorySample:
        """Read total, free, torch-reserved and process bytes now."""
        ...

    def reset_peak(self) -> None:
        """Start a new peak measurement (:meth:`peak_bytes` counts from here)."""
        ...

    def peak_bytes(self) -> int:
        """The highest ``process_bytes`` since :meth:`reset_peak`."""
        ...

    def settle(self) -> None:
        """Collect garbage, wait for queued work, and return cached, unused memory to the device."""
        ...


class CudaMemory:
    """A CUDA device, read through ``torch.cuda`` (driver free/total and allocator statistics)."""

    cap_of_total = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sample(self) -> MemorySample:
        free, total = torch.cuda.mem_get_info(self.device)
        stats = torch.cuda.memory_stats(self.device)
        return MemorySample(
            total_bytes=int(total),
            free_bytes=int(free),
            torch_reserved_bytes=int(stats.get("reserved_bytes.all.current", 0)),
            process_bytes=int(stats.get("allocated_bytes.all.current", 0)),
        )

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        return int(torch.cuda.memory_stats(self.device).get("allocated_bytes.all.peak", 0))

    def settle(self) -> None:
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


_MEMINFO = Path("/proc/meminfo")
_STATUS = Path("/proc/self/status")
_STATM = Path("/proc/self/statm")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_CGROUP = Path("/sys/fs/cgroup")


def _proc_kib(path: Path, key: str) -> int | None:
    """``key:  <n> kB`` from a /proc file, in bytes; ``None`` when unreadable."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> tuple[int, int] | None:
    """``(limit, in use)`` of this process's cgroup v2 memory controller, if it has a limit."""
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        used = (_CGROUP / "memory.current").read_text().strip()
    except OSError:
        return None
    if limit == "max":
        return None
    try:
        return int(limit), int(used)
    except ValueError:
        return None


class HostMemory:
    """System memory seen from this process (Linux ``/proc``, with POSIX fallbacks).

    Free memory is ``MemAvailable`` (what can be allocated without swapping), lowered to the
    room left under a cgroup limit where there is one. The profile run's growth is measured as
    the growth of the resident set: the kernel's high-water mark ``VmHWM``, reset through
    ``/proc/self/clear_refs``; where that cannot be reset the lifetime peak is used, which only
    overstates the growth (a smaller, safe budget).
    """

    cap_of_total = False

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None else torch.device("cpu")
        self._peak_was_reset = False

    def sample(self) -> MemorySample:
        page = os.sysconf("SC_PAGE_SIZE")
        total = _proc_kib(_MEMINFO, "MemTotal") or page * os.sysconf("SC_PHYS_PAGES")
        free = _proc_kib(_MEMINFO, "MemAvailable")
        if free is None:
            free = page * os.sysconf("SC_AVPHYS_PAGES")
        room = _cgroup_room()
        if room is not None:
            limit, used = room
            total = min(total, limit)
            free = min(free, max(0, limit - used))
        return MemorySample(
            total_bytes=total, free_bytes=free, torch_reserved_bytes=0, process_bytes=self.rss_bytes()
        )

    @staticmethod
    def rss_bytes() -> int:
        """This process's resident set size now."""
        try:
            return int(_STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return _max_rss_bytes()

    def reset_peak(self) -> None:
        try:
            _CLEAR_REFS.write_text("5")
            self._peak_was_reset = True
        except OSError:
            self._peak_was_reset = False

    def peak_bytes(self) -> int:
        peak = _proc_kib(_STATUS, "VmHWM") if self._peak_was_reset else None
        return max(peak if peak is not None else _max_rss_bytes(), self.rss_bytes())

    def settle(self) -> None:
        gc.collect()


def _max_rss_bytes() -> int:
    """The lifetime peak resident set (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def as_device(device: torch.device | str) -> torch.device:
    """``device`` as a :class:`torch.device`.

    Raises:
        InvalidInputError: the text is not a device torch knows (``cpu``, ``cuda:0``, ``meta``).
    """
    if isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidInputError(
            f"cannot read device {device!r} ({exc}); use e.g. 'cpu', 'cuda' or 'cuda:1'"
        ) from None


def check_device(device: torch.device | str) -> torch.device:
    """``device``, checked to exist here.

    Raises:
        InvalidInputError: the text is not a device.
        DeviceUnavailableError: a CUDA device without a visible GPU, or an index out of range.
    """
    dev = as_device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device {str(dev)!r} needs a CUDA GPU, but torch.cuda.is_available() is False "
                f"(torch {torch.__version__} built {'with' if torch.version.cuda else 'without'} "
                "CUDA, or no GPU is visible); use the cpu device or a machine with a GPU",
                device=str(dev),
            )
        count = torch.cuda.device_count()
        if ":" in str(dev) and dev.index >= count:
            raise DeviceUnavailableError(
                f"device {str(dev)!r} does not exist: this machine has {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1}",
                device=str(dev),
            )
        if ":" not in str(dev):  # bare "cuda": the current device (torch types index as int)
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def device_memory(device: torch.device | str) -> DeviceMemory:
    """The probe for ``device``: :class:`CudaMemory` or :class:`HostMemory`.

    Raises:
        DeviceUnavailableError: CUDA without a GPU, or a device kvcore cannot profile (``meta``,
            ``mps``, ...); pass a fixed ``kv_cache_bytes`` for those.
    """
    dev = check_device(device)
    if dev.type == "cuda":
        return CudaMemory(dev)
    if dev.type == "cpu":
        return HostMemory(dev)
    raise DeviceUnavailableError(
        f"kvcore cannot measure the memory of device {str(dev)!r}; give the KV cache a fixed "
        "size instead (kv_cache_bytes=...)",
        device=str(dev),
    )


def _check_utilization(utilization: float) -> float:
    if not is_number(utilization) or not 0 < utilization <= 1:
        raise InvalidInputError(f"'utilization' must be a number in (0, 1] (got {utilization!r})")
    return float(utilization)


@attrs.frozen(kw_only=True)
class MemoryProfile:
    """What profiling saw, and the KV-cache budget that follows.

    Attributes:
        device: the device profiled (as text, e.g. ``"cuda:0"``).
        source: ``"profiled"``, or ``"fixed"`` when a ``kv_cache_bytes`` bypassed profiling.
        total_bytes: the device's memory.
        free_before_bytes: free memory before the profile run.
        free_after_bytes: free memory after it (cached memory returned).
        torch_peak_bytes: CUDA: the most bytes torch held allocated during the profile run
            (weights included). Host: how far the resident set grew during the run.
        non_torch_bytes: memory in use that torch's allocator does not hold: other processes,
            the CUDA context, NCCL and library workspaces (0 on the host, where those are
            already outside the available memory).
        utilization: the share of memory the process may fill (``None`` when fixed).
        cap_basis: what the cap is a share of: ``"total"`` (CUDA), ``"available"`` (host) or
            ``"fixed"``.
        cap_bytes: ``utilization`` times the total (CUDA) or the available memory (host).
        kv_cache_bytes: the budget: ``cap - non_torch - torch_peak``, or the fixed size.
        profile_seconds: wall time of the profile run.
    """

    device: str
    source: str
    total_bytes: int
    free_before_bytes: int
    free_after_bytes: int
    torch_peak_bytes: int
    non_torch_bytes: int
    utilization: float | None
    cap_basis: str
    cap_bytes: int
    kv_cache_bytes: int
    profile_seconds: float = 0.0

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        """A few aligned lines, one figure each."""
        b = format_bytes
        if self.source == "fixed":
            seen = f"total {b(self.total_bytes)}, free {b(self.free_before_bytes)}; " * bool(self.total_bytes)
            return f"memory on {self.device}: KV cache fixed at {b(self.kv_cache_bytes)} ({seen}not profiled)"
        rows = [
            ("total", b(self.total_bytes)),
            ("free before / after", f"{b(self.free_before_bytes)} / {b(self.free_after_bytes)}"),
            (f"cap ({self.utilization:g} of {self.cap_basis})", b(self.cap_bytes)),
            ("held outside torch", b(self.non_torch_bytes)),
            ("peak of the profile run", f"{b(self.torch_peak_bytes)} ({self.profile_seconds:.2f} s)"),
            ("KV cache budget", b(self.kv_cache_bytes)),
        ]
        width = max(len(label) for label, _ in rows)
        return "\n".join(
            [f"memory on {self.device}:", *(f"  {label.ljust(width)}  {value}" for label, value in rows)]
        )


def determine_available_memory(
    memory: DeviceMemory | torch.device | str,
    *,
    utilization: float = DEFAULT_UTILIZATION,
    profile_fn: Callable[[], object] | None = None,
    kv_cache_bytes: int | None = None,
) -> MemoryProfile:
    """Profile ``profile_fn`` (e.g. a dummy forward pass at the largest batch) and size the KV cache.

    Args:
        memory: a probe, or a device to probe (``"cuda:0"``, ``"cpu"``).
        utilization: the share of memory the process may fill, in (0, 1].
        profile_fn: the run whose peak memory must stay available besides the KV cache;
            ``None`` measures nothing beyond what is held now.
        kv_cache_bytes: a fixed budget; profiling and the cap are skipped.

    Returns:
        The :class:`MemoryProfile`; its ``kv_cache_bytes`` is the budget.

    Raises:
        DeviceUnavailableError: the device is absent or cannot be profiled.
        InvalidInputError: ``utilization`` or ``kv_cache_bytes`` is out of range.
        MemoryProfilingError: nothing is left for the KV cache (the message says what holds
            the memory), or the budget is more than is free.
    """
    if kv_cache_bytes is not None:
        return _fixed_profile(memory, kv_cache_bytes)
    probe = memory if isinstance(memory, DeviceMemory) else device_memory(memory)
    where = str(probe.device)
    util = _check_utilization(utilization)
    probe.settle()
    before = probe.sample()
    probe.reset_peak()
    start = time.perf_counter()
    if profile_fn is not None:
        profile_fn()
    probe.settle()
    seconds = time.perf_counter() - start
    peak = probe.peak_bytes()
    after = probe.sample()

    if probe.cap_of_total:
        cap = int(after.total_bytes * util)
        non_torch = max(0, after.total_bytes - after.free_bytes - after.torch_reserved_bytes)
        used_peak = max(peak, after.process_bytes)
    else:
        cap = int(before.free_bytes * util)
        non_torch = 0
        used_peak = max(0, peak - before.process_bytes)
    budget = cap - non_torch - used_peak
    profile = MemoryProfile(
        device=where,
        source="profiled",
        total_bytes=after.total_bytes,
        free_before_bytes=before.free_bytes,
        free_after_bytes=after.free_bytes,
        torch_peak_bytes=used_peak,
        non_torch_bytes=non_torch,
        utilization=util,
        cap_basis="total" if probe.cap_of_total else "available",
        cap_bytes=cap,
        kv_cache_bytes=max(0, budget),
        profile_seconds=seconds,
    )
    _check_budget(profile, budget)
    return profile


def _fixed_profile(memory: DeviceMemory | torch.device | str, kv_cache_bytes: int) -> MemoryProfile:
    """The record of a fixed budget; total and free are read where the device can be probed.

    Raises:
        InvalidInputError: ``kv_cache_bytes`` is not an int >= 1.
        MemoryProfilingError: it is more than the device's free memory now (checked before
            anything is allocated; ``meta`` and devices kvcore cannot probe are not checked).
    """
    check_int(kv_cache_bytes, "'kv_cache_bytes'", minimum=1)
    if isinstance(memory, DeviceMemory):
        probe: DeviceMemory | None = memory
        dev = memory.device
    else:
        dev = check_device(memory)
        probe = device_memory(dev) if dev.type in ("cpu", "cuda") else None
    now = probe.sample() if probe is not None else None
    if now is not None and kv_cache_bytes > now.free_bytes:
        b = format_bytes
        raise MemoryProfilingError(
            f"the fixed KV cache size of {b(kv_cache_bytes)} (kv_cache_bytes) is more than the "
            f"{b(now.free_bytes)} free on {dev} now (of {b(now.total_bytes)}); nothing was allocated: "
            f"give at most {b(now.free_bytes)}, free memory on the device, or let kvcore size the cache "
            "from a utilization"
        )
    return MemoryProfile(
        device=str(dev),
        source="fixed",
        total_bytes=now.total_bytes if now else 0,
        free_before_bytes=now.free_bytes if now else 0,
        free_after_bytes=now.free_bytes if now else 0,
        torch_peak_bytes=0,
        non_torch_bytes=0,
        utilization=None,
        cap_basis="fixed",
        cap_bytes=kv_cache_bytes,
        kv_cache_bytes=kv_cache_bytes,
    )


def _check_budget(profile: MemoryProfile, budget: int) -> None:
    """Raise :class:`MemoryProfilingError` unless the budget is positive and free to allocate."""
    b = format_bytes
    on = f"on {profile.device}"
    if budget <= 0:
        outside = profile.total_bytes - profile.cap_bytes
        if profile.non_torch_bytes > outside:
            raise MemoryProfilingError(
                f"other processes (and this process's CUDA context) already hold "
                f"{b(profile.non_torch_bytes)} {on}, more than the {b(outside)} that utilization "
                f"{profile.utilization:g} of {b(profile.total_bytes)} leaves outside the cap; with the "
                f"{b(profile.torch_peak_bytes)} this process peaked at, nothing is left for the KV cache: "
                "free the device or raise the utilization"
            )
        raise MemoryProfilingError(
            f"the profile run peaked at {b(profile.torch_peak_bytes)} {on} and "
            f"{b(profile.non_torch_bytes)} is held outside torch, together more than the cap of "
            f"{b(profile.cap_bytes)} (utilization {profile.utilization:g}); nothing is left for the KV "
            "cache: raise the utilization, shrink the profile run (fewer batched tokens) or use a "
            "larger device"
        )
    if budget > profile.free_after_bytes:
        raise MemoryProfilingError(
            f"the KV cache budget of {b(budget)} {on} is more than the {b(profile.free_after_bytes)} "
            f"free after profiling (free before: {b(profile.free_before_bytes)}); another process may "
            "have allocated memory meanwhile: lower the utilization or give a fixed KV cache size"
        )
