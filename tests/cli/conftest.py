import json

import pytest

from kvcore.cli import main


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run ``kvcore`` in-process with autoloading off; return (status, stdout, stderr)."""
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(*argv):
        status = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return status, out, err

    run.capsys = capsys  # for a caller that catches argparse's SystemExit itself
    return run


@pytest.fixture
def spec_file(tmp_path):
    """Write a spec file from ``{layer: spec dict}`` and return its path."""

    def write(layers, name="specs.json"):
        path = tmp_path / name
        path.write_text(json.dumps({"layers": layers}))
        return path

    return write


def full_entry(**kw):
    return {
        "kind": "full_attention",
        "block_size": 16,
        "num_kv_heads": 8,
        "head_size": 128,
        "dtype": "bfloat16",
        **kw,
    }


def sliding_entry(window, **kw):
    return {**full_entry(**kw), "kind": "sliding_window", "sliding_window": window}
