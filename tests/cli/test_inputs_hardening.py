"""Issue 12, "inputs that crash or lie": every reproducer ends in one ``kvcore: error:`` line and
exit 1 (2 for argparse's own usage errors), or in the right refusal."""

from __future__ import annotations

import json

import pytest

from kvcore.frontends.hf_config import find_bundled_model
from kvcore.limits import MAX_LAYERS
from tests.cli.conftest import full_entry

ONE = {"l0": full_entry()}
SPEC = ("--memory", "1GiB", "--max-model-len", "16")


def error_line(run_cli, *argv, status=1):
    """The error line of a failing command; ``status=2``: an argparse usage error (SystemExit)."""
    if status == 2:
        with pytest.raises(SystemExit) as info:
            run_cli(*argv)
        code = info.value.code
        out, err = run_cli.capsys.readouterr()
    else:
        code, out, err = run_cli(*argv)
    assert code == status, (code, out, err)
    assert out == "" and err.endswith("\n")
    last = err.rstrip("\n").splitlines()[-1]  # argparse prints its usage first
    assert "Traceback" not in err
    if status == 1:
        assert err.count("\n") == 1 and err.startswith("kvcore: error: ")
    return last


def bundled(name):
    model = find_bundled_model(name)
    assert model is not None
    return model.config()


