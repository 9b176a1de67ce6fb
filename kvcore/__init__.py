"""kvcore: plan, allocate and bind the KV cache of an LLM inference engine.

Spec kinds and allocation policies are plugins (pluggy); the built-ins register through the
same hooks a third-party package uses. Start with :func:`get_plugin_manager` /
:class:`Registry`, then :func:`plan_kv_cache`.

Everything that needs torch is imported on first use (module ``__getattr__``), so ``import
kvcore`` stays cheap: pytest imports it at start-up wherever kvcore is installed, because of its
pytest plugin.
"""

import importlib as _importlib
import types as _types
import typing as _typing

from kvcore.errors import (
    AgreementMismatchError as AgreementMismatchError,
    BlockPoolExhaustedError as BlockPoolExhaustedError,
    DeviceUnavailableError as DeviceUnavailableError,
    DistributedAgreementError as DistributedAgreementError,
    DuplicateRegistrationError as DuplicateRegistrationError,
    GroupLimitError as GroupLimitError,
    HostTierError as HostTierError,
    HubUnavailableError as HubUnavailableError,
    InsufficientMemoryError as InsufficientMemoryError,
    InvalidInputError as InvalidInputError,
    InvalidSpecError as InvalidSpecError,
    KVCacheAllocationError as KVCacheAllocationError,
    KVCacheBindingError as KVCacheBindingError,
    KVCoreError as KVCoreError,
    KVCoreWarning as KVCoreWarning,
    MemoryProfilingError as MemoryProfilingError,
    MissingDependencyError as MissingDependencyError,
    ModelAccessError as ModelAccessError,
    ModelConfigError as ModelConfigError,
    MultiplePoolsError as MultiplePoolsError,
    PlanValidationError as PlanValidationError,
    PluginFailedWarning as PluginFailedWarning,
    PluginLoadError as PluginLoadError,
    PluginValidationError as PluginValidationError,
    PolicyNotApplicableError as PolicyNotApplicableError,
    SimulationWarning as SimulationWarning,
    SpecMismatchError as SpecMismatchError,
    StaleBuildError as StaleBuildError,
    StoreUnavailableError as StoreUnavailableError,
    UnknownGpuError as UnknownGpuError,
    UnknownModelError as UnknownModelError,
    UnknownPolicyError as UnknownPolicyError,
    UnknownSpecKindError as UnknownSpecKindError,
)
from kvcore.hookspecs import (
    hookimpl as hookimpl,
    hookspec as hookspec,
)
from kvcore.removed import refuse_removed as _refuse_removed

#: Names kvcore 0.3 removed (deprecated since 0.2), with what replaced each.
_REMOVED: dict[str, str] = {
    "KVCacheConfig": "kvcore.KVCachePlan",
    "Layout": "kvcore.BlockPlacement",
    "RankLayout": "kvcore.Parallelism",
}

#: The public names imported on first use, by where each is defined: ``kvcore.NAME`` imports
#: the module then (the runtime's names need torch; the rest are kept out of ``import kvcore``,
#: which pytest runs at start-up wherever kvcore is installed).
_LAZY: dict[str, str] = {
    "CacheLayout": "kvcore.cache_layout",
    "PagePart": "kvcore.cache_layout",
    "DType": "kvcore.dtypes",
    "to_dtype": "kvcore.dtypes",
    "DistributedExecutor": "kvcore.engine.distributed",
    "LocalExecutor": "kvcore.engine.local",
    "Executor": "kvcore.engine.workflow",
    "initialize_kv_caches": "kvcore.engine.workflow",
    "layer_specs_from_config": "kvcore.frontends.hf_config",
    "model_layer_specs": "kvcore.frontends.hf_config",
    "scan_module": "kvcore.frontends.module_scan",
    "ModelFamily": "kvcore.model_family",
    "ModelOptions": "kvcore.model_options",
    "ParameterCount": "kvcore.model_weights",
    "WeightGroup": "kvcore.model_weights",
    "KVCacheGroup": "kvcore.plan",
    "KVCachePlan": "kvcore.plan",
    "KVCachePool": "kvcore.plan",
    "KVCacheTensor": "kvcore.plan",
    "Capacity": "kvcore.planning.capacity",
    "efficiency": "kvcore.planning.capacity",
    "ideal_concurrency": "kvcore.planning.capacity",
    "request_bytes": "kvcore.planning.capacity",
    "PluginOrigin": "kvcore.planning.manager",
    "get_plugin_manager": "kvcore.planning.manager",
    "longest_admitted": "kvcore.planning.planner",
    "plan_kv_cache": "kvcore.planning.planner",
    "Parallelism": "kvcore.planning.ranks",
    "plan_for_ranks": "kvcore.planning.ranks",
    "Registry": "kvcore.planning.registry",
    "MaxModelLen": "kvcore.planning.request",
    "PlanRequest": "kvcore.planning.request",
    "AllocationPolicy": "kvcore.policy",
    "BlockPlacement": "kvcore.policy",
    "PlanOptions": "kvcore.policy",
    "PolicyChoice": "kvcore.policy",
    "TensorPlacement": "kvcore.policy",
    "PartViews": "kvcore.runtime.allocation",
    "allocate": "kvcore.runtime.allocation",
    "bind_to_forward_context": "kvcore.runtime.binding",
    "bind_to_modules": "kvcore.runtime.binding",
    "bind_to_runner_list": "kvcore.runtime.binding",
    "BlockPool": "kvcore.runtime.block_pool",
    "NULL_PAGE": "kvcore.runtime.block_pool",
    "BlockTables": "kvcore.runtime.block_tables",
    "MemoryProfile": "kvcore.runtime.memory",
    "determine_available_memory": "kvcore.runtime.memory",
    "PrefixKey": "kvcore.runtime.prefix_cache",
    "find_gpu": "kvcore.simulation.gpus",
    "SimulationResult": "kvcore.simulation.simulator",
    "simulate": "kvcore.simulation.simulator",
    "latency_report": "kvcore.simulation.timing",
    "read_profile": "kvcore.simulation.timing",
    "roofline": "kvcore.simulation.timing",
    "Request": "kvcore.simulation.workload",
    "Workload": "kvcore.simulation.workload",
    "read_trace": "kvcore.simulation.workload",
    "synthetic": "kvcore.simulation.workload",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS": "kvcore.spec",
    "KVCacheSpec": "kvcore.spec",
    "SizingContext": "kvcore.spec",
    "is_kv_cache_type_uniform": "kvcore.spec",
    "format_bytes": "kvcore.units",
    "parse_size": "kvcore.units",
}

