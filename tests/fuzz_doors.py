"""The doors the fuzz suite knocks on, what it knocks with, and how an answer is judged.

A *door* is one way input enters kvcore: a spec file, a ``config.json``, the command line's
numbers, a saved plan. Each door function takes one generated input and returns an
:class:`Outcome`: kvcore refused it with a :class:`~kvcore.errors.KVCoreError` (or, on the
command line, exit 1 with one ``kvcore: error:`` line, or argparse's exit 2), or accepted it,
in which case every plan it made is checked with
:func:`kvcore.planning.invariants.plan_problems` (budget and live-page overlap) and must hold
one request of its ``max_model_len``. The file doors are also fed JSON nested past
``MAX_JSON_DEPTH``, numbers of more than 4,300 digits and files that never end
(``/dev/zero``); traces are simulated (arrivals ten million steps out included); a block pool
is driven with random calls (ids that cannot be hashed, lengths past ``max_model_len``, prefix
keys of 10**9 tokens, frees of pages a request holds) and must never give a block id two
holders. Anything else
(another exception, a traceback, a plan with problems) is a *failure*; the outcome carries it.

Used by ``tests/test_fuzz_doors.py`` (quick, the ``ci`` hypothesis profile) and by
``benchmarks/fuzz.py`` (>= 10,000 examples, counts per door).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from hypothesis import strategies as st

from kvcore import KVCoreError, SizingContext, plan_kv_cache
from kvcore.cli import main
from kvcore.frontends.hf_config import bundled_models
from kvcore.frontends.specfile import read_spec_file
from kvcore.limits import MAX_JSON_DEPTH
from kvcore.model_options import ModelOptions
from kvcore.plan import KVCachePlan
from kvcore.planning.invariants import plan_problems
from kvcore.planning.registry import Registry
from kvcore.planning.serialization import plan_from_dict, plan_to_dict

REGISTRY = Registry.default(autoload=False)
WORK = Path(tempfile.mkdtemp(prefix="kvcore-fuzz-"))


@attrs.frozen
class Outcome:
    """How kvcore answered one input.

    Attributes:
        kind: ``"refused"`` (a KVCoreError, or a one-line error and exit 1/2 on the command
            line), ``"accepted"``, or ``"failure"``.
        over_budget: accepted plans whose bytes exceed their budget.
        overlapping: accepted plans with live pages that share bytes (or another problem).
        detail: what went wrong, for a failure.
    """

    kind: str
    over_budget: int = 0
    overlapping: int = 0
    detail: str = ""


def _judge(plans: list[KVCachePlan]) -> Outcome:
    over = overlap = 0
    details = []
    for plan in plans:
        problems = plan_problems(plan)
        if not plan.fits():  # judged on its own, not only through the check under test
            problems.append(f"the plan holds no request of {plan.context.max_model_len} tokens")
        if plan.kv_cache_bytes > plan.available_memory_bytes or any("budget" in p for p in problems):
            over += 1
        if problems:
            overlap += 1
            details.extend(problems[:3])
    if over or overlap:
        return Outcome("failure", over_budget=over, overlapping=overlap, detail="; ".join(details))
    return Outcome("accepted")


def _guarded(run: Callable[[], list[KVCachePlan]]) -> Outcome:
    try:
        plans = run()
    except KVCoreError as exc:
        text = str(exc)
        if "\n" in text or not text:
            return Outcome("failure", detail=f"{type(exc).__name__} message is not one line: {text!r}")
        return Outcome("refused")
    except Exception as exc:
        return Outcome("failure", detail=f"{type(exc).__name__}: {exc}"[:500])
    return _judge(plans)


# -- values ---------------------------------------------------------------------------------

#: Numbers and near-numbers that break naive code: zero, negatives, floats, int64 and float
#: limits, numbers of hundreds of digits, strings, null.
HUGE = [2**31, 2**32 + 1, 2**53 + 1, 2**63, 2**64, 10**20, 10**400]
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5000),
    st.sampled_from([0, -1, *HUGE]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        ["", "16", "bfloat16", "fp8", "banana", "full_attention", "sliding_window", "a..b", "to"]
    ),
    st.lists(st.integers(-2, 300), max_size=3),
    st.dictionaries(st.sampled_from(["kind", "name", "shape", "dtype", "x"]), st.integers(0, 64), max_size=3),
)

SPEC_ENTRIES: list[dict[str, Any]] = [
    {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"},
    {
        "kind": "sliding_window",
        "block_size": 16,
        "num_kv_heads": 8,
        "head_size": 128,
        "dtype": "bfloat16",
        "sliding_window": 1024,
    },
    {
        "kind": "chunked_local_attention",
        "block_size": 16,
        "num_kv_heads": 4,
        "head_size": 64,
        "dtype": "float16",
        "attention_chunk_size": 512,
    },
    {"kind": "mla", "block_size": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "dtype": "bfloat16"},
    {
        "kind": "state",
        "block_size": 16,
        "parts": [
            {"name": "conv", "shape": [3, 256], "dtype": "bfloat16"},
            {"name": "ssm", "shape": [8, 64, 16], "dtype": "float32"},
        ],
    },
]
LAYER_NAMES = st.one_of(
    st.integers(0, 200).map(lambda i: f"model.layers.{i}.self_attn"),
    st.sampled_from(["", "a..b", "y.", "to", "training", "model.layers.0.forward", "_x", "l.0", "kv_cache"]),
    st.text(max_size=6),
)


@st.composite
def valid_spec_files(draw: st.DrawFn) -> dict[str, Any]:
    """A spec file kvcore should plan: 1-40 layers of the built-in kinds."""
    entries = draw(st.lists(st.sampled_from(SPEC_ENTRIES), min_size=1, max_size=40))
    return {"layers": {f"model.layers.{i}.self_attn": copy.deepcopy(e) for i, e in enumerate(entries)}}


def _mutate(draw: st.DrawFn, data: Any, steps: int) -> Any:
    """Replace, delete or add a few values anywhere in a JSON tree."""
    data = copy.deepcopy(data)
    for _ in range(steps):
        node, parents = data, []
        while isinstance(node, (dict, list)) and node and draw(st.integers(0, 3)):
            key = (
                draw(st.sampled_from(sorted(node, key=str)))
                if isinstance(node, dict)
                else draw(st.integers(0, len(node) - 1))
            )
            parents.append((node, key))
            node = node[key]
        if not parents:
            continue
        parent, key = parents[-1]
        action = draw(st.integers(0, 5))
        if action == 0 and isinstance(parent, dict):
            del parent[key]
        elif action == 1 and isinstance(parent, dict):
            parent[draw(LAYER_NAMES)] = draw(values)
        elif action == 2 and isinstance(node, int) and not isinstance(node, bool):
            parent[key] = node * draw(st.sampled_from([-1, 0, 2, 3, 1024, 2**40, 10**30]))
        else:
            parent[key] = draw(values)
    return data


@st.composite
def spec_file_texts(draw: st.DrawFn) -> bytes:
    """Bytes of a spec file: mutated valid files, random JSON, broken text."""
    choice = draw(st.integers(0, 9))
    if choice <= 5:
        data = _mutate(draw, draw(valid_spec_files()), draw(st.integers(0, 4)))
        text = json.dumps(data)
        layers = data.get("layers") if isinstance(data, dict) else None
        if draw(st.integers(0, 9)) == 0 and isinstance(layers, dict) and len(layers) > 1:
            first = next(iter(data["layers"]))  # name one layer twice
            text = text.replace('{"layers": {', f'{{"layers": {{"{first}": {{}}, ', 1)
        return text.encode()
    if choice <= 7:
        return json.dumps(
            draw(
                st.recursive(
                    values,
                    lambda v: (
                        st.lists(v, max_size=3)
                        | st.dictionaries(st.sampled_from(["layers", "kind", "l0", "x"]), v, max_size=3)
                    ),
                    max_leaves=10,
                )
            )
        ).encode()
    if choice == 8:
        return draw(hostile_json(json.dumps(draw(valid_spec_files()))))
    return draw(
        st.sampled_from(
            [
                b"\xff\xfe{}",
                b"",
                b"{",
                b"[" * 5000,
                b'{"layers": 1' + b"0" * 5000 + b"}",
                b'{"layers": {"a": {"kind": "full_attention", "block_size": 1e999}}}',
            ]
        )
    )


@st.composite
def hostile_json(draw: st.DrawFn, text: str) -> bytes:
    """``text`` (JSON) with one value replaced by arrays nested past the depth limit (up to
    100,000 deep, balanced or not) or by a number of more than 4,300 digits."""
    depth = draw(st.sampled_from([MAX_JSON_DEPTH + 1, 999, 1_000, 5_000, 100_000]))
    digits = draw(st.sampled_from([4_301, 5_000, 50_000]))
    value = draw(
        st.sampled_from(
            [
                "[" * depth + "]" * depth,
                "[" * depth,
                '{"a": ' * depth + "1" + "}" * depth,
                "1" + "0" * digits,
                "-" + "9" * digits,
            ]
        )
    )
    spots = [i for i, char in enumerate(text) if char == ":"] or [0]
    at = draw(st.sampled_from(spots)) + 1
    end = at + 1
    while end < len(text) and text[end] not in ",}]":  # replace a scalar where there is one
        end += 1
    return (text[:at] + " " + value + text[end:]).encode()


#: Budgets and lengths: mostly ones a plan fits in (so that accepted plans get checked), and the edges.
BUDGETS = st.one_of(
    st.sampled_from([2**30, 2**34, 80 * 2**30, 2**40]),
    st.sampled_from([2**34, 2**40]),
    st.integers(0, 2**40),
    st.sampled_from([0, 1, 2**20, 2**60]),
)
LENGTHS = st.one_of(
    st.sampled_from([16, 256, 4096, 32768]), st.integers(1, 2**20), st.sampled_from([1, 131072, 2**32])
)


# -- doors ------------------------------------------------------------------------------------


def spec_file_door(text: bytes, budget: int, max_model_len: int) -> Outcome:
    """Write a spec file, read it (:func:`read_spec_file`) and plan it."""
    path = WORK / "specs.json"
    path.write_bytes(text)
    return _guarded(
        lambda: [
            plan_kv_cache(
                read_spec_file(path, REGISTRY),
                budget,
                SizingContext(max_model_len=max_model_len),
                registry=REGISTRY,
            )
        ]
    )


CONFIGS = [m.config() for m in bundled_models()]


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A bundled config with fields deleted, retyped or made huge, here or in ``text_config``."""
    config: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(CONFIGS)))
    for _ in range(draw(st.integers(1, 4))):
        part = config
        if isinstance(config.get("text_config"), dict) and draw(st.booleans()):
            part = config["text_config"]
        key = (
            draw(st.sampled_from(sorted(part)))
            if part and draw(st.integers(0, 5))
            else draw(st.text(max_size=8))
        )
        action = draw(st.integers(0, 3))
        if action == 0:
            part.pop(key, None)
        elif action == 1 and isinstance(part.get(key), int) and not isinstance(part.get(key), bool):
            part[key] = part[key] * draw(st.sampled_from([0, -1, 3, 2**20, 2**62, 10**400]))
        else:
            part[key] = draw(values)
    return config


