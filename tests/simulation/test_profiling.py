"""``kvcore profile``'s pieces, engine-neutral: the scenarios, the timed repeats, the held-out
choice of terms and the profile file, driven by a stub engine whose steps take seconds from
known coefficients (the same code path a real engine's steps take)."""

from __future__ import annotations

import json

import attrs
import pytest

from kvcore.errors import InvalidInputError
from kvcore.simulation.profile_file import (
    HEADER_KEY,
    ProfileFile,
    ProfileHeader,
    ProfileSample,
    read_profile_file,
    write_profile_file,
)
from kvcore.simulation.profiling import (
    PREFILL_LENGTHS,
    EngineLimits,
    ProfileRequest,
    Scenario,
    ScheduledRequest,
    TimedStep,
    choose_terms,
    measure,
    profile_engine,
    scenarios,
)
from kvcore.simulation.steps import StepRecord
from kvcore.simulation.timing import PROFILE_TERMS, read_profile

LIMITS = EngineLimits(max_batched_tokens=256, max_num_seqs=16, max_model_len=512, kv_tokens=8192)


@attrs.define
class StubEngine:
    """A first-come scheduler (decodes first, then prompt chunks within the token budget) whose
    steps take ``a + b P + c D + d C + e pairs`` seconds, plus ``noise`` on every other run."""

    coefficients: tuple[float, float, float, float, float, float]
    limits_: EngineLimits = LIMITS
    noise: float = 0.0
    runs: int = 0
    shuffle: bool = False

    def limits(self) -> EngineLimits:
        return self.limits_

    def settings(self) -> dict[str, object]:
        return {"max_num_seqs": self.limits_.max_num_seqs}

    def run(self, scenario: Scenario) -> list[TimedStep]:
        self.runs += 1
        waiting = sorted(scenario.requests, key=lambda r: r.arrival_step)
        running: list[list[int]] = []  # [prompt, computed, output left]
        steps: list[TimedStep] = []
        step = 0
        while waiting or running:
            while waiting and waiting[0].arrival_step <= step and len(running) < self.limits_.max_num_seqs:
                r = waiting.pop(0)
                running.append([r.prompt_tokens, 0, r.output_tokens])
            budget = self.limits_.max_batched_tokens
            scheduled = []
            for req in sorted(running, key=lambda q: q[1] < q[0]):  # decodes first
                prompt, computed, _ = req
                new = 1 if computed >= prompt else min(prompt - computed, budget)
                if new <= 0 or budget < new:
                    continue
                budget -= new
                req[1] += new
                if req[1] >= prompt:
                    req[2] -= 1
                scheduled.append(ScheduledRequest(new_tokens=new, context_tokens=req[1]))
            if self.shuffle and self.runs % 2 and scheduled:
                scheduled.pop()
            running = [q for q in running if q[2] > 0]
            timed = TimedStep(scheduled=tuple(scheduled), seconds=1.0)
            p, d, c, pairs, requests = timed.shape
            a, b, cd, cc, e, f = self.coefficients
            seconds = a + b * p + cd * d + cc * c + e * pairs + f * (requests - d)
            if self.runs % 2:
                seconds *= 1 + self.noise
            steps.append(attrs.evolve(timed, seconds=seconds))
            step += 1
        return steps


LINE = (2e-3, 5e-6, 4e-5, 3e-8, 0.0, 0.0)
QUADRATIC = (2e-3, 5e-6, 4e-5, 3e-8, 4e-8, 0.0)
PER_CHUNK = (2e-3, 5e-6, 4e-5, 3e-8, 0.0, 1e-3)


def test_the_scenarios_cover_prefill_decode_and_mixed_steps_within_the_engine():
    plan = scenarios(LIMITS, decode_steps=4)
    kinds = {s.name.split()[0] for s in plan}
    assert kinds == {"prefill", "decode", "mixed", "serving"}
    for s in plan:
        assert all(r.prompt_tokens + r.output_tokens <= LIMITS.max_model_len for r in s.requests)
        assert sum(r.prompt_tokens + r.output_tokens for r in s.requests) <= LIMITS.kv_tokens
    prefill = sorted(s.requests[0].prompt_tokens for s in plan if s.name.startswith("prefill"))
    assert prefill[0] < prefill[-1] == LIMITS.max_batched_tokens
    assert len(set(prefill)) == PREFILL_LENGTHS, "prompts of many lengths, each once"
    assert all(s.cold for s in plan if not s.name.startswith("decode"))
    mixed = [s for s in plan if s.name.startswith("mixed")]
    assert {len(s.requests) - 1 for s in mixed} >= {1, 4, LIMITS.max_num_seqs - 1}, "beside 1 to all decodes"
    assert len({s.requests[-1].prompt_tokens for s in mixed}) >= 3
    widths = {len(s.requests) for s in plan if s.name.startswith("decode")}
    assert {1, LIMITS.max_num_seqs} <= widths
    assert any(r.arrival_step > 0 for s in plan for r in s.requests)  # a prompt joins decoding ones


