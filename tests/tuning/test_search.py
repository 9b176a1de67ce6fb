"""kvcore.tuning.search: the coordinate search, its pruning, the Pareto front, and engine flags
that reproduce the chosen candidate."""

import math

import attrs
import pytest

from kvcore import InvalidInputError, PlanOptions, PlanRequest, SizingContext
from kvcore.dtypes import to_dtype
from kvcore.integrations.sglang.model import sglang_model
from kvcore.integrations.tuned import sglang_settings, vllm_planner, vllm_settings
from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
from kvcore.planning.compare import variant_specs
from kvcore.simulation.workload import parse_length, synthetic
from kvcore.tuning.search import TIE, Knobs, SearchSpace, Trial, better, dominated, pareto_front, tune
from tests.helpers import full, mix, sliding

GIB = 1 << 30
CTX = SizingContext(max_model_len=4096)
SPECS = mix((2, full()), (10, sliding(512)))
#: ``SPECS`` as SGLang runs a model it gives a sliding pool (gpt-oss's architecture)
SWA_MODEL = sglang_model(SPECS, {"architectures": ["GptOssForCausalLM"]}, fix="")
WORKLOAD = synthetic(
    40, parse_length("uniform:64:1024"), parse_length("uniform:16:128"), rate=2.0, seed=3, max_model_len=4096
)
SPACE = SearchSpace(
    policies=("shared_buffer", "kind_pools", "equal_groups"),
    max_num_seqs=(8, 256),
    max_num_batched_tokens=(512, 1024),
)


def _request(budget: int) -> PlanRequest:
    """What every candidate of a search plans: ``SPECS`` in ``budget`` bytes at ``CTX``."""
    return PlanRequest.for_context(SPECS, budget, CTX)