def config_door(
    config: Mapping[str, Any], tp: int, block_size: int, budget: int, max_model_len: int
) -> Outcome:
    """Read a config through the model families and plan it."""

    def run() -> list[KVCachePlan]:
        specs = REGISTRY.layer_specs(config, ModelOptions(tp=tp, block_size=block_size))
        return [plan_kv_cache(specs, budget, SizingContext(max_model_len=max_model_len), registry=REGISTRY)]

    return _guarded(run)


NUMBER_TEXTS = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.sampled_from(
        [
            "0",
            "1",
            "1e400",
            "1e999999",
            "1e9999999",
            "1" + "0" * 5000,
            "2**63",
            "-1",
            "1.5",
            "nan",
            "inf",
            "0x10",
            "1_000",
            "",
            " ",
            "24GiB",
            "1e25",
            "1EiB",
            "9" * 40,
            str(2**32 + 1),
        ]
    ),
    st.text(alphabet="0123456789eE.+-_GiBMKT ", max_size=12),
)
SOURCES = [
    ("--model", "meta-llama/Llama-3.2-1B"),
    ("--model", "google/gemma-3-27b-it"),
    ("--model", "ai21labs/AI21-Jamba-1.5-Mini"),
    ("--model", "deepseek-ai/DeepSeek-V3"),
    ("--model", "openai/whisper-large-v3"),
]


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """``kvcore plan|compare`` with random numbers for ``--memory`` (or ``--gpu-memory`` and
    ``--utilization``), ``--max-model-len``, ``--num-blocks``, ``--tp``, ``--pp``, ``--block-size``,
    ``--num-speculative-tokens`` and ``--max-encoder-tokens``, and random serving choices
    (``--speculative``, ``--state-cache-mode``)."""
    command = draw(st.sampled_from(["plan", "plan", "plan", "compare"]))
    argv = ["--no-plugin-autoload", command, *draw(st.sampled_from(SOURCES))]
    budget = draw(st.sampled_from(["--memory", "--memory", "--gpu-memory"]))
    argv += [budget, draw(NUMBER_TEXTS | st.sampled_from(["1GiB", "80GiB", "4TiB"]))]
    if budget == "--gpu-memory" and draw(st.booleans()):
        argv += ["--utilization", draw(NUMBER_TEXTS | st.sampled_from(["0.5", "0.9", "1"]))]
    argv += ["--max-model-len", draw(NUMBER_TEXTS | st.sampled_from(["4096", "131072"]))]
    for flag in ("--num-blocks", "--tp", "--block-size") + (("--pp",) if command == "plan" else ()):
        if draw(st.integers(0, 2)) == 0:
            argv += [flag, draw(NUMBER_TEXTS | st.sampled_from(["1", "2", "3", "4", "8"]))]
    for flag in ("--num-speculative-tokens", "--max-encoder-tokens"):
        if draw(st.integers(0, 3)) == 0:
            argv += [flag, draw(NUMBER_TEXTS | st.sampled_from(["0", "2", "1500"]))]
    choices_of = {"--speculative": ["mtp", "eagle", "medusa"], "--state-cache-mode": ["align", "all"]}
    for flag, choices in choices_of.items():
        if draw(st.integers(0, 3)) == 0:
            argv += [flag, draw(st.sampled_from(choices))]
    if command == "plan" and draw(st.booleans()):
        argv.append("--json")
    return argv


