"""vLLM's own KV cache specs against kvcore's, architecture by architecture (the table in
``docs/reference/models.md``, made by :mod:`~tests.integrations.vllm_engine.architectures`).

vLLM's CPU worker builds each tiny model with dummy weights in a subprocess (several models in
one) and reports its per-layer specs; kvcore reads the same config. A representative set, one
per kind of cache layout, runs in the quick run; the whole registry (about ten minutes here)
runs under ``slow`` (CI names this directory, which runs it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.vllm_engine.architectures import (
    KNOWN_DIFFERENCES,
    build_rows,
    page_table,
    render,
    vllm_architectures,
)

#: One architecture per kind of layout: all full (Llama), alternating sliding / full (Gemma-2),
#: five sliding to one full (Gemma-3), sliding on every layer (Mistral), Phi-3, a
#: linear-attention state hybrid (Qwen3-Next), a Mamba hybrid (Jamba), Mamba-2 with a shared
#: attention block (Zamba2, compared in vLLM's build order), a mixture of experts (Mixtral: its
#: parameters against vLLM's) and a family kvcore does not know (Bloom, refused by name).
REPRESENTATIVE = (
    "LlamaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "Qwen3NextForCausalLM",
    "JambaForCausalLM",
    "Zamba2ForCausalLM",
    "MixtralForCausalLM",
    "BloomForCausalLM",
)


def _page_rows() -> dict[str, str]:
    lines = [line for line in page_table().splitlines() if line.startswith("| `")]
    return {line.split("`")[1]: line for line in lines}


def _check_rows(rows: list[dict[str, str]]) -> None:
    on_page = _page_rows()
    for row, line in zip(rows, render(rows).splitlines()[2:], strict=True):
        verdict = row["verdict"]
        if verdict.startswith("differs"):
            assert row["arch"] in KNOWN_DIFFERENCES, (
                f"{row['arch']}: kvcore's specs differ from vLLM's and nobody said why: {verdict}"
            )
        assert not verdict.startswith("error"), f"{row['arch']}: the comparison itself failed: {verdict}"
        assert on_page.get(row["arch"]) == line, (
            f"{row['arch']}: the page says\n{on_page.get(row['arch'])}\nthe engine\n{line}\n"
            "rerun python -m tests.integrations.vllm_engine.architectures --write"
        )


def test_representative_architectures_match_the_page(tmp_path: Path) -> None:
    rows = build_rows(list(REPRESENTATIVE), tmp_path, timeout=900)
    _check_rows(rows)
    verdicts = {row["arch"]: row["verdict"] for row in rows}
    for arch in REPRESENTATIVE[:-1]:
        assert verdicts[arch].startswith("same"), (arch, verdicts[arch])
    weights = {row["arch"]: (row.get("vllm_params"), row.get("kvcore_params")) for row in rows}
    vllm_count, kvcore_count = weights["MixtralForCausalLM"]
    assert isinstance(vllm_count, int) and vllm_count == kvcore_count
    assert verdicts["BloomForCausalLM"].startswith("kvcore refuses it"), verdicts["BloomForCausalLM"]


@pytest.mark.slow  # every architecture of vLLM's registry, one build each (about ten minutes)
def test_every_architecture_matches_the_page(tmp_path: Path) -> None:
    archs = vllm_architectures()
    rows = build_rows(archs, tmp_path, timeout=3000)
    _check_rows(rows)
    assert render(rows) == page_table(), (
        "rerun python -m tests.integrations.vllm_engine.architectures --write"
    )
    stale = sorted(set(KNOWN_DIFFERENCES) - {r["arch"] for r in rows if r["verdict"].startswith("differs")})
    assert not stale, f"KNOWN_DIFFERENCES lists architectures that no longer differ: {stale}"
