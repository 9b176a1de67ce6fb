"""From steps to seconds: the GPU catalogue, the roofline (hand-computed), fitted step-time
profiles, the simulator's clock (arrivals in seconds), and latency percentiles and goodput."""

from __future__ import annotations

import math
import random

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from kvcore import InvalidInputError, KVCoreError, SizingContext, Workload, plan_kv_cache, simulate
from kvcore.errors import UnknownGpuError
from kvcore.frontends.hf_config import layer_specs_from_config, load_model_config
from kvcore.planning.manager import get_plugin_manager
from kvcore.planning.registry import Registry
from kvcore.simulation.gpus import Gpu, find_gpu, gpu_catalogue
from kvcore.simulation.steps import StepRecord, Timeline
from kvcore.simulation.timing import (
    PROFILE_TOLERANCE,
    Roofline,
    Spread,
    fit_profile,
    latency_report,
    read_profile,
    roofline,
)
from kvcore.simulation.workload import Request, parse_length, read_trace, synthetic
from tests.helpers import full
from tests.simulation._workloads import random_workload

REGISTRY = Registry.from_plugin_manager(get_plugin_manager(autoload=False))
ONE_LAYER = {"model.layers.0": full(block_size=16)}

#: A GPU of round figures: 1,000 GB/s and 100 TFLOPS.
ROUND = Gpu(
    name="Round",
    aliases=(),
    vendor="test",
    memory_gb=10,
    hbm_bandwidth_gbps=1000,
    bf16_tflops=100,
    fp8_tflops=200,
    host_link="PCIe Gen4 x16",
    host_link_gbps=64,
    source="https://example.com/round",
)


def _plan(specs, max_model_len=4096, *, num_blocks=None, step=2048):
    context = SizingContext(max_model_len=max_model_len, max_num_batched_tokens=step)
    return plan_kv_cache(specs, 2**34, context, registry=REGISTRY, policy="auto", num_blocks=num_blocks)


@attrs.frozen
class Constant:
    """Every step that runs something takes ``seconds``; the records are kept."""

    seconds: float
    records: list[StepRecord] = attrs.field(factory=list, eq=False)
    description: str = "constant"

    def __call__(self, record: StepRecord) -> float:
        self.records.append(record)
        return self.seconds if record.requests else 0.0


# -- the catalogue ---------------------------------------------------------------------------


