"""The GPU catalogue: published memory bandwidth, dense tensor FLOPs, memory size and host link
of the GPUs the step-time roofline (:mod:`kvcore.simulation.timing`) knows.

The figures live in ``kvcore/data/gpus.json``, one entry per GPU with the vendor datasheet it
was read from (``source``) and what was derived (``notes``: vendors print peaks with sparsity
beside the dense ones; the catalogue holds the dense peaks). :func:`find_gpu` looks a GPU up by
name or alias, ignoring case, spaces, dashes and underscores (``"h100"``, ``"H100 SXM"``).

The link to the host's memory (what a host tier's blocks cross) is read per direction:
:func:`host_link` works a PCIe link's bandwidth out of its generation and lanes (the
catalogue's ``host_links.pcie`` table, from the PCI Express specifications) and takes a named
link (NVLink-C2C) from ``host_links.named``, each with its source; :func:`host_transfer`
prices moving bytes each way over it.
"""

from __future__ import annotations

import difflib
import json
import math
import re
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
    def memory_bytes(self) -> int:
        """Device memory in bytes. A GPU's memory size is quoted in binary units although the
        datasheet writes "GB" (HBM and GDDR come in power-of-two dies): an H100's "80GB" is
        80 GiB, of which ``nvidia-smi`` shows 81,559 MiB after the driver's share. So
        ``memory_gb`` is read as GiB here, as ``--gpu-memory 80GiB`` writes it."""
        return round(self.memory_gb * 2**30)

    @property
    def memory_bandwidth(self) -> float:
        """Device memory bandwidth in bytes per second."""
        return self.hbm_bandwidth_gbps * _GIGA

    def peak_flops(self, fp8: bool = False) -> float:
        """The dense tensor peak in FLOP/s: FP8 when ``fp8`` and the GPU has it, else BF16."""
        if fp8 and self.fp8_tflops is not None:
            return self.fp8_tflops * _TERA
        return self.bf16_tflops * _TERA


@attrs.frozen(kw_only=True)
class HostLink:
    """A GPU's link to its host's memory, per direction.

    Attributes:
        name: the link as the catalogue names it (``"PCIe Gen5 x16"``, ``"NVLink-C2C"``).
        gbps_each_way: data bandwidth in each direction, GB/s (1e9 bytes per second); the link
            moves this much to the host and this much back at the same time.
        source: where the figure comes from (a URL).
        notes: how it was worked out.
    """

    name: str
    gbps_each_way: float
    source: str
    notes: str = ""

    @property
    def bytes_per_second(self) -> float:
        """Bandwidth in each direction, bytes per second."""
        return self.gbps_each_way * _GIGA


@attrs.frozen(kw_only=True)
class HostTransfer:
    """What moving bytes over a host link costs: each direction's time, and the time of both
    (the directions overlap on a full-duplex link, so the slower one decides).

    Attributes:
        link: the link.
        to_host_bytes: bytes moved from the GPU to host memory (offloaded blocks).
        to_device_bytes: bytes moved from host memory to the GPU (restored blocks).
        to_host_seconds: ``to_host_bytes / bandwidth``.
        to_device_seconds: ``to_device_bytes / bandwidth``.
    """

    link: HostLink
    to_host_bytes: int
    to_device_bytes: int
    to_host_seconds: float
    to_device_seconds: float

    @property
    def seconds(self) -> float:
        """Both directions at once: the slower one's time (a lower bound: peak link bandwidth,
        no per-copy latency)."""
        return max(self.to_host_seconds, self.to_device_seconds)


_PCIE = re.compile(r"^PCIe Gen(\d+) x(\d+)$")


@cache
def _host_links() -> dict[str, Any]:
    text = resources.files(CATALOGUE_PACKAGE).joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
    links: dict[str, Any] = json.loads(text)["host_links"]
    return links


def host_link(gpu: Gpu) -> HostLink:
    """``gpu``'s link to its host's memory, per direction.

    A PCIe link (``"PCIe Gen5 x16"``) is worked out from its generation and lanes:
    ``GT/s x lanes x data bits / line bits / 8`` (Gen5 x16: ``32 x 16 x 128/130 / 8 = 63.0``
    GB/s each way); a named link (``"NVLink-C2C"``: 450 GB/s each way) is read from the
    catalogue.

    Raises:
        InvalidInputError: the catalogue knows no such link (or PCIe generation).
    """
    links = _host_links()
    match = _PCIE.match(gpu.host_link)
    if match is not None:
        generation, lanes = match.group(1), int(match.group(2))
        row = links["pcie"].get(generation)
        if row is None or lanes < 1:
            known = ", ".join(f"Gen{g}" for g in links["pcie"] if not g.startswith("_"))
            raise InvalidInputError(
                f"GPU {gpu.name!r}: host link {gpu.host_link!r}: the catalogue knows PCIe {known}, "
                "with lanes >= 1"
            )
        rate = row["gt_per_s"] * lanes * row["data_bits"] / row["line_bits"] / 8
        return HostLink(
            name=gpu.host_link,
            gbps_each_way=rate,
            source=row["source"],
            notes=(
                f"{row['gt_per_s']} GT/s x {lanes} lanes x {row['data_bits']}/{row['line_bits']} / 8; "
                f"{row['notes']}"
            ),
        )
    named = links["named"].get(gpu.host_link)
    if named is None:
        raise InvalidInputError(
            f"GPU {gpu.name!r}: host link {gpu.host_link!r} is neither 'PCIe GenN xL' nor one of "
            f"{', '.join(links['named'])} (kvcore/data/gpus.json host_links)"
        )
    return HostLink(name=gpu.host_link, **named)


def host_transfer(gpu: Gpu, to_host_bytes: int, to_device_bytes: int = 0) -> HostTransfer:
    """Price moving ``to_host_bytes`` from ``gpu`` to host memory and ``to_device_bytes`` back
    over its host link (:func:`host_link`), each direction at the link's peak.

    Args:
        gpu: the GPU.
        to_host_bytes: bytes offloaded (``>= 0``).
        to_device_bytes: bytes restored (``>= 0``).

    Returns:
        The seconds each way, and both together (:attr:`HostTransfer.seconds`).

    Raises:
        InvalidInputError: a negative or non-integer byte count, or an unknown link.
    """
    for what, value in (("to_host_bytes", to_host_bytes), ("to_device_bytes", to_device_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError(f"{what} must be an int >= 0 (got {value!r})")
    link = host_link(gpu)
    rate = link.bytes_per_second
    return HostTransfer(
        link=link,
        to_host_bytes=to_host_bytes,
        to_device_bytes=to_device_bytes,
        to_host_seconds=to_host_bytes / rate,
        to_device_seconds=to_device_bytes / rate,
    )


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
