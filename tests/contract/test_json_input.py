"""Every file door reads at most ``MAX_INPUT_BYTES`` bytes and JSON at most ``MAX_JSON_DEPTH``
deep, and refuses numbers past Python's digit limit with an InvalidInputError naming the limit:
spec files, config.json, saved plans (``kvcore check``) and traces."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvcore import limits
from kvcore.cli.check import read_plan_file
from kvcore.errors import InvalidInputError
from kvcore.frontends.hf_config import read_config_file
from kvcore.frontends.specfile import read_spec_file
from kvcore.json_input import json_depth, loads
from kvcore.planning.registry import Registry
from kvcore.planning.serialization import plan_from_json
from kvcore.simulation.workload import read_trace

REGISTRY = Registry.default(autoload=False)
SPEC = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}


DOORS: dict[str, Callable[[Path], Any]] = {
    "spec file": lambda p: read_spec_file(p, REGISTRY),
    "config.json": read_config_file,
    "plan": lambda p: read_plan_file(str(p), REGISTRY),
    "trace": read_trace,
}


def nested(depth: int) -> str:
    """A spec file whose one layer has a field nested ``depth`` arrays deep (one line)."""
    inner = "[" * (depth - 3) + "]" * (depth - 3)
    return '{"layers": {"a": {"kind": "full_attention", "x": ' + inner + "}}}"


@pytest.mark.parametrize("door", ["spec file", "config.json", "plan", "trace"])
@pytest.mark.parametrize("depth", [limits.MAX_JSON_DEPTH + 1, 1_000, 100_000])
def test_json_nested_past_the_limit_is_refused_naming_it(tmp_path: Path, door: str, depth: int) -> None:
    path = tmp_path / "input.json"
    path.write_text(nested(depth))
    with pytest.raises(InvalidInputError) as caught:
        DOORS[door](path)
    message = str(caught.value)
    assert f"nests JSON arrays or objects {depth:,} deep" in message
    assert f"at most {limits.MAX_JSON_DEPTH} levels (kvcore.limits.MAX_JSON_DEPTH)" in message


def test_json_at_the_depth_limit_is_read() -> None:
    text = "[" * limits.MAX_JSON_DEPTH + "]" * limits.MAX_JSON_DEPTH
    value = loads(text, "x")
    for _ in range(limits.MAX_JSON_DEPTH - 1):
        value = value[0]
    assert value == []


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('{"a": "[[[[[[{{{{"}', 1),  # brackets in strings do not count
        ('["\\"[[[[", [[]]]', 3),  # nor after an escaped quote
        ("[" * 500, 500),  # unbalanced text is measured too
    ],
)
def test_json_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


@pytest.mark.parametrize("door", ["spec file", "config.json", "plan", "trace"])
def test_a_number_of_5000_digits_is_refused(tmp_path: Path, door: str) -> None:
    path = tmp_path / "input.json"
    path.write_text('{"layers": 1' + "0" * 5000 + ', "prompt_tokens": 1}')
    with pytest.raises(InvalidInputError, match="holds a number of more than 4,300 digits"):
        DOORS[door](path)


@pytest.mark.parametrize("door", ["spec file", "config.json", "plan", "trace"])
def test_a_file_past_the_byte_limit_is_refused_after_reading_one_byte_more(
    tmp_path: Path, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "MAX_INPUT_BYTES", 4096)
    with pytest.raises(
        InvalidInputError, match=r"holds more than 4,096 bytes \(kvcore.limits.MAX_INPUT_BYTES\)"
    ):
        DOORS[door](Path("/dev/zero"))  # /dev/zero never ends


def test_a_file_at_the_byte_limit_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps({"layers": {"model.layers.0.self_attn": SPEC}})
    monkeypatch.setattr(limits, "MAX_INPUT_BYTES", len(text.encode()))
    path = tmp_path / "specs.json"
    path.write_text(text)
    assert list(read_spec_file(path, REGISTRY)) == ["model.layers.0.self_attn"]
    path.write_text(text + " ")
    with pytest.raises(InvalidInputError, match="MAX_INPUT_BYTES"):
        read_spec_file(path, REGISTRY)


def test_plan_json_from_python_is_bounded_too() -> None:
    with pytest.raises(InvalidInputError, match="MAX_JSON_DEPTH"):
        plan_from_json("[" * 5000 + "]" * 5000, REGISTRY)
    with pytest.raises(InvalidInputError, match="4,300 digits"):
        plan_from_json('{"pools": ' + "9" * 4301 + "}", REGISTRY)