def test_every_catalogue_gpu_has_a_datasheet_source_and_positive_figures():
    names = {gpu.name for gpu in gpu_catalogue()}
    for wanted in ("A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "L40S", "MI300X"):
        assert wanted in names
    for gpu in gpu_catalogue():
        assert gpu.source.startswith("https://") and gpu.notes
        assert min(gpu.memory_gb, gpu.hbm_bandwidth_gbps, gpu.bf16_tflops, gpu.host_link_gbps) > 0
        assert gpu.fp8_tflops is None or gpu.fp8_tflops >= gpu.bf16_tflops
        assert gpu.peak_flops(fp8=True) >= gpu.peak_flops() == gpu.bf16_tflops * 1e12
    aliases = [a.lower() for gpu in gpu_catalogue() for a in (gpu.name, *gpu.aliases)]
    assert len(aliases) == len(set(aliases))


def test_a_gpu_is_found_by_alias_ignoring_case_and_punctuation():
    assert find_gpu("h100").name == "H100-SXM"
    assert find_gpu("H100 pcie").name == "H100-PCIe"
    assert find_gpu("a100_40gb").memory_gb == 40
    assert find_gpu("H200").hbm_bandwidth_gbps == 4800


def test_an_unknown_gpu_says_which_is_closest_and_what_to_do():
    with pytest.raises(UnknownGpuError, match="did you mean H200") as caught:
        find_gpu("H2000")
    assert isinstance(caught.value, KVCoreError)
    assert "MI300X" in str(caught.value) and "step-time profile" in str(caught.value)


@pytest.mark.parametrize("field", ["memory_gb", "hbm_bandwidth_gbps", "bf16_tflops"])
def test_a_catalogue_entry_with_a_figure_that_is_not_positive_is_refused(field):
    with pytest.raises(InvalidInputError, match=field):
        attrs.evolve(ROUND, **{field: 0})


# -- the roofline ----------------------------------------------------------------------------


def test_a_decode_step_is_bound_by_memory_and_a_prefill_by_compute_by_hand():
    model = Roofline(
        gpu=ROUND,
        matmul_params=1e9,  # 2 GFLOP a token
        lm_head_params=1e8,
        dense_weight_bytes=2e9,
        attention_flops_per_pair=1e6,
        kv_bytes_per_token=1e5,
    )
    decode = StepRecord(
        prefill_tokens=0, decode_tokens=4, requests=4, context_tokens=4000, attention_pairs=4000
    )
    # bytes: 2e9 weights + 1e5 * 4000 KV = 2.4e9 at 1e12 B/s = 2.4 ms;
    # FLOPs: 2e9 * 4 + 2e8 * 4 + 1e6 * 4000 = 1.28e10 at 1e14 = 0.128 ms
    assert model.bytes_read(decode) == pytest.approx(2.4e9)
    assert model.flops(decode) == pytest.approx(1.28e10)
    assert model(decode) == pytest.approx(2.4e-3)
    prefill = StepRecord(
        prefill_tokens=2000, decode_tokens=0, requests=1, context_tokens=2000, attention_pairs=2001000
    )
    # FLOPs: 2e9 * 2000 + 2e8 + 1e6 * 2001000 = 6.0012e12 -> 60.01 ms; bytes 2.2e9 -> 2.2 ms
    assert model(prefill) == pytest.approx(6.0012e12 / 1e14)
    assert model(StepRecord(0, 0, 0, 0, 0)) == 0.0


def test_tensor_parallel_ranks_split_weights_and_flops_but_not_the_plans_kv():
    one = Roofline(gpu=ROUND, matmul_params=1e9, dense_weight_bytes=2e9, kv_bytes_per_token=1e5)
    two = attrs.evolve(one, tp=2)
    record = StepRecord(0, 1, 1, 10_000, 10_000)
    assert two.bytes_read(record) == pytest.approx(1e9 + 1e9)  # half the weights, one rank's KV
    assert two(record) == pytest.approx(2e9 / 1e12)
    assert "tp 2" in two.description and two.description.endswith("a lower bound")


def test_a_mixture_of_experts_reads_the_experts_a_batch_touches():
    model = Roofline(
        gpu=ROUND,
        matmul_params=1e9,
        dense_weight_bytes=1e9,
        expert_weight_bytes=8e9,
        num_experts=8,
        experts_per_token=2,
    )
    one = StepRecord(0, 1, 1, 0, 0)
    assert model.bytes_read(one) == pytest.approx(1e9 + 8e9 * 2 / 8)  # one token: its 2 experts
    many = StepRecord(0, 500, 500, 0, 0)
    assert model.bytes_read(many) == pytest.approx(9e9)  # a large batch touches them all


def test_windows_read_at_most_their_window_per_request():
    model = Roofline(gpu=ROUND, matmul_params=0, dense_weight_bytes=0, windows=((100, 10.0),))
    assert model.bytes_read(StepRecord(0, 2, 2, 50, 50)) == 500.0
    assert model.bytes_read(StepRecord(0, 2, 2, 5000, 5000)) == 2 * 100 * 10.0


def test_the_roofline_of_llama_8b_counts_its_weights_and_kv_from_config_and_plan():
    config, source = load_model_config("meta-llama/Llama-3.1-8B")
    registry = REGISTRY
    plan = _plan(layer_specs_from_config(config, registry), 8192)
    model = roofline(config, registry, plan, find_gpu("H100"), source=source)
    # 32 layers x K and V x 8 KV heads x 128 dims x 2 bytes (bf16)
    assert model.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    vocab, hidden = 128_256, 4096
    assert model.lm_head_params == vocab * hidden
    # 8.03 B parameters: all but the two vocab x hidden tables go through matmuls;
    # every step reads all weights in bf16 except the input embedding table
    assert model.matmul_params == pytest.approx(8.03e9 - 2 * vocab * hidden, rel=0.01)
    assert model.dense_weight_bytes == pytest.approx(2 * (8.03e9 - vocab * hidden), rel=0.01)
    # 32 layers x (2 x 32 heads x 128 for the scores + the same for the weighted sum)
    assert model.attention_flops_per_pair == 32 * 4 * 32 * 128
    decode = StepRecord(0, 1, 1, 1000, 1000)
    assert model(decode) == pytest.approx((model.dense_weight_bytes + 1000 * 131072) / 3.35e12)


def test_the_roofline_of_a_mixture_of_experts_counts_its_active_experts():
    config, source = load_model_config("openai/gpt-oss-20b")
    registry = REGISTRY
    plan = _plan(layer_specs_from_config(config, registry), 8192)
    model = roofline(config, registry, plan, find_gpu("H100"), source=source)
    assert (model.num_experts, model.experts_per_token) == (32, 4)
    assert model.expert_weight_bytes > model.dense_weight_bytes > 0
    assert 3e9 < model.matmul_params < 4e9  # ~3.6 B active parameters (published), less the tables
    assert model.windows and model.windows[0][0] == 128  # sliding layers read 128 tokens


# -- measured profiles -----------------------------------------------------------------------

KNOWN = (
    0.004,
    2e-5,
    1.5e-4,
    3e-8,
)  # seconds: fixed, per prefill token, per decode request, per context token


def _known_samples(noise=0.0, seed=0):
    rng = random.Random(seed)
    samples = []
    for prefill in (0, 256, 1024, 2048):
        for decode in (0, 8, 64, 256):
            for context in (1_000, 50_000, 400_000):
                seconds = KNOWN[0] + KNOWN[1] * prefill + KNOWN[2] * decode + KNOWN[3] * context
                samples.append((prefill, decode, context, seconds * (1 + rng.uniform(-noise, noise))))
    return samples


def test_a_profile_from_known_coefficients_is_fitted_back_and_reproduces_its_samples():
    profile = fit_profile(_known_samples())
    fitted = (
        profile.intercept,
        profile.per_prefill_token,
        profile.per_decode_request,
        profile.per_context_token,
    )
    assert fitted == pytest.approx(KNOWN, rel=1e-6)
    assert profile.max_error < 1e-9
    assert profile(StepRecord(100, 10, 110, 20_000, 0)) == pytest.approx(0.004 + 2e-3 + 1.5e-3 + 6e-4)


def test_a_noisy_profile_reproduces_every_sample_within_five_percent(tmp_path):
    path = tmp_path / "h100.jsonl"
    lines = [
        f'{{"prefill_tokens": {p}, "decode_requests": {d}, "context_tokens": {c}, "seconds": {s!r}}}'
        for p, d, c, s in _known_samples(noise=0.02, seed=3)
    ]
    path.write_text("\n".join(lines) + "\n\n")
    profile = read_profile(path)
    assert profile.samples == len(lines)
    assert profile.max_error <= PROFILE_TOLERANCE
    for p, d, c, s in _known_samples(noise=0.02, seed=3):
        assert abs(profile.predict(p, d, c) - s) <= PROFILE_TOLERANCE * s
    assert profile.description.startswith(f"measured profile {path} (48 samples")


def test_a_term_no_sample_varies_gets_no_coefficient():
    samples = [(0, d, c, 0.002 + 1e-4 * d + 1e-8 * c) for d in (1, 16, 64) for c in (100, 90_000)]
    profile = fit_profile(samples)
    assert profile.per_prefill_token == 0.0
    assert profile.per_decode_request == pytest.approx(1e-4)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no samples"),
        ("\n  \n", "no samples"),
        ("{not json", ":1: not valid JSON"),
        ('{"prefill_tokens": 1}', ":1: a line is one object with exactly the keys"),
        (
            '{"prefill_tokens": 1, "decode_requests": 1, "context_tokens": 1, "seconds": 0}',
            "'seconds' must be",
        ),
        (
            '{"prefill_tokens": -1, "decode_requests": 1, "context_tokens": 1, "seconds": 1}',
            "'prefill_tokens'",
        ),
        ('{"prefill_tokens": 1, "decode_requests": 1, "context_tokens": 1, "seconds": "1"}', "'seconds'"),
        (
            '{"prefill_tokens": 1, "decode_requests": 1, "context_tokens": 1, "seconds": 1}',
            "cannot fit 4 terms",
        ),
    ],
)
def test_a_bad_profile_file_is_refused_with_the_line_and_the_fix(tmp_path, text, says):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(InvalidInputError, match=says):
        read_profile(path)


