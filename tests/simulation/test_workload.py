"""Workloads: trace files (every problem named file:line), length distributions, Poisson arrivals."""

from __future__ import annotations

import contextlib
import random
import statistics

import pytest
from hypothesis import given, strategies as st

from kvcore import InvalidInputError, KVCoreError, Request, Workload, read_trace, synthetic
from kvcore.limits import MAX_TOKENS
from kvcore.simulation import workload as workload_module
from kvcore.simulation.workload import MAX_ARRIVAL_STEP, LengthDist, parse_length


def _trace(tmp_path, text, name="trace.jsonl"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_a_trace_reads_in_file_order_and_sorts_by_arrival(tmp_path):
    path = _trace(
        tmp_path,
        '{"prompt_tokens": 10, "output_tokens": 2, "arrival_step": 5}\n'
        "\n"
        '{"prompt_tokens": 20, "output_tokens": 3}\n'
        '   \n{"output_tokens": 1, "prompt_tokens": 7, "arrival_step": 5}',
    )
    workload = read_trace(path)
    assert workload.name == "trace.jsonl"
    assert workload.requests == (Request(1, 20, 3, 0), Request(0, 10, 2, 5), Request(2, 7, 1, 5))
    assert workload.longest == 23 and len(workload) == 3


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        (b'{"prompt_tokens": 1, "output_tokens": 1}\n\xff\xfe\n', 2, "not UTF-8"),
        ('{"prompt_tokens": 1, "output_tokens": 1}\n{"prompt_tokens": 1,\n', 2, "not valid JSON"),
        ("[1, 2]\n", 1, "must be a JSON object"),
        ('{"prompt_tokens": 3}\n', 1, "missing 'output_tokens'"),
        ('{"prompt_tokens": 3, "output_tokens": 1, "priority": 2}\n', 1, "unknown key(s) 'priority'"),
        ('{"prompt_tokens": "3", "output_tokens": 1}\n', 1, "'prompt_tokens' must be an int >= 1"),
        ('{"prompt_tokens": 3.0, "output_tokens": 1}\n', 1, "'prompt_tokens' must be an int"),
        ('{"prompt_tokens": true, "output_tokens": 1}\n', 1, "'prompt_tokens' must be an int"),
        ('{"prompt_tokens": 3, "output_tokens": 0}\n', 1, "'output_tokens' must be an int >= 1"),
        (
            '{"prompt_tokens": 3, "output_tokens": 1, "arrival_step": -1}\n',
            1,
            "'arrival_step' must be an int >= 0",
        ),
        (f'{{"prompt_tokens": {MAX_TOKENS + 1}, "output_tokens": 1}}\n', 1, "MAX_TOKENS"),
        (
            f'{{"prompt_tokens": 1, "output_tokens": 1, "arrival_step": {MAX_ARRIVAL_STEP + 1}}}\n',
            1,
            "MAX_ARRIVAL",
        ),
        ("[" * 100_000 + "\n", 1, "the line nests JSON arrays or objects 100,000 deep"),
        ('{"prompt_tokens": 1' + "0" * 5000 + "}\n", 1, "the line holds a number of more than 4,300 digits"),
    ],
)
def test_every_problem_of_a_trace_names_file_and_line(tmp_path, text, line, says):
    path = _trace(tmp_path, text)
    with pytest.raises(InvalidInputError) as caught:
        read_trace(path)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert says in str(caught.value)


def test_an_empty_or_missing_trace_is_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="has no requests"):
        read_trace(_trace(tmp_path, "\n \n"))
    with pytest.raises(InvalidInputError, match="cannot read the trace"):
        read_trace(tmp_path / "nope.jsonl")


def test_a_trace_has_at_most_max_requests(tmp_path, monkeypatch):
    monkeypatch.setattr(workload_module, "MAX_REQUESTS", 2)
    path = _trace(tmp_path, '{"prompt_tokens": 1, "output_tokens": 1}\n' * 3)
    with pytest.raises(InvalidInputError, match=f"{path}:3: a trace has at most 2 requests"):
        read_trace(path)


@given(st.binary(max_size=200))
def test_any_bytes_give_a_workload_or_a_kvcore_error(data):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        path.write_bytes(data)
        with contextlib.suppress(KVCoreError):
            read_trace(path)


