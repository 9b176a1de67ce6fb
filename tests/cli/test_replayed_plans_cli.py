"""Under a vLLM profile, ``kvcore simulate`` (and ``kvcore tune``) replay the plan vLLM would run
(kvcore's vLLM plugin re-plans with ``plan_for_vllm``), and the output says which plan it is."""

import json
from pathlib import Path

import pytest

from kvcore.errors import InsufficientMemoryError
from kvcore.frontends.hf_config import layer_specs_from_config, load_model_config
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.planning.planner import plan
from kvcore.planning.request import PlanRequest
from kvcore.simulation.simulator import simulate
from kvcore.simulation.workload import read_trace
from kvcore.spec import SizingContext

ROOT = Path(__file__).parents[2]
CHAT = ROOT / "examples" / "traces" / "chat.jsonl"
JAMBA = "ai21labs/AI21-Jamba-1.5-Mini"
GEMMA3 = "google/gemma-3-27b-it"
FIGURES = ("steps", "preemptions", "recomputed_tokens", "mean_running", "peak_pool_usage")
GIB = 1 << 30


@pytest.fixture
def chat(tmp_path):
    """The first 200 requests of the chat trace: enough to preempt in a tight pool."""
    path = tmp_path / "chat200.jsonl"
    path.write_text("".join(CHAT.read_text().splitlines(keepends=True)[:200]))
    return path


def _figures(result):
    return {name: getattr(result, name) for name in FIGURES}


