"""A plan is checked at every door: a policy's result (plan, compare, allocate), a saved plan
(`kvcore check`, `kvcore allocate --plan`), and a model with nothing to cache."""

from __future__ import annotations

import copy
import json

import pytest

from kvcore import BlockPlacement, ModelFamily, PlanValidationError, SizingContext, TensorPlacement, hookimpl
from kvcore.planning import registry as registry_module
from kvcore.planning.serialization import plan_from_dict
from kvcore.policies.uniform import UniformPolicy
from tests.cli.conftest import full_entry, sliding_entry


class StackedPolicy(UniformPolicy):
    """Broken on purpose: every layer's pages on the same bytes of one buffer."""

    name = "test.stacked"
    description = "every layer at offset 0 (overlaps live pages)"
    auto_priority = None

    def layout(self, groups):
        page = max(g.spec.page_size_bytes for g in groups)
        names = [name for g in groups for name in g.layer_names]
        return BlockPlacement(
            bytes_per_block=page,
            single_buffer=True,
            tensors=tuple(TensorPlacement(0, page, (n,)) for n in names),
        )


class StackedPlugin:
    @hookimpl
    def kvcore_register_policies(self, register):
        register(StackedPolicy())


class EncoderPlugin:
    """A model family with no cache-holding layer (an encoder-only model)."""

    @hookimpl
    def kvcore_register_model_families(self, register):
        register(ModelFamily(name="acme_encoder", model_types=("acme_encoder",), layer_specs=lambda c, o: {}))


@pytest.fixture
def with_plugins(monkeypatch, make_registry):
    """Make every command's registry hold the test plugins too."""
    registry = make_registry(StackedPlugin(), EncoderPlugin())
    monkeypatch.setattr(registry_module.Registry, "default", classmethod(lambda cls, **kw: registry))
    return registry


@pytest.fixture
def specs(spec_file):
    return spec_file({f"model.layers.{i}": full_entry(num_kv_heads=1, head_size=8) for i in range(3)})


SIZE = ("--memory", "1MiB", "--max-model-len", "64")


def test_plan_refuses_a_policy_whose_pages_overlap(run_cli, with_plugins, specs):
    status, out, err = run_cli("plan", "--specs", specs, *SIZE, "--policy", "test.stacked")
    assert status == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert "policy 'test.stacked'" in line and "pages of one group" in line
    assert "laid out by the policy from" in line  # where the policy came from


def test_compare_shows_the_overlapping_policy_as_no_plan(run_cli, with_plugins, specs):
    status, out, _ = run_cli("compare", "--specs", specs, *SIZE, "--json")
    assert status == 0  # other policies planned
    rows = {c["policy"]: c for c in json.loads(out)["candidates"]}
    assert rows["test.stacked"]["plan"] is None and "pages of one group" in rows["test.stacked"]["error"]
    assert rows["uniform"]["plan"] is not None  # the others are still shown
    _, out, _ = run_cli("compare", "--specs", specs, *SIZE)
    assert "test.stacked: no plan: the plan of policy 'test.stacked'" in out and "uniform" in out


def test_allocate_refuses_it_before_any_memory(run_cli, with_plugins, specs):
    status, _, err = run_cli("allocate", "--specs", specs, *SIZE, "--policy", "test.stacked")
    assert status == 1 and "pages of one group" in err


@pytest.fixture
def saved(run_cli, spec_file, tmp_path):
    """A hybrid plan as `kvcore plan --json` prints it (with its report keys)."""
    layers = {
        f"model.layers.{i}": (full_entry if i % 2 else lambda **kw: sliding_entry(32, **kw))(
            num_kv_heads=1, head_size=8
        )
        for i in range(6)
    }
    status, out, _ = run_cli(
        "plan", "--specs", spec_file(layers), "--memory", "1MiB", "--max-model-len", "64", "--json"
    )
    assert status == 0
    return json.loads(out)