def test_requests_and_workloads_check_their_fields():
    with pytest.raises(InvalidInputError, match="'prompt_tokens' must be an int >= 1"):
        Request(0, 0, 1)
    with pytest.raises(InvalidInputError, match="unique"):
        Workload((Request(0, 1, 1), Request(0, 2, 1)), name="x")


# -- lengths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", LengthDist("fixed", 512)),
        ("fixed:512", LengthDist("fixed", 512)),
        ("uniform:128:4096", LengthDist("uniform", 128, 4096)),
        ("lognormal:1024:1.5", LengthDist("lognormal", 1024, 1.5)),
        ("LogNormal:1e3:0", LengthDist("lognormal", 1000, 0)),
    ],
)
def test_lengths_parse(text, expected):
    assert parse_length(text) == expected
    assert parse_length(str(expected)) == expected


@pytest.mark.parametrize(
    "text",
    ["", "0", "-3", "1.5", "fixed", "uniform:5", "uniform:9:3", "uniform:a:b", "normal:3:4", "lognormal:0:1",
     "lognormal:100:-1", "lognormal:100:nan", "lognormal:inf:1", f"{MAX_TOKENS + 1}", "fixed:1:2"],
)  # fmt: skip
def test_bad_lengths_are_refused_with_the_forms(text):
    with pytest.raises(InvalidInputError, match="length"):
        parse_length(text)


@given(
    dist=st.sampled_from(
        [LengthDist("fixed", 700), LengthDist("uniform", 3, 900), LengthDist("lognormal", 400, 1.2)]
    ),
    cap=st.integers(1, 1000),
    seed=st.integers(0, 2**32),
)
def test_samples_stay_within_bounds_and_repeat_with_the_seed(dist, cap, seed):
    first = dist.sample(random.Random(seed), 50, cap)
    assert first == dist.sample(random.Random(seed), 50, cap)
    assert all(1 <= n <= cap for n in first)
    if dist.kind == "uniform":
        assert all(n >= min(3, cap) for n in first)


def test_lognormal_lengths_have_the_mean_asked_for():
    lengths = LengthDist("lognormal", 1000, 0.8).sample(random.Random(1), 50_000, 10**9)
    assert statistics.fmean(lengths) == pytest.approx(1000, rel=0.03)
    assert LengthDist("lognormal", 1000, 0).sample(random.Random(1), 3, 10**9) == [1000] * 3


# -- synthetic workloads ----------------------------------------------------------------------


def test_synthetic_requests_fit_max_model_len_and_repeat_with_the_seed():
    args = (500, parse_length("lognormal:3000:1.5"), parse_length("uniform:1:4000"))
    workload = synthetic(*args, seed=3, max_model_len=4096)
    assert workload == synthetic(*args, seed=3, max_model_len=4096)
    assert workload != synthetic(*args, seed=4, max_model_len=4096)
    assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in workload.requests)
    assert {r.arrival_step for r in workload.requests} == {0}
    assert "500 requests" in workload.name and "seed 3" in workload.name


def test_poisson_arrivals_come_at_the_rate_asked_for():
    count, rate = 20_000, 2.5
    workload = synthetic(count, parse_length("10"), parse_length("10"), rate=rate, max_model_len=64)
    last = workload.requests[-1].arrival_step
    assert count / (last + 1) == pytest.approx(rate, rel=0.03)
    per_step = [0] * (last + 1)
    for r in workload.requests:
        per_step[r.arrival_step] += 1
    assert statistics.pvariance(per_step) == pytest.approx(rate, rel=0.1)  # Poisson: variance = mean


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"count": 0}, "'count' must be an int >= 1"),
        ({"count": 10**7}, "MAX_REQUESTS"),
        ({"max_model_len": 1}, "'max_model_len' must be an int >= 2"),
        ({"rate": 0}, "'rate' must be"),
        ({"rate": float("nan")}, "'rate' must be"),
        ({"rate": True}, "'rate' must be"),
        ({"rate": 1e-9}, "MAX_ARRIVAL_STEP"),
    ],
)
def test_synthetic_arguments_are_checked(kwargs, says):
    args = {"count": 10, "max_model_len": 100, **kwargs}
    count = args.pop("count")
    with pytest.raises(InvalidInputError, match=says):
        synthetic(count, parse_length("5"), parse_length("5"), **args)
