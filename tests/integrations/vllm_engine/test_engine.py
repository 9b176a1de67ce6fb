"""vLLM's real engine (the CPU build) serving tokens on kvcore's plans.

For each tiny model (full attention, alternating sliding/full, Gemma-3's 5:1, a Gemma-3 whose
kvcore layout differs from vLLM's own, a linear-attention state hybrid, MLA) the engine runs once
without the plugin and once per policy vLLM can run (and ``auto``), each in a fresh process
(:mod:`~tests.integrations.vllm_engine.engine_run`), with the same forced block count. Each
plugin run must:

- log kvcore's start-up line through vLLM's log;
- run the ``KVCacheConfig`` kvcore plans for the engine's own layer specs and budget (blocks,
  groups, tensors);
- generate exactly the greedy tokens vLLM generates alone;
- with more requests of ``max_model_len`` tokens than fit, run exactly kvcore's promise at once,
  with no preemption.

And without the plugin, a burst of requests into a tight pool runs in the engine step for step as
kvcore's ``vllm`` scheduler profile replays it on the plan of the engine's bytes.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm_engine.engine_run import RESULT_MARK
from tests.integrations.vllm_engine.tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[3]

#: The engine's request length in every case: several blocks, longer than every window.
MAX_MODEL_LEN = 256

#: case -> (tiny model, engine settings, kvcore policies run). The CPU attention kernels take
#: block sizes that are multiples of 32 (``cpu_attn.py``). No MLA model: vLLM 0.32's CPU build
#: fails alone on a tiny DeepSeek-V2 (the AMX MLA backend these CPUs pick stops at its first
#: forward with "Unsupported block size: 16" whatever block size is asked).
CASES: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "llama": (
        "llama",
        {"block_size": 32, "num_blocks": 24},
        ("uniform", "shared_buffer", "equal_groups", "auto"),
    ),
    "gemma2": ("gemma2", {"block_size": 32, "num_blocks": 40}, ("shared_buffer", "equal_groups", "auto")),
    "gemma3": ("gemma3", {"block_size": 32, "num_blocks": 60}, ("shared_buffer", "equal_groups", "auto")),
    # vLLM's CPU default block (128), where kvcore's layout differs from vLLM's own (kvcore's
    # shared_buffer gives each layer a tensor of its own where vLLM's tensors each serve one
    # layer of every group)
    "gemma3-block128": ("gemma3", {"num_blocks": 24}, ("shared_buffer",)),
    "qwen3_next": ("qwen3_next", {"block_size": 32, "num_blocks": 40}, ("auto",)),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@functools.cache
def _run(model_dir: str, settings_json: str) -> tuple[dict[str, Any], str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "tests.integrations.vllm_engine.engine_run", settings_json],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    assert done.returncode == 0 and lines, f"the engine run failed ({settings_json}):\n{log[-6000:]}"
    return json.loads(lines[-1][len(RESULT_MARK) :]), log


def run_engine(
    models: Path, name: str, settings: dict[str, Any], policy: str | None
) -> tuple[dict[str, Any], str]:
    """The engine's results and log for tiny model ``name`` with kvcore's ``policy`` (None: off)."""
    path = models / name
    if not path.exists():
        save_tiny_model(name, models)
    full = dict(settings, model=str(path), max_model_len=MAX_MODEL_LEN, policy=policy)
    full["prompt_tokens"] = 100  # longer than the sliding windows (64)
    return _run(str(path), json.dumps(full, sort_keys=True))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_engine_serves_kvcores_plan(case: str, models: Path) -> None:
    name, settings, policies = CASES[case]
    alone, _ = run_engine(models, name, settings, None)
    if case == "gemma3-block128":  # the case is there to serve a layout vLLM would not make
        result, _ = run_engine(models, name, dict(settings, admission=1), "shared_buffer")
        assert result["config"] != alone["config"]
    for policy in policies:
        result, log = run_engine(models, name, dict(settings, admission=1), policy)
        assert "kvcore: policy" in log, f"{policy}: kvcore's start-up line is not in vLLM's log"
        assert result["config"] == result["plan"], (
            f"{policy}: the engine runs another layout than kvcore's plan"
        )
        assert result["tokens"] == alone["tokens"], f"{policy}: tokens differ from vLLM alone"
        # one request more than the promise: exactly the promise runs at once, none preempted
        assert result["most_running"] == result["promise"], (
            policy,
            result["most_running"],
            result["promise"],
        )
        assert result["preemptions"] == 0, (policy, result["preemptions"])


#: A burst into a pool that cannot hold it: (prompt tokens, output tokens, arrival step). Prompts
#: longer than the window (64), outputs that run the full group's blocks out while the later
#: requests' prompts are still coming in.
BURST = [
    (180, 40, 0), (150, 50, 0), (120, 45, 1), (200, 30, 2), (90, 50, 3),
    (170, 40, 5), (130, 35, 6), (110, 50, 8), (160, 25, 9), (100, 40, 12),
]  # fmt: skip


def test_the_vllm_profile_runs_the_engine_step_for_step(models: Path) -> None:
    """The tiny Gemma-2 (a sliding group and a full group, the hybrid allocator on) in 24 blocks
    of 32 tokens, 8 requests at most and 128 tokens a step, the burst added by step number (no
    clock): kvcore's ``vllm`` profile, synchronous as the CPU build schedules, on the plan
    ``plan_for_vllm`` makes of the engine's KV bytes (its one backing allocation), takes as many
    steps, runs as many requests after every step's scheduling and preempts as often."""
    from kvcore import Registry, layer_specs_from_config, simulate
    from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
    from kvcore.simulation.profiles.vllm import VllmProfile
    from kvcore.simulation.workload import Request, Workload
    from kvcore.spec import resize_blocks

    trace = [{"prompt_tokens": p, "output_tokens": o, "arrival_step": a} for p, o, a in BURST]
    settings = {"block_size": 32, "num_blocks": 24, "max_num_seqs": 8, "max_num_batched_tokens": 128}
    result, _ = run_engine(models, "gemma2", dict(settings, trace=trace), None)
    engine = result["replay"]
    sizes = {size for size, *_ in result["config"]["tensors"]}
    assert len(sizes) == 1, "every KVCacheTensor gives the size of the one backing allocation"

    registry = Registry.default()
    config = json.loads((models / "gemma2" / "config.json").read_text())
    specs = resize_blocks(layer_specs_from_config(config, registry), 32)
    rules = VllmRules(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=128, async_scheduling=False)
    plan = plan_for_vllm(rules.request(specs, sizes.pop(), policy="equal_groups"), rules, registry=registry)
    assert plan.num_blocks == result["config"]["num_blocks"] == 24
    workload = Workload(
        tuple(
            Request(id=k, prompt_tokens=p, output_tokens=o, arrival_step=a)
            for k, (p, o, a) in enumerate(BURST)
        ),
        name="burst",
    )
    ours = simulate(
        plan,
        workload,
        scheduler=VllmProfile(async_scheduling=False, max_num_seqs=8),
        max_num_batched_tokens=128,
        registry=registry,
    )
    assert engine["preemptions"] > 0, "the burst must preempt, or the case proves less"
    assert (ours.steps, ours.preemptions) == (engine["steps"], engine["preemptions"])
    assert list(ours.running) == engine["running"]


