"""The GPU catalogue's host links: PCIe worked out from generation and lanes, NVLink-C2C read
by name, each with its source; moving bytes each way priced by hand."""

from __future__ import annotations

import attrs
import pytest

from kvcore.errors import InvalidInputError
from kvcore.simulation.gpus import find_gpu, gpu_catalogue, host_link, host_transfer


def test_every_catalogue_gpu_has_a_host_link_with_a_source():
    for gpu in gpu_catalogue():
        link = host_link(gpu)
        assert link.gbps_each_way > 0 and link.source.startswith("https://"), gpu.name
        # a datasheet prints both directions before encoding: each way is at most half of it
        assert link.gbps_each_way <= gpu.host_link_gbps / 2 + 1e-9, gpu.name


@pytest.mark.parametrize(
    ("name", "link", "each_way"),
    [
        ("A100", "PCIe Gen4 x16", 16 * 16 * 128 / 130 / 8),  # 31.5 GB/s
        ("H100", "PCIe Gen5 x16", 32 * 16 * 128 / 130 / 8),  # 63.0 GB/s
        ("GH200", "NVLink-C2C", 450.0),  # 900 GB/s both ways together
    ],
)
def test_links_by_hand(name, link, each_way):
    found = host_link(find_gpu(name))
    assert (found.name, found.gbps_each_way) == (link, pytest.approx(each_way))


def test_moving_bytes_each_way_is_priced_by_the_slower_direction():
    h100 = find_gpu("H100")
    rate = 32 * 16 * 128 / 130 / 8 * 1e9
    cost = host_transfer(h100, to_host_bytes=10 * 2**30, to_device_bytes=2 * 2**30)
    assert cost.to_host_seconds == pytest.approx(10 * 2**30 / rate)  # 0.170 s
    assert cost.to_device_seconds == pytest.approx(2 * 2**30 / rate)
    assert cost.seconds == cost.to_host_seconds  # the directions overlap on a full-duplex link
    gh200 = host_transfer(find_gpu("GH200"), 10 * 2**30)
    assert gh200.seconds == pytest.approx(10 * 2**30 / 450e9)
    assert gh200.seconds < cost.seconds / 7  # NVLink-C2C against PCIe Gen5 x16
    assert host_transfer(h100, 0).seconds == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_byte_counts_are_refused(bad):
    with pytest.raises(InvalidInputError, match="must be an int >= 0"):
        host_transfer(find_gpu("H100"), bad)


@pytest.mark.parametrize(
    ("link", "says"),
    [("PCIe Gen9 x16", "knows PCIe Gen3, Gen4, Gen5, Gen6"), ("Infinity Fabric", "neither 'PCIe GenN xL'")],
)
def test_an_unknown_link_is_refused(link, says):
    gpu = attrs.evolve(find_gpu("H100"), host_link=link)
    with pytest.raises(InvalidInputError, match=says):
        host_link(gpu)
