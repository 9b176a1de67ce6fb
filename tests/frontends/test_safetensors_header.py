"""Weights read from safetensors headers on disk: a model folder, a Hugging Face cache snapshot."""

from __future__ import annotations

import json
import struct

import pytest

from kvcore.cli import main
from kvcore.errors import InvalidInputError
from kvcore.frontends.hf_config import find_bundled_model, find_model_config
from kvcore.frontends.safetensors_header import local_weights, read_header
from tests.frontends.hub_stand_in import safetensors_file

QWEN = find_bundled_model("Qwen/Qwen3-8B").config()


def model_folder(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(QWEN))
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return folder


def test_a_folder_with_one_file_is_read_to_the_byte(tmp_path):
    tensors = {"embed": ("BF16", [1000, 64]), "scale": ("F32", [3]), "packed": ("U8", [7, 5])}
    folder = model_folder(tmp_path / "m", {"model.safetensors": safetensors_file(tensors)})
    weights = local_weights(folder, "here")
    assert weights is not None
    assert (weights.total, weights.elements, weights.files) == (128_000 + 12 + 35, 64_000 + 3 + 35, 1)
    assert weights.by_dtype == (("BF16", 128_000), ("U8", 35), ("F32", 12))
    assert weights.source == "1 safetensors header (here)"


def test_a_sharded_checkpoint_needs_every_shard(tmp_path):
    shards = {"a.safetensors": {"x": ("BF16", [10, 10])}, "b.safetensors": {"y": ("BF16", [5])}}
    index = {"weight_map": {t: s for s, ts in shards.items() for t in ts}}
    files = {name: safetensors_file(ts) for name, ts in shards.items()}
    folder = model_folder(
        tmp_path / "m", {**files, "model.safetensors.index.json": json.dumps(index).encode()}
    )
    weights = local_weights(folder, "here")
    assert weights is not None and (weights.total, weights.files) == (210, 2)
    (folder / "b.safetensors").unlink()  # a partial download: counted instead, never half-read
    assert local_weights(folder, "here") is None
    assert local_weights(tmp_path, "here") is None  # no checkpoint at all


def test_plan_with_gpu_memory_reads_a_folders_weights(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    tensors = {"w": ("BF16", [1024, 1024, 512])}  # 1 GiB of BF16 weights
    folder = model_folder(tmp_path / "qwen", {"model.safetensors": safetensors_file(tensors, data=False)})
    argv = ["plan", "--model", str(folder), "--gpu-memory", "24GiB", "--max-model-len", "4096", "--json"]
    assert main(argv) == 0
    budget = json.loads(capsys.readouterr().out)["gpu_budget"]
    assert budget["weights_bytes"] == 2**30 and budget["weights_by_group"] == {"BF16": 2**30}
    assert budget["weights_source"] == f"1 safetensors header ({folder})"
    assert find_model_config(str(folder)).origin == "path"


def test_a_cached_snapshot_with_its_weights_is_read_without_the_hub(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hub" / "models--acme--qwen"
    snapshot = model_folder(
        repo / "snapshots" / ("a" * 40),
        {"model.safetensors": safetensors_file({"w": ("F8_E4M3", [4096, 4096])})},
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    found = find_model_config("acme/qwen")
    assert found.origin == "cache" and found.folder == snapshot
    assert found.checkpoint_weights()[0].total == 4096 * 4096
    argv = ["plan", "--model", "acme/qwen", "--gpu-memory", "24GiB", "--max-model-len", "4096"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "  - weights         16.00 MiB  (read from 1 safetensors header (the Hugging Face cache): F8_E4M3"
        in out
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x02", "shorter than 8 bytes"),
        (struct.pack("<Q", 10**12), "over the 100,000,000 safetensors allows"),
        (struct.pack("<Q", 50) + b"{}", r"cut short \(2 of 50 bytes\)"),
        (struct.pack("<Q", 4) + b"[1]x", "not JSON"),
        (struct.pack("<Q", 3) + b"[1]", "not a JSON object"),
    ],
)
def test_a_bad_header_is_a_typed_error(tmp_path, content, message):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(InvalidInputError, match=message):
        read_header(path)


def test_a_bad_tensor_entry_names_the_tensor(tmp_path):
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 0]}}).encode()
    folder = model_folder(tmp_path / "m", {"model.safetensors": struct.pack("<Q", len(raw)) + raw})
    with pytest.raises(InvalidInputError, match="tensor 'w' is not a safetensors header entry"):
        local_weights(folder, "here")