def test_a_missing_profile_file_and_a_profile_that_is_not_linear_are_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="cannot read the step-time profile"):
        read_profile(tmp_path / "absent.jsonl")
    quadratic = [(p, 0, 0, 0.001 + 1e-9 * p * p) for p in (1, 500, 1000, 2000, 4000, 8000)]
    with pytest.raises(InvalidInputError, match="not linear"):
        fit_profile(quadratic)
    together = [(n, n, 0, 0.001 + 1e-5 * n) for n in (1, 2, 3, 4)]  # prefill and decode always equal
    with pytest.raises(InvalidInputError, match="cannot tell the profile's terms apart"):
        fit_profile(together)


# -- the clock -------------------------------------------------------------------------------


def _timed(*requests):
    return Workload(tuple(Request(i, p, o, arrival_time=t) for i, (p, o, t) in enumerate(requests)), name="t")


def test_requests_arriving_in_seconds_join_at_the_first_step_after_and_the_clock_jumps_when_idle():
    clock = Constant(0.1)
    # r0 runs steps 0-2; r1 arrives at 0.25 and joins step 3 (starts at 0.3); r2 arrives at 5.0,
    # when nothing runs: the clock jumps there
    workload = _timed((10, 3, 0.0), (10, 2, 0.25), (20, 1, 5.0))
    result = simulate(_plan(ONE_LAYER), workload, step_time=clock, scheduler="kvcore")
    timeline = result.timeline
    assert timeline is not None and timeline.model == "constant"
    assert result.steps == 6
    assert timeline.step_end == pytest.approx((0.1, 0.2, 0.3, 0.4, 0.5, 5.1))
    assert timeline.arrival == (0.0, 0.25, 5.0)
    assert timeline.first_token == pytest.approx((0.1, 0.4, 5.1))
    assert timeline.finish == pytest.approx((0.3, 0.5, 5.1))
    assert result.mean_queue_delay == 0.0  # every request was scheduled at the step it joined
    # what each step computed: 10 prompt tokens (pairs 1 + ... + 10), then single decodes
    assert clock.records[0] == StepRecord(10, 0, 1, 10, 55)
    assert clock.records[1] == StepRecord(0, 1, 1, 11, 11)
    assert clock.records[5] == StepRecord(20, 0, 1, 20, 210)


