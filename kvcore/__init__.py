"""kvcore: plan, allocate and bind the KV cache of an LLM inference engine.

Spec kinds and allocation policies are plugins (pluggy); the built-ins register through the
same hooks a third-party package uses. Start with :func:`get_plugin_manager` /
:class:`Registry`, then :func:`plan_kv_cache`.

Everything that needs torch is imported on first use (module ``__getattr__``), so ``import
kvcore`` stays cheap: pytest imports it at start-up wherever kvcore is installed, because of its
pytest plugin.
"""

import importlib as _importlib
import typing as _typing

from kvcore.errors import (
    AgreementMismatchError,
    BlockPoolExhaustedError,
    DeviceUnavailableError,
    DistributedAgreementError,
    DuplicateRegistrationError,
    GroupLimitError,
    InsufficientMemoryError,
    InvalidInputError,
    InvalidSpecError,
    KVCacheAllocationError,
    KVCacheBindingError,
    KVCoreError,
    MemoryProfilingError,
    ModelConfigError,
    MultiplePoolsError,
    PlanValidationError,
    PluginLoadError,
    PluginValidationError,
    PolicyNotApplicableError,
    SpecMismatchError,
    StoreUnavailableError,
    UnknownGpuError,
    UnknownModelError,
    UnknownPolicyError,
    UnknownSpecKindError,
)
from kvcore.hookspecs import (
    hookimpl,
    hookspec,
)

#: Public names imported on first use, and the module that holds each.
_LAZY: dict[str, str] = {
    "PluginOrigin": "kvcore.planning.manager",
    "get_plugin_manager": "kvcore.planning.manager",
    "PartViews": "kvcore.runtime.allocation",
    "allocate": "kvcore.runtime.allocation",
    "bind_to_forward_context": "kvcore.runtime.binding",
    "bind_to_modules": "kvcore.runtime.binding",
    "bind_to_runner_list": "kvcore.runtime.binding",
    "NULL_PAGE": "kvcore.runtime.block_pool",
    "BlockPool": "kvcore.runtime.block_pool",
    "BlockTables": "kvcore.runtime.block_tables",
    "PrefixKey": "kvcore.runtime.prefix_cache",
    "Capacity": "kvcore.planning.capacity",
    "efficiency": "kvcore.planning.capacity",
    "ideal_concurrency": "kvcore.planning.capacity",
    "request_bytes": "kvcore.planning.capacity",
    "DistributedExecutor": "kvcore.engine.distributed",
    "Executor": "kvcore.engine.workflow",
    "LocalExecutor": "kvcore.engine.local",
    "initialize_kv_caches": "kvcore.engine.workflow",
    "CacheLayout": "kvcore.cache_layout",
    "DType": "kvcore.dtypes",
    "to_dtype": "kvcore.dtypes",
    "PagePart": "kvcore.cache_layout",
    "MemoryProfile": "kvcore.runtime.memory",
    "determine_available_memory": "kvcore.runtime.memory",
    "ModelFamily": "kvcore.model_family",
    "ModelOptions": "kvcore.model_options",
    "ParameterCount": "kvcore.model_weights",
    "WeightGroup": "kvcore.model_weights",
    "layer_specs_from_config": "kvcore.frontends.hf_config",
    "model_layer_specs": "kvcore.frontends.hf_config",
    "scan_module": "kvcore.frontends.module_scan",
    "KVCachePlan": "kvcore.plan",
    "KVCacheConfig": "kvcore.plan",
    "KVCacheGroup": "kvcore.plan",
    "KVCachePool": "kvcore.plan",
    "KVCacheTensor": "kvcore.plan",
    "Parallelism": "kvcore.planning.ranks",
    "RankLayout": "kvcore.planning.ranks",
    "plan_for_ranks": "kvcore.planning.ranks",
    "plan_kv_cache": "kvcore.planning.planner",
    "AllocationPolicy": "kvcore.policy",
    "BlockPlacement": "kvcore.policy",
    "Layout": "kvcore.policy",
    "PlanOptions": "kvcore.policy",
    "PolicyChoice": "kvcore.policy",
    "TensorPlacement": "kvcore.policy",
    "Registry": "kvcore.planning.registry",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS": "kvcore.spec",
    "KVCacheSpec": "kvcore.spec",
    "SizingContext": "kvcore.spec",
    "is_kv_cache_type_uniform": "kvcore.spec",
    "format_bytes": "kvcore.units",
    "parse_size": "kvcore.units",
    "SimulationResult": "kvcore.simulation.simulator",
    "simulate": "kvcore.simulation.simulator",
    "find_gpu": "kvcore.simulation.gpus",
    "latency_report": "kvcore.simulation.timing",
    "read_profile": "kvcore.simulation.timing",
    "roofline": "kvcore.simulation.timing",
    "Request": "kvcore.simulation.workload",
    "Workload": "kvcore.simulation.workload",
    "read_trace": "kvcore.simulation.workload",
    "synthetic": "kvcore.simulation.workload",
}

