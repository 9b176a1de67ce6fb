"""One answer for SGLang: ``kvcore tune``'s SGLang flags and figures are ``kvcore compare --engine
sglang``'s, on every bundled model (both read :func:`kvcore.integrations.sglang.model.sglang_model`).

Issue 38: ``tune`` told SGLang ``--swa-full-tokens-ratio 0.627`` for Gemma-3-27B while ``compare
--engine sglang`` (rightly: SGLang 0.5.23 turns Gemma 3's sliding pool off) showed one full pool.
"""

import json

import pytest

from kvcore.frontends.hf_config import bundled_models

MODELS = [m.name for m in bundled_models()]
SIZING = ("--memory", "8GiB", "--max-model-len", "4096")
BATCH = 512


def _tune(run_cli, model):
    status, out, err = run_cli(
        "tune", "--model", model, *SIZING,
        "--requests", "4", "--prompt-len", "256", "--output-len", "8",
        # kind_pools split by the worst case: the layout compare plans for SGLang
        "--policies", "kind_pools", "--no-split-search", "--passes", "1",
        "--max-num-seqs", "8", "--max-num-batched-tokens", str(BATCH), "--json",
    )  # fmt: skip
    assert status == 0, err
    return json.loads(out)["engines"]["sglang"]


def _compare(run_cli, model, page):
    status, out, err = run_cli(
        "compare", "--model", model, *SIZING, "--engine", "sglang", "--policies", "kind_pools",
        *(("--block-sizes", page) if page else ()), "--max-num-batched-tokens", str(BATCH), "--json",
    )  # fmt: skip
    return status, json.loads(out), err


@pytest.mark.parametrize("model", MODELS)
def test_tunes_sglang_figures_are_compares(run_cli, model):
    tuned = _tune(run_cli, model)
    page = tuned.get("flags", {}).get("--page-size")
    status, compared, err = _compare(run_cli, model, page)
    if "error" in tuned:
        # neither plans a model SGLang cannot run, for the same reason
        (row,) = compared["candidates"]
        assert status == 1 and tuned["error"] == row["error"] == compared["sglang_own"]["error"]
        return
    assert status == 0, err
    flags = tuned["flags"]
    assert compared["page_size"] == int(flags["--page-size"])
    (row,) = compared["candidates"]
    assert row["policy"] == "kind_pools" and "error" not in row
    # the pools kvcore plans for SGLang: the full pool's tokens, and both pools together
    assert int(flags["--max-total-tokens"]) == row["full_tokens"]
    assert tuned["kvcore_tokens"] == row["full_tokens"] + row["swa_tokens"]
    # a sliding pool (and its ratio) exactly where compare says SGLang builds one
    sliding = compared["hybrid_swa"] and row["swa_tokens"] > 0
    assert ("--swa-full-tokens-ratio" in flags) == sliding
    if sliding:
        assert float(flags["--swa-full-tokens-ratio"]) == round(row["swa_tokens"] / row["full_tokens"], 4)
    else:
        # no ratio to tell SGLang: its own sizing is the same in both
        own = compared["sglang_own"]
        assert tuned["engine_tokens"] == own["full_tokens"] + own["swa_tokens"]


def test_gemma_3_gets_no_sliding_pool_in_tune_either(run_cli):
    tuned = _tune(run_cli, "google/gemma-3-27b-it")
    assert "--swa-full-tokens-ratio" not in tuned["flags"]
    assert any("no sliding pool" in c["why"] for c in tuned["cannot_express"])
    # gpt-oss is on SGLang's list: its sliding pool and ratio stay
    assert "--swa-full-tokens-ratio" in _tune(run_cli, "openai/gpt-oss-20b")["flags"]
