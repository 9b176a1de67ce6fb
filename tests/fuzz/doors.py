"""The doors the fuzz suite knocks on, what it knocks with, and how an answer is judged.

A *door* is one way input enters kvcore: a spec file, a ``config.json``, the command line's
numbers, a saved plan. Each door function takes one generated input and returns an
:class:`Outcome`: kvcore refused it with a :class:`~kvcore.errors.KVCoreError` (or, on the
command line, exit 1 with one ``kvcore: error:`` line, or argparse's exit 2), or accepted it,
in which case every plan it made is checked with
:func:`kvcore.planning.invariants.plan_problems` (budget and live-page overlap). Anything else
(another exception, a traceback, a plan with problems) is a *failure*; the outcome carries it.

Used by ``tests/fuzz/test_doors.py`` (quick, the ``ci`` hypothesis profile) and by
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
        if "--json" in argv and "--pp" not in argv and "--tp" not in argv:
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
    """A valid plan's JSON with a few values replaced, scaled, deleted or added."""
    return _mutate(draw, draw(valid_plans()), draw(st.integers(1, 4)))  # type: ignore[no-any-return]


def plan_json_door(data: Any) -> Outcome:
    """Read a (mutated) plan back; an accepted plan must pass every check."""
    return _guarded(lambda: [plan_from_dict(data, REGISTRY)])


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
    "plan JSON": (st.fixed_dictionaries({"data": mutated_plans()}), plan_json_door),
}
