"""The documented limits (kvcore.limits) and the layer-name rule, at the Python doors."""

from __future__ import annotations

import pytest

from kvcore import InvalidInputError, InvalidSpecError, SizingContext, format_bytes, parse_size, plan_kv_cache
from kvcore.limits import MAX_BYTES, MAX_LAYERS, MAX_TOKENS, check_layer_count, check_layer_name, shown
from tests.helpers import full


@pytest.mark.parametrize(
    "text", ["1e400", "1e999999", "1e9999999", "1" + "0" * 5000, str(MAX_BYTES + 1), "1048577TiB"]
)
def test_sizes_past_the_cap_are_refused_before_they_become_ints(text):
    # 1e999999 once took 78 s to expand; it is compared as a decimal now
    with pytest.raises(InvalidInputError, match="1 EiB"):
        parse_size(text)


def test_the_cap_itself_is_accepted():
    assert parse_size(str(MAX_BYTES)) == MAX_BYTES == parse_size("1024TiB") * 1024
    with pytest.raises(InvalidInputError, match="1 EiB"):
        parse_size(MAX_BYTES + 1)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (5 * 2**50, "5.00 PiB"),
        (3 * 2**60, "3.00 EiB"),
        (2**70, "1.18e+21 B"),
        (10**400, "1.00e+400 B"),
        (7 * 10**4000, "7.00e+4000 B"),
        (float("inf"), "inf B"),
        (-(2**33), "-8.00 GiB"),
    ],
)
def test_format_bytes_is_total(value, text):
    assert format_bytes(value) == text


def test_format_bytes_takes_ints_longer_than_python_prints():
    assert format_bytes(7 * 10**5000) == "7.00e+5000 B"


def test_shown_abbreviates_long_ints():
    assert shown(12345) == "12345"
    assert shown(10**400) == "a number of about 401 digits"


@pytest.mark.parametrize(
    "name", ["", "a..b", "y.", ".a", "to", "training", "model.layers.0.forward", "__init__", 3]
)
def test_layer_names_no_module_can_have_are_refused(name):
    with pytest.raises(InvalidSpecError):
        check_layer_name(name)


@pytest.mark.parametrize(
    "name", ["l0", "model.layers.0.self_attn", "_orig_mod.model.layers.0.attn", "layer-0"]
)
def test_qualified_module_names_are_accepted(name):
    assert check_layer_name(name) == name


def test_the_planner_checks_names_counts_budget_and_length(registry):
    ctx = SizingContext(max_model_len=16)
    with pytest.raises(InvalidSpecError, match="layer name 'to'"):
        plan_kv_cache({"to": full()}, 2**30, ctx, registry=registry)
    with pytest.raises(InvalidInputError, match="1 EiB"):
        plan_kv_cache({"l0": full()}, 10**400, ctx, registry=registry)
    with pytest.raises(InvalidSpecError, match="MAX_LAYERS"):
        check_layer_count(MAX_LAYERS + 1)
    with pytest.raises(InvalidSpecError, match="at most 4,294,967,296"):
        SizingContext(max_model_len=MAX_TOKENS + 1)
    with pytest.raises(InvalidSpecError, match="about 401 digits"):
        SizingContext(max_model_len=10**400)