def test_the_vllm_profile_runs_the_engine_step_for_step_with_shared_prefixes_cached(models: Path) -> None:
    """The same burst with prefix caching on, every prompt leading with one of two shared
    prefixes of 128 tokens: the engine keeps the sliding group's prefix-cache blocks sparsely
    (vLLM's ``prefix_cache_retention_interval``, 0 by default: only the blocks a later request
    can resume at), and so does kvcore's ``vllm`` profile by default: as many steps, running
    requests after every step and preemptions. Dense retention would give other figures (the
    case's premise)."""
    from kvcore import Registry, layer_specs_from_config, simulate
    from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
    from kvcore.simulation.profiles.vllm import VllmProfile
    from kvcore.simulation.workload import Request, Workload
    from kvcore.spec import resize_blocks

    shared = 128
    trace = [
        {
            "prompt_tokens": max(p, shared + 1),
            "output_tokens": o,
            "arrival_step": a,
            "prefix_id": k % 2,
            "prefix_tokens": shared,
        }
        for k, (p, o, a) in enumerate(BURST)
    ]
    settings = {"block_size": 32, "num_blocks": 24, "max_num_seqs": 8, "max_num_batched_tokens": 128}
    result, _ = run_engine(models, "gemma2", dict(settings, trace=trace, prefix_caching=True), None)
    engine = result["replay"]
    sizes = {size for size, *_ in result["config"]["tensors"]}

    registry = Registry.default()
    config = json.loads((models / "gemma2" / "config.json").read_text())
    specs = resize_blocks(layer_specs_from_config(config, registry), 32)
    rules = VllmRules(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=128, async_scheduling=False)
    plan = plan_for_vllm(rules.request(specs, sizes.pop(), policy="equal_groups"), rules, registry=registry)
    workload = Workload(
        tuple(
            Request(
                id=k,
                prompt_tokens=r["prompt_tokens"],
                output_tokens=r["output_tokens"],
                arrival_step=r["arrival_step"],
                prefix_id=r["prefix_id"],
                prefix_tokens=shared,
            )
            for k, r in enumerate(trace)
        ),
        name="burst with shared prefixes",
    )
    ours, dense = (
        simulate(
            plan,
            workload,
            scheduler=VllmProfile(
                async_scheduling=False, max_num_seqs=8, prefix_cache_retention_interval=retention
            ),
            prefix_caching=True,
            max_num_batched_tokens=128,
            registry=registry,
        )
        for retention in (0, None)
    )
    assert ours.cached_tokens > 0 and (dense.steps, dense.preemptions) != (ours.steps, ours.preemptions)
    assert (ours.steps, ours.preemptions) == (engine["steps"], engine["preemptions"])
    assert list(ours.running) == engine["running"]
