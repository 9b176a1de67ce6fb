"""``--model org/name`` from the Hugging Face Hub: config.json and safetensors headers, through a
stand-in for the Hub on a loopback port (``HF_ENDPOINT``), never the network."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvcore.cli import main
from kvcore.errors import HubUnavailableError, ModelAccessError, UnknownModelError
from kvcore.frontends.hf_config import find_bundled_model, find_model_config
from tests.frontends.hub_stand_in import HubStandIn, Repo, safetensors_file

pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parents[2]
QWEN = find_bundled_model("Qwen/Qwen3-8B").config()  # a real config, served as a Hub repo's
SECRET = "hf_kvcore_test_token_do_not_print"
SHARDS = {
    "model-00001-of-00002.safetensors": {"model.embed_tokens.weight": ("BF16", [1000, 256])},
    "model-00002-of-00002.safetensors": {
        "model.layers.0.mlp.up_proj.weight": ("F8_E4M3", [512, 256]),
        "model.layers.0.mlp.up_proj.weight_scale": ("F32", [512]),
        "lm_head.weight": ("BF16", [1000, 256]),
    },
}
#: The bytes of SHARDS' tensors: what the headers say the weights take.
SHARD_BYTES = 1000 * 256 * 2 + 512 * 256 + 512 * 4 + 1000 * 256 * 2


def sharded_repo(config=QWEN, **kw):
    index = {
        "metadata": {"total_size": SHARD_BYTES},
        "weight_map": {tensor: shard for shard, tensors in SHARDS.items() for tensor in tensors},
    }
    files = {
        "config.json": json.dumps(config).encode(),
        "model.safetensors.index.json": json.dumps(index).encode(),
        # what a range request of the header reads is all the stand-in serves of each shard
        **{shard: safetensors_file(tensors) for shard, tensors in SHARDS.items()},
        "modeling_acme.py": b"raise SystemExit('repository code ran')\n",
    }
    return Repo(files=files, **kw)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The stand-in, named by HF_ENDPOINT, with HF_HOME a fresh folder and offline mode off.

    huggingface_hub reads some settings once, at import (its ``constants``); an earlier test may
    have imported it under the suite's HF_HUB_OFFLINE=1, so those are set here too (kvcore passes
    the endpoint and the cache folder to each call, from the environment of the moment).
    """
    from huggingface_hub import constants

    stand_in = HubStandIn()
    for variable in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "XDG_CACHE_HOME",
    ):
        monkeypatch.delenv(variable, raising=False)
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    logger = logging.getLogger("huggingface_hub")  # its retry warnings, on a stream capsys replaced
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with stand_in.running():
            yield stand_in
    finally:
        logger.setLevel(level)


def layer_count(out):
    return sum(len(group["layers"]) for group in json.loads(out)["groups"])