def test_a_step_counts_as_the_simulator_counts_it():
    step = TimedStep(
        scheduled=(
            ScheduledRequest(new_tokens=4, context_tokens=10),
            ScheduledRequest(new_tokens=1, context_tokens=7),
        ),
        seconds=0.1,
    )
    # 4 new tokens ending at 10 cached: 4 x 10 - 4 x 3 / 2 pairs; a decode reads its 7
    assert step.shape == (4, 1, 17, 4 * 10 - 6 + 7, 2)


def test_the_least_of_the_repeats_is_kept_with_their_spread():
    warm = [s for s in scenarios(LIMITS, decode_steps=2) if not s.cold]
    engine = StubEngine(LINE, noise=0.5)
    samples = measure(engine, warm, repeats=3)
    for s in samples:
        assert s.spread == pytest.approx(0.5)
    exact = measure(StubEngine(LINE), warm, repeats=1)
    assert [s.seconds for s in samples] == pytest.approx([s.seconds for s in exact])


def test_a_cold_scenario_runs_each_variant_once_and_keeps_steps_as_serving_runs_them():
    """Prompt-chunk steps are kept when their token count is new to the engine, decode steps
    when it is not; each repeat of a cold scenario is a variant with prompts k tokens shorter."""
    engine = StubEngine(LINE)
    cold = Scenario(
        name="prefill 100", requests=(ProfileRequest(prompt_tokens=100, output_tokens=3),), cold=True
    )
    warm = Scenario(name="warm 97", requests=(ProfileRequest(prompt_tokens=97, output_tokens=2),))
    samples = measure(engine, [warm, cold], repeats=3)
    assert engine.runs == 1 + 3 + 3, "a warm-up, the warm scenario's 3 repeats, 3 variants run once"
    cold_prefills = sorted(s.prefill_tokens for s in samples if s.prefill_tokens and s.spread is None)
    # variants of 100, 99 and 98 tokens; the 97-token step was run warm before (and is kept
    # once, from the warm scenario, with its spread)
    assert cold_prefills == [98, 99, 100]
    decodes = [s for s in samples if not s.prefill_tokens and s.spread is None]
    assert decodes and all(s.decode_requests == 1 for s in decodes), "1-token steps ran before: warm"
    assert cold.variant(99).requests[0].prompt_tokens == 2, "never under 2 tokens"


def test_repeats_that_schedule_differently_are_refused():
    with pytest.raises(InvalidInputError, match="repeats scheduled different batches"):
        measure(StubEngine(LINE, shuffle=True), scenarios(LIMITS), repeats=2)
    with pytest.raises(InvalidInputError, match="'repeats' must be >= 1"):
        measure(StubEngine(LINE), scenarios(LIMITS), repeats=0)


def _profile_stub(coefficients):
    """``kvcore profile`` of a stub engine whose steps cost ``coefficients`` exactly, run once each."""
    return profile_engine(
        StubEngine(coefficients),
        engine_name="stub",
        engine_version="1",
        model="m",
        device="cpu",
        versions={},
        repeats=1,
    )


def test_steps_on_the_line_keep_the_four_terms_and_recover_them(tmp_path):
    measured = _profile_stub(LINE)
    assert measured.choice.terms == PROFILE_TERMS[:4]
    assert measured.choice.held_out[-1].steps == "all held-out steps"
    assert measured.choice.held_out[-1].max_error < 1e-6
    path = tmp_path / "stub.jsonl"
    write_profile_file(path, measured.file)
    profile = read_profile(path)
    fitted = (
        profile.intercept,
        profile.per_prefill_token,
        profile.per_decode_request,
        profile.per_context_token,
    )
    assert fitted == pytest.approx(LINE[:4], rel=1e-6)
    assert profile.terms == PROFILE_TERMS[:4]


def test_steps_the_line_misses_get_the_attention_term(tmp_path):
    measured = _profile_stub(QUADRATIC)
    choice = measured.choice
    assert max(e.mean_error for e in choice.line_held_out) > 0.03, (
        "the four-term line misses quadratic prefill"
    )
    assert "attention_pairs" in choice.terms
    assert choice.held_out[-1].max_error < 1e-6
    path = tmp_path / "stub.jsonl"
    write_profile_file(path, measured.file)
    header = json.loads(path.read_text().splitlines()[0])[HEADER_KEY]
    assert "attention_pairs" in header["terms"]
    assert header["settings"] == {"max_num_seqs": 16, "repeats": 1, "statistic": "least", "decode_steps": 8}
    profile = read_profile(path)
    assert profile.per_attention_pair == pytest.approx(QUADRATIC[4], rel=1e-6)
    assert "attention pairs" in profile.description


