"""The command line says what it did: unknown names exit 1 with the closest names, units and
suffixes are accepted and said back, token counts read k/K/M as vLLM reads them."""

from __future__ import annotations

import argparse
import json

import pytest

from kvcore.cli.inputs import Echoed, echo_given, size, token_count, tokens
from kvcore.error_messages import did_you_mean
from tests.cli.conftest import full_entry

MODEL = ("--model", "google/gemma-2-9b-it")


def one_error(run_cli, *argv):
    status, out, err = run_cli(*argv)
    assert status == 1, (out, err)
    lines = err.rstrip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvcore: error: "), err
    return lines[0]


def test_did_you_mean_offers_the_closest_names():
    assert did_you_mean("shared_bufer", ["uniform", "shared_buffer", "equal_groups"]) == (
        "did you mean 'shared_buffer'? "
    )
    assert did_you_mean("SHARED_BUFFER", ["shared_buffer"]) == "did you mean 'shared_buffer'? "
    assert did_you_mean("zzz", ["uniform", "shared_buffer"]) == ""


def test_unknown_policy_in_plan(run_cli):
    line = one_error(run_cli, "plan", *MODEL, "--memory", "8GiB", "--policy", "shared_bufer")
    assert "unknown policy 'shared_bufer'; did you mean 'shared_buffer'?" in line


@pytest.mark.parametrize("command", ["compare", "simulate"])
def test_unknown_policy_in_compare_and_simulate_exits_1(run_cli, command):
    extra = ("--requests", "4") if command == "simulate" else ()
    line = one_error(
        run_cli, command, *MODEL, "--memory", "8GiB", "--policies", "shared_buffer,pagedattention", *extra
    )
    assert "unknown policy 'pagedattention'" in line
    line = one_error(run_cli, command, *MODEL, "--memory", "8GiB", "--policies", "equal_group", *extra)
    assert "did you mean 'equal_groups'?" in line


def test_unknown_kind_in_a_spec_file(run_cli, spec_file):
    path = spec_file({"l0": full_entry(kind="full_atention")})
    line = one_error(run_cli, "plan", "--specs", path, "--memory", "1GiB", "--max-model-len", "64")
    assert "did you mean 'full_attention'" in line


@pytest.mark.parametrize(
    ("name", "suggested"),
    [("gemma-3-27b", "google/gemma-3-27b-it"), ("meta-llama/Llama-3.1-8", "meta-llama/Llama-3.1-8B")],
)
def test_unknown_model(run_cli, name, suggested):
    line = one_error(run_cli, "models", name)
    assert f"did you mean {suggested!r}" in line


def test_unknown_model_type(run_cli, tmp_path):
    config = {"model_type": "lama", "num_hidden_layers": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    line = one_error(run_cli, "models", path)
    assert "no model-family plugin knows model type 'lama'" in line and "did you mean 'llama'" in line


# -- units and suffixes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("32768", 32768), ("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("1M", 2**20), ("2m", 2_000_000)],
)
def test_token_suffixes_as_vllm_reads_them(text, value):
    assert token_count(text) == value


@pytest.mark.parametrize(
    ("text", "match"),
    [("1.5K", "takes a whole number"), ("1.0005k", "1000.5 tokens, not a whole number"), ("0k", ">= 1")],
)
def test_bad_suffixed_counts(text, match):
    with pytest.raises(argparse.ArgumentTypeError, match=match):
        token_count(text)


def test_suffixed_counts_past_the_limit_are_refused():
    with pytest.raises(argparse.ArgumentTypeError, match="at most"):
        tokens("999999999T")


def test_echo_puts_plain_ints_back(capsys):
    args = argparse.Namespace(memory=size("80GB"), max_model_len=tokens("32k"), other=3)
    assert isinstance(args.memory, Echoed)
    echo_given(args)
    assert type(args.memory) is int and type(args.max_model_len) is int and args.max_model_len == 32_000
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "kvcore: warning: --memory 80GB = 74.51 GiB (GB is decimal, 1000-based; write GiB for 1024-based)",
        "kvcore: warning: --max-model-len 32k = 32,000 tokens (k is decimal: 1k = 1,000; 1K = 1,024, "
        "as vLLM reads it)",
    ]


def test_binary_units_and_bare_counts_are_not_echoed():
    assert type(size("80GiB")) is int and type(token_count("4096")) is int
    assert type(token_count("32K")) is int and token_count("32K") == 32_768


def test_plan_echoes_a_decimal_memory_and_a_decimal_length(run_cli):
    status, out, err = run_cli("plan", *MODEL, "--memory", "80GB", "--max-model-len", "8k", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["available_memory_bytes"] == 80 * 10**9 and data["max_model_len"] == 8000
    assert "--memory 80GB = 74.51 GiB" in err and "--max-model-len 8k = 8,000 tokens" in err


def test_a_binary_length_is_read_without_a_warning(run_cli):
    """``32K`` = 32,768 is how context lengths are quoted: no line on every run (issue 38)."""
    status, out, err = run_cli("plan", *MODEL, "--memory", "8GiB", "--max-model-len", "8K", "--json")
    assert status == 0 and err == ""
    assert json.loads(out)["max_model_len"] == 8192


def test_unknown_plugin_to_block(run_cli):
    line = one_error(run_cli, "--block-plugin", "kvcore.policies.shared_bufer", "plugins")
    assert "no plugin has that name; did you mean 'kvcore.policies.shared_buffer'?" in line


def test_unknown_dtype(run_cli):
    line = one_error(run_cli, "plan", *MODEL, "--memory", "8GiB", "--kv-cache-dtype", "bfloat61")
    assert "(got 'bfloat61': did you mean 'bfloat16'?)" in line
