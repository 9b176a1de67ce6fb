"""Every fenced block of README.md and docs/, and how the tests check it.

A shell block (``console``, ``sh``) or Python block must carry one marker, an HTML comment on the
line before its fence, saying how it is checked; :func:`check_marked` refuses a block without
one, and ``tests/meta/test_doc_blocks.py`` runs every block a marker says to run:

- ``<!-- checked-output -->``: a ``console`` block of one ``$ kvcore ...`` command and its
  output; the command runs in-process and its stdout must equal the output.
  ``checked-output: slow`` marks it slow (``pytest -m slow``); ``checked-output: vllm`` is run by
  ``tests/integrations/vllm/test_howto.py`` (it needs vLLM).
- ``<!-- checked-excerpt -->``: a ``console`` block of ``$`` commands (``kvcore ...``, with
  ``VAR=value`` before it, or ``> /dev/null`` after it to show stderr), each followed by an
  excerpt of its output: a line ``...`` stands for any lines, ``...`` inside a line for any text
  (figures that change from machine to machine: memory free, milliseconds); a command shown
  without output only has to succeed. The exit status must be 1 where the excerpt shows
  ``kvcore: error:``, else 0. ``python SCRIPT.py ARGS`` runs a script the same way.
- ``<!-- checked-code -->``: a ``python`` block, run (in the repository root, in a fresh
  namespace; ``checked-code: continues`` in the namespace of the page's previous block,
  ``checked-code: slow`` marks it slow). A ``<!-- code-output -->`` block right after it is
  what it must print (with the excerpt's ``...``); so are ``# `` comment lines that end a block
  which prints.
- ``<!-- quote: PATH -->``: code copied from the file PATH, which must contain it
  (``tests/meta/test_docs.py``); the file itself is run by its own tests.
- ``<!-- run-by: TEST -->``: run by the test file TEST, which names the page.
- ``<!-- synopsis -->``: a command's or a Python callable's syntax: every ``--flag`` must be one
  the command takes, or every parameter one the callable has.
- ``<!-- not-run: REASON -->``: cannot run in the default test run (needs vLLM, SGLang, a GPU,
  torchrun, the network, or installs packages); the reason is required.

``text``, ``json``, ``jsonl`` and ``toml`` blocks are output, formulas, diagrams or data; a ``json``
block must parse, and none may hide a command (a ``text`` block may not start with ``$``).
``python tests/meta/doc_blocks.py --write`` pastes current outputs into the ``checked-output``
blocks (read the diff before committing it).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import os
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"^<!-- ([a-z-]+)(?::\s*(.*?))? -->$")
#: Markers that say how a block runs (or why it does not).
RUN_MARKERS = (
    "checked-output",
    "checked-excerpt",
    "checked-code",
    "code-output",
    "quote",
    "run-by",
    "synopsis",
    "not-run",
)
SHELL = ("console", "sh")
DATA = ("text", "json", "jsonl", "toml")
#: Names the kvcore command line is run by in a doc block.
KVCORE = "kvcore"


@attrs.frozen
class Block:
    """One fenced block.

    Attributes:
        page: the Markdown file.
        line: the fence's line (1-based).
        lang: the fence's language (``""`` when none is given).
        code: the text between the fences.
        marker: the marker on the line before (``""`` when none).
        arg: the marker's argument (``""`` when none).
    """

    page: Path
    line: int
    lang: str
    code: str
    marker: str = ""
    arg: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(pages: tuple[Path, ...] = PAGES) -> list[Block]:
    """Every fenced block of ``pages``, in order."""
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            marker = MARKER.match(before)
            found.append(
                Block(
                    page=page,
                    line=text.count("\n", 0, match.start()) + 1,
                    lang=match.group(1),
                    code=match.group(2),
                    marker=marker.group(1) if marker else "",
                    arg=(marker.group(2) or "") if marker else "",
                )
            )
    return found


def check_marked(block: Block) -> str | None:
    """Why ``block`` is not covered by a check (``None``: it is)."""
    if block.lang in SHELL or block.lang == "python":
        if block.marker not in RUN_MARKERS:
            return f"a {block.lang} block needs a marker: one of {', '.join(RUN_MARKERS)}"
        if block.marker == "not-run" and len(block.arg) < 10:
            return "<!-- not-run: REASON -->: say why it cannot run in the tests"
        if block.marker == "checked-output" and block.arg not in ("", "slow", "vllm"):
            return f"checked-output: {block.arg!r}: only slow or vllm"
        if block.marker == "checked-code" and block.arg not in ("", "slow", "vllm", "continues"):
            return f"checked-code: {block.arg!r}: only slow, vllm or continues"
        return None
    if block.lang == "text" and block.marker == "synopsis":
        return None
    if block.lang in DATA:
        first = block.code.lstrip().split("\n", 1)[0]
        if first.startswith("$ ") or re.match(r"(kvcore|pip|python3?) (?!trace:)", first):
            return f"a {block.lang} block that starts with a command: mark it console and check it"
        return None
    return f"language {block.lang!r}: give the fence one of {', '.join((*SHELL, 'python', *DATA))}"


def console_runs(code: str) -> list[tuple[str, str]]:
    """``(command, output)`` for each ``$`` line of a console block (with the lines a trailing
    ``\\`` continues it on) and the lines after it."""
    runs: list[tuple[str, list[str]]] = []
    going = False
    for line in code.splitlines():
        if going:
            command, lines = runs[-1]
            runs[-1] = (f"{command[:-1].rstrip()} {line.strip()}", lines)
            going = line.endswith("\\")
        elif line.startswith("$ "):
            runs.append((line[2:], []))
            going = line.endswith("\\")
        elif runs:
            runs[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block output before any $ command: {line!r}")
    return [(command, "".join(f"{line}\n" for line in lines)) for command, lines in runs]


def run_command(command: str, *, merged: bool = False) -> tuple[int, str, str]:
    """Run one documented ``kvcore`` command in-process: ``(status, stdout, stderr)``, or with
    ``merged`` ``(status, stdout and stderr as a terminal shows them, "")``.

    ``VAR=value`` words before ``kvcore`` are set for the run; a trailing ``> FILE`` writes
    stdout to FILE (``/dev/null``: drops it; the block then shows stderr)."""
    from kvcore.cli import main

    argv = shlex.split(command.split("  #", 1)[0])
    env = {}
    while argv and "=" in argv[0] and argv[0] != KVCORE:
        name, value = argv.pop(0).split("=", 1)
        env[name] = value
    target = argv[-1] if len(argv) > 2 and argv[-2] == ">" else None
    argv = argv[:-2] if target else argv
    if argv[:1] in (["python"], ["python3"]) and argv[1:2] and (argv[1].endswith(".py") or argv[1] == "-m"):
        return _run_script(argv[1:], env, merged=merged)
    if not argv or argv[0] != KVCORE:
        raise ValueError(f"not a kvcore or python script command: {command!r}")
    out = io.StringIO()
    err = out if merged else io.StringIO()
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        with (
            contextlib.redirect_stdout(kept := io.StringIO() if target else out),
            contextlib.redirect_stderr(err),
        ):
            try:
                status = main(argv[1:])
            except SystemExit as exc:  # argparse's own exits
                status = int(exc.code or 0)
        if target and target != "/dev/null":
            Path(target).write_text(kept.getvalue(), encoding="utf-8")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return status, out.getvalue(), "" if merged else err.getvalue()


def _run_script(argv: list[str], env: dict[str, str], *, merged: bool) -> tuple[int, str, str]:
    """``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` in-process (``runpy``), as
    :func:`run_command` runs ``kvcore``."""
    import runpy

    out = io.StringIO()
    err = out if merged else io.StringIO()
    saved_argv, saved_env = sys.argv, {name: os.environ.get(name) for name in env}
    sys.argv = list(argv)
    os.environ.update(env)
    status = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if argv[0] == "-m":
                    import importlib.util

                    spec = importlib.util.find_spec(argv[1])
                    assert spec is not None and spec.origin, f"no module {argv[1]}"
                    sys.argv = [spec.origin, *argv[2:]]
                    runpy.run_path(spec.origin, run_name="__main__")
                else:
                    runpy.run_path(argv[0], run_name="__main__")
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved_argv
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return status, out.getvalue(), "" if merged else err.getvalue()


def matches(shown: str, actual: str) -> bool:
    """Whether ``actual`` output fits the excerpt ``shown``: line by line, a line ``...`` for any
    lines (none included), ``...`` inside a line for any text."""
    want = shown.rstrip("\n").split("\n") if shown.strip() else []
    have = actual.rstrip("\n").split("\n") if actual.strip() else []

    def line_fits(pattern: str, line: str) -> bool:
        if "..." not in pattern:
            return pattern.rstrip() == line.rstrip()
        escaped = "".join(
            "*" if part == "..." else re.sub(r"([*?\[])", r"[\1]", part)
            for part in re.split(r"(\.\.\.)", pattern)
        )
        return fnmatch.fnmatchcase(line.rstrip(), escaped.rstrip())

    def fits(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(have)
        if want[i].strip() == "...":
            return any(fits(i + 1, k) for k in range(j, len(have) + 1))
        return j < len(have) and line_fits(want[i], have[j]) and fits(i + 1, j + 1)

    return fits(0, 0)


def run_python(code: str, namespace: dict[str, object], name: str) -> str:
    """Run a Python block in ``namespace`` (in the current folder); what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), namespace)
    return out.getvalue()


def trailing_output(code: str) -> str | None:
    """The output a Python block shows in its last lines, as ``# `` comments (``None``: none)."""
    lines = code.rstrip("\n").split("\n")
    shown: list[str] = []
    while lines and lines[-1].startswith("# "):
        shown.insert(0, lines.pop()[2:])
    return "".join(f"{line}\n" for line in shown) if shown else None


def reader_folder(folder: Path) -> Path:
    """``folder`` made to look like a checkout (its top-level entries linked), so that a block's
    relative paths resolve and what it writes stays out of the repository."""
    for entry in ("examples", "benchmarks", "docs", "kvcore", "tests", "constraints.txt", "pyproject.toml"):
        (folder / entry).symlink_to(ROOT / entry)
    return folder


def expected_status(shown: str) -> int:
    """The exit status an excerpt implies: 1 where it shows ``kvcore: error:``, else 0."""
    return 1 if any(line.startswith("kvcore: error:") for line in shown.splitlines()) else 0


def code_chains(found: list[Block]) -> Iterator[tuple[Block, list[Block], Block | None]]:
    """``(block, the blocks it continues, its code-output block or None)`` for every
    ``checked-code`` block; ``checked-code: continues`` continues the page's ``checked-code`` and
    ``checked-excerpt`` blocks before it."""
    chain: list[Block] = []
    for index, block in enumerate(found):
        if block.marker == "checked-excerpt":
            chain = [*chain, block] if chain and chain[-1].page == block.page else [block]
            continue
        if block.marker != "checked-code":
            continue
        if block.arg != "continues" or not chain or chain[-1].page != block.page:
            chain = []
        after = found[index + 1] if index + 1 < len(found) else None
        output = (
            after
            if after is not None and after.marker == "code-output" and after.page == block.page
            else None
        )
        yield block, list(chain), output
        chain = [*chain, block]


def write_outputs() -> int:
    """Paste each ``checked-output`` command's current stdout into its block; the pages changed."""
    changed = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")

        def paste(match: re.Match[str]) -> str:
            command = match.group(2)
            _, out, _ = run_command(command)
            return f"{match.group(1)}$ {command}\n{out}```"

        new = re.sub(
            r"(<!-- checked-output(?:: slow)? -->\n```console\n)\$ (.*?)\n.*?```", paste, text, flags=re.S
        )
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed += 1
            print(f"updated {page.relative_to(ROOT)}", file=sys.stderr)
    return changed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--write", action="store_true", help="paste current outputs into checked-output blocks"
    )
    if parser.parse_args().write:
        from kvcore.planning.manager import ENV_BLOCK, ENV_DISABLE_AUTOLOAD, ENV_TRACE

        for variable in (ENV_DISABLE_AUTOLOAD, ENV_BLOCK, ENV_TRACE):  # as test_docs.py runs them
            os.environ.pop(variable, None)
        os.chdir(ROOT)
        write_outputs()