def test_a_chunked_prefill_records_its_pairs_and_context():
    clock = Constant(0.01)
    simulate(_plan(ONE_LAYER, step=8), _timed((12, 2, 0.0)), step_time=clock, scheduler="kvcore")
    # 8 tokens (pairs 1..8 = 36), then 4 more over a context of 12 (pairs 9..12 = 42), then a decode
    assert clock.records[:3] == [
        StepRecord(8, 0, 1, 8, 36),
        StepRecord(4, 0, 1, 12, 42),
        StepRecord(0, 1, 1, 13, 13),
    ]


def test_arrival_times_without_a_step_time_model_are_refused():
    with pytest.raises(InvalidInputError, match="needs a step-time model"):
        simulate(_plan(ONE_LAYER), _timed((10, 3, 0.0)))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), rate=st.sampled_from([None, 0.05, 0.5]), prefix=st.booleans())
@pytest.mark.parametrize("scheduler", ["kvcore", "vllm", "sglang"])
def test_a_time_model_leaves_every_step_figure_unchanged(seed, rate, prefix, scheduler):
    share = 0.7 if prefix else 0.0
    workload = random_workload(seed, 40, "uniform:16:400", "uniform:1:60", rate=rate, prefix_share=share)
    plan = _plan(ONE_LAYER, 512, num_blocks=40, step=256)
    plain = simulate(plan, workload, prefix_caching=prefix, scheduler=scheduler)
    clock = Constant(0.02)
    timed = simulate(plan, workload, step_time=clock, prefix_caching=prefix, scheduler=scheduler)
    # the load is in seconds with a time model (per step without): a time figure, not a step one
    assert attrs.evolve(timed, timeline=None, load=None) == attrs.evolve(plain, load=None)
    assert (timed.load is None) == (plain.load is None)
    assert timed.timeline is not None and len(timed.timeline.step_end) == plain.steps
    assert all(t >= a - 1e-9 for t, a in zip(timed.timeline.first_token, timed.timeline.arrival, strict=True))
    assert all(f >= t for f, t in zip(timed.timeline.finish, timed.timeline.first_token, strict=True))
    # the records account for every scheduled token, and each step's within the budget
    records = clock.records
    assert sum(r.prefill_tokens + r.decode_tokens for r in records) == plain.total_tokens
    for r in records:
        assert 0 < r.prefill_tokens + r.decode_tokens <= 256 and r.decode_tokens <= r.requests
        assert r.context_tokens >= r.prefill_tokens + r.decode_tokens  # the new tokens are read too
        if not r.prefill_tokens:  # decodes only: each token attends to its request's whole context
            assert r.attention_pairs == r.context_tokens