@st.composite
def tune_command_lines(draw: st.DrawFn) -> list[str]:
    """``kvcore tune`` on a small synthetic workload with random numbers for ``--memory``,
    ``--max-model-len`` and the search's lists (``--num-seqs``, ``--batched-tokens``,
    ``--block-sizes``, ``--passes``)."""
    argv = ["--no-plugin-autoload", "tune", "--model", "meta-llama/Llama-3.2-1B"]
    argv += ["--memory", draw(NUMBER_TEXTS | st.sampled_from(["64MiB", "1GiB"]))]
    argv += ["--max-model-len", draw(NUMBER_TEXTS | st.sampled_from(["512", "4096"]))]
    argv += ["--requests", "6", "--prompt-len", "uniform:8:200", "--output-len", "uniform:1:16"]
    argv += ["--policies", "shared_buffer"]
    for flag in ("--num-seqs", "--batched-tokens", "--block-sizes", "--passes"):
        if draw(st.booleans()):
            values = draw(
                st.lists(NUMBER_TEXTS | st.sampled_from(["1", "16", "256"]), min_size=1, max_size=3)
            )
            argv += [flag, ",".join(values) if flag != "--passes" else values[0]]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


def cli_door(argv: list[str]) -> Outcome:
    """Run ``kvcore`` in-process; judge the exit status, stderr and (``--json``) the plan."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:
        return Outcome("failure", detail=f"{type(exc).__name__}: {exc}"[:500])
    text = err.getvalue()
    if status == 0:
        if "--json" in argv and "--pp" not in argv and "--tp" not in argv and "tune" not in argv:
            report = json.loads(out.getvalue())
            return _guarded(lambda: [plan_from_dict(report, REGISTRY, check=False)])
        return Outcome("accepted")
    # warnings (a --max-model-len beyond the model's max_position_embeddings) may come first
    lines = [line for line in text.rstrip("\n").splitlines() if not line.startswith("kvcore: warning: ")]
    if status == 1 and len(lines) == 1 and lines[0].startswith("kvcore: error: "):
        return Outcome("refused")
    if status == 2 and lines and "error: " in lines[-1] and "Traceback" not in text:
        return Outcome("refused")
    return Outcome("failure", detail=f"exit {status}: {text[-500:]!r}")


@st.composite
def valid_plans(draw: st.DrawFn) -> dict[str, Any]:
    """The JSON of a plan kvcore made for a spec mix, by some policy."""
    data = draw(valid_spec_files())
    specs = read_spec_dict(data)
    policy = draw(st.sampled_from(["auto", "uniform", "shared_buffer", "equal_groups"]))
    budget = draw(st.sampled_from([2**26, 2**30, 2**34]))
    try:
        plan = plan_kv_cache(
            specs,
            budget,
            SizingContext(max_model_len=draw(st.sampled_from([16, 256, 4096]))),
            registry=REGISTRY,
            policy=policy,
        )
    except KVCoreError:
        plan = plan_kv_cache(specs, 2**40, SizingContext(max_model_len=16), registry=REGISTRY)
    return plan_to_dict(plan, REGISTRY)


def read_spec_dict(data: Mapping[str, Any]) -> Any:
    from kvcore.frontends.specfile import specs_from_dict

    return specs_from_dict(data, REGISTRY)


@st.composite
def mutated_plans(draw: st.DrawFn) -> dict[str, Any]:
    """A valid plan's JSON with a few values replaced, scaled, deleted or added, or shrunk to
    hold no request (see :func:`shrunk_plans`)."""
    if draw(st.integers(0, 3)) == 0:
        return draw(shrunk_plans())  # type: ignore[no-any-return]
    return _mutate(draw, draw(valid_plans()), draw(st.integers(1, 4)))  # type: ignore[no-any-return]


@st.composite
def shrunk_plans(draw: st.DrawFn) -> dict[str, Any]:
    """A valid plan's JSON edited so that it cannot hold one request of its ``max_model_len``
    but is otherwise sound: fewer blocks (0, 1, or one short) with the tensors shrunk to
    match, or a group's pages spanning ``2**40`` block ids. kvcore must refuse every one."""
    data = draw(valid_plans())
    if "pools" in data or not data.get("groups"):
        return data  # (several pools: the mutations above cover them)
    edit = draw(st.sampled_from(["blocks", "blocks", "span"]))
    if edit == "span":
        group = draw(st.sampled_from(data["groups"]))
        group["blocks_per_page"] = 2**40
        return data
    plan = plan_from_dict(data, REGISTRY)
    count = draw(st.sampled_from([0, 1, max(0, plan.blocks_per_request() - 1)]))
    if count >= data["num_blocks"]:
        return data
    for tensor in data["tensors"]:
        width = tensor["size"] - (data["num_blocks"] - 1) * tensor["page_stride"]  # its last page
        tensor["size"] = (count - 1) * tensor["page_stride"] + width if count else 0
    data["num_blocks"] = count
    return data