def cli(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_plan_reads_a_model_neither_bundled_nor_cached_from_the_hub(hub, capsys):
    hub.repos["acme/qwen-like"] = sharded_repo()
    status, out, err = cli(capsys, "plan", "--model", "acme/qwen-like", "--memory", "8GiB", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["max_model_len"] == QWEN["max_position_embeddings"]  # the config was read
    assert len(report["groups"][0]["layers"]) == QWEN["num_hidden_layers"]
    # config.json only: no weights are needed for a --memory budget, and no repository code
    assert {path for _, path, _ in hub.fetched()} == {"/acme/qwen-like/resolve/main/config.json"}
    # a second run reads huggingface_hub's cache, as a cached model is read: no request at all
    hub.requests.clear()
    status, out2, _ = cli(capsys, "plan", "--model", "acme/qwen-like", "--memory", "8GiB", "--json")
    assert status == 0 and json.loads(out2) == report and hub.requests == []


def test_the_weights_are_read_from_the_safetensors_headers_by_range_requests(hub, capsys):
    hub.repos["acme/qwen-like"] = sharded_repo()
    status, out, err = cli(
        capsys,
        "plan",
        "--model",
        "acme/qwen-like",
        "--gpu-memory",
        "24GiB",
        "--max-model-len",
        "4096",
        "--json",
    )
    assert status == 0, err
    budget = json.loads(out)["gpu_budget"]
    assert budget["weights_bytes"] == SHARD_BYTES  # read, where the count of Qwen3-8B says 15 GiB
    assert budget["weights_by_group"] == {"BF16": 1000 * 256 * 4, "F8_E4M3": 512 * 256, "F32": 512 * 4}
    assert budget["weights_source"].startswith(
        "2 safetensors headers (the Hugging Face Hub http://127.0.0.1:"
    )
    commit = sharded_repo().commit
    shard_gets = [(m, p, r) for m, p, r in hub.fetched() if p.endswith(".safetensors") and m == "GET"]
    assert sorted(p for _, p, _ in shard_gets) == [
        f"/acme/qwen-like/resolve/{commit}/{s}" for s in sorted(SHARDS)
    ]
    assert all(r == "bytes=0-100000" for _, _, r in shard_gets)  # headers only: ranged, never the data
    assert not any(p.endswith(".py") for _, p, _ in hub.fetched())
    # the text output says where the weights came from
    status, out, _ = cli(
        capsys, "plan", "--model", "acme/qwen-like", "--gpu-memory", "24GiB", "--max-model-len", "4096"
    )
    assert status == 0
    assert "  - weights          1.10 MiB  (read from 2 safetensors headers (the Hugging Face Hub" in out


def test_one_safetensors_file_and_a_long_header(hub, capsys):
    tensors = {
        f"model.layers.{i}.weight.with.a.long.name.{'x' * 200}": ("BF16", [64, 64]) for i in range(600)
    }
    hub.repos["acme/single"] = Repo(
        files={"config.json": json.dumps(QWEN).encode(), "model.safetensors": safetensors_file(tensors)}
    )
    assert len(safetensors_file(tensors, data=False)) > 100_000  # the header outgrows the first range
    found = find_model_config("acme/single")
    weights, _ = found.checkpoint_weights()
    assert weights is not None and weights.files == 1
    assert (weights.total, weights.elements, weights.by_dtype) == (
        600 * 64 * 64 * 2,
        600 * 64 * 64,
        (("BF16", 600 * 8192),),
    )
    ranges = [r for m, p, r in hub.fetched() if p.endswith("/model.safetensors") and m == "GET"]
    assert ranges[0] == "bytes=0-100000" and ranges[1].startswith("bytes=8-")


def test_a_repository_without_safetensors_falls_back_to_the_count(hub, capsys):
    hub.repos["acme/bin-only"] = Repo(files={"config.json": json.dumps(QWEN).encode()})
    status, out, err = cli(
        capsys,
        "plan",
        "--model",
        "acme/bin-only",
        "--gpu-memory",
        "80GiB",
        "--max-model-len",
        "4096",
        "--json",
    )
    assert status == 0, err
    budget = json.loads(out)["gpu_budget"]
    assert budget["weights_source"] == "counted from the config"
    assert "embeddings" in budget["weights_by_group"]


def test_a_revision_is_read_at_that_branch_and_an_unknown_one_is_named(hub, capsys):
    old = sharded_repo()
    newer = dict(QWEN, num_hidden_layers=4)
    hub.repos["acme/qwen-like"] = old
    old.branches["v2"] = "f" * 40
    # the stand-in serves one set of files; a second repo object stands for the branch's commit
    status, out, _ = cli(capsys, "plan", "--model", "acme/qwen-like", "--memory", "8GiB", "--json")
    assert status == 0 and layer_count(out) == 36
    hub.repos["acme/qwen-like"] = sharded_repo(config=newer, commit="f" * 40, branches={"v2": "f" * 40})
    status, out, err = cli(
        capsys, "plan", "--model", "acme/qwen-like", "--revision", "v2", "--memory", "8GiB", "--json"
    )
    assert status == 0, err
    assert layer_count(out) == 4
    assert ("HEAD", "/acme/qwen-like/resolve/v2/config.json", None) in hub.fetched()
    # the default branch still comes from the cache: the first snapshot refs/main names
    status, out, _ = cli(capsys, "plan", "--model", "acme/qwen-like", "--memory", "8GiB", "--json")
    assert status == 0 and layer_count(out) == 36
    status, _, err = cli(capsys, "plan", "--model", "acme/qwen-like", "--revision", "v9", "--memory", "8GiB")
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert "acme/qwen-like has no revision 'v9' on the Hugging Face Hub" in err


def test_a_hub_whose_name_does_not_resolve_is_said_at_once_and_the_cache_still_serves(
    hub, capsys, monkeypatch
):
    import huggingface_hub.utils._http as http

    waits = []  # huggingface_hub's backoff, which a name that does not resolve must not reach
    monkeypatch.setattr(http.time, "sleep", waits.append)
    hub.repos["acme/qwen-like"] = sharded_repo(branches={"v2": "0123456789ab" + "0" * 28})
    status, out, err = cli(
        capsys, "plan", "--model", "acme/qwen-like", "--revision", "v2", "--memory", "8GiB"
    )
    assert status == 0, err
    asked = len(hub.requests)
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")  # RFC 2606: .invalid never resolves
    status, out, err = cli(
        capsys, "plan", "--model", "acme/qwen-like", "--revision", "v2", "--memory", "8GiB", "--json"
    )
    assert status == 0 and layer_count(out) == 36, err  # the revision's config, cached by the first run
    status, _, err = cli(capsys, "plan", "--model", "acme/other", "--memory", "8GiB")
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert "cannot reach the Hugging Face Hub at http://hub.invalid (hub.invalid does not resolve:" in err
    assert "does not hold config.json of it at its default branch" in err
    assert waits == [] and len(hub.requests) == asked


def test_a_bundled_name_with_a_revision_is_read_from_the_hub(hub, capsys):
    hub.repos["Qwen/Qwen3-8B"] = Repo(
        files={"config.json": json.dumps(dict(QWEN, num_hidden_layers=3)).encode()}
    )
    found = find_model_config("Qwen/Qwen3-8B", revision="main")
    assert found.origin == "hub" and found.config["num_hidden_layers"] == 3
    assert find_model_config("Qwen/Qwen3-8B").origin == "zoo"  # the zoo stays the default


def test_a_gated_repository_says_to_set_hf_token_and_never_prints_it(hub, capsys, monkeypatch):
    hub.repos["acme/gated"] = sharded_repo(gated=True, token=SECRET)
    common = ("plan", "--model", "acme/gated", "--gpu-memory", "80GiB", "--max-model-len", "4096")
    status, out, err = cli(capsys, *common)
    assert status == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "acme/gated is gated on the Hugging Face Hub" in err and "HTTP 401" in err
    assert f"accept its licence on {hub.url}/acme/gated and set HF_TOKEN" in err
    with pytest.raises(ModelAccessError):
        find_model_config("acme/gated")
    monkeypatch.setenv("HF_TOKEN", "hf_not_on_the_list")
    status, out, err = cli(capsys, *common)
    assert status == 1 and "HTTP 403" in err and "hf_not_on_the_list" not in out + err
    monkeypatch.setenv("HF_TOKEN", SECRET)
    status, out, err = cli(capsys, *common, "--json")
    assert status == 0, err
    assert json.loads(out)["gpu_budget"]["weights_bytes"] == SHARD_BYTES
    assert hub.requests[-1].token == SECRET  # the token was sent, with every request
    assert SECRET not in out + err
    cache = Path(os.environ["HF_HOME"])
    assert not any(SECRET.encode() in p.read_bytes() for p in cache.rglob("*") if p.is_file())


def test_a_missing_repository_or_file_is_one_clear_line(hub, capsys):
    common = ("--memory", "8GiB", "--max-model-len", "4096")
    status, _, err = cli(capsys, "plan", "--model", "acme/nothing-here", *common)
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert "acme/nothing-here: no such model repository on the Hugging Face Hub" in err
    assert "set HF_TOKEN" in err  # the Hub answers 401 for a missing repo without a token
    # a near miss of a bundled name says which
    status, _, err = cli(capsys, "plan", "--model", "google/gemma-3-27b", *common)
    assert status == 1 and "did you mean 'google/gemma-3-27b-it'" in err
    hub.repos["acme/no-config"] = Repo(files={"README.md": b"# nothing"})
    status, _, err = cli(capsys, "plan", "--model", "acme/no-config", *common)
    assert status == 1 and "acme/no-config has no config.json at its default branch" in err
    with pytest.raises(UnknownModelError):
        find_model_config("acme/no-config")


def test_offline_mode_names_hf_hub_offline_and_the_cache(hub, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.repos["acme/qwen-like"] = sharded_repo()
    status, _, err = cli(capsys, "plan", "--model", "acme/qwen-like", "--memory", "8GiB")
    assert status == 1 and len(err.strip().splitlines()) == 1
    cache = Path(os.environ["HF_HOME"]) / "hub"
    assert f"acme/qwen-like is neither bundled nor in the Hugging Face cache ({cache})" in err
    assert "HF_HUB_OFFLINE=1 keeps kvcore off the Hub: unset HF_HUB_OFFLINE" in err
    assert hub.requests == []
    # once fetched online, the model is in the cache, which offline mode reads
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert cli(capsys, "plan", "--model", "acme/qwen-like", "--memory", "8GiB")[0] == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    status, out, _ = cli(capsys, "models", "acme/qwen-like")
    assert status == 0 and hub.requests == []
    assert out.startswith(f"acme/qwen-like (Hugging Face cache {cache}")


def test_an_unreachable_or_failing_hub_is_a_typed_error(hub, capsys, monkeypatch):
    import huggingface_hub.utils._http as http

    waits = []  # huggingface_hub retries a failed request with a backoff (1 + 2 + 4 + 8 + 8 s)
    monkeypatch.setattr(http.time, "sleep", waits.append)
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    with pytest.raises(HubUnavailableError, match=f"cannot reach the Hugging Face Hub at {closed}"):
        find_model_config("acme/anything")
    status, _, err = cli(capsys, "plan", "--model", "acme/anything", "--memory", "8GiB")
    assert status == 1 and "check the network (or HF_ENDPOINT)" in err
    assert err.strip().splitlines()[-1].startswith("kvcore: error: acme/anything: cannot reach")
    assert "Traceback" not in err
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.fail_with = 503
    with pytest.raises(HubUnavailableError, match="HTTP 503"):
        find_model_config("acme/anything")
    assert waits  # the client's own retries ran (without waiting here)


def test_models_says_where_a_model_came_from(hub, capsys):
    hub.repos["acme/qwen-like"] = sharded_repo()
    status, out, _ = cli(capsys, "models", "acme/qwen-like")
    assert status == 0
    assert out.startswith(f"acme/qwen-like (Hugging Face Hub {hub.url}, revision main, commit 0123456789ab;")
    status, out, _ = cli(capsys, "models", "Qwen/Qwen3-8B")
    assert out.startswith("bundled Qwen/Qwen3-8B (qwen3)")


def test_a_fresh_process_reads_the_environment(hub, tmp_path):
    """The command line as a user runs it: HF_ENDPOINT, HF_HOME and HF_TOKEN read at start-up."""
    hub.repos["acme/qwen-like"] = sharded_repo(gated=True, token=SECRET)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_TOKEN=SECRET, HF_HOME=str(tmp_path / "fresh"), HF_HUB_DISABLE_TELEMETRY="1")
    argv = ["plan", "--model", "acme/qwen-like", "--gpu-memory", "24GiB", "--max-model-len", "4096", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "kvcore", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpu_budget"]["weights_bytes"] == SHARD_BYTES
    assert SECRET not in done.stdout + done.stderr
    assert (tmp_path / "fresh" / "hub" / "models--acme--qwen-like").is_dir()  # huggingface_hub's cache


def test_without_huggingface_hub_the_error_names_the_extra(tmp_path):
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'huggingface_hub':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from kvcore.cli import main\n"
        "sys.exit(main(['plan', '--model', 'acme/anything', '--memory', '8GiB']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_HOME=str(tmp_path), KVCORE_DISABLE_PLUGIN_AUTOLOAD="1")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "reading acme/anything from the Hugging Face Hub needs huggingface_hub" in done.stderr
    assert "pip install 'kvcore[hub]'" in done.stderr


@pytest.mark.parametrize(
    "name", ["configs/missing.json", "acme/has space", "acme--x/y", "acme/x..y", "a/b/c"]
)
def test_names_that_are_no_repository_id_never_reach_the_hub(hub, name):
    with pytest.raises(UnknownModelError, match="is neither a file or folder here, nor a bundled model"):
        find_model_config(name)
    assert hub.requests == []