def _edits(data):
    """The issue's edits of a saved plan, each of which must be refused."""
    same_group = copy.deepcopy(data)  # two layers of one group on the same bytes
    group = same_group["groups"][0]["layers"]
    lanes = same_group["tensors"]
    first = next(t for t in lanes if group[0] in t["shared_by"])
    second = next(t for t in lanes if group[1] in t["shared_by"])
    second["offset"] = first["offset"]
    at_zero = copy.deepcopy(data)
    for tensor in at_zero["tensors"]:
        tensor["offset"] = 0
    scaled = copy.deepcopy(data)  # x4 the blocks, tensors scaled: 4x over the budget
    scaled["num_blocks"] *= 4
    for tensor in scaled["tensors"]:
        tensor["size"] = tensor["size"] + 3 * scaled["num_blocks"] // 4 * tensor["page_stride"]
    # plans that cannot hold one request of their max_model_len: one block short of it, with
    # the tensors shrunk to match; no blocks at all; pages of 2**40 block ids
    need = data["blocks_per_request"]  # the report's own figure
    short = copy.deepcopy(data)
    old_blocks, short["num_blocks"] = short["num_blocks"], need - 1
    for tensor in short["tensors"]:
        tensor["size"] -= (old_blocks - short["num_blocks"]) * tensor["page_stride"]
    empty = copy.deepcopy(data)
    empty["num_blocks"] = 0
    for tensor in empty["tensors"]:
        tensor["size"] = 0
    huge_pages = copy.deepcopy(data)
    huge_pages["groups"][0]["blocks_per_page"] = 2**40
    return {
        "same group": (same_group, "pages of one group"),
        "offset 0": (at_zero, "pages of one group"),
        "x4": (scaled, "available_memory_bytes"),
        "one block short": (short, f"needs {need} block ids but the plan's {need - 1} blocks"),
        "no blocks": (empty, "the plan's 0 blocks leave 0 for requests, so the plan serves no request"),
        "2**40 per page": (huge_pages, "so the plan serves no request"),
    }


def test_a_saved_plan_is_valid_as_printed(run_cli, saved, tmp_path, with_plugins):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(saved))
    status, out, err = run_cli("check", path)
    assert status == 0, err
    (line,) = out.strip().splitlines()
    assert line.startswith(f"{path}: valid; policy shared_buffer:") and "2 groups, 6 layers" in line
    status, out, err = run_cli("allocate", "--plan", path)
    assert status == 0, err
    assert "bound 6 layers" in out


@pytest.mark.parametrize(
    "edit", ["same group", "offset 0", "x4", "one block short", "no blocks", "2**40 per page"]
)
def test_edited_plans_are_refused_at_every_door(run_cli, saved, tmp_path, with_plugins, edit):
    data, problem = _edits(saved)[edit]
    with pytest.raises(PlanValidationError, match=problem) as info:
        plan_from_dict(data, with_plugins, source="plan.json")
    assert info.value.policy == "shared_buffer" and info.value.source == "plan.json"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    status, out, err = run_cli("check", path)
    assert status == 1 and out == ""
    lines = err.strip().splitlines()
    assert "is invalid" in lines[0] and all(line.startswith("  - ") for line in lines[1:])
    assert problem in err
    status, out, err = run_cli("allocate", "--plan", path)
    assert status == 1 and problem in err and "allocated" not in out


def test_a_rejected_field_keeps_its_reason(saved, with_plugins):
    data = copy.deepcopy(saved)
    data["num_blocks"] = "12"
    with pytest.raises(Exception, match=r"expected an integer, got '12' @ \$\.num_blocks"):
        plan_from_dict(data, with_plugins)


def test_allocate_plan_takes_no_sizing_options(run_cli, saved, tmp_path, with_plugins):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(saved))
    status, _, err = run_cli("allocate", "--plan", path, "--memory", "1GiB")
    assert status == 1 and "--memory cannot be combined with --plan" in err


def test_check_of_a_missing_file_is_one_line(run_cli, tmp_path):
    status, _, err = run_cli("check", tmp_path / "nope.json")
    assert status == 1 and err.strip() == f"kvcore: error: {tmp_path / 'nope.json'}: no such file"


def test_a_model_with_nothing_to_cache_gets_an_empty_plan(run_cli, with_plugins, tmp_path):
    from kvcore import plan_kv_cache
    from kvcore.runtime.allocation import allocate

    plan = plan_kv_cache({}, 2**20, SizingContext(max_model_len=64), registry=with_plugins)
    assert (plan.groups, plan.tensors, plan.num_blocks) == ((), (), 0)
    calls = []
    assert allocate(plan, "cpu", registry=with_plugins, allocator=lambda n, d: calls.append(n)) == {}
    assert calls == []  # nothing allocated
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "acme_encoder", "num_hidden_layers": 4}))
    status, out, err = run_cli("plan", "--model", config, *SIZE)
    assert status == 0, err
    assert out.startswith("nothing to cache")
    status, out, _ = run_cli("plan", "--model", config, *SIZE, "--json")
    data = json.loads(out)
    assert data["groups"] == [] and data["num_blocks"] == 0
    path = tmp_path / "empty.json"
    path.write_text(out)
    status, out, _ = run_cli("check", path)
    assert status == 0 and "nothing to cache" in out