# -- latencies -------------------------------------------------------------------------------


def _schedule():
    """Ten requests, arrival at 0, first token at 0.1 * (i + 1) s, then (i + 1) * 10 ms a token."""
    first = tuple(0.1 * (i + 1) for i in range(10))
    outputs = [11] * 10
    finish = tuple(f + 10 * 0.01 * (i + 1) for i, f in enumerate(first))
    timeline = Timeline(
        model="hand", step_end=(max(finish),), arrival=(0.0,) * 10, first_token=first, finish=finish
    )
    return timeline, outputs


def test_percentiles_of_a_hand_made_schedule():
    timeline, outputs = _schedule()
    report = latency_report(timeline, outputs)
    # nearest rank of 10 values: p50 the 5th, p90 the 9th, p99 the 10th
    assert (report.ttft.p50, report.ttft.p90, report.ttft.p99) == pytest.approx((0.5, 0.9, 1.0))
    assert (report.itl.p50, report.itl.p90, report.itl.p99) == pytest.approx((0.05, 0.09, 0.1))
    assert (report.e2e.p50, report.e2e.p90, report.e2e.p99) == pytest.approx((1.0, 1.8, 2.0))
    assert report.ttft.mean == pytest.approx(0.55)
    assert report.seconds == pytest.approx(2.0)
    assert report.output_tokens_per_second == pytest.approx(110 / 2.0)
    assert report.requests_per_second == pytest.approx(5.0)
    assert report.good_requests == 10  # no targets: every request counts


def test_goodput_counts_the_requests_meeting_both_targets():
    timeline, outputs = _schedule()
    # TTFT <= 0.65 s: requests 0-5; ITL <= 45 ms: requests 0-3
    report = latency_report(timeline, outputs, slo_ttft=0.65, slo_itl=0.045)
    assert report.good_requests == 4
    assert report.goodput_requests_per_second == pytest.approx(4 / 2.0)
    assert report.goodput_tokens_per_second == pytest.approx(44 / 2.0)
    assert latency_report(timeline, outputs, slo_ttft=0.65).good_requests == 6
    one_token = latency_report(timeline, [1] * 10, slo_itl=1e-9)
    assert one_token.good_requests == 10 and one_token.itl == Spread(mean=0.0, p50=0.0, p90=0.0, p99=0.0)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "1"])
def test_a_latency_target_that_is_not_a_positive_number_is_refused(bad):
    timeline, outputs = _schedule()
    with pytest.raises(InvalidInputError, match="seconds > 0"):
        latency_report(timeline, outputs, slo_ttft=bad)


# -- workloads in seconds --------------------------------------------------------------------


def test_a_trace_may_give_arrival_times_in_seconds(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"prompt_tokens": 10, "output_tokens": 2, "arrival_time": 1.5}\n'
        '{"prompt_tokens": 20, "output_tokens": 3, "arrival_time": 0.25}\n'
    )
    workload = read_trace(path)
    assert [(r.id, r.arrival_time) for r in workload.requests] == [(1, 0.25), (0, 1.5)]
    result = simulate(_plan(ONE_LAYER), workload, step_time=Constant(0.1))
    assert result.timeline is not None and result.timeline.arrival == (0.25, 1.5)


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (
            '{"prompt_tokens": 1, "output_tokens": 1, "arrival_time": -1}',
            "'arrival_time' must be a number of seconds",
        ),
        ('{"prompt_tokens": 1, "output_tokens": 1, "arrival_time": "soon"}', "'arrival_time' must be"),
        (
            '{"prompt_tokens": 1, "output_tokens": 1, "arrival_time": 1, "arrival_step": 3}',
            "'arrival_step' or 'arrival_time', not both",
        ),
        (
            '{"prompt_tokens": 1, "output_tokens": 1, "arrival_time": 1}\n'
            '{"prompt_tokens": 1, "output_tokens": 1}',
            "1 of the workload's 2 requests give an arrival_time",
        ),
    ],
)
def test_bad_arrival_times_in_a_trace_are_refused(tmp_path, lines, says):
    path = tmp_path / "t.jsonl"
    path.write_text(lines + "\n")
    with pytest.raises(InvalidInputError, match=says):
        read_trace(path)


