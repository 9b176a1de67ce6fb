"""``kvcore compare --engine vllm``: the policies under vLLM's rules (null block, async tokens in
flight, one block id per page), and vLLM's own plan when vLLM is importable (tests/integrations/vllm checks
that row against the real vLLM; here vLLM may be missing and a line says so)."""

import importlib.util
import json

from kvcore import Registry, model_layer_specs
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm, vllm_blocks_per_request
from kvcore.spec import resize_blocks

BASE = ("--model", "google/gemma-3-27b-it", "--memory", "8GiB", "--max-model-len", "8192", "--engine", "vllm")
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_rows_are_the_plans_vllm_runs(run_cli):
    status, out, err = run_cli("compare", *BASE, "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["engine"] == "vllm" and payload["max_in_flight_tokens"] == 4096
    rows = {row["policy"]: row for row in payload["candidates"]}
    assert "cannot plan" in rows["uniform"]["error"]
    registry = Registry.default()
    specs = model_layer_specs("google/gemma-3-27b-it", registry)
    rules = VllmRules(max_model_len=8192)
    plan = plan_for_vllm(rules.request(specs, 8 * 2**30, policy="shared_buffer"), rules, registry=registry)
    row = rows["shared_buffer"]
    assert (row["usable_blocks"], row["num_blocks"]) == (plan.num_blocks - 1, plan.num_blocks)
    assert row["requests"] == plan.usable_blocks // plan.blocks_per_request() == 3
    # both figures: the joint peak a request holds, and what vLLM's scheduler admits one by
    rules = VllmRules(max_model_len=8192)
    assert (row["blocks_per_request"], row["vllm_admission_blocks"]) == (
        plan.blocks_per_request(),
        vllm_blocks_per_request(plan, rules),
    )
    assert row["blocks_per_request"] <= row["vllm_admission_blocks"]
    # async scheduling holds two batches: kvcore's own rules (one batch, no null block) promise more
    status, out, _ = run_cli("compare", *BASE[:-2], "--policies", "shared_buffer", "--json")
    assert json.loads(out)["candidates"][0]["max_concurrency"] > row["max_concurrency"]
    if not HAS_VLLM:
        assert "vllm is not importable" in payload["vllm_own"]["error"]


def test_the_table_says_when_vllms_own_plan_is_missing(run_cli):
    status, out, _ = run_cli("compare", *BASE, "--policies", "shared_buffer")
    assert status == 0
    assert "null block" in out and "4,096 tokens in flight" in out
    assert "shared_buffer" in out and "vLLM admits by" in out
    if not HAS_VLLM:
        assert "vllm (own plan): not shown: vllm is not importable here" in out


def test_options_it_does_not_take_are_refused(run_cli):
    status, _, err = run_cli("compare", *BASE, "--block-sizes", "16,32")
    assert status != 0 and "--engine vllm" in err and "--block-sizes" in err and "Traceback" not in err


def test_the_best_candidate_vllm_runs_is_starred(run_cli):
    status, out, err = run_cli("compare", *BASE)
    assert status == 0, err
    firsts = [line.split()[0] for line in out.splitlines() if line.split()]
    starred = [first for first in firsts if first.endswith("*") and first != "*"]
    (why,) = [line.strip() for line in out.splitlines() if line.strip().startswith("* best vLLM runs: ")]
    assert len(starred) == 1 and why.startswith(f"* best vLLM runs: {starred[0][:-1]}: ")
    payload = json.loads(run_cli("compare", *BASE, "--json")[1])
    ran = [row for row in payload["candidates"] if "error" not in row]
    (best,) = [row for row in ran if row["best"]]
    # the highest concurrency among the plans vLLM runs (never kind_pools or unified_pool here)
    assert best["policy"] == payload["best"]
    assert best["max_concurrency"] == max(r["max_concurrency"] for r in ran)
    assert best["policy"] not in ("kind_pools", "unified_pool")


def test_the_cpu_build_runs_its_own_layout(run_cli):
    """``--engine vllm-cpu`` plans as vLLM's CPU build runs: block 128 by default, one batch in
    flight (no async scheduling), so the rows are the plans of those specs under those rules."""
    cpu = (*BASE[:-1], "vllm-cpu", "--policies", "shared_buffer", "--json")
    status, out, err = run_cli("compare", *cpu)
    assert status == 0, err
    payload = json.loads(out)
    assert (payload["engine"], payload["block_size"], payload["async_scheduling"]) == ("vllm-cpu", 128, False)
    assert payload["max_in_flight_tokens"] == 2048
    registry = Registry.default()
    specs = resize_blocks(model_layer_specs("google/gemma-3-27b-it", registry), 128)
    rules = VllmRules(max_model_len=8192, async_scheduling=False)
    plan = plan_for_vllm(rules.request(specs, 8 * 2**30, policy="shared_buffer"), rules, registry=registry)
    row = payload["candidates"][0]
    assert (row["num_blocks"], row["block_sizes"]) == (plan.num_blocks, [128])
    # one --block-sizes value is vLLM's --block-size; the CPU kernels take multiples of 32 only
    status, out, _ = run_cli("compare", *cpu, "--block-sizes", "64")
    assert status == 0 and json.loads(out)["block_size"] == 64
    status, _, err = run_cli("compare", *cpu, "--block-sizes", "16")
    assert status == 1 and "multiples of 32" in err and "--block-sizes 32" in err
    # two values are a sweep, which an engine comparison does not take
    status, _, err = run_cli("compare", *cpu, "--block-sizes", "32,64")
    assert status == 1 and "does not take --block-sizes" in err
