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

#: Names kept from earlier versions: each still works, with a DeprecationWarning naming its
#: replacement, until the version given (docs/reference/plugin-api.md).
_DEPRECATED: dict[str, tuple[str, str, str]] = {
    "Layout": ("kvcore.policy", "BlockPlacement", "0.3"),
    "KVCacheConfig": ("kvcore.plan", "KVCachePlan", "0.3"),
    "RankLayout": ("kvcore.planning.ranks", "Parallelism", "0.3"),
}

# The public names imported on first use are written once, in the TYPE_CHECKING block below
# (as explicit re-exports, for type checkers); _lazy_names() reads that block at import.
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
    from kvcore.planning.planner import plan_kv_cache as plan_kv_cache
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



def _lazy_names() -> dict[str, str]:
    """The TYPE_CHECKING block's ``from MODULE import NAME as NAME``, as ``{NAME: MODULE}``."""
    import ast

    with open(__file__, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_typing.TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    module = statement.module
                    found.update((alias.asname or alias.name, module) for alias in statement.names)
    return found


_LAZY = _lazy_names()
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
    if name in _DEPRECATED:
        home, replacement, until = _DEPRECATED[name]
        import warnings

        warnings.warn(
            f"kvcore.{name} is deprecated: use kvcore.{replacement} (removed in kvcore {until})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_importlib.import_module(home), replacement)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvcore' has no attribute {name!r}")
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
