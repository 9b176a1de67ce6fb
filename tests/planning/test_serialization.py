import json

import pytest

from kvcore import InvalidInputError, InvalidSpecError, SizingContext, UnknownSpecKindError, plan_kv_cache
from kvcore.frontends.specfile import read_spec_file, specs_to_dict
from kvcore.planning.serialization import plan_from_json, plan_to_json, spec_from_dict, spec_to_dict
from tests.helpers import chunked, full, mix, mla, sliding


@pytest.mark.parametrize("spec", [full(), sliding(1024, dtype="fp8"), chunked(8192), mla()])
def test_spec_round_trip(registry, spec):
    data = spec_to_dict(spec, registry)
    assert data["kind"] == spec.kind
    assert isinstance(data["dtype"], str)
    assert spec_from_dict(json.loads(json.dumps(data)), registry) == spec


def test_spec_json_names_dtype_by_torch_name(registry):
    assert spec_to_dict(sliding(8, dtype="fp8"), registry)["dtype"] == "float8_e4m3fn"


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (
            {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "dtype": "bfloat16"},
            InvalidSpecError,
            "head_size",
        ),
        (
            {"kind": "full_attention", "block_size": 16, "num_kv_heads": 0, "head_size": 8, "dtype": "bf16"},
            InvalidSpecError,
            "num_kv_heads",
        ),
        (
            {
                "kind": "full_attention",
                "block_size": 16,
                "num_kv_heads": 8,
                "head_size": 8,
                "dtype": "bf16",
                "sliding_window": 4,
            },
            InvalidSpecError,
            "sliding_window",
        ),
        ({"kind": "sparse", "block_size": 16}, UnknownSpecKindError, "unknown spec kind 'sparse'"),
        ({"block_size": 16}, InvalidSpecError, "'kind'"),
        (["full_attention"], InvalidSpecError, "JSON object"),
        (
            {"kind": "mla", "block_size": "16", "kv_lora_rank": 512, "qk_rope_head_dim": 64, "dtype": "bf16"},
            InvalidSpecError,
            "block_size",
        ),
    ],
)
def test_bad_spec_dicts(registry, data, error, match):
    with pytest.raises(error, match=match):
        spec_from_dict(data, registry)


def test_spec_file_round_trip(registry, tmp_path):
    specs = mix((3, full()), (7, sliding(4096)))
    path = tmp_path / "specs.json"
    path.write_text(json.dumps(specs_to_dict(specs, registry)))
    assert read_spec_file(path, registry) == specs
    assert list(read_spec_file(path, registry)) == list(specs)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("[1, 2]", "expected a JSON object"),
        ('{"layers": []}', "expected 'layers' to map"),
        ('{"layers": {}}', "no layers"),
        ('{"layers": {"a": {"kind": "full_attention"}}, "extra": 1}', "unknown top-level keys"),
        ('{"layers": {"l0": {"kind": "full_attention", "block_size": 16}}}', "layer 'l0'"),
        ('{"layers": {"l0": ', "not valid JSON"),
    ],
)
def test_bad_spec_files(registry, tmp_path, content, match):
    path = tmp_path / "specs.json"
    path.write_text(content)
    with pytest.raises((InvalidSpecError, InvalidInputError), match=match):
        read_spec_file(path, registry)


def test_missing_spec_file(registry, tmp_path):
    with pytest.raises(InvalidInputError, match="file not found"):
        read_spec_file(tmp_path / "nope.json", registry)


def test_json_files_are_read_like_transformers_reads_them(tmp_path):
    from kvcore.frontends.specfile import load_json_file

    path = tmp_path / "config.json"
    path.write_text('{"time_step_limit": [0.0, Infinity], "x": NaN}')
    data = load_json_file(path)
    assert data["time_step_limit"][1] == float("inf")
    assert data["x"] != data["x"]


@pytest.mark.parametrize("policy", ["uniform", "shared_buffer"])
def test_plan_round_trip(registry, policy):
    specs = mix((6, full())) if policy == "uniform" else mix((4, full()), (7, sliding(512)), (2, mla()))
    plan = plan_kv_cache(specs, 2**30, SizingContext(max_model_len=4096), registry=registry, policy=policy)
    again = plan_from_json(plan_to_json(plan, registry), registry)
    assert again == plan
    assert plan_to_json(again, registry) == plan_to_json(plan, registry)


def test_plan_json_reads_back_with_report_keys(registry):
    from kvcore.cli.report import plan_report

    specs = mix((2, full()), (2, sliding(64)))
    plan = plan_kv_cache(specs, 2**28, SizingContext(max_model_len=2048), registry=registry)
    report = plan_report(plan, specs, registry)
    assert plan_from_json(json.dumps(report), registry) == plan


def test_bad_plan_json(registry):
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        plan_from_json("{", registry)
    with pytest.raises(InvalidInputError, match="not a kvcore plan"):
        plan_from_json('{"policy": "uniform"}', registry)


def test_unknown_keys_inside_nested_values_are_errors(registry):
    data = {
        "kind": "state",
        "block_size": 16,
        "parts": [{"name": "conv", "shape": [3, 8], "dtype": "bfloat16", "bogus": 1}],
    }
    with pytest.raises(InvalidSpecError, match="bogus"):
        spec_from_dict(data, registry)


def test_unknown_keys_inside_a_plan_are_errors_but_top_level_figures_are_not(registry):
    from kvcore.planning.serialization import plan_from_dict, plan_to_dict

    plan = plan_kv_cache({"a": full()}, 2**24, SizingContext(max_model_len=64), registry=registry)
    data = plan_to_dict(plan, registry)
    assert plan_from_dict({**data, "max_concurrency": 1.0}, registry) == plan
    data["tensors"][0]["strides"] = 1
    with pytest.raises(InvalidInputError, match="strides"):
        plan_from_dict(data, registry)
