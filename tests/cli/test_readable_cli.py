"""The command line's reports read well and say what they chose: the best candidate and why,
wrapped wide cells with ``--json`` / ``--csv`` in full, help that offers only what works, and
trace errors that name the file's line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from kvcore.cli.table import render_table

ROOT = Path(__file__).parents[2]
GEMMA = ROOT / "examples" / "specs" / "gemma-3-27b.json"
NEMOTRON_H_LIKE = ROOT / "tests" / "configs" / "synthetic__nemotron-h-like.json"
SMALL = ("--specs", GEMMA, "--memory", "2GiB", "--max-model-len", "4096")


def rows_of(text):
    return list(csv.DictReader(io.StringIO(text)))


# -- the best candidate ----------------------------------------------------------------------


BEST_KVCORE = "best for kvcore's runtime (judged for --engine kvcore)"


def test_compare_marks_the_best_candidate_and_says_why(run_cli):
    status, out, err = run_cli("compare", *SMALL, "--policies", "shared_buffer,equal_groups,kind_pools")
    assert status == 0, err
    marked = [
        line.split()[0]
        for line in out.splitlines()
        if line.split() and line.split()[0][-2:-1].isalnum() and line.split()[0].endswith("*")
    ]
    assert len(marked) == 1
    (why,) = [line for line in out.splitlines() if line.lstrip().startswith("* best ")]
    best = marked[0].removesuffix("*")
    # it says which engine it judged for
    assert why.lstrip().startswith(f"* {BEST_KVCORE}: {best}: the highest max concurrency: ")
    # the JSON names the same candidate, with the highest concurrency of all
    status, out, _ = run_cli(
        "compare", *SMALL, "--policies", "shared_buffer,equal_groups,kind_pools", "--json"
    )
    data = json.loads(out)
    (chosen,) = [c for c in data["candidates"] if c["best"]]
    assert chosen["policy"] == best
    assert chosen["max_concurrency"] == max(c["max_concurrency"] or 0 for c in data["candidates"])
    assert data["best_reason"] in why


def test_ties_go_to_fewer_groups_and_a_near_second_is_named(run_cli):
    from kvcore.cli.compare import best_candidate
    from kvcore.planning.compare import compare_policies
    from kvcore.planning.registry import Registry
    from kvcore.planning.request import PlanRequest
    from kvcore.spec import SizingContext
    from tests.helpers import full

    registry = Registry.default(autoload=False)
    candidates = compare_policies(
        PlanRequest.for_context(
            {f"l{i}": full() for i in range(4)}, 2**30, SizingContext(max_model_len=4096)
        ),
        registry=registry,
    )
    best = best_candidate(candidates)
    planned = [c for c in candidates if c.plan is not None]
    assert len(planned) > 1 and all(c.max_concurrency == planned[0].max_concurrency for c in planned)
    assert best.candidate.plan is not None
    assert len(best.candidate.plan.groups) == min(len(c.plan.groups) for c in planned)
    assert f"{len(planned)} candidates tie" in best.reason


def test_with_a_workload_the_best_serves_the_most(run_cli):
    status, out, err = run_cli(
        "compare", *SMALL, "--policies", "shared_buffer,equal_groups", "--requests", "40",
        "--prompt-len", "uniform:64:512", "--output-len", "uniform:16:64", "--json",
    )  # fmt: skip
    assert status == 0, err
    data = json.loads(out)
    served = {c["policy"]: c["simulation"]["served_tokens_per_step"] for c in data["candidates"]}
    (chosen,) = [c["policy"] for c in data["candidates"] if c["best"]]
    assert served[chosen] == max(served.values())
    assert data["best_reason"].startswith("the most tokens served per step on the workload")


# -- wide cells and machine formats ----------------------------------------------------------


def test_render_table_wraps_a_wide_column_at_its_spaces():
    text = render_table(["n", "layers"], [[1, "0, 2, 4, 6-7, 9, 11, 13"], [2, "3"]], wrap={1: 10})
    assert text.splitlines() == [
        "  n  layers",
        "  -  --------",
        "  1  0, 2, 4,",
        "     6-7, 9,",
        "     11, 13",
        "  2  3",
    ]


def test_rank_table_wraps_its_layers_and_csv_gives_them_whole(run_cli):
    argv = ("plan", "--model", NEMOTRON_H_LIKE, "--pp", "2", "--memory", "4GiB", "--max-model-len", "4096")
    status, out, err = run_cli(*argv)
    assert status == 0, err
    table = out.split("\n\n")[1]
    assert max(len(line) for line in table.splitlines()) < 120
    status, out, err = run_cli(*argv, "--csv")
    assert status == 0, err
    ranks = rows_of(out)
    assert [r["rank"] for r in ranks] == ["0", "1"]
    assert len(ranks[0]["layers"].split()) == 32 and len(ranks[0]["layer_ranges"]) > 100


def test_plan_csv_is_the_groups_table_unformatted(run_cli):
    status, out, err = run_cli("plan", *SMALL, "--csv")
    assert status == 0, err
    groups = rows_of(out)
    status, out, _ = run_cli("plan", *SMALL, "--json")
    report = json.loads(out)
    assert len(groups) == len(report["groups"])
    assert [int(g["blocks_per_request"]) for g in groups] == [
        g["blocks_per_request"] for g in report["groups"]
    ]
    assert {g["kind"] for g in groups} == {"sliding_window", "full_attention"}


@pytest.mark.parametrize(
    "argv",
    [
        ("compare", *SMALL),
        (
            "simulate",
            *SMALL,
            "--requests",
            "10",
            "--prompt-len",
            "uniform:8:64",
            "--output-len",
            "uniform:4:16",
        ),
        ("models",),
    ],
    ids=["compare", "simulate", "models"],
)
def test_csv_has_one_row_per_json_item(run_cli, argv):
    status, out, err = run_cli(*argv, "--json")
    assert status in (0, 1), err
    data = json.loads(out)
    items = data.get("candidates") or data.get("models")
    status, out, err = run_cli(*argv, "--csv")
    rows = rows_of(out)
    assert len(rows) == len(items)
    key = "policy" if "candidates" in data else "name"
    assert [row[key] for row in rows] == [item[key] for item in items]


def test_json_and_csv_together_are_refused(run_cli):
    status, out, err = run_cli("plan", *SMALL, "--json", "--csv")
    assert status == 1 and out == "" and "give one of them" in err


# -- help and trace lines ----------------------------------------------------------------------


@pytest.mark.parametrize(("command", "auto"), [("compare", True), ("simulate", True), ("tune", False)])
def test_help_offers_auto_only_where_it_works(run_cli, command, auto):
    with pytest.raises(SystemExit):
        run_cli(command, "--help")
    text = run_cli.capsys.readouterr().out
    if auto:  # one length for every candidate: the auto policy's plan's
        assert "--max-model-len N|auto" in text and "every candidate at that length" in " ".join(text.split())
    else:
        assert "--max-model-len N " in text and "N|auto" not in text and "auto: the longest" not in text
    with pytest.raises(SystemExit):
        run_cli("plan", "--help")
    assert "N|auto" in run_cli.capsys.readouterr().out


def test_trace_errors_name_the_line(run_cli, tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = ['{"prompt_tokens": 10, "output_tokens": 5}', "", '{"prompt_tokens": 5000, "output_tokens": 5}']
    path.write_text("\n".join(lines) + "\n")
    status, out, err = run_cli("simulate", *SMALL, "--trace", path, "--policies", "shared_buffer")
    assert status == 0, err  # the longer request is rejected, as vLLM rejects it; the rest is served
    # the file's third line is the second request (id 1): the message counts as the file does
    assert "request on line 3 of the trace (5,000 + 5 tokens)" in out


def test_allocate_and_plugins_take_csv(run_cli):
    status, out, err = run_cli("allocate", *SMALL, "--csv")
    assert status == 0, err
    steps = rows_of(out)
    assert [s["step"] for s in steps][:2] == ["read specs", "stand-in layers"]
    assert all(float(s["ms"]) >= 0 for s in steps)
    status, out, err = run_cli("plugins", "--csv")
    assert status == 0, err
    rows = rows_of(out)
    assert {r["section"] for r in rows} == {"spec_kinds", "policies", "model_families", "plugins"}
    assert "shared_buffer" in {r["policy"] for r in rows if r["section"] == "policies"}


def test_compare_engine_vllm_takes_csv(run_cli):
    base = ("compare", "--model", "google/gemma-2-9b-it", "--memory", "20GiB", "--engine", "vllm")
    status, out, err = run_cli(*base, "--json")
    payload = json.loads(out)
    status, out, err = run_cli(*base, "--csv")
    assert status == 0, err
    rows = rows_of(out)
    assert [r["policy"] for r in rows[: len(payload["candidates"])]] == [
        c["policy"] for c in payload["candidates"]
    ]
    assert rows[-1]["policy"] == "vllm (own plan)"


def test_compare_marks_the_best_one_vllm_runs_beside_the_best_and_what_auto_picks(run_cli):
    # Gemma 3: unified_pool holds the most, but its sliding pages take runs of block ids, which
    # vLLM cannot run, and auto (kvcore plan's default) never picks it
    args = ("compare", "--model", "google/gemma-3-27b-it", "--memory", "16GiB", "--max-model-len", "8192")
    status, out, err = run_cli(*args, "--policies", "shared_buffer,kind_pools,unified_pool")
    assert status == 0, err
    firsts = [line.split()[0] for line in out.splitlines() if line.split()]
    assert "unified_pool*" in firsts and "shared_buffer+" in firsts
    notes = [line.strip() for line in out.splitlines() if line.strip()[:2] in ("* ", "+ ")]
    assert notes[0].startswith(f"* {BEST_KVCORE}: unified_pool: ")
    assert notes[1].startswith("+ best vLLM 0.33 runs: shared_buffer: ")
    (auto,) = [line.strip() for line in out.splitlines() if "--policy auto" in line]
    assert auto.startswith("kvcore plan's default (--policy auto) picks shared_buffer: ")
    assert auto.endswith("kvcore plan --policy unified_pool")
    status, plan_out, err = run_cli("plan", *args[1:])  # kvcore plan, the same options
    assert plan_out.startswith("policy shared_buffer (auto")
    data = json.loads(run_cli(*args, "--policies", "shared_buffer,kind_pools,unified_pool", "--json")[1])
    assert (data["judged_for"], data["auto_policy"]) == ("kvcore", "shared_buffer")
    assert [c["policy"] for c in data["candidates"] if c["best_vllm_runs"]] == ["shared_buffer"]
