import struct
import xml.etree.ElementTree as ET

import pytest

from kvcore import InvalidInputError, SizingContext, plan_kv_cache
from kvcore.cli.memory_map import memory_map, render_memory_map
from tests.helpers import full, mix, sliding

CTX = SizingContext(max_model_len=32768)


@pytest.fixture
def hybrid_plan(registry):
    # 3 full + 7 sliding: groups of 2 plus block-32 remainders, so padding-free rows and
    # one tensor shared by several groups
    return plan_kv_cache(mix((3, full()), (7, sliding(4096))), 4 * 2**30, CTX, registry=registry)


def test_boxes_show_shared_bytes_and_cover_the_window(hybrid_plan):
    data = memory_map(hybrid_plan, rows=4)
    assert data.buffer_bytes == 4 * hybrid_plan.bytes_per_block
    # the tensor at offset 0 is shared by one layer of every group: one band per group
    first = [b for b in data.buffer_boxes if b.track == 0]
    assert {b.group for b in first} == set(range(len(hybrid_plan.groups)))
    assert all(b.bands == len(hybrid_plan.tensors[0].shared_by) for b in first)
    assert all(0 <= b.x0 < b.x1 <= data.buffer_bytes for b in data.buffer_boxes)
    assert len(data.legend) == len(hybrid_plan.groups)


def test_padding_is_marked(registry):
    plan = plan_kv_cache(mix((10, full()), (52, sliding(1024))), 40 * 2**30, CTX, registry=registry)
    data = memory_map(plan)
    padding = [b for b in data.row_boxes if b.group is None]
    # only the remainder group (2 layers at block 64) leaves part of its row empty: 2 of 10 pages
    assert len(padding) == 1
    assert padding[0].x1 - padding[0].x0 == plan.bytes_per_block // 5


def test_png_is_valid_and_not_trivial(hybrid_plan, tmp_path):
    pytest.importorskip("matplotlib")
    path = render_memory_map(hybrid_plan, tmp_path / "map.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 300
    import matplotlib.image as mpimg

    pixels = mpimg.imread(path)
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::97].round(2).tolist()}
    assert len(colours) > 8  # group colours, hatching, text: not a blank canvas


def test_svg_draws_every_box_of_a_group_in_its_colour(hybrid_plan, tmp_path):
    pytest.importorskip("matplotlib")
    path = render_memory_map(hybrid_plan, tmp_path / "map.svg")
    root = ET.parse(path).getroot()
    group0 = [e for e in root.iter() if "fill: #1f77b4" in e.get("style", "")]  # tab20 colour 0
    data = memory_map(hybrid_plan)
    boxes = [b for b in (*data.buffer_boxes, *data.row_boxes) if b.group == 0]
    assert len(group0) == len(boxes) + 1  # and its legend patch


def test_bad_suffix(hybrid_plan, tmp_path):
    with pytest.raises(InvalidInputError, match=r"\.png or \.svg"):
        render_memory_map(hybrid_plan, tmp_path / "map.jpg")


def test_missing_matplotlib_names_the_extra(hybrid_plan, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(InvalidInputError, match=r"pip install 'kvcore\[plot\]'"):
        render_memory_map(hybrid_plan, tmp_path / "map.png")


def test_uniform_plan_map(registry):
    plan = plan_kv_cache({f"l{i}": full() for i in range(3)}, 2**30, CTX, registry=registry)
    data = memory_map(plan, rows=2)
    assert data.buffer_tracks == ("l0", "l1", "l2")
    assert all(b.x1 <= 2 * full().page_size_bytes for b in data.buffer_boxes)


@pytest.mark.parametrize(
    ("value", "label"),
    [(0, "0"), (512, "512 B"), (1.125 * 2**20, "1.125 MiB"), (1.5 * 2**20, "1.5 MiB"), (2 * 2**20, "2 MiB")],
)
def test_axis_labels_keep_the_decimals_they_need(value, label):
    from kvcore.cli.memory_map import axis_bytes

    assert axis_bytes(value) == label


def test_row_edges_of_1_125_mib_read_so_on_the_axis(registry, tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    # blocks of 96 tokens x 8 heads x 128 x 2 (K, V) x 2 bytes = 384 KiB: rows end at 1.125 MiB
    # and 1.5 MiB, which whole-unit labels rounded to "1 MiB" and "2 MiB"
    specs = {"a": full(block_size=96), "b": sliding(1024, block_size=96)}
    plan = plan_kv_cache(specs, 2**30, CTX, registry=registry, policy="shared_buffer")
    assert plan.single_buffer and plan.bytes_per_block == 384 * 2**10
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # tick labels as text, not glyph paths
        path = render_memory_map(plan, tmp_path / "map.svg")
    texts = {"".join(t.itertext()).strip() for t in ET.parse(path).iter("{http://www.w3.org/2000/svg}text")}
    assert {"768 KiB", "1.125 MiB", "1.5 MiB"} <= texts
    assert not {"1 MiB", "2 MiB"} & texts


def test_byte_ticks_fall_on_binary_steps():
    from kvcore.cli.memory_map import byte_tick_step

    assert byte_tick_step(4.5 * 2**20) == 2**20  # 0, 1, 2, 3, 4 MiB
    assert byte_tick_step(1.5 * 2**20) == 256 * 2**10
    assert byte_tick_step(100) == 16