def plan_json_door(data: Any) -> Outcome:
    """Read a (mutated) plan back; an accepted plan must pass every check."""
    return _guarded(lambda: [plan_from_dict(data, REGISTRY)])


@st.composite
def plan_file_texts(draw: st.DrawFn) -> bytes:
    """Bytes of a saved plan: a mutated or shrunk plan, or one made hostile (deep, long numbers)."""
    text = json.dumps(draw(mutated_plans()))
    return draw(hostile_json(text)) if draw(st.booleans()) else text.encode()


def plan_file_door(text: bytes) -> Outcome:
    """Write a plan file and read it as ``kvcore check`` does; an accepted plan is judged."""
    from kvcore.cli.check import read_plan_file

    path = WORK / "plan.json"
    path.write_bytes(text)
    return _guarded(lambda: [read_plan_file(str(path), REGISTRY)])


#: The file readers of every file door, for the size bound.
def _readers() -> dict[str, Callable[[str], object]]:
    from kvcore.cli.check import read_plan_file
    from kvcore.frontends.hf_config import read_config_file
    from kvcore.simulation.workload import read_trace

    return {
        "spec file": lambda path: read_spec_file(path, REGISTRY),
        "config.json": read_config_file,
        "plan": lambda path: read_plan_file(path, REGISTRY),
        "trace": read_trace,
    }


