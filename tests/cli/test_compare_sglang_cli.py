"""``kvcore compare --engine sglang``: the policies as SGLang 0.5 runs them (one token pool per
kind, one page size, the padded first page inside the budget) beside SGLang's own sizing, without
SGLang installed (tests/integrations/sglang checks the own-sizing row against SGLang's configurators)."""

import json
from pathlib import Path

from kvcore import Registry, model_layer_specs
from kvcore.integrations.sglang import rules

BASE = ("--model", "openai/gpt-oss-20b", "--memory", "8GiB", "--max-model-len", "8192", "--engine", "sglang")


def test_rows_are_sglangs_pools(run_cli):
    status, out, err = run_cli("compare", *BASE, "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["engine"] == "sglang" and payload["hybrid_swa"] and payload["swa_full_tokens_ratio"] == 0.8
    rows = {row["policy"]: row for row in payload["candidates"]}
    assert "one token index" in rows["equal_groups"]["error"]
    registry = Registry.default()
    specs = model_layer_specs("openai/gpt-oss-20b", registry)
    sglang = rules.SglangRules(context_len=8192)
    plan = rules.plan_for_sglang(sglang.request(specs, 8 * 2**30), sglang, registry=registry)
    sizes = rules.pool_sizes(plan, rules.paged_specs(specs, 1))
    row = rows["kind_pools"]
    assert (row["full_tokens"], row["swa_tokens"]) == (sizes.full_tokens, sizes.swa_tokens)
    assert row["pool_bytes"] == plan.kv_cache_bytes <= 8 * 2**30
    own = payload["sglang_own"]
    assert own["full_tokens"] == rules.own_pool_sizes(specs, 8 * 2**30, sglang).full_tokens
    # kvcore's split by what a request needs holds more requests than SGLang's fixed ratio
    assert row["requests"] > own["requests"]


def test_gemma_3_runs_without_a_sliding_pool(run_cli):
    status, out, err = run_cli(
        "compare",
        "--model",
        "google/gemma-3-27b-it",
        "--memory",
        "8GiB",
        "--max-model-len",
        "8192",
        "--engine",
        "sglang",
        "--policies",
        "kind_pools",
    )
    assert status == 0, err
    assert "SGLang gives this model no sliding pool" in out and "sglang (own sizing)" in out


def test_kinds_sglang_has_no_pool_for_are_named(run_cli):
    status, out, _ = run_cli(
        "compare",
        "--model",
        "openai/whisper-large-v3",
        "--memory",
        "8GiB",
        "--max-model-len",
        "448",
        "--engine",
        "sglang",
    )
    assert status == 1 and "cross_attention" in out and "not shown" in out


def test_options_it_does_not_take_are_refused(run_cli):
    status, _, err = run_cli("compare", *BASE, "--block-sizes", "16,32")
    assert status != 0 and "--engine sglang" in err and "--block-sizes" in err and "Traceback" not in err


def test_gpu_memory_is_sized_with_mem_fraction_static(run_cli):
    gpu = ("--model", "openai/gpt-oss-20b", "--gpu-memory", "80GiB", "--utilization", "0.85")
    status, out, err = run_cli("compare", *gpu, "--max-model-len", "8192", "--engine", "sglang", "--json")
    assert status == 0, err
    payload = json.loads(out)
    # kvcore's own budget: the same weights, less its activation estimate as well
    _, own_out, _ = run_cli("compare", *gpu, "--max-model-len", "8192", "--policies", "kind_pools", "--json")
    weights = json.loads(own_out)["gpu_budget"]["weights_bytes"]
    assert payload["mem_fraction_static"] == 0.85
    assert payload["available_memory_bytes"] == rules.kv_budget(80 * 2**30, weights, 0.85)


def test_a_mamba_hybrid_shows_sglangs_state_split_beside_kvcores(run_cli):
    model = "ai21labs/AI21-Jamba-1.5-Mini"
    args = ("--model", model, "--memory", "40GiB", "--max-model-len", "8192", "--engine", "sglang")
    status, out, err = run_cli("compare", *args, "--policies", "kind_pools", "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["mamba_full_memory_ratio"] == 0.9 and payload["mamba_slots_per_request"] == 3
    registry = Registry.default()
    specs = rules.as_sglang_runs(model_layer_specs(model, registry), hybrid_swa=False)
    sglang = rules.SglangRules(context_len=8192)
    own = rules.own_pool_sizes(rules.paged_specs(specs, 1), 40 * 2**30, sglang)
    theirs, (ours,) = payload["sglang_own"], payload["candidates"]
    assert (theirs["mamba_states"], theirs["full_tokens"]) == (own.mamba_states, own.full_tokens)
    plan = rules.plan_for_sglang(sglang.request(specs, 40 * 2**30), sglang, registry=registry)
    sizes = rules.pool_sizes(plan, rules.sglang_specs(specs, sglang))
    assert (ours["mamba_states"], ours["full_tokens"]) == (sizes.mamba_states, sizes.full_tokens)
    # SGLang's fixed 0.9 ratio leaves its KV pool short of its state pool's requests; kvcore's balances them
    assert ours["requests"] > theirs["requests"] == own.full_tokens // 8192
    status, out, _ = run_cli("compare", *args, "--policies", "kind_pools")
    assert status == 0 and "mamba states" in out and "no model for this architecture" in out


def test_a_dsa_model_runs_in_one_pool_of_sglangs_64_token_pages(run_cli):
    args = ("--model", "deepseek-ai/DeepSeek-V3.2", "--memory", "8GiB", "--max-model-len", "8192")
    status, out, err = run_cli("compare", *args, "--engine", "sglang", "--json")
    assert status == 0, err
    payload = json.loads(out)
    registry = Registry.default()
    specs = model_layer_specs("deepseek-ai/DeepSeek-V3.2", registry)
    # SGLang's own page for a DSA model (its DeepSeek override), without --block-size
    sglang = rules.SglangRules(context_len=8192, page_size=64)
    plan = rules.plan_for_sglang(sglang.request(specs, 8 * 2**30), sglang, registry=registry)
    sizes = rules.pool_sizes(plan, rules.paged_specs(specs, 64))
    row = {row["policy"]: row for row in payload["candidates"]}["kind_pools"]
    assert (row["full_tokens"], row["swa_tokens"]) == (sizes.full_tokens, 0)
    # SGLang's own: the budget over 61 x (1,152-byte latent + 132-byte indexer key), to a page
    assert payload["sglang_own"]["full_tokens"] == 8 * 2**30 // (61 * 1284) // 64 * 64


def test_a_dsa_model_kvcore_does_not_map_is_refused_saying_why(run_cli, tmp_path):
    # the synthetic DeepSeek-V3.2-shaped config (its "_synthetic" key says so), with pooled index keys
    config = json.loads(Path("tests/integrations/sglang/synthetic__deepseek-v32-like.json").read_text())
    model = tmp_path / "config.json"
    model.write_text(json.dumps({**config, "index_kpool": 4}))
    status, out, err = run_cli("compare", "--model", str(model), "--memory", "8GiB", "--engine", "sglang")
    assert status != 0 and not out
    assert "sparse attention (DSA)" in err and "index_kpool 4" in err


def test_the_best_candidate_sglang_runs_is_starred(run_cli):
    status, out, err = run_cli("compare", *BASE)
    assert status == 0, err
    firsts = [line.split()[0] for line in out.splitlines() if line.split()]
    starred = [first for first in firsts if first.endswith("*") and first != "*"]
    # gpt-oss: only kind_pools keeps SGLang's full and sliding pools apart
    assert starred == ["kind_pools*"]
    assert "  * best SGLang 0.5 runs: kind_pools: the most requests of 8,192 tokens held at once" in out
    payload = json.loads(run_cli("compare", *BASE, "--json")[1])
    assert payload["best"] == "kind_pools"
    assert [r["policy"] for r in payload["candidates"] if r.get("best")] == ["kind_pools"]