def test_a_rate_per_second_draws_arrival_times_of_that_mean_gap():
    workload = synthetic(
        4000, parse_length("64"), parse_length("8"), rate=20.0, seed=7, max_model_len=128, per_second=True
    )
    times = [r.arrival_time for r in workload.requests]
    assert all(t is not None for t in times) and all(r.arrival_step == 0 for r in workload.requests)
    assert times == sorted(times)
    assert times[-1] / len(times) == pytest.approx(1 / 20.0, rel=0.05)
    assert "Poisson 20/s" in workload.name
    with pytest.raises(InvalidInputError, match="requests per second > 0"):
        synthetic(4, parse_length("64"), parse_length("8"), rate=-2.0, max_model_len=128, per_second=True)


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_a_step_time_model_that_gives_no_duration_is_refused(bad):
    with pytest.raises(InvalidInputError, match="a step takes a finite time >= 0"):
        simulate(_plan(ONE_LAYER), _timed((10, 3, 0.0)), step_time=Constant(bad))


def test_chunked_layers_read_at_most_a_chunk_and_scout_counts_its_active_parameters():
    config, source = load_model_config("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    plan = _plan(layer_specs_from_config(config, REGISTRY), 8192)  # max_model_len = the chunk
    model = roofline(config, REGISTRY, plan, find_gpu("H100"), source=source)
    assert [window for window, _ in model.windows] == [8192]  # attention_chunk_size
    assert (model.num_experts, model.experts_per_token) == (16, 1)
    # "17B active parameters" (the model's name): the matmuls plus the two vocab tables
    assert model.matmul_params + 2 * model.lm_head_params == pytest.approx(17e9, rel=0.03)


def test_an_encoder_output_is_read_once_a_request_not_once_a_token():
    config, source = load_model_config("openai/whisper-large-v3")
    plan = _plan(layer_specs_from_config(config, REGISTRY), 448)
    model = roofline(config, REGISTRY, plan, find_gpu("H100"), source=source)
    # 32 decoder layers x K and V x 20 heads x 64 dims x 2 bytes: self-attention per token
    assert model.kv_bytes_per_token == 32 * 2 * 20 * 64 * 2
    # cross-attention: the 1,500 encoder frames in 94 pages of 16 tokens, per request
    assert model.state_bytes == 32 * 2 * 20 * 64 * 2 * 94 * 16
    assert model.dense_weight_bytes < 1.1e9 * 2  # the decoder alone (~0.9 B), not the 1.55 B model


def test_steps_that_scatter_are_fitted_at_their_mean_not_under_it():
    """On a loaded machine a step's repeats scatter upwards; weighting each by its own seconds
    alone would put the fit under their mean (the slow ones count least). Reweighted by the
    fit's own seconds, the fit of one shape measured at 1, 1 and 2 ms sits at about their mean."""
    rows = []
    for prefill, decode, context in (
        (64, 0, 64),
        (1024, 0, 1024),
        (0, 8, 500),
        (0, 32, 9000),
        (256, 4, 2000),
    ):
        base = 1e-3 + 1e-5 * prefill + 1e-4 * decode + 1e-8 * context
        rows += [(prefill, decode, context, s) for s in (base, base, 2 * base)]
    profile = fit_profile(rows, tolerance=1.0)
    for prefill, decode, context, _ in rows[::3]:
        base = 1e-3 + 1e-5 * prefill + 1e-4 * decode + 1e-8 * context
        assert profile.predict(prefill, decode, context) == pytest.approx(4 / 3 * base, rel=0.08)
