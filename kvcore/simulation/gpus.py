"""The GPU catalogue: published memory bandwidth, dense tensor FLOPs, memory size and host link
of the GPUs the step-time roofline (:mod:`kvcore.simulation.timing`) knows.

The figures live in ``kvcore/data/gpus.json``, one entry per GPU with the vendor datasheet it
was read from (``source``) and what was derived (``notes``: vendors print peaks with sparsity
beside the dense ones; the catalogue holds the dense peaks). :func:`find_gpu` looks a GPU up by
name or alias, ignoring case, spaces, dashes and underscores (``"h100"``, ``"H100 SXM"``).
"""

from __future__ import annotations

import difflib
import json
import math
from functools import cache
from importlib import resources
from typing import Any, Final

import attrs

from kvcore.errors import InvalidInputError, UnknownGpuError

#: Package and file of the bundled catalogue.
CATALOGUE_PACKAGE: Final = "kvcore.data"
CATALOGUE_FILE: Final = "gpus.json"

_GIGA = 1e9
_TERA = 1e12


@attrs.frozen(kw_only=True)
class Gpu:
    """One GPU's published figures (decimal units, dense tensor-core peaks).

    Attributes:
        name: the catalogue's name (``"H100-SXM"``).
        aliases: other names it answers to (``"H100"``).
        vendor: who makes it.
        memory_gb: device memory, GB as the datasheet prints it.
        hbm_bandwidth_gbps: device memory bandwidth, GB/s (1e9 bytes per second).
        bf16_tflops: dense BF16 tensor peak, TFLOPS (1e12 FLOP/s).
        fp8_tflops: dense FP8 tensor peak, TFLOPS; ``None`` where the GPU has no FP8 tensor cores.
        host_link: the link to the host CPU (``"PCIe Gen5 x16"``, ``"NVLink-C2C"``).
        host_link_gbps: that link's bandwidth as the datasheet prints it, GB/s.
        source: the vendor datasheet the figures come from (a URL).
        notes: what was read where, and what was derived.
    """

    name: str
    aliases: tuple[str, ...] = attrs.field(converter=tuple)
    vendor: str
    memory_gb: float
    hbm_bandwidth_gbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    host_link: str
    host_link_gbps: float
    source: str
    notes: str = ""

    def __attrs_post_init__(self) -> None:
        for field in ("memory_gb", "hbm_bandwidth_gbps", "bf16_tflops", "host_link_gbps", "fp8_tflops"):
            value = getattr(self, field)
            if value is None and field == "fp8_tflops":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidInputError(f"GPU {self.name!r}: {field} must be a number (got {value!r})")
            if value <= 0:
                raise InvalidInputError(f"GPU {self.name!r}: {field} must be > 0 (got {value!r})")
        if not self.source.startswith("https://"):
            raise InvalidInputError(f"GPU {self.name!r}: source must be an https URL (got {self.source!r})")

    @property
    def memory_bandwidth(self) -> float:
        """Device memory bandwidth in bytes per second."""
        return self.hbm_bandwidth_gbps * _GIGA

    def peak_flops(self, fp8: bool = False) -> float:
        """The dense tensor peak in FLOP/s: FP8 when ``fp8`` and the GPU has it, else BF16."""
        if fp8 and self.fp8_tflops is not None:
            return self.fp8_tflops * _TERA
        return self.bf16_tflops * _TERA


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _gpu(entry: Any) -> Gpu:
    if not isinstance(entry, dict):
        raise InvalidInputError(f"{CATALOGUE_FILE}: each GPU must be a JSON object (got {entry!r})")
    try:
        return Gpu(**entry)
    except TypeError as exc:
        raise InvalidInputError(f"{CATALOGUE_FILE}: GPU {entry.get('name')!r}: {exc}") from None


@cache
def gpu_catalogue() -> tuple[Gpu, ...]:
    """Every GPU of the bundled catalogue, in file order.

    Raises:
        InvalidInputError: the bundled file is malformed (a packaging fault).
    """
    text = resources.files(CATALOGUE_PACKAGE).joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    return tuple(_gpu(entry) for entry in data["gpus"])


def find_gpu(name: str) -> Gpu:
    """The catalogue's GPU called ``name`` (or an alias of it), ignoring case and punctuation.

    Raises:
        UnknownGpuError: no GPU has that name; the message says which is closest and lists all.
    """
    wanted = _key(str(name))
    names: dict[str, Gpu] = {}
    for gpu in gpu_catalogue():
        for alias in (gpu.name, *gpu.aliases):
            names[_key(alias)] = gpu
    if wanted in names:
        return names[wanted]
    close = difflib.get_close_matches(wanted, list(names), n=1, cutoff=0.5)
    hint = f"did you mean {names[close[0]].name}? " if close else ""
    known = ", ".join(gpu.name for gpu in gpu_catalogue())
    raise UnknownGpuError(
        f"unknown GPU {name!r}: {hint}the catalogue (kvcore/data/gpus.json) has {known}; "
        "for another GPU, measure a step-time profile and give it instead"
    )
