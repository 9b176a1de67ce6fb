"""Planning needs no torch: reading a bundled model config, planning it, writing the plan as JSON
and the ``plan``, ``compare``, ``models`` and ``plugins`` commands leave torch unimported (and
the built-in plugins leave hypothesis unimported). Each check runs in a fresh interpreter, and a
failure names the import chain that pulled the module in."""

import os
import subprocess
import sys
import textwrap

import pytest

MODEL = "google/gemma-3-27b-it"

#: Runs first in the child: records who imports a watched module first, then ``BODY`` runs and
#: the child prints the chains of kvcore frames that imported a watched module.
PRELUDE = textwrap.dedent(
    """
    import importlib.abc, sys, traceback

    WATCHED = ("torch", "hypothesis")
    chains = {}

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in WATCHED and top not in chains:
                frames = [f for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename]
                chains[top] = " <- ".join(
                    f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno}" for f in reversed(frames[-8:])
                )
            return None

    sys.meta_path.insert(0, Watch())
    """
)

BODY = textwrap.dedent(
    f"""
    import contextlib, io, json

    import kvcore
    from kvcore import Registry, SizingContext, plan_kv_cache
    from kvcore.cli import main
    from kvcore.planning.serialization import plan_from_json, plan_to_json

    registry = Registry.default(autoload=False)
    specs = kvcore.model_layer_specs({MODEL!r}, registry)
    plan = plan_kv_cache(specs, 80 * 2**30, SizingContext(max_model_len=32768), registry=registry)
    assert plan_from_json(plan_to_json(plan, registry), registry) == plan
    sizing = ["--memory", "80GiB", "--max-model-len", "32768"]
    for argv in (
        ["plan", "--model", {MODEL!r}, *sizing],
        ["plan", "--model", {MODEL!r}, *sizing, "--json"],
        ["plan", "--model", {MODEL!r}, "--gpu-memory", "80GiB", "--max-model-len", "auto"],
        ["compare", "--model", {MODEL!r}, *sizing, "--kv-cache-dtypes", "auto,fp8"],
        ["models"],
        ["plugins"],
    ):
        with contextlib.redirect_stdout(io.StringIO()):
            status = main(argv)
        assert status == 0, (argv, status)
    """
)

REPORT = textwrap.dedent(
    """
    for name in WATCHED:
        if name in sys.modules:
            print(f"{name} imported: {chains.get(name, '?')}")
    """
)


def _run(body):
    env = {**os.environ, "KVCORE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE + body + REPORT], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_planning_and_its_commands_import_no_torch():
    leaks = [line for line in _run(BODY).splitlines() if line.startswith("torch imported")]
    assert leaks == [], f"planning imported torch; first import chain: {leaks}"


@pytest.mark.parametrize("watched", ["torch", "hypothesis"])
def test_loading_the_builtin_plugins_imports_neither_torch_nor_hypothesis(watched):
    body = "from kvcore import Registry\nRegistry.default(autoload=False)\n"
    leaks = [line for line in _run(body).splitlines() if line.startswith(f"{watched} imported")]
    assert leaks == [], f"the built-in plugins import {watched}: {leaks}"