def test_steps_with_a_cost_per_prompt_chunk_get_the_prefill_requests_term(tmp_path):
    measured = _profile_stub(PER_CHUNK)
    choice = measured.choice
    assert max(e.mean_error for e in choice.line_held_out) > 0.03
    assert choice.terms == (*PROFILE_TERMS[:4], "prefill_requests"), "the fewest terms that fit"
    assert choice.held_out[-1].max_error < 1e-6
    path = tmp_path / "stub.jsonl"
    write_profile_file(path, measured.file)
    profile = read_profile(path)
    assert profile.per_prefill_request == pytest.approx(1e-3, rel=1e-6)
    # the simulator's step record: 3 requests, 1 decoding, so 2 prefilling
    record = StepRecord(
        prefill_tokens=100, decode_tokens=1, requests=3, context_tokens=500, attention_pairs=0
    )
    assert profile(record) == pytest.approx(2e-3 + 5e-4 + 4e-5 + 1.5e-5 + 2e-3)


def test_too_few_steps_to_hold_some_out_are_refused():
    few = [
        ProfileSample(prefill_tokens=p, decode_requests=0, context_tokens=p, seconds=1e-3 * p)
        for p in (1, 2, 3)
    ]
    with pytest.raises(InvalidInputError, match="too few to hold some out"):
        choose_terms(few)


def _header(**changes):
    base = ProfileHeader(engine="vllm", engine_version="0.32.0", model="m", device="cpu")
    return json.dumps({HEADER_KEY: {**attrs.asdict(base), **changes}})


def test_a_profile_file_round_trips_and_the_first_format_still_reads(tmp_path):
    samples = tuple(
        ProfileSample(
            prefill_tokens=p,
            decode_requests=d,
            context_tokens=c,
            seconds=1e-3 + 1e-6 * p + 1e-4 * d + 1e-8 * c,
        )
        for p, d, c in ((0, 1, 100), (0, 8, 90), (64, 0, 64), (256, 0, 900), (64, 4, 500), (0, 32, 5000))
    )
    headed = ProfileFile(
        header=ProfileHeader(engine="vllm", engine_version="0.32", model="m", device="cpu"), samples=samples
    )
    path = tmp_path / "p.jsonl"
    write_profile_file(path, headed)
    assert read_profile_file(path) == headed
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join(line for line in path.read_text().splitlines()[1:]) + "\n")
    assert read_profile_file(old).header is None
    assert read_profile(old).max_error < 1e-9


@pytest.mark.parametrize(
    ("first", "message"),
    [
        (_header(version=2), "format version 2"),
        (_header(terms=["fixed"]), "'terms' must be"),
        (_header(tolerance=0), "'tolerance' must be a share"),
        (_header(colour="red"), "header is not valid"),
        (_header(held_out=[{"steps": "all"}]), "header is not valid"),
    ],
)
def test_a_bad_header_is_refused_with_the_line(tmp_path, first, message):
    path = tmp_path / "p.jsonl"
    path.write_text(
        first + '\n{"prefill_tokens": 1, "decode_requests": 0, "context_tokens": 1, "seconds": 0.1}\n'
    )
    with pytest.raises(InvalidInputError, match=rf"p.jsonl:1: .*{message}"):
        read_profile(path)


def test_a_header_after_the_steps_or_an_attention_fit_without_pairs_is_refused(tmp_path):
    step = '{"prefill_tokens": 1, "decode_requests": 0, "context_tokens": 1, "seconds": 0.1}'
    path = tmp_path / "p.jsonl"
    path.write_text(step + "\n" + _header() + "\n")
    with pytest.raises(InvalidInputError, match=r"p\.jsonl:2: .*first line"):
        read_profile(path)
    path.write_text(_header(terms=list(PROFILE_TERMS)) + "\n" + step + "\n")
    with pytest.raises(InvalidInputError, match=r"p\.jsonl:2: .*has no 'attention_pairs'"):
        read_profile(path)


def test_a_scenario_request_joins_at_its_step():
    late = Scenario(
        name="late",
        requests=(
            ProfileRequest(prompt_tokens=8, output_tokens=6),
            ProfileRequest(prompt_tokens=8, output_tokens=2, arrival_step=3),
        ),
    )
    steps = StubEngine(LINE).run(late)
    assert [s.shape[:2] for s in steps[:4]] == [(8, 0), (0, 1), (0, 1), (8, 1)]
