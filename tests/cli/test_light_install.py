"""``pip install kvcore`` (no extras) runs the planner: no command that does not allocate imports
torch, numpy or huggingface_hub; allocation names the extra that brings torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What the light install lacks: the torch extra (torch, numpy) and the others.
MISSING = ("torch", "numpy", "huggingface_hub", "transformers", "matplotlib")

#: An interpreter in which the modules of MISSING cannot be imported, as in a fresh
#: `pip install kvcore`: a finder ahead of every other raises ModuleNotFoundError for them.
BLOCKER = f"""
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {MISSING!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Missing())
"""


def run_without_torch(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVCORE_DISABLE_PLUGIN_AUTOLOAD": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )


def test_the_planner_commands_run_without_torch(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(json.dumps({"prompt_tokens": 900, "output_tokens": 100}) + "\n" for _ in range(20))
    )
    model = ["--model", "google/gemma-3-27b-it", "--max-model-len", "8192"]
    workload = ["--requests", "20", "--prompt-len", "900", "--output-len", "100"]
    commands = [
        ["models"],
        ["models", "Qwen/Qwen3-8B"],
        ["plan", *model, "--memory", "16GiB", "--json"],
        ["plan", *model, "--gpu-memory", "80GiB", "--tp", "2"],
        ["plan", "--model", "Qwen/Qwen3-8B", "--memory", "8GiB", "--max-model-len", "auto"],
        ["compare", *model, "--memory", "16GiB"],
        ["compare", *model, "--memory", "16GiB", "--engine", "vllm"],
        ["compare", *model, "--memory", "16GiB", "--engine", "sglang"],
        ["simulate", *model, "--memory", "16GiB", "--trace", str(trace), "--gpu", "H100"],
        ["tune", *model, "--memory", "16GiB", *workload],
        ["plugins"],
    ]
    body = f"""
    import contextlib, io, json
    from kvcore.cli import main

    statuses = []
    for argv in {commands!r}:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            statuses.append(main(argv))
        if argv[0] == "plan" and "--json" in argv:
            open("plan.json", "w").write(out.getvalue())
    statuses.append(main(["check", "plan.json"]))
    print(json.dumps({{"statuses": statuses, "loaded": sorted(m for m in {MISSING!r} if m in sys.modules)}}))
    """
    done = run_without_torch(body, tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"statuses": [0] * (len(commands) + 1), "loaded": []}, done.stderr


def test_allocation_without_torch_names_the_extra(tmp_path):
    body = """
    import kvcore
    from kvcore.cli import main

    status = main(["allocate", "--model", "Qwen/Qwen3-8B", "--memory", "1GiB", "--max-model-len", "1024"])
    try:
        kvcore.allocate
    except kvcore.MissingDependencyError as exc:
        print("python:", exc.extra, exc)
    try:
        kvcore.LocalExecutor
    except ImportError as exc:  # a MissingDependencyError is an ImportError too
        print("python:", type(exc).__name__)
    sys.exit(status)
    """
    done = run_without_torch(body, tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "kvcore: error: kvcore allocate (allocating and binding a KV cache) needs torch, which is not "
        "installed: pip install 'kvcore[torch]' (from a checkout: pip install -c constraints.txt -e "
        "'.[torch]'); planning, comparing, simulating and tuning run without it"
    )
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("python: torch kvcore.allocate needs torch, which is not installed")
    assert lines[1] == "python: MissingDependencyError"


@pytest.mark.slow
def test_a_fresh_install_without_extras_plans_without_torch(tmp_path):
    """The README's first command in a fresh virtual environment: no torch installed, and the
    plan it prints. Needs the package index pip is configured with (pluggy, attrs, cattrs)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = venv / "bin" / "pip"
    subprocess.run(
        [str(pip), "install", "--quiet", "-c", str(ROOT / "constraints.txt"), str(ROOT)],
        check=True,
        timeout=600,
        cwd=tmp_path,
    )
    listed = subprocess.run(
        [str(pip), "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    names = {entry["name"].lower() for entry in json.loads(listed.stdout)}
    assert "kvcore" in names and not {"torch", "numpy", "huggingface-hub", "huggingface_hub"} & names
    done = subprocess.run(
        [
            str(venv / "bin" / "kvcore"),
            "plan",
            "--model",
            "google/gemma-3-27b-it",
            "--memory",
            "80GiB",
            "--max-model-len",
            "32768",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "max concurrency  21.40 requests of 32,768 tokens (ideal 21.48, efficiency 99.66%)" in done.stdout