@pytest.fixture(scope="module")
def searched(registry_module):
    return tune(_request(GIB // 8), WORKLOAD, SPACE, registry=registry_module, scheduler="vllm")


@pytest.fixture(scope="module")
def registry_module():
    from kvcore.planning.registry import Registry

    return Registry.default()


def test_the_best_is_the_highest_score_and_on_the_front(searched):
    ran = [t for t in searched.trials if t.ok]
    assert searched.best.score >= max(t.score for t in ran) * (1 - TIE)
    assert searched.best.score >= searched.default.score
    assert any(t.knobs == searched.best.knobs or t.score == searched.best.score for t in searched.front)


def test_the_front_holds_no_dominated_candidate_and_drops_the_dominated(searched):
    ran = [t for t in searched.trials if t.ok]
    for trial in searched.front:
        assert not dominated(trial, ran)
    for trial in ran:
        if trial not in searched.front:
            assert dominated(trial, ran) or any(
                (t.score, t.latency_figure) == (trial.score, trial.latency_figure) for t in searched.front
            )


def _trial(score, latency):
    knobs = Knobs("p", None, None, None, 1, 1)
    return attrs.evolve(Trial(knobs=knobs, plan=None), score=score, latency_figure=latency, result=object())


def test_pareto_front_by_hand():
    a, b, c, d = _trial(10, 5), _trial(12, 6), _trial(9, 7), _trial(12, 8)
    assert pareto_front([a, b, c, d]) == (a, b)  # c worse than a on both; d ties b's score, slower
    assert dominated(c, [a, b, c, d]) and not dominated(a, [a, b, c, d])


def test_a_tie_goes_to_the_lower_latency():
    fast, slow, high = _trial(10.0, 5), _trial(10.0 * (1 + TIE / 2), 9), _trial(10.0 * (1 + 2 * TIE), 9)
    assert better(fast, slow) and not better(slow, fast)
    assert better(high, fast)


def test_a_cap_that_never_bound_is_not_simulated_again(searched):
    reused = [t for t in searched.trials if t.reused]
    assert reused and searched.simulations < len([t for t in searched.trials if t.ok])
    for trial in reused:
        # a reused run is a run of the same plan: equal figures
        twin = next(t for t in searched.trials if not t.reused and t.ok and t.result is trial.result)
        assert twin.score == trial.score


def test_the_split_knob_is_searched_for_the_pooled_policy(searched):
    splits = {t.knobs.split_shift for t in searched.trials if t.knobs.policy == "kind_pools" and t.ok}
    assert None in splits and 0.0 in splits
    sized = next(t for t in searched.trials if t.knobs.policy == "kind_pools" and t.knobs.split_shift == 0.0)
    assert sized.pool_split is not None and math.isclose(sum(sized.pool_split), 1.0)


def test_knob_effects_change_one_knob_from_the_default(searched):
    default = searched.default.knobs
    for effect in searched.knob_effects:
        alone = [
            t
            for t in searched.trials
            if all(
                getattr(t.knobs, k) == getattr(default, k)
                for k in attrs.fields_dict(Knobs)
                if k != effect.knob
            )
        ]
        assert effect.score == max(t.score for t in alone)


def test_vllm_flags_fed_back_reproduce_the_candidate(registry_module):
    space = SearchSpace(
        policies=("shared_buffer", "equal_groups"),
        kv_cache_dtypes=(None, "fp8"),
        max_num_seqs=(16, 128),
        max_num_batched_tokens=(512, 1024),
    )
    budget = GIB // 8
    result = tune(
        _request(budget), WORKLOAD, space, registry=registry_module, planner=vllm_planner(registry_module)
    )
    for trial in [result.best, *result.front]:
        settings = vllm_settings(trial, SPECS, budget, registry=registry_module)
        flags = {f.name: f.value for f in settings.flags}
        dtype = flags["--kv-cache-dtype"]
        specs = variant_specs(
            SPECS,
            block_size=int(flags["--block-size"]),
            kv_cache_dtype=None if dtype == "auto" else to_dtype(dtype),
        )
        rules = VllmRules(
            max_model_len=CTX.max_model_len, max_num_batched_tokens=int(flags["--max-num-batched-tokens"])
        )
        again = plan_for_vllm(
            rules.request(
                specs,
                int(flags["--kv-cache-memory-bytes"]),
                policy=flags.get("KVCORE_VLLM_POLICY", "equal_groups"),
                options=None if "KVCORE_VLLM_POLICY" in flags else PlanOptions(mixed_pages=False),
            ),
            rules,
            registry=registry_module,
        )
        assert trial.plan is not None
        assert [(p.num_blocks, p.bytes_per_block) for p in again.pools] == [
            (p.num_blocks, p.bytes_per_block) for p in trial.plan.pools
        ]
        assert again.max_concurrency() == trial.plan.max_concurrency() == settings.kvcore_tokens
        assert int(flags["--max-num-seqs"]) == trial.knobs.max_num_seqs


def test_a_pooled_candidate_names_what_vllm_cannot_express_and_gives_sglang_its_split(registry_module):
    space = SearchSpace(policies=("kind_pools",), split_shifts=(0.0,))
    result = tune(_request(GIB // 2), WORKLOAD, space, registry=registry_module)
    vllm = vllm_settings(result.best, SPECS, GIB // 2, registry=registry_module)
    assert any("block pools" in setting for setting, _ in vllm.cannot_express)
    sglang = sglang_settings(result.best, SWA_MODEL, GIB // 2, registry=registry_module)
    flags = {f.name: f.value for f in sglang.flags}
    ratio = float(flags["--swa-full-tokens-ratio"])
    assert ratio > 0 and not sglang.cannot_express
    # SGLang's own configurator, told the ratio, sizes what kvcore's split holds (within its page rounding)
    assert sglang.engine_tokens is not None
    assert abs(sglang.engine_tokens - sglang.kvcore_tokens) <= 0.01 * sglang.kvcore_tokens


def test_a_unified_pool_candidate_is_weighed_under_vllm_rules_and_named_where_engines_cannot_run_it(
    registry_module,
):
    # 10 sliding layers beside 2 full ones of one page: the sliding page is a run of 5 rows
    space = SearchSpace(policies=("unified_pool",))
    result = tune(
        _request(GIB // 2), WORKLOAD, space, registry=registry_module, planner=vllm_planner(registry_module)
    )
    best = result.best
    assert best.ok and best.plan is not None and best.plan.null_block == 0  # vLLM's sizing rules
    assert sorted(g.blocks_per_page for g in best.plan.groups) == [1, 5]
    vllm = vllm_settings(best, SPECS, GIB // 2, registry=registry_module)
    assert any("runs of [5] block ids" in setting for setting, _ in vllm.cannot_express)
    assert {f.name: f.value for f in vllm.flags}["KVCORE_VLLM_POLICY"] == "unified_pool"
    sglang = sglang_settings(best, SWA_MODEL, GIB // 2, registry=registry_module)
    ((setting, why),) = sglang.cannot_express
    assert setting == "policy unified_pool" and "--enable-unified-memory" in why


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"objective": "speed"}, "unknown objective"),
        ({"objective": "throughput"}, "is in seconds"),
        ({"objective": "goodput", "step_time": lambda plan: None}, "latency target"),
        ({"max_passes": 0}, "'max_passes'"),
    ],
)
def test_bad_search_inputs_are_refused(registry_module, kwargs, words):
    with pytest.raises(InvalidInputError, match=None) as info:
        tune(_request(GIB // 8), WORKLOAD, SPACE, registry=registry_module, **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("policies", (), "no value"),
        ("max_num_seqs", (0,), "int >= 1"),
        ("max_num_batched_tokens", (True,), "int >= 1"),
        ("split_shifts", (1.5,), "(-1, 1)"),
    ],
)
def test_a_bad_search_space_is_refused(field, value, words):
    kwargs = {"policies": ("shared_buffer",), field: value}
    with pytest.raises(InvalidInputError) as info:
        SearchSpace(**kwargs)
    assert words in str(info.value)


def test_no_candidate_that_runs_says_why(registry_module):
    with pytest.raises(InvalidInputError, match="no candidate could be planned"):
        tune(_request(1 << 20), WORKLOAD, SearchSpace(policies=("shared_buffer",)), registry=registry_module)


def test_sglang_settings_of_a_model_sglang_gives_no_sliding_pool_have_no_ratio(registry_module):
    # Gemma 3's architecture: SGLang turns its sliding pool off and sizes it as full attention
    model = sglang_model(SPECS, {"architectures": ["Gemma3ForCausalLM"]}, fix="")
    space = SearchSpace(policies=("kind_pools",), split_shifts=(0.0,))
    result = tune(_request(GIB // 2), WORKLOAD, space, registry=registry_module)
    sglang = sglang_settings(result.best, model, GIB // 2, registry=registry_module)
    flags = {f.name: f.value for f in sglang.flags}
    assert "--swa-full-tokens-ratio" not in flags
    ((setting, why),) = sglang.cannot_express
    assert setting.startswith("2 pools split") and "no sliding pool" in why
    # kvcore's plan for SGLang and SGLang's own configurator: one full pool of the same tokens
    assert sglang.plan is not None and len(sglang.plan.pools) == 1
    assert int(flags["--max-total-tokens"]) == sglang.kvcore_tokens
    assert sglang.engine_tokens is not None
    # SGLang floors its own pool to a page: kvcore's plan holds as much, within a page
    assert abs(sglang.engine_tokens - sglang.kvcore_tokens) <= int(flags["--page-size"])


@pytest.mark.parametrize("policy", ["uniform", "shared_buffer", "unified_pool"])
def test_a_model_of_one_kind_is_expressible_in_sglang_under_any_policy(registry_module, policy):
    """One attention kind is one SGLang pool whatever the policy: no "SGLang keeps each attention
    kind in a pool of its own" for a model with one kind (issue 38)."""
    specs = mix((4, full()))
    space = SearchSpace(policies=(policy,))
    result = tune(PlanRequest.for_context(specs, GIB // 2, CTX), WORKLOAD, space, registry=registry_module)
    sglang = sglang_settings(result.best, sglang_model(specs, {}, fix=""), GIB // 2, registry=registry_module)
    assert sglang.cannot_express == ()


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (
            PlanRequest.for_context(SPECS, [GIB, GIB], CTX, rank_layers=[list(SPECS)[:6], list(SPECS)[6:]]),
            "one rank",
        ),
        (PlanRequest.for_context(SPECS, GIB, CTX, auto_length=True), "max_model_len='auto'"),
        (PlanRequest.for_context(SPECS, GIB, CTX, num_blocks=64), "num_blocks=64"),
    ],
)
def test_a_request_the_search_cannot_plan_every_candidate_of_is_refused(registry_module, request_, words):
    with pytest.raises(InvalidInputError) as info:
        tune(request_, WORKLOAD, SPACE, registry=registry_module)
    assert words in str(info.value)