@pytest.mark.parametrize(("model", "gib"), [(JAMBA, 1), (GEMMA3, 2)])
def test_the_vllm_profile_replays_the_plan_vllm_runs(run_cli, registry, chat, model, gib):
    """The figures are those of plan_for_vllm's plan, which here differ from kvcore's own plan's
    (Jamba: attention blocks enlarged to one block id per page; Gemma 3: the null block and the
    sliding layers sized for two batches in flight)."""
    argv = ("simulate", "--model", model, "--memory", f"{gib}GiB", "--max-model-len", "4096")
    argv += ("--policies", "shared_buffer", "--trace", chat)
    status, out, err = run_cli(*argv, "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["replayed_plans"]["planned_as"] == "vllm"
    candidate = payload["candidates"][0]
    assert candidate["planned_as"] == "vllm" and "vllm_would_not_run" not in candidate
    got = {name: candidate["simulation"][name] for name in FIGURES}

    specs = layer_specs_from_config(load_model_config(model)[0], registry)
    workload = read_trace(chat)
    rules = VllmRules(max_model_len=4096)
    vllms = plan_for_vllm(rules.request(specs, gib * GIB, policy="shared_buffer"), rules, registry=registry)
    request = PlanRequest.for_context(
        specs, gib * GIB, SizingContext(max_model_len=4096), policy="shared_buffer"
    )
    own = plan(request, registry=registry).plans[0]
    assert got == _figures(simulate(vllms, workload))
    assert got != _figures(simulate(own, workload))  # the case tells the two plans apart

    status, out, err = run_cli(*argv)
    assert status == 0, err
    line = next(line for line in out.splitlines() if line.startswith("plans: "))
    assert line.startswith(
        "plans: as vLLM runs them (plan_for_vllm, as kvcore's vLLM plugin re-plans: null block"
    )
    assert "4,096 tokens in flight" in line
    blocks = {g.spec.block_size for g in vllms.groups if g.spec.page_scales_with_block_size}
    if model == JAMBA:  # one block id per page: attention blocks as wide as the state's page
        assert len(blocks) == 1 and min(blocks) > 16
        assert f"attention blocks enlarged: shared_buffer (16 -> {min(blocks)})" in line
    else:  # the same block sizes as kvcore's own plan
        assert "enlarged" not in line


def test_a_plan_vllm_cannot_run_is_replayed_as_kvcores_and_named(run_cli, chat):
    argv = ("simulate", "--model", JAMBA, "--memory", "1GiB", "--max-model-len", "4096", "--trace", chat)
    argv += ("--policies", "shared_buffer,kind_pools")
    status, out, err = run_cli(*argv)
    assert status == 0, err
    line = next(line for line in out.splitlines() if line.startswith("plans: "))
    assert (
        "kind_pools: kvcore's plan, which vLLM would not run (several block pools, where vLLM has one)"
        in line
    )
    status, out, err = run_cli(*argv, "--json")
    assert status == 0, err
    rows = {c["policy"]: c for c in json.loads(out)["candidates"]}
    assert rows["shared_buffer"]["planned_as"] == "vllm"
    assert rows["kind_pools"]["planned_as"] == "kvcore"
    assert "several block pools" in rows["kind_pools"]["vllm_would_not_run"]
    assert rows["kind_pools"]["simulation"]["steps"] > 0


def test_states_kept_for_prefix_caching_are_planned_as_vllm_runs_them(run_cli, chat):
    """``--state-cache-mode align`` is vLLM's mode under prefix caching (mamba_cache_mode
    'align'), which kvcore's plugin runs: the plan replayed is plan_for_vllm's."""
    argv = ("simulate", "--model", JAMBA, "--memory", "1GiB", "--max-model-len", "4096", "--trace", chat)
    argv += ("--policies", "shared_buffer", "--state-cache-mode", "align", "--prefix-caching", "--json")
    status, out, err = run_cli(*argv)
    assert status == 0, err
    payload = json.loads(out)
    assert payload["replayed_plans"]["line"].startswith("plans: as vLLM runs them")
    assert "would not run" not in payload["replayed_plans"]["line"]
    (row,) = payload["candidates"]
    assert row["planned_as"] == "vllm" and "vllm_would_not_run" not in row


def test_a_state_per_block_is_kvcores_plan_and_named(run_cli, chat):
    status, out, err = run_cli(
        "simulate", "--model", JAMBA, "--memory", "8GiB", "--max-model-len", "4096", "--trace", chat,
        "--policies", "shared_buffer", "--state-cache-mode", "all",
    )  # fmt: skip
    assert status == 0, err
    assert (
        "shared_buffer: kvcore's plan, which vLLM would not run (a state per block (--state-cache-mode all)"
        in out
    )


def test_other_profiles_replay_kvcores_own_plan_and_say_so(run_cli, chat):
    argv = ("simulate", "--model", JAMBA, "--memory", "1GiB", "--max-model-len", "4096", "--trace", chat)
    status, out, err = run_cli(*argv, "--policies", "shared_buffer", "--scheduler", "kvcore", "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["replayed_plans"] == {
        "planned_as": "kvcore",
        "line": "plans: kvcore's own, as kvcore plan makes them",
    }
    assert payload["candidates"][0]["planned_as"] == "kvcore"


def test_tune_plans_as_vllm_runs_them_under_the_vllm_reference_too(run_cli, chat):
    """``tune --scheduler vllm-reference`` searches the plans vLLM runs, as ``vllm`` does: the
    same figures (kvcore's own plan of Jamba would give others)."""
    argv = ("tune", "--model", JAMBA, "--memory", "1GiB", "--max-model-len", "4096", "--trace", chat)
    argv += ("--policies", "shared_buffer", "--no-split-search", "--max-num-seqs", "128", "--json")
    scores = {}
    for name in ("vllm", "vllm-reference"):
        status, out, err = run_cli(*argv, "--scheduler", name)
        assert status == 0, err
        best = json.loads(out)["best"]
        scores[name] = (best["score"], best["latency"])
    assert scores["vllm"] == scores["vllm-reference"]


def test_auto_length_under_vllm_is_the_longest_vllms_plan_admits(run_cli, registry):
    """``--max-model-len auto`` sets every candidate at one length; under the vllm profile the
    plan vLLM runs takes more room (its null block, sliding layers sized for two batches in
    flight), so the length is the longest that plan admits, said on stderr."""
    argv = (
        "simulate",
        "--model",
        GEMMA3,
        "--memory",
        "4GiB",
        "--max-model-len",
        "auto",
        "--policies",
        "auto",
    )
    argv += ("--requests", "4", "--prompt-len", "100", "--output-len", "10", "--json")
    status, out, err = run_cli(*argv)
    assert status == 0, err
    length = json.loads(out)["max_model_len"]
    status, kvcores, _ = run_cli(
        "plan", "--model", GEMMA3, "--memory", "4GiB", "--max-model-len", "auto", "--json"
    )
    assert length < json.loads(kvcores)["max_model_len"]
    assert (
        f"as vLLM runs the plan (plan_for_vllm: its null block and tokens in flight), "
        f"--max-model-len auto = {length:,}" in err
    )
    specs = layer_specs_from_config(load_model_config(GEMMA3)[0], registry)

    def vllms(n):
        rules = VllmRules(max_model_len=n)
        return plan_for_vllm(rules.request(specs, 4 * GIB, policy="auto"), rules, registry=registry)

    assert vllms(length).context.max_model_len == length
    with pytest.raises(InsufficientMemoryError):
        vllms(length + 1)


@pytest.mark.parametrize(("scheduler", "said"), [("vllm", "kvcore"), ("kvcore", "as planned")])
def test_compare_says_it_simulates_its_own_plans_where_vllm_would_run_others(run_cli, chat, scheduler, said):
    """``kvcore compare`` simulates the plans its table lists; under a vLLM profile it says that
    vLLM would run ``plan_for_vllm``'s, which ``kvcore simulate`` replays."""
    argv = ("compare", "--model", JAMBA, "--memory", "1GiB", "--max-model-len", "4096")
    argv += ("--policies", "shared_buffer", "--trace", chat, "--scheduler", scheduler)
    status, out, err = run_cli(*argv)
    assert status == 0, err
    assert ("plans: kvcore's own" in out) == (scheduler == "vllm")
    status, out, err = run_cli(*argv, "--json")
    assert status == 0, err
    assert json.loads(out)["simulated_plans"] == said