def input_size_door(reader: str, source: str, limit: int) -> Outcome:
    """Read a file that never ends (``/dev/zero``) or one larger than the byte limit (lowered
    to ``limit`` for the run): refused with a KVCoreError, never read to the end."""
    from kvcore import limits

    path = source
    if source == "large file":
        path = str(WORK / "large.json")
        Path(path).write_bytes(b"[" + b"0, " * limit + b"0]")
    kept = limits.MAX_INPUT_BYTES
    limits.MAX_INPUT_BYTES = limit
    try:

        def read() -> list[KVCachePlan]:
            _readers()[reader](path)
            return []

        outcome = _guarded(read)
    finally:
        limits.MAX_INPUT_BYTES = kept
    if outcome.kind == "accepted":  # the file exceeds the limit: accepting it is a failure
        return Outcome("failure", detail=f"{reader} read {source} past {limit} bytes")
    return outcome


@st.composite
def trace_texts(draw: st.DrawFn) -> bytes:
    """A JSON-lines trace: a few requests with random (often huge) fields, one line made hostile."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        sound = draw(st.integers(0, 3)) > 0  # mostly requests the plan serves, so they are simulated
        line: dict[str, Any] = {
            "prompt_tokens": draw(st.integers(1, 40) if sound else values),
            "output_tokens": draw(st.integers(1, 8) if sound else values),
        }
        if draw(st.booleans()):
            line["arrival_step"] = draw(
                st.one_of(st.integers(0, 5), st.sampled_from([10**6, 10**7, 10**7 + 1, 2**63]), values)
                if not sound
                else st.one_of(st.integers(0, 5), st.sampled_from([10**6, 10**7 - 1, 10**7]))
            )
        lines.append(json.dumps(line))
    if draw(st.integers(0, 3)) == 0:
        index = draw(st.integers(0, len(lines) - 1))
        lines[index] = draw(hostile_json(lines[index])).decode()
    return "\n".join(lines).encode()


TRACE_PLAN = plan_kv_cache(
    {"model.layers.0": read_spec_dict({"layers": {"l": SPEC_ENTRIES[0]}})["l"],
     "model.layers.1": read_spec_dict({"layers": {"l": SPEC_ENTRIES[1]}})["l"]},
    2**30,
    SizingContext(max_model_len=64, max_num_batched_tokens=16),
    registry=REGISTRY,
)  # fmt: skip


def trace_door(text: bytes) -> Outcome:
    """Read a trace and simulate it on a small plan (an arrival ten million steps out included):
    refused with a KVCoreError, or simulated; nothing else."""
    from kvcore.simulation.simulator import simulate
    from kvcore.simulation.workload import read_trace

    path = WORK / "trace.jsonl"
    path.write_bytes(text)

    def run() -> list[KVCachePlan]:
        result = simulate(TRACE_PLAN, read_trace(path))
        if len(result.running) != result.steps:
            raise AssertionError(f"{result.steps} steps but {len(result.running)} recorded")
        return [TRACE_PLAN]

    return _guarded(run)


#: What a block-pool session does: (operation, request id, number).
POOL_IDS = st.one_of(st.integers(0, 3), st.sampled_from(["a", "b"]), st.just([1]), st.just({"id": 0}))
POOL_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["reserve", "reserve", "attach", "free held", "free own", "allocate", "free_request", "release"]
        ),
        POOL_IDS,
        st.one_of(st.integers(0, 80), st.sampled_from([63, 64, 65, 2**20, 10**9, -1])),
    ),
    max_size=12,
)


def block_pool_door(ops: list[tuple[str, Any, int]], caching: bool, lowest_first: bool) -> Outcome:
    """Drive a :class:`~kvcore.runtime.block_pool.BlockPool` with random calls: reserves past
    ``max_model_len``, prefix keys of 10**9 tokens, unhashable ids, frees of pages a request
    holds. Each call is refused with a KVCoreError or done; after each, no block id may have
    two holders (request tables and ``allocate()``'s pages together), and the free count must
    match."""
    from kvcore.runtime.block_pool import NULL_PAGE, BlockPool
    from kvcore.runtime.prefix_cache import PrefixKey

    pool = BlockPool(TRACE_PLAN, prefix_caching=caching, lowest_first=lowest_first)
    own: dict[int, list[int]] = {}  # pages allocate() handed out, per group
    refused = False
    for op, rid, number in ops:
        try:
            if op == "reserve":
                pool.reserve(rid, number)
            elif op == "attach":
                pool.attach_prefix(rid, PrefixKey("p", number))
            elif op == "free held":
                pages = [p for p in pool.block_table(rid, 0) if p != NULL_PAGE][: max(1, number % 4)]
                pool.free(0, pages)
            elif op == "free own":
                pages = own.get(number % 2, [])[: max(1, number % 3)]
                pool.free(number % 2, pages)
                own[number % 2] = own.get(number % 2, [])[len(pages) :]
            elif op == "allocate":
                own.setdefault(number % 2, []).extend(pool.allocate(number % 2, number % 5))
            elif op == "free_request":
                pool.free_request(rid)
            else:
                pool.release_stale(rid, number)
        except KVCoreError as exc:
            if "\n" in str(exc) or not str(exc):
                return Outcome("failure", detail=f"{type(exc).__name__} message is not one line: {exc!s}")
            refused = True
        except Exception as exc:
            return Outcome("failure", detail=f"{op}({rid!r}, {number}): {type(exc).__name__}: {exc}"[:500])
        held = [b for g, pages in own.items() for p in pages for b in pool.blocks_of(g, p)]
        for request in pool.requests:
            for g in range(len(TRACE_PLAN.groups)):
                for page in pool.live_pages(request, g):
                    held.extend(pool.blocks_of(g, page))
        if len(held) != len(set(held)) and not caching:  # (a cache shares blocks by design)
            return Outcome(
                "failure", overlapping=1, detail=f"after {op}({rid!r}, {number}): a block id has two holders"
            )
        if not caching and pool.num_free_blocks != TRACE_PLAN.usable_blocks - len(set(held)):
            return Outcome("failure", detail=f"after {op}({rid!r}, {number}): the free count is off")
    return Outcome("refused" if refused else "accepted")  # (refused: at least one call was)


#: Every door: its name, the strategy of its inputs (keyword arguments) and its function.
DOORS: dict[str, tuple[Any, Callable[..., Outcome]]] = {
    "spec file": (
        st.fixed_dictionaries({"text": spec_file_texts(), "budget": BUDGETS, "max_model_len": LENGTHS}),
        spec_file_door,
    ),
    "config.json": (
        st.fixed_dictionaries(
            {
                "config": mutated_configs(),
                "tp": st.sampled_from([1, 2, 3, 4, 8, 64]),
                "block_size": st.sampled_from([1, 16, 64]),
                "budget": BUDGETS,
                "max_model_len": LENGTHS,
            }
        ),
        config_door,
    ),
    "command line": (st.fixed_dictionaries({"argv": command_lines()}), cli_door),
    "tune numbers": (st.fixed_dictionaries({"argv": tune_command_lines()}), cli_door),
    "plan JSON": (st.fixed_dictionaries({"data": mutated_plans()}), plan_json_door),
    "plan file": (st.fixed_dictionaries({"text": plan_file_texts()}), plan_file_door),
    "input size": (
        st.fixed_dictionaries(
            {
                "reader": st.sampled_from(["spec file", "config.json", "plan", "trace"]),
                "source": st.sampled_from(["/dev/zero", "large file"]),
                "limit": st.sampled_from([1, 4096, 65536]),
            }
        ),
        input_size_door,
    ),
    "trace": (st.fixed_dictionaries({"text": trace_texts()}), trace_door),
    "block pool": (
        st.fixed_dictionaries({"ops": POOL_OPS, "caching": st.booleans(), "lowest_first": st.booleans()}),
        block_pool_door,
    ),
}
