"""Every shell and Python block of README.md and docs/ runs in a test, or says why it cannot.

The markers are :mod:`tests.meta.doc_blocks`'; ``checked-output`` blocks are run by
``tests/meta/test_docs.py`` (``test_documented_outputs_are_current``), ``quote`` blocks compared
with their files there too; the rest run here.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re

import pytest

from kvcore.cli import build_parser
from kvcore.planning.manager import ENV_BLOCK, ENV_DISABLE_AUTOLOAD, ENV_TRACE
from tests.meta import doc_blocks
from tests.meta.doc_blocks import ROOT, Block

BLOCKS = doc_blocks.blocks()


def _param(block: Block, *values: object) -> object:
    marks = [pytest.mark.slow] if "slow" in block.arg else []
    return pytest.param(*values, id=block.id, marks=marks)


@pytest.fixture
def docs_env(monkeypatch, tmp_path):
    """The environment a reader has: plugins autoloaded, none blocked, no tracing, in a checkout
    (a folder of links to it, so that what a block writes stays out of the repository)."""
    for name in (ENV_DISABLE_AUTOLOAD, ENV_BLOCK, ENV_TRACE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(doc_blocks.reader_folder(tmp_path))


def test_every_shell_and_python_block_is_checked_or_says_why_not():
    problems = [f"{b.id}: {why}" for b in BLOCKS if (why := doc_blocks.check_marked(b)) is not None]
    assert problems == [], "\n".join(problems)


def test_the_marker_scan_sees_every_block_and_every_unmarked_one_fails():
    # the scan finds the blocks (README and docs pages), and refuses an unmarked command
    assert len(BLOCKS) > 100 and any(b.page.name == "README.md" for b in BLOCKS)
    bare = Block(page=ROOT / "README.md", line=1, lang="console", code="$ kvcore plan\n")
    assert "needs a marker" in (doc_blocks.check_marked(bare) or "")
    assert "language ''" in (doc_blocks.check_marked(Block(page=ROOT, line=1, lang="", code="x\n")) or "")
    hidden = Block(page=ROOT, line=1, lang="text", code="kvcore plan --model x\n")
    assert "starts with a command" in (doc_blocks.check_marked(hidden) or "")
    vague = Block(page=ROOT, line=1, lang="python", code="x = 1\n", marker="not-run", arg="no")
    assert "say why" in (doc_blocks.check_marked(vague) or "")


def test_excerpts_match_as_documented():
    assert doc_blocks.matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert doc_blocks.matches("took ... ms\n", "took 4.2 ms\n")
    assert not doc_blocks.matches("a\nd\n", "a\nb\nd\n")
    assert not doc_blocks.matches("took ... s\n", "took 4.2 ms\n")


EXCERPTS = [_param(b, b) for b in BLOCKS if b.marker == "checked-excerpt"]


@pytest.mark.parametrize("block", EXCERPTS)
def test_excerpted_commands_print_what_the_page_shows(docs_env, block):
    runs = doc_blocks.console_runs(block.code)
    assert runs, f"{block.id}: no $ command"
    for command, shown in runs:
        status, out, _ = doc_blocks.run_command(command, merged=True)
        # a command shown without output is checked to run (its exit status)
        assert not shown or doc_blocks.matches(shown, out), f"{block.id}: `{command}` printed:\n{out}"
        assert status == doc_blocks.expected_status(shown), f"{block.id}: `{command}` exited {status}"


CODE = [
    _param(b, b, chain, output)
    for b, chain, output in doc_blocks.code_chains(BLOCKS)
    if b.arg != "vllm"  # tests/integrations/vllm/test_howto.py runs those
]


@pytest.mark.parametrize(("block", "chain", "output"), CODE)
def test_python_blocks_run(docs_env, block, chain, output):
    namespace: dict[str, object] = {"__name__": "__doc_block__"}
    for earlier in chain:
        if earlier.marker == "checked-excerpt":
            for command, _ in doc_blocks.console_runs(earlier.code):
                doc_blocks.run_command(command)
        else:
            doc_blocks.run_python(earlier.code, namespace, earlier.id)
    printed = doc_blocks.run_python(block.code, namespace, block.id)
    shown = output.code if output is not None else doc_blocks.trailing_output(block.code)
    if shown is not None and (output is not None or printed):
        assert doc_blocks.matches(shown, printed), f"{block.id} printed:\n{printed}"


RUN_BY = [_param(b, b) for b in BLOCKS if b.marker == "run-by"]


@pytest.mark.parametrize("block", RUN_BY)
def test_blocks_run_elsewhere_name_a_test_that_reads_their_page(block):
    test = ROOT / block.arg
    assert test.is_file() and test.name.startswith("test_"), f"{block.id}: no test file {block.arg}"
    assert block.page.name in test.read_text(encoding="utf-8"), f"{block.arg} does not read {block.page.name}"


def _subparser(name: str):
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return parser, commands.choices[name]


def _cli_synopsis_problems(code: str) -> list[str]:
    words = code.split()
    parser, sub = words[0], None
    assert parser == "kvcore"
    top = build_parser()
    flags = {f for a in top._actions for f in a.option_strings}
    names = [w for w in words[1:] if re.fullmatch(r"[a-z]+", w)]
    if names:
        _, sub = _subparser(names[0])
        flags |= {f for a in sub._actions for f in a.option_strings}
    used = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", code))
    return sorted(used - flags)


def _python_synopsis_problems(code: str) -> list[str]:
    match = re.match(r"\s*(?:\w+ = )?([A-Za-z_][\w.]*)\((.*)\)", code, re.S)
    assert match, f"not a call signature: {code[:60]!r}"
    name, params = match.group(1), match.group(2)
    module = importlib.import_module("kvcore")
    target = getattr(module, name)
    have = set(inspect.signature(target).parameters)
    named = [p.split("=")[0].strip() for p in params.split(",")]
    return [p for p in named if p and p not in ("*", "/") and p not in have]


SYNOPSES = [_param(b, b) for b in BLOCKS if b.marker == "synopsis"]


@pytest.mark.parametrize("block", SYNOPSES)
def test_synopses_name_real_options(block):
    if block.lang == "python":
        problems = _python_synopsis_problems(block.code)
    else:
        problems = _cli_synopsis_problems(block.code)
    assert problems == [], f"{block.id}: no such options or parameters {problems}"


# a quote may be an excerpt of its file (its first lines); the file itself is read by its tests
JSON = [_param(b, b) for b in BLOCKS if b.lang in ("json", "jsonl") and b.marker != "quote"]


@pytest.mark.parametrize("block", JSON)
def test_json_blocks_parse(block):
    texts = block.code.splitlines() if block.lang == "jsonl" else [block.code]
    for text in texts:
        if text.strip():
            json.loads(text)
