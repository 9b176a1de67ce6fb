"""``kvcore simulate`` and ``kvcore compare --workload``: the table, JSON, plot and errors."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
GEMMA = ROOT / "examples" / "specs" / "gemma-3-27b.json"
CHAT = ROOT / "examples" / "traces" / "chat.jsonl"
SMALL = ("--specs", GEMMA, "--memory", "2GiB", "--max-model-len", "4096")
SYNTHETIC = ("--requests", "60", "--prompt-len", "uniform:64:512", "--output-len", "lognormal:64:0.5")


@pytest.fixture
def trace(tmp_path):
    """Write a JSON-lines trace from lines (dicts, or raw text) and return its path."""

    def write(*lines, name="trace.jsonl"):
        path = tmp_path / name
        path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
        return path

    return write


def test_table_has_a_row_per_plan_with_the_simulated_figures(run_cli):
    status, out, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--policies", "shared_buffer,equal_groups")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("workload 60 requests") and lines[1].startswith("60 requests, prompts")
    assert lines[2].startswith("plans: as vLLM runs them")
    header = lines[4].split()
    for column in ("policy", "running", "tokens/step", "preemptions", "queue", "p99", "pool", "steps"):
        assert column in header
    rows = [line.split()[0] for line in lines[6:] if not line.startswith("  uniform")]
    assert rows == ["shared_buffer", "equal_groups"]


def test_json_has_the_workload_and_every_figure_per_plan(run_cli):
    status, out, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--block-sizes", "16,32", "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["workload"]["num_requests"] == 60
    assert payload["max_num_batched_tokens"] == 2048
    planned = [c for c in payload["candidates"] if c["simulation"] is not None]
    assert {c["block_size"] for c in planned} == {16, 32}
    for c in planned:
        sim = c["simulation"]
        for key in (
            "policy",
            "num_requests",
            "steps",
            "mean_running",
            "peak_running",
            "tokens_per_step",
            "total_tokens",
            "preemptions",
            "mean_queue_delay",
            "p99_queue_delay",
            "mean_pool_usage",
            "peak_pool_usage",
            "running",
            "pool_usage",
        ):
            assert key in sim, key
        assert sim["num_requests"] == 60 and len(sim["running"]) == sim["steps"] == len(sim["pool_usage"])
        assert 0 < sim["peak_pool_usage"] <= 1
    failed = [c for c in payload["candidates"] if c["simulation"] is None]
    assert all(c["error"] for c in failed)  # uniform cannot plan a hybrid model: it says why


def test_a_trace_is_read_and_named(run_cli, trace):
    path = trace(
        {"prompt_tokens": 100, "output_tokens": 10},
        {"prompt_tokens": 50, "output_tokens": 5, "arrival_step": 3},
    )
    status, out, err = run_cli("simulate", *SMALL, "--trace", path, "--policies", "shared_buffer", "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["workload"]["name"] == "trace.jsonl" and payload["workload"]["num_requests"] == 2
    sim = payload["candidates"][0]["simulation"]
    assert sim["num_requests"] == 2 and sim["preemptions"] == 0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", ["trace.jsonl:2", "JSON"]),
        ({"prompt_tokens": 10}, ["trace.jsonl:2", "output_tokens"]),
        ({"prompt_tokens": 0, "output_tokens": 1}, ["trace.jsonl:2", "prompt_tokens"]),
        ({"prompt_tokens": 1, "output_tokens": 1, "colour": "red"}, ["trace.jsonl:2", "colour"]),
    ],
)
def test_a_bad_trace_is_one_line_naming_file_and_line(run_cli, trace, line, words):
    path = trace({"prompt_tokens": 10, "output_tokens": 1}, line)
    status, out, err = run_cli("simulate", *SMALL, "--trace", path)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvcore: error: ")
    for word in words:
        assert word in err


def test_a_missing_trace_is_one_line(run_cli, tmp_path):
    status, _, err = run_cli("simulate", *SMALL, "--trace", tmp_path / "nope.jsonl")
    assert status == 1 and err.count("\n") == 1 and "nope.jsonl" in err


def test_a_request_longer_than_max_model_len_is_refused(run_cli, trace):
    path = trace({"prompt_tokens": 5000, "output_tokens": 10})
    status, _, err = run_cli("simulate", *SMALL, "--trace", path, "--policies", "shared_buffer")
    assert status == 1 and err.count("\n") == 1 and "4096" in err.replace(",", "")


def test_a_request_longer_than_max_model_len_is_rejected_and_the_rest_served(run_cli, trace):
    """vLLM refuses such a request with an error for it alone and serves the others: so does the
    replay, and it says how many it refused (issue 38: the whole simulation stopped)."""
    path = trace(
        {"prompt_tokens": 100, "output_tokens": 10},
        {"prompt_tokens": 5000, "output_tokens": 10},
        {"prompt_tokens": 200, "output_tokens": 20, "arrival_step": 3},
    )
    status, out, err = run_cli("simulate", *SMALL, "--trace", path, "--policies", "shared_buffer")
    assert status == 0, err
    assert (
        "rejected 1 of 3 requests, longer than max_model_len 4,096 (vLLM refuses such a request with an "
        "error and serves the rest): request on line 2 of the trace (5,000 + 10 tokens)"
    ) in out
    assert out.splitlines()[1].startswith("2 requests, prompts")
    status, out, err = run_cli("simulate", *SMALL, "--trace", path, "--policies", "shared_buffer", "--json")
    payload = json.loads(out)
    assert payload["workload"]["num_requests"] == 2 and payload["workload"]["rejected_requests"] == 1
    assert payload["candidates"][0]["simulation"]["num_requests"] == 2


def test_compare_rejects_the_same_requests(run_cli, trace):
    path = trace({"prompt_tokens": 100, "output_tokens": 10}, {"prompt_tokens": 5000, "output_tokens": 10})
    status, out, err = run_cli("compare", *SMALL, "--trace", path, "--policies", "shared_buffer")
    assert status == 0, err
    assert "rejected 1 of 2 requests, longer than max_model_len 4,096" in out


def test_compare_takes_trace_as_simulate_does(run_cli, trace):
    """One spelling for one idea: ``--trace`` (issue 38; 0.1's ``--workload`` was removed in 0.3,
    tests/plugins/test_removed_in_0_3.py)."""
    path = trace({"prompt_tokens": 100, "output_tokens": 10})
    status, out, err = run_cli("compare", *SMALL, "--trace", path, "--policies", "shared_buffer", "--json")
    assert status == 0 and err == ""
    assert json.loads(out)


OVERLOADED = ("--requests", "300", "--prompt-len", "1000", "--output-len", "200", "--rate", "1")


def test_an_overloaded_run_says_so_in_one_line(run_cli):
    """Arrivals at about one request a step against a pool that serves a fifth of that: one line
    with both rates and the growing queue (issue 40)."""
    status, out, err = run_cli("simulate", *SMALL, *OVERLOADED, "--policies", "shared_buffer,equal_groups")
    assert status == 0, err
    lines = [line for line in out.splitlines() if "overloaded" in line]
    assert len(lines) == 1, lines  # plans of one figure share the line
    assert lines[0].startswith("  shared_buffer, equal_groups: overloaded: requests arrive at 0.97 per step")
    assert "per step, served at 0." in lines[0] and "the queue grows (" in lines[0]
    status, out, err = run_cli("simulate", *SMALL, *OVERLOADED, "--policies", "shared_buffer", "--json")
    load = json.loads(out)["candidates"][0]["simulation"]["load"]
    assert load["overloaded"] is True and load["unit"] == "step"
    assert load["arrival_rate"] > 2 * load["served_rate"]
    assert load["waiting_at_last_arrival"] > load["waiting_half_way"] > 0


def test_a_run_that_keeps_up_says_nothing_of_load(run_cli):
    light = ("--requests", "60", "--prompt-len", "200", "--output-len", "20", "--rate", "0.02")
    status, out, err = run_cli("simulate", *SMALL, *light, "--policies", "shared_buffer")
    assert status == 0, err and "overloaded" not in out
    assert "overloaded" not in out
    status, out, _ = run_cli("simulate", *SMALL, *light, "--policies", "shared_buffer", "--json")
    assert json.loads(out)["candidates"][0]["simulation"]["load"]["overloaded"] is False
    # every request at once: a burst has no rate to outpace
    status, out, _ = run_cli("simulate", *SMALL, *SYNTHETIC, "--policies", "shared_buffer", "--json")
    assert json.loads(out)["candidates"][0]["simulation"]["load"] is None


def test_plot_writes_a_file(run_cli, tmp_path):
    pytest.importorskip("matplotlib")
    out_file = tmp_path / "sim.png"
    status, _, err = run_cli(
        "simulate", *SMALL, *SYNTHETIC, "--policies", "shared_buffer,equal_groups", "--plot", out_file
    )
    assert status == 0, err
    assert out_file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"kvcore: wrote {out_file} (the simulation plot, " in err


def test_plot_to_a_missing_folder_is_refused_before_simulating(run_cli, tmp_path, monkeypatch):
    import kvcore.cli.simulate as simulate_cli

    def must_not_run(*args, **kwargs):
        raise AssertionError("simulated before checking --plot")

    monkeypatch.setattr(simulate_cli, "simulate_candidates", must_not_run)
    status, out, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--plot", tmp_path / "no" / "sim.png")
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "does not exist" in err and "simulation plot" in err
    status, _, err = run_cli("simulate", *SMALL, *SYNTHETIC, "--plot", tmp_path / "sim.pdf")
    assert status == 1 and ".png or .svg" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--requests", "10", "--prompt-len", "64"), ["--output-len"]),
        (("--trace", CHAT, "--prompt-len", "64"), ["--prompt-len", "--requests"]),
        (("--trace", CHAT, "--seed", "3", "--rate", "2"), ["--rate", "--seed", "--requests"]),
    ],
)
def test_synthetic_options_go_together(run_cli, argv, words):
    status, out, err = run_cli("simulate", *SMALL, *argv)
    assert status == 1 and out == "" and err.count("\n") == 1
    for word in words:
        assert word in err


@pytest.mark.parametrize(
    "argv",
    [
        ("--requests", "0", "--prompt-len", "64", "--output-len", "8"),
        ("--requests", "10", "--prompt-len", "gaussian:5:1", "--output-len", "8"),
        ("--requests", "10", "--prompt-len", "uniform:64", "--output-len", "8"),
        ("--requests", "10", "--prompt-len", "64", "--output-len", "8", "--rate", "0"),
        ("--requests", "10", "--prompt-len", "64", "--output-len", "8", "--rate", "nan"),
        ("--requests", "10", "--prompt-len", "64", "--output-len", "8", "--seed", "-1"),
        ("--requests", "10", "--trace", CHAT),
        (),  # no workload at all
    ],
)
def test_bad_synthetic_options_are_usage_errors(run_cli, argv):
    with pytest.raises(SystemExit) as exc:
        run_cli("simulate", *SMALL, *argv)
    assert exc.value.code == 2
    assert "usage:" in run_cli.capsys.readouterr().err


def test_same_seed_same_figures_and_rate_spreads_arrivals(run_cli):
    def figures(*extra):
        status, out, err = run_cli(
            "simulate", *SMALL, *SYNTHETIC, "--policies", "shared_buffer", *extra, "--json"
        )
        assert status == 0, err
        return json.loads(out)["candidates"][0]["simulation"]

    assert figures("--seed", "5") == figures("--seed", "5")
    assert figures("--seed", "5") != figures("--seed", "6")
    # 60 requests at 0.1 a step arrive over some 600 steps: the trace takes longer to drain
    assert figures("--rate", "0.1")["steps"] > figures()["steps"]


def test_compare_workload_adds_simulated_columns_and_ranks_by_tokens_per_step(run_cli):
    argv = ("compare", *SMALL, *SYNTHETIC, "--block-sizes", "16,64")
    status, out, err = run_cli(*argv, "--json")
    assert status == 0, err
    payload = json.loads(out)
    assert payload["workload"]["num_requests"] == 60
    sims = [c["simulation"] for c in payload["candidates"]]
    planned = [s["served_tokens_per_step"] for s in sims if s is not None]
    assert len(planned) >= 2 and planned == sorted(planned, reverse=True)
    assert all(s is None for s in sims[len(planned) :])  # the unplanned ones last
    assert "running" not in sims[0]  # compare keeps the figures, not the series
    status, out, err = run_cli(*argv)
    assert status == 0, err
    assert "ranked by tokens per step" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("policy"))
    assert header.split()[-4:] == ["tokens/step", "mean", "running", "preemptions"]


def test_compare_without_a_workload_is_unchanged(run_cli):
    status, out, _ = run_cli("compare", *SMALL, "--json")
    assert status == 0
    payload = json.loads(out)
    assert "workload" not in payload and all("simulation" not in c for c in payload["candidates"])
