"""kvcore 0.3 removed the forms deprecated in 0.2: each now fails with an error naming its
replacement (docs/reference/plugin-api.md, "Removed in 0.3"), instead of a bare "no attribute".

``third_party/example_0_1/`` is the example plugin package as it was written against kvcore
0.1, byte for byte: its spec kind compares torch dtypes and its policy imports ``kvcore.Layout``,
so both now fail, saying what to write instead.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import kvcore
from kvcore import (
    InvalidInputError,
    PlanRequest,
    PluginValidationError,
    SizingContext,
    hookimpl,
    initialize_kv_caches,
    plan_kv_cache,
)
from kvcore.dtypes import to_dtype
from tests.helpers import full, mix, sliding

SPECS = mix((2, full()), (6, sliding(1024)))
CONTEXT = SizingContext(max_model_len=8192)


# -- names ------------------------------------------------------------------------------------


#: (module, removed name, what its error names)
REMOVED_NAMES = [
    ("kvcore", "KVCacheConfig", "kvcore.KVCachePlan"),
    ("kvcore", "Layout", "kvcore.BlockPlacement"),
    ("kvcore", "RankLayout", "kvcore.Parallelism"),
    ("kvcore.planning.ranks", "RankLayout", "Parallelism"),
    ("kvcore.runtime.block_pool", "MultiPoolBlockPool", "BlockPool"),
    ("kvcore.planning.planner", "plan_model", "plan(PlanRequest(...), registry=...)"),
    ("kvcore.planning.planner", "plan_longest", "MaxModelLen.up_to"),
    ("kvcore.planning.planner", "largest_admitted", "longest_admitted(PlanRequest(..., check_fit=False)"),
]


@pytest.mark.parametrize(("module", "name", "replacement"), REMOVED_NAMES)
def test_a_removed_name_names_its_replacement(module, name, replacement):
    home = importlib.import_module(module)
    said = rf"{module}\.{name} was removed in kvcore 0\.3: use .*{_escaped(replacement)}"
    with pytest.raises(AttributeError, match=said):
        getattr(home, name)
    with pytest.raises(ImportError, match=said):
        exec(f"from {module} import {name}", {})
    assert not hasattr(home, name)  # hasattr and getattr's default still work
    assert name not in getattr(home, "__all__", ())


def test_a_name_that_never_was_is_still_a_plain_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'plan_everything'"):
        kvcore.plan_everything  # noqa: B018
    from kvcore.planning import planner

    with pytest.raises(AttributeError, match="has no attribute 'plan_everything'"):
        planner.plan_everything  # noqa: B018


def test_is_multi_pool_names_what_to_ask_instead(registry):
    plan = plan_kv_cache(SPECS, 2**30, CONTEXT, registry=registry)
    with pytest.raises(AttributeError, match=r"is_multi_pool was removed .*runs_in_one_pool.*names_pools"):
        plan.is_multi_pool  # noqa: B018
    assert not hasattr(plan, "is_multi_pool") and plan.runs_in_one_pool


def test_the_model_family_kit_is_only_under_its_new_name():
    sys.modules.pop("kvcore.plugins.models.common", None)
    with pytest.raises(ImportError, match=r"models\.common was removed in kvcore 0\.3: .*models\.kit"):
        importlib.import_module("kvcore.plugins.models.common")
    with pytest.raises(ImportError, match=r"ModelFamily\(.*model_types"):  # 0.1's claim, said too
        from kvcore.plugins.models.common import claim  # noqa: F401


# -- the keyword form of the planning entry points -----------------------------------------


def _engine_calls(registry):
    from kvcore.integrations.sglang.rules import SglangRules, plan_for_sglang
    from kvcore.integrations.transformers.rules import TransformersRules, plan_for_transformers
    from kvcore.integrations.vllm.rules import VllmRules, plan_for_vllm
    from kvcore.planning.compare import compare_policies
    from kvcore.planning.frontier import policy_frontier

    vllm = VllmRules(max_model_len=8192, max_num_batched_tokens=512)
    return {
        "plan_for_vllm": lambda: plan_for_vllm(SPECS, 2**30, vllm, registry=registry, policy="shared_buffer"),
        "plan_for_sglang": lambda: plan_for_sglang(
            SPECS, 2**30, SglangRules(context_len=8192, page_size=16), registry=registry
        ),
        "plan_for_transformers": lambda: plan_for_transformers(
            SPECS, 2**30, TransformersRules(max_model_len=8192), registry=registry
        ),
        "compare_policies": lambda: compare_policies(SPECS, 2**30, CONTEXT, registry=registry),
        "policy_frontier": lambda: policy_frontier(
            SPECS, 2**30, CONTEXT, registry=registry, policy="uniform"
        ),
    }


@pytest.mark.parametrize(
    "name",
    ["plan_for_vllm", "plan_for_sglang", "plan_for_transformers", "compare_policies", "policy_frontier"],
)
def test_the_keyword_form_of_an_entry_point_names_the_request_form(registry, name):
    call = _engine_calls(registry)[name]
    with pytest.raises(
        InvalidInputError, match=rf"{name}\(specs, .* was removed in kvcore 0\.3: use {name}\("
    ):
        call()


def test_an_executor_of_the_0_1_protocol_is_refused_naming_the_new_one(registry):
    class Agreeing01:
        def get_kv_cache_spec(self):
            return {"a": full()}

        def determine_available_memory(self):
            return 2**30

        def initialize(self, plan):  # pragma: no cover - refused before
            raise AssertionError("initialized")

        def agree_on_plan(
            self, specs, memory, context, *, registry, policy="auto", options=None, num_blocks=None
        ):
            raise AssertionError("called the 0.1 way")  # pragma: no cover

    with pytest.raises(
        PluginValidationError, match=r"Agreeing01\.agree_on_plan\(specs, .*agree_on_plan\(request"
    ):
        initialize_kv_caches(Agreeing01(), registry=registry, context=CONTEXT)


def test_the_distributed_executor_takes_a_request_only():
    from kvcore.engine.distributed import DistributedExecutor

    executor = object.__new__(DistributedExecutor)  # the check comes before any rank is asked
    with pytest.raises(InvalidInputError, match=r"agree_on_plan\(specs, .* was removed .*PlanRequest"):
        executor.agree_on_plan(SPECS, 2**30, CONTEXT, registry=None)
    request = PlanRequest.for_context(SPECS, 2**30, CONTEXT)
    assert request.budgets == (2**30,)


# -- plugins ----------------------------------------------------------------------------------


def test_a_policy_without_auto_priority_is_refused_naming_it(make_kvcore_registry):
    from kvcore.policies.uniform import UniformPolicy

    class Policy01:  # 0.1 had no auto_priority
        name = "acme.legacy"
        description = "a 0.1 policy"
        _inner = UniformPolicy()

        def why_not(self, specs):
            return self._inner.why_not(specs)

        def group(self, specs, context, options):
            return self._inner.group(specs, context, options)

        def layout(self, groups):
            return self._inner.layout(groups)

    @hookimpl
    def kvcore_register_policies(register):
        register(Policy01())

    plugin = type("Legacy01", (), {"kvcore_register_policies": staticmethod(kvcore_register_policies)})()
    with pytest.raises(
        PluginValidationError, match=r"'acme.legacy' has no auto_priority.*auto_priority = None"
    ):
        make_kvcore_registry(plugin)


def test_the_0_1_kind_fails_where_it_compares_torch_dtypes_naming_kvcore_dtypes():
    from tests.plugins.third_party.example_0_1.quantized_kv_0_1 import QuantizedKVSpec

    with pytest.raises(InvalidInputError, match=r"torch\.int8.*kvcore\.dtypes\.int8 .*to_dtype"):
        QuantizedKVSpec(
            block_size=16, num_kv_heads=8, head_size=128, payload_dtype="int8", scale_dtype="float16"
        )


@pytest.mark.parametrize("torch_dtype", [torch.int8, torch.bfloat16])
def test_a_dtype_compared_with_a_torch_dtype_names_the_kvcore_one(torch_dtype):
    name = str(torch_dtype).removeprefix("torch.")
    for compare in (lambda: to_dtype(name) == torch_dtype, lambda: torch_dtype != to_dtype(name)):
        with pytest.raises(InvalidInputError, match=rf"kvcore\.dtypes\.{name} \(or to_dtype"):
            compare()
    assert to_dtype(torch_dtype) == to_dtype(name)  # converting first is the replacement


def test_the_0_1_region_policy_is_refused_at_its_import_naming_block_placement():
    sys.modules.pop("tests.plugins.third_party.example_0_1.separate_regions_0_1", None)
    with pytest.raises(
        ImportError, match=r"kvcore\.Layout was removed in kvcore 0\.3: use kvcore\.BlockPlacement"
    ):
        importlib.import_module("tests.plugins.third_party.example_0_1.separate_regions_0_1")


# -- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "new"),
    [
        (["compare", "--model", "llama-3.1-8b", "--memory", "8GiB", "--workload", "x.jsonl"], "--trace"),
        (["tune", "--model", "llama-3.1-8b", "--memory", "8GiB", "--num-seqs", "8"], "--max-num-seqs"),
        (
            ["tune", "--model", "llama-3.1-8b", "--memory", "8GiB", "--batched-tokens", "8"],
            "--max-num-batched-tokens",
        ),
    ],
)
def test_a_removed_option_names_the_one_to_write(argv, new, capsys, monkeypatch):
    from kvcore.cli import main

    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{argv[-2]} was removed in kvcore 0.3; write {new}" in err and "Traceback" not in err


def _escaped(text: str) -> str:
    import re

    return re.escape(text)