if _typing.TYPE_CHECKING:
    from kvcore.cache_layout import (
        CacheLayout,
        PagePart,
    )
    from kvcore.dtypes import DType, to_dtype
    from kvcore.engine.distributed import DistributedExecutor
    from kvcore.engine.local import LocalExecutor
    from kvcore.engine.workflow import (
        Executor,
        initialize_kv_caches,
    )
    from kvcore.frontends.hf_config import (
        layer_specs_from_config,
        model_layer_specs,
    )
    from kvcore.frontends.module_scan import scan_module
    from kvcore.model_family import ModelFamily
    from kvcore.model_options import ModelOptions
    from kvcore.model_weights import ParameterCount, WeightGroup
    from kvcore.plan import (
        KVCacheConfig,
        KVCacheGroup,
        KVCachePlan,
        KVCachePool,
        KVCacheTensor,
    )
    from kvcore.planning.capacity import (
        Capacity,
        efficiency,
        ideal_concurrency,
        request_bytes,
    )
    from kvcore.planning.manager import (
        PluginOrigin,
        get_plugin_manager,
    )
    from kvcore.planning.planner import plan_kv_cache
    from kvcore.planning.ranks import Parallelism, RankLayout, plan_for_ranks
    from kvcore.planning.registry import Registry
    from kvcore.policy import (
        AllocationPolicy,
        BlockPlacement,
        Layout,
        PlanOptions,
        PolicyChoice,
        TensorPlacement,
    )
    from kvcore.runtime.allocation import (
        PartViews,
        allocate,
    )
    from kvcore.runtime.binding import (
        bind_to_forward_context,
        bind_to_modules,
        bind_to_runner_list,
    )
    from kvcore.runtime.block_pool import (
        NULL_PAGE,
        BlockPool,
    )
    from kvcore.runtime.block_tables import BlockTables
    from kvcore.runtime.memory import (
        MemoryProfile,
        determine_available_memory,
    )
    from kvcore.runtime.prefix_cache import PrefixKey
    from kvcore.simulation.gpus import find_gpu
    from kvcore.simulation.simulator import SimulationResult, simulate
    from kvcore.simulation.timing import latency_report, read_profile, roofline
    from kvcore.simulation.workload import Request, Workload, read_trace, synthetic
    from kvcore.spec import (
        DEFAULT_MAX_NUM_BATCHED_TOKENS,
        KVCacheSpec,
        SizingContext,
        is_kv_cache_type_uniform,
    )
    from kvcore.units import (
        format_bytes,
        parse_size,
    )

__all__ = [
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "NULL_PAGE",
    "AgreementMismatchError",
    "AllocationPolicy",
    "BlockPlacement",
    "BlockPool",
    "BlockPoolExhaustedError",
    "BlockTables",
    "CacheLayout",
    "Capacity",
    "DType",
    "DeviceUnavailableError",
    "DistributedAgreementError",
    "DistributedExecutor",
    "DuplicateRegistrationError",
    "Executor",
    "GroupLimitError",
    "InsufficientMemoryError",
    "InvalidInputError",
    "InvalidSpecError",
    "KVCacheAllocationError",
    "KVCacheBindingError",
    "KVCacheConfig",
    "KVCacheGroup",
    "KVCachePlan",
    "KVCachePool",
    "KVCacheSpec",
    "KVCacheTensor",
    "KVCoreError",
    "Layout",
    "LocalExecutor",
    "MemoryProfile",
    "MemoryProfilingError",
    "ModelConfigError",
    "ModelFamily",
    "ModelOptions",
    "MultiplePoolsError",
    "PagePart",
    "Parallelism",
    "ParameterCount",
    "PartViews",
    "PlanOptions",
    "PlanValidationError",
    "PluginLoadError",
    "PluginOrigin",
    "PluginValidationError",
    "PolicyChoice",
    "PolicyNotApplicableError",
    "PrefixKey",
    "RankLayout",
    "Registry",
    "Request",
    "SimulationResult",
    "SizingContext",
    "SpecMismatchError",
    "StoreUnavailableError",
    "TensorPlacement",
    "UnknownGpuError",
    "UnknownModelError",
    "UnknownPolicyError",
    "UnknownSpecKindError",
    "WeightGroup",
    "Workload",
    "allocate",
    "bind_to_forward_context",
    "bind_to_modules",
    "bind_to_runner_list",
    "determine_available_memory",
    "efficiency",
    "find_gpu",
    "format_bytes",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "ideal_concurrency",
    "initialize_kv_caches",
    "is_kv_cache_type_uniform",
    "latency_report",
    "layer_specs_from_config",
    "model_layer_specs",
    "parse_size",
    "plan_for_ranks",
    "plan_kv_cache",
    "read_profile",
    "read_trace",
    "request_bytes",
    "roofline",
    "scan_module",
    "simulate",
    "synthetic",
    "to_dtype",
]


def __getattr__(name: str) -> _typing.Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("kvcore")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvcore' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
