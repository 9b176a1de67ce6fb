"""`kvcore compare --frontier`: each policy's capacity against group count, in text and JSON."""

from __future__ import annotations

import json

from kvcore import PlanOptions, SizingContext, plan_kv_cache
from kvcore.planning.serialization import spec_from_dict
from tests.cli.conftest import full_entry, sliding_entry


def _layers():
    return {
        f"model.layers.{i}.attn": full_entry() if i % 6 == 5 else sliding_entry(1024, num_kv_heads=4)
        for i in range(24)
    }


ARGS = ("--memory", "4GiB", "--max-model-len", "32768", "--policies", "shared_buffer,kind_pools,uniform")


def test_frontier_text_lists_each_policys_points(run_cli, spec_file):
    path = spec_file(_layers())
    status, out, _ = run_cli("compare", "--specs", path, *ARGS, "--frontier")
    assert status == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("frontier: "))
    rows = {line.split()[0]: line for line in lines[start + 3 :] if line.strip()}
    assert set(rows) == {"shared_buffer", "kind_pools"}  # uniform has no plan, so no frontier
    assert rows["kind_pools"].split()[1] == "2:"  # one pool and one group per retention kind
    counts = [int(cell[:-1]) for cell in rows["shared_buffer"].split() if cell.endswith(":")]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == len(counts)


def test_frontier_json_carries_points_and_they_are_real_plans(run_cli, spec_file, registry):
    layers = _layers()
    path = spec_file(layers)
    status, out, _ = run_cli("compare", "--specs", path, *ARGS, "--frontier", "--json")
    assert status == 0
    candidates = {c["policy"]: c for c in json.loads(out)["candidates"]}
    assert candidates["uniform"]["frontier"] == []
    points = candidates["shared_buffer"]["frontier"]
    assert points and all(set(p) == {"groups", "pools", "max_concurrency", "efficiency"} for p in points)
    specs = {name: spec_from_dict(entry, registry) for name, entry in layers.items()}
    last = points[-1]
    plan = plan_kv_cache(
        specs,
        4 * 2**30,
        SizingContext(max_model_len=32768),
        registry=registry,
        policy="shared_buffer",
        options=PlanOptions(grouping_tolerance=0, max_groups=last["groups"]),
    )
    assert len(plan.groups) == last["groups"]
    assert plan.max_concurrency() == last["max_concurrency"]


def test_without_frontier_the_json_is_unchanged(run_cli, spec_file):
    status, out, _ = run_cli("compare", "--specs", spec_file(_layers()), *ARGS, "--json")
    assert status == 0
    assert all("frontier" not in c for c in json.loads(out)["candidates"])
    status, out, _ = run_cli("compare", "--specs", spec_file(_layers()), *ARGS)
    assert "frontier" not in out


def test_the_vllm_comparison_does_not_take_frontier(run_cli, spec_file):
    status, _, err = run_cli(
        "compare", "--specs", spec_file(_layers()), *ARGS, "--engine", "vllm", "--frontier"
    )
    assert status == 1
    assert err.strip().endswith("does not take --frontier; drop it, or leave out --engine vllm")