def config_file(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


# 1. not UTF-8 ---------------------------------------------------------------------------


def test_a_spec_file_or_config_that_is_not_utf8_names_the_file(run_cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{}")
    for option in ("--specs", "--model"):
        line = error_line(run_cli, "plan", option, bad, *SPEC)
        assert f"{bad} is not UTF-8 text (byte 0xff at offset 0)" in line
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(b"\xff\xfe{}")
    assert "config.json is not UTF-8 text" in error_line(run_cli, "models", folder)


# 2. 5,000 digits ------------------------------------------------------------------------


def test_a_number_of_5000_digits_is_a_clear_error(run_cli, tmp_path):
    path = tmp_path / "specs.json"
    path.write_text(json.dumps({"layers": ONE}).replace('"head_size": 128', '"head_size": 1' + "0" * 5000))
    line = error_line(run_cli, "plan", "--specs", path, *SPEC)
    assert "holds a number of more than 4,300 digits" in line and str(path) in line


# 3./4. --memory past the cap --------------------------------------------------------------


@pytest.mark.parametrize("memory", ["1e400", "1e999999", "1e9999999", "2EB", str(2**60 + 1)])
def test_a_memory_past_the_cap_is_a_usage_error_with_the_limit(run_cli, spec_file, memory):
    line = error_line(
        run_cli, "plan", "--specs", spec_file(ONE), "--memory", memory, "--max-model-len", "16", status=2
    )
    assert "--memory" in line
    if memory != "2EB":
        assert "above the largest kvcore accepts, 1 EiB" in line and "kvcore.limits.MAX_BYTES" in line


# 5. a page of 10**400 bytes ---------------------------------------------------------------


def test_a_huge_head_size_is_refused_with_readable_figures(run_cli, spec_file):
    line = error_line(run_cli, "plan", "--specs", spec_file({"l0": full_entry(head_size=10**400)}), *SPEC)
    assert "5.12e+402 B of KV cache (1 block of 5.12e+402 B)" in line
    assert "0 blocks of" in line


# 6. max_model_len past the cap ------------------------------------------------------------


def test_a_max_model_len_past_the_cap_is_refused(run_cli, spec_file):
    state = {
        "m": {
            "kind": "state",
            "block_size": 16,
            "parts": [{"name": "s", "shape": [8, 64], "dtype": "float32"}],
        }
    }
    for extra in ((), ("--json",)):
        line = error_line(
            run_cli, "plan", "--specs", spec_file(state), "--memory", "1GiB",
            "--max-model-len", str(10**400), *extra, status=2,
        )  # fmt: skip
        assert "--max-model-len" in line and "at most 30 digits" in line
    line = error_line(
        run_cli,
        "plan",
        "--specs",
        spec_file(state),
        "--memory",
        "1GiB",
        "--max-model-len",
        str(2**32 + 1),
        status=2,
    )
    assert "at most 4,294,967,296 tokens (kvcore.limits.MAX_TOKENS)" in line


# 7./8. layer counts -------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [2**63, 10**9, 10**7, 10**6, MAX_LAYERS + 1])
@pytest.mark.parametrize(
    "model",
    [
        "meta-llama/Llama-3.2-1B",
        "mistralai/Mistral-7B-v0.1",
        "deepseek-ai/DeepSeek-V3",
        "microsoft/Phi-3-mini-4k-instruct",
    ],
)
def test_a_layer_count_past_the_cap_is_refused_before_anything_is_built(run_cli, tmp_path, model, layers):
    config = bundled(model)
    config["num_hidden_layers"] = layers
    line = error_line(run_cli, "plan", "--model", config_file(tmp_path, config), *SPEC)
    assert f"'num_hidden_layers' is {layers}, more than the 100,000 layers kvcore plans" in line


def test_a_spec_file_with_too_many_layers_is_refused(run_cli, spec_file):
    layers = {f"l{i}": full_entry() for i in range(MAX_LAYERS + 1)}
    line = error_line(run_cli, "plan", "--specs", spec_file(layers), *SPEC)
    assert "has 100001 layers; kvcore plans at most 100,000 layers" in line


# 9. allocation errors are KVCacheAllocationErrors -----------------------------------------------


def test_allocate_past_the_cap_is_refused_before_torch(run_cli):
    line = error_line(
        run_cli, "allocate", "--model", "meta-llama/Llama-3.2-1B", "--memory", "1e25",
        "--max-model-len", "4096", status=2,
    )  # fmt: skip
    assert "1 EiB" in line


# 10. layer names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a..b", "y.", ".a", "to", "training", "model.layers.0.forward", "__init__"])
@pytest.mark.parametrize("command", ["plan", "allocate"])
def test_layer_names_no_module_can_have_are_refused_when_read(run_cli, spec_file, name, command):
    extra = ("--device", "cpu") if command == "allocate" else ()
    path = spec_file({name: full_entry()})
    line = error_line(run_cli, command, "--specs", path, "--memory", "1MiB", "--max-model-len", "16", *extra)
    assert f"layer name {name!r}" in line and str(path) in line


# 11. --map ----------------------------------------------------------------------------------------


def test_a_map_into_a_missing_folder_is_refused_before_planning(run_cli, spec_file, monkeypatch):
    import kvcore.planning.planner

    def never(*args, **kwargs):
        raise AssertionError("planned before checking --map")

    monkeypatch.setattr(kvcore.planning.planner, "plan", never)
    line = error_line(run_cli, "plan", "--specs", spec_file(ONE), *SPEC, "--map", "/missing/dir/m.png")
    assert "the folder /missing/dir does not exist" in line


# 12. duplicate keys ----------------------------------------------------------------------------------


def test_a_layer_named_twice_is_refused_naming_it(run_cli, tmp_path):
    entry = json.dumps(full_entry())
    path = tmp_path / "dup.json"
    path.write_text(f'{{"layers": {{"a": {entry}, "b": {entry}, "a": {entry}}}}}')
    line = error_line(run_cli, "plan", "--specs", path, *SPEC)
    assert "'a' appears twice in one JSON object" in line and str(path) in line


# 13. a fixed --memory above the free memory ----------------------------------------------------------------


def test_a_fixed_memory_above_the_free_memory_is_refused_before_allocating(run_cli, spec_file, monkeypatch):
    from kvcore.runtime import memory

    def tiny(self):
        return memory.MemorySample(
            total_bytes=2**30, free_bytes=2**20, torch_reserved_bytes=0, process_bytes=0
        )

    monkeypatch.setattr(memory.HostMemory, "sample", tiny)
    line = error_line(
        run_cli, "allocate", "--device", "cpu", "--memory", "23GiB", "--no-zero", "--specs", spec_file(ONE),
        "--max-model-len", "16",
    )  # fmt: skip
    assert "23.00 GiB" in line and "1.00 MiB free on cpu" in line and "nothing was allocated" in line


# 14. tp and heads ------------------------------------------------------------------------------------------


def test_a_tp_that_does_not_divide_the_heads_is_refused(run_cli):
    line = error_line(run_cli, "plan", "--model", "meta-llama/Llama-3.1-8B", "--tp", "3", *SPEC)
    assert "'num_attention_heads' (32) does not divide by tp=3" in line and "[1, 2, 4, 8, 16, 32]" in line


def test_kv_heads_replicate_when_tp_is_a_multiple_of_them(run_cli):
    code, out, _ = run_cli("plan", "--model", "meta-llama/Llama-3.1-8B", "--tp", "16", *SPEC, "--json")
    assert code == 0
    assert {g["num_kv_heads"] for g in json.loads(out)["groups"]} == {1}


def test_kv_heads_that_do_not_divide_the_attention_heads_are_refused(run_cli, tmp_path):
    config = bundled("meta-llama/Llama-3.2-1B")
    config["num_key_value_heads"] = 7
    line = error_line(run_cli, "plan", "--model", config_file(tmp_path, config), *SPEC)
    assert "'num_key_value_heads' (7) must divide 'num_attention_heads' (32)" in line


def test_kv_heads_and_tp_that_do_not_divide_one_another_are_refused(run_cli, tmp_path):
    config = bundled("meta-llama/Llama-3.2-1B")  # 32 heads, 8 KV heads
    config["num_attention_heads"], config["num_key_value_heads"] = 48, 12
    line = error_line(run_cli, "plan", "--model", config_file(tmp_path, config), "--tp", "8", *SPEC)
    assert "'num_key_value_heads' (12) and tp=8 must divide one another" in line


# 15. blocked plugins, unknown names, compare ---------------------------------------------------------------


def test_a_family_whose_kind_was_blocked_refuses(run_cli):
    line = error_line(
        run_cli,
        "--block-plugin",
        "kvcore.plugins.full_attention",
        "plan",
        "--model",
        "meta-llama/Llama-3.2-1B",
        *SPEC,
    )
    assert "built 'full_attention' layers, but no registered plugin provides the spec kind" in line


def test_an_unknown_plugin_to_block_is_an_error_listing_the_known_ones(run_cli, spec_file):
    line = error_line(run_cli, "--block-plugin", "nonexistent", "plan", "--specs", spec_file(ONE), *SPEC)
    assert "cannot block 'nonexistent': no plugin has that name" in line and "kvcore.plugins.mla" in line


def test_an_unknown_plugin_to_block_from_the_environment_says_so(run_cli, monkeypatch):
    monkeypatch.setenv("KVCORE_BLOCK_PLUGINS", "nonexistent")
    assert "(named in $KVCORE_BLOCK_PLUGINS)" in error_line(run_cli, "plugins")


def test_compare_exits_1_when_no_policy_could_plan(run_cli, spec_file):
    for extra in ((), ("--json",)):
        code, out, err = run_cli(
            "compare", "--specs", spec_file(ONE), "--memory", "1KiB", "--max-model-len", "16", *extra
        )
        assert (code == 1 and "no plan" in out) or extra
        assert err.startswith("kvcore: error: no policy could plan these specs") and err.count("\n") == 1


# 16. messages ----------------------------------------------------------------------------------------------


def test_one_group_one_block_one_tensor_are_singular(run_cli, spec_file):
    code, out, _ = run_cli("plan", "--specs", spec_file(ONE), *SPEC)
    assert code == 0
    assert "1 group, 1 tensor)" in out and "one request      1 block = " in out


def test_a_config_field_present_as_null_is_not_reported_missing(run_cli, tmp_path):
    config = bundled("meta-llama/Llama-3.2-1B")
    config["num_attention_heads"] = None
    line = error_line(run_cli, "plan", "--model", config_file(tmp_path, config), *SPEC)
    assert "'num_attention_heads' is null" in line


def test_a_spec_file_without_layers_names_the_file(run_cli, tmp_path):
    path = tmp_path / "empty.json"
    path.write_text('{"layers": {}}')
    code, _, err = run_cli("plan", "--specs", path, *SPEC)
    if code:  # an empty model may plan (no groups); an error must name the file
        assert str(path) in err and err.count("\n") == 1


def test_a_mistyped_spec_field_shows_the_value(run_cli, spec_file):
    line = error_line(run_cli, "plan", "--specs", spec_file({"l0": full_entry(head_size="128")}), *SPEC)
    assert "'128'" in line


def test_a_hook_with_a_wrong_parameter_says_how_to_skip_the_plugin():
    from kvcore import get_plugin_manager, hookimpl
    from kvcore.errors import PluginValidationError

    class Wrong:
        @hookimpl
        def kvcore_register_spec_kinds(self, regsiter):
            pass

    with pytest.raises(PluginValidationError, match="skip the plugin with KVCORE_BLOCK_PLUGINS="):
        get_plugin_manager(autoload=False, plugins=[Wrong()])