# The same names for type checkers, which cannot follow the table (tests/meta/test_exports.py
# holds the two equal).
if _typing.TYPE_CHECKING:
    from kvcore.cache_layout import (
        CacheLayout as CacheLayout,
        PagePart as PagePart,
    )
    from kvcore.dtypes import (
        DType as DType,
        to_dtype as to_dtype,
    )
    from kvcore.engine.distributed import DistributedExecutor as DistributedExecutor
    from kvcore.engine.local import LocalExecutor as LocalExecutor
    from kvcore.engine.workflow import (
        Executor as Executor,
        initialize_kv_caches as initialize_kv_caches,
    )
    from kvcore.frontends.hf_config import (
        layer_specs_from_config as layer_specs_from_config,
        model_layer_specs as model_layer_specs,
    )
    from kvcore.frontends.module_scan import scan_module as scan_module
    from kvcore.model_family import ModelFamily as ModelFamily
    from kvcore.model_options import ModelOptions as ModelOptions
    from kvcore.model_weights import (
        ParameterCount as ParameterCount,
        WeightGroup as WeightGroup,
    )
    from kvcore.plan import (
        KVCacheGroup as KVCacheGroup,
        KVCachePlan as KVCachePlan,
        KVCachePool as KVCachePool,
        KVCacheTensor as KVCacheTensor,
    )
    from kvcore.planning.capacity import (
        Capacity as Capacity,
        efficiency as efficiency,
        ideal_concurrency as ideal_concurrency,
        request_bytes as request_bytes,
    )
    from kvcore.planning.manager import (
        PluginOrigin as PluginOrigin,
        get_plugin_manager as get_plugin_manager,
    )
    from kvcore.planning.planner import (
        longest_admitted as longest_admitted,
        plan_kv_cache as plan_kv_cache,
    )
    from kvcore.planning.ranks import (
        Parallelism as Parallelism,
        plan_for_ranks as plan_for_ranks,
    )
    from kvcore.planning.registry import Registry as Registry
    from kvcore.planning.request import (
        MaxModelLen as MaxModelLen,
        PlanRequest as PlanRequest,
    )
    from kvcore.policy import (
        AllocationPolicy as AllocationPolicy,
        BlockPlacement as BlockPlacement,
        PlanOptions as PlanOptions,
        PolicyChoice as PolicyChoice,
        TensorPlacement as TensorPlacement,
    )
    from kvcore.runtime.allocation import (
        PartViews as PartViews,
        allocate as allocate,
    )
    from kvcore.runtime.binding import (
        bind_to_forward_context as bind_to_forward_context,
        bind_to_modules as bind_to_modules,
        bind_to_runner_list as bind_to_runner_list,
    )
    from kvcore.runtime.block_pool import (
        NULL_PAGE as NULL_PAGE,
        BlockPool as BlockPool,
    )
    from kvcore.runtime.block_tables import BlockTables as BlockTables
    from kvcore.runtime.memory import (
        MemoryProfile as MemoryProfile,
        determine_available_memory as determine_available_memory,
    )
    from kvcore.runtime.prefix_cache import PrefixKey as PrefixKey
    from kvcore.simulation.gpus import find_gpu as find_gpu
    from kvcore.simulation.simulator import (
        SimulationResult as SimulationResult,
        simulate as simulate,
    )
    from kvcore.simulation.timing import (
        latency_report as latency_report,
        read_profile as read_profile,
        roofline as roofline,
    )
    from kvcore.simulation.workload import (
        Request as Request,
        Workload as Workload,
        read_trace as read_trace,
        synthetic as synthetic,
    )
    from kvcore.spec import (
        DEFAULT_MAX_NUM_BATCHED_TOKENS as DEFAULT_MAX_NUM_BATCHED_TOKENS,
        KVCacheSpec as KVCacheSpec,
        SizingContext as SizingContext,
        is_kv_cache_type_uniform as is_kv_cache_type_uniform,
    )
    from kvcore.units import (
        format_bytes as format_bytes,
        parse_size as parse_size,
    )


#: Every public name: the errors, the hook markers and the names imported on first use.
__all__ = sorted(
    {
        name
        for name, value in globals().items()
        if not name.startswith("_") and not isinstance(value, _types.ModuleType)  # not kvcore.errors
    }
    | set(_LAZY)
)


def __getattr__(name: str) -> _typing.Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("kvcore")
    if name in _REMOVED:
        _refuse_removed("kvcore", name, _REMOVED[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvcore' has no attribute {name!r}", name=name)
    try:
        imported = _importlib.import_module(module)
    except ModuleNotFoundError as exc:  # torch, for the runtime's names: say which extra brings it
        from kvcore.optional_dependencies import missing_from

        error = missing_from(exc, f"kvcore.{name}")
        if error is None:
            raise
        raise error from None
    value = getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
