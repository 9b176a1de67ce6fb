"""A plan with no cache-holding layer: its capacity is unbounded, read as "unbounded" in text
and ``null`` in JSON at every place a plan's figures are shown, and nothing divides by zero."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import kvcore.planning.registry as registry_module
from kvcore import ModelFamily, SizingContext, hookimpl, plan_kv_cache
from kvcore.cli.compare import candidate_row
from kvcore.cli.gpu import answer_line
from kvcore.cli.memory_map import render_memory_map
from kvcore.cli.report import format_plan, plan_report
from kvcore.engine.workflow import capacity_summary
from kvcore.planning.capacity import UNBOUNDED, Capacity, finite_or_none, format_figure
from kvcore.planning.compare import compare_policies
from kvcore.planning.request import PlanRequest
from kvcore.simulation.simulator import simulate
from kvcore.simulation.workload import Request, Workload

MiB = 2**20


@pytest.fixture
def empty_plan(registry):
    return plan_kv_cache({}, 4 * MiB, SizingContext(max_model_len=256), registry=registry)


def test_capacity_of_an_empty_plan_is_unbounded(empty_plan):
    capacity = Capacity.of(empty_plan, {})
    assert capacity.unbounded
    assert capacity.max_concurrency == capacity.ideal_concurrency == float("inf")
    assert capacity.kv_cache_tokens is None and capacity.blocks_per_request == 0
    assert capacity.efficiency == 1.0  # nothing to hold, nothing wasted


def test_a_bounded_plan_keeps_its_figures(registry):
    from tests.helpers import full

    plan = plan_kv_cache({"a": full()}, 4 * MiB, SizingContext(max_model_len=256), registry=registry)
    capacity = Capacity.of(plan)
    assert not capacity.unbounded
    assert capacity.kv_cache_tokens == int(capacity.max_concurrency * 256) > 0


def test_figures_read_unbounded_in_text_and_null_in_json():
    assert format_figure(float("inf")) == format_figure(None) == UNBOUNDED
    assert format_figure(1234.5) == "1,234.50" and format_figure(1234, ",") == "1,234"
    assert finite_or_none(float("inf")) is None and finite_or_none(2.5) == 2.5


def test_plan_text_and_json(empty_plan, registry):
    text = format_plan(empty_plan, {})
    assert "max concurrency  unbounded requests of 256 tokens (ideal unbounded" in text
    data = plan_report(empty_plan, {}, registry)
    # strict JSON: Infinity would not be JSON at all
    data = json.loads(json.dumps(data, allow_nan=False))
    assert data["max_concurrency"] is None and data["ideal_concurrency"] is None
    assert data["kv_cache_tokens"] is None


def test_start_up_log_line(empty_plan):
    assert capacity_summary(empty_plan, {}).startswith(
        "KV cache: unbounded tokens, max concurrency unbounded requests of 256 tokens"
    )


def test_compare_row_and_gpu_answer(registry, empty_plan):
    candidates = compare_policies(
        PlanRequest.for_context({}, 4 * MiB, SizingContext(max_model_len=256)), registry=registry
    )
    assert candidates
    for candidate in candidates:
        row = json.loads(json.dumps(candidate_row(candidate), allow_nan=False))
        assert row["max_concurrency"] is None and row["ideal_concurrency"] is None
    budget = SimpleNamespace(gpu_memory=8 * MiB)  # the answer line reads only the GPU's size
    assert "unbounded of them at once (unbounded tokens of KV cache)" in answer_line(empty_plan, budget)


def test_memory_map_and_simulation(empty_plan, tmp_path):
    pytest.importorskip("matplotlib")
    path = render_memory_map(empty_plan, tmp_path / "map.svg")
    assert path.is_file()
    workload = Workload(
        name="w", requests=[Request(id=i, prompt_tokens=10, output_tokens=5) for i in range(3)]
    )
    result = simulate(empty_plan, workload)
    assert result.peak_running == 3 and result.preemptions == 0 and result.peak_pool_usage == 0.0


def test_check_and_allocate_read_a_saved_empty_plan(run_cli, empty_plan, registry, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_report(empty_plan, {}, registry), allow_nan=False))
    status, out, err = run_cli("check", path)
    assert status == 0, err
    assert "nothing to cache" in out
    status, out, err = run_cli("allocate", "--plan", path, "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["max_concurrency"] is None and data["allocated_bytes"] == 0 and data["bound_layers"] == 0


class EncoderPlugin:
    """A model family with no cache-holding layer (an encoder-only model)."""

    @hookimpl
    def kvcore_register_model_families(self, register):
        register(ModelFamily(name="acme_encoder", model_types=("acme_encoder",), layer_specs=lambda c, o: {}))


@pytest.fixture
def encoder(monkeypatch, make_registry, tmp_path):
    """The config of an encoder-only model, with every command's registry knowing its family."""
    registry = make_registry(EncoderPlugin())
    monkeypatch.setattr(registry_module.Registry, "default", classmethod(lambda cls, **kw: registry))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "acme_encoder", "num_hidden_layers": 4}))
    return config


SIZE = ("--memory", "1MiB", "--max-model-len", "64")
LENGTHS = ("--prompt-len", "uniform:8:16", "--output-len", "uniform:4:8")


def test_plan_of_a_model_with_nothing_to_cache(run_cli, encoder):
    status, out, err = run_cli("plan", "--model", encoder, *SIZE)
    assert status == 0, err
    assert out.startswith("nothing to cache") and "max concurrency unbounded" in out
    status, out, err = run_cli("plan", "--model", encoder, *SIZE, "--json")
    data = json.loads(out)
    assert data["groups"] == [] and data["max_concurrency"] is None and data["kv_cache_tokens"] is None


def test_compare_and_simulate_of_a_model_with_nothing_to_cache(run_cli, encoder):
    status, out, err = run_cli("compare", "--model", encoder, *SIZE, "--policies", "uniform")
    assert status == 0, err
    assert "unbounded" in out
    status, out, err = run_cli("compare", "--model", encoder, *SIZE, "--policies", "uniform", "--json")
    (row,) = json.loads(out)["candidates"]
    assert row["max_concurrency"] is None and row["plan"]["kv_cache_tokens"] is None
    status, out, err = run_cli(
        "simulate", "--model", encoder, *SIZE, "--policies", "uniform", "--requests", "5", *LENGTHS, "--json"
    )
    assert status == 0, err
    (row,) = json.loads(out)["candidates"]
    assert row["simulation"]["preemptions"] == 0 and row["max_concurrency"] is None


def test_compare_frontier_of_a_model_with_nothing_to_cache(run_cli, encoder):
    status, out, err = run_cli("compare", "--model", encoder, *SIZE, "--policies", "uniform", "--frontier")
    assert status == 0, err
    assert "0: unbounded (100.00%)" in out
    status, out, err = run_cli(
        "compare", "--model", encoder, *SIZE, "--policies", "uniform", "--frontier", "--json"
    )
    (row,) = json.loads(out)["candidates"]
    assert row["frontier"] == [{"groups": 0, "pools": 1, "max_concurrency": None, "efficiency": 1.0}]


def test_allocate_of_a_model_with_nothing_to_cache(run_cli, encoder):
    status, out, err = run_cli("allocate", "--model", encoder, *SIZE)
    assert status == 0, err
    assert "max concurrency  unbounded requests of 64 tokens (ideal unbounded" in out
    status, out, err = run_cli("allocate", "--model", encoder, *SIZE, "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["max_concurrency"] is None and data["allocated_bytes"] == 0
