"""The hooks kvcore calls: the whole contract between kvcore and its plugins.

Built-in spec kinds, model families and policies implement these hooks exactly as a
third-party package does. Implementations are marked with :data:`hookimpl`::

    from kvcore import hookimpl

    @hookimpl
    def kvcore_register_spec_kinds(register):
        register(MySpec)

Hooks are always called with keyword arguments, and an implementation may accept any subset of
a hook's arguments (opt-in arguments), so hooks can gain arguments without breaking plugins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from kvcore.cache_layout import CacheLayout
    from kvcore.dtypes import DType
    from kvcore.model_family import ModelFamily
    from kvcore.model_options import ModelOptions
    from kvcore.model_weights import ParameterCount
    from kvcore.policy import AllocationPolicy
    from kvcore.spec import KVCacheSpec

#: Project name of kvcore's hooks; also the entry-point group plugins are found under.
PROJECT_NAME = "kvcore"

#: Marks a function in this module as a hook specification.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marks a plugin function as the implementation of a kvcore hook.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -- registration hooks --------------------------------------------------------------------


@hookspec
def kvcore_register_spec_kinds(register: Callable[[type[KVCacheSpec]], None]) -> None:
    """Register the spec kinds (``KVCacheSpec`` subclasses) this plugin contributes.

    :param register: call it once per spec class. kvcore checks the class at once: it must be
        a frozen attrs subclass of :class:`kvcore.KVCacheSpec` with a non-empty ``kind`` that
        no other plugin registered.
    :returns: nothing; results are ignored.

    All implementations are called, once per plugin manager, when the registry is built.

    .. versionadded:: 0.1
    """


@hookspec
def kvcore_register_policies(register: Callable[[AllocationPolicy], None]) -> None:
    """Register the allocation policies this plugin contributes.

    :param register: call it once per policy *instance*. The policy must follow
        :class:`kvcore.AllocationPolicy` and have a ``name`` no other plugin registered.
    :returns: nothing; results are ignored.

    All implementations are called, once per plugin manager, when the registry is built.

    .. versionadded:: 0.1
    """


@hookspec
def kvcore_register_spec_strategies(
    register: Callable[[type[KVCacheSpec], SearchStrategy[KVCacheSpec]], None],
    block_sizes: SearchStrategy[int],
    dtypes: SearchStrategy[DType],
) -> None:
    """Register a hypothesis strategy for each spec kind this plugin contributes (tests only).

    :param register: call it once per spec class with a strategy that draws valid instances
        of it: ``register(MySpec, my_specs())``.
    :param block_sizes: the testing kit's strategy for block sizes; draw ``block_size`` from it
        so that every kind is drawn alike.
    :param dtypes: the testing kit's strategy for cache dtypes.
    :returns: nothing; results are ignored.

    Only :mod:`kvcore.testing.strategies` calls it, when a test first asks for the strategy
    of a kind (``specs(registry=...)``, the conformance suites); kvcore never calls it at
    run time. Import hypothesis inside the implementation, never at module level, so that
    the plugin loads where hypothesis is not installed. When two plugins register a strategy
    for one class, the first one called wins (plugins registered later are called first, so
    a third-party plugin can narrow a built-in kind's strategy).

    .. versionadded:: 0.2
    """


@hookspec
def kvcore_register_scheduler_profiles(register: Callable[[Any], None]) -> None:
    """Register the scheduler profiles this plugin contributes: the engines ``kvcore simulate``
    can replay a workload as (``--scheduler NAME``; ``simulate(..., scheduler=NAME)``).

    :param register: call it once per profile *instance*: an object with a ``name`` (the
        ``--scheduler`` value, unique among plugins), a one-line ``description`` and
        ``simulator(plan, workload, *, max_num_batched_tokens, prefix_caching)`` returning a
        stepper (``done``, ``steps``, ``finished``, ``step()``, ``result()``) as
        :class:`kvcore.simulation.profile.SchedulerProfile` describes. kvcore checks it at
        once: a name another plugin registered raises
        :class:`~kvcore.errors.DuplicateRegistrationError` naming both plugins.
    :returns: nothing; results are ignored.

    All implementations are called, once per plugin manager, when the registry is built;
    :func:`kvcore.simulation.simulate` then asks the registry for the profile it is given
    by name. The built-in profiles (``vllm``, the default, ``kvcore`` and ``sglang``) are registered by
    :mod:`kvcore.simulation.profiles` through this same hook.

    .. versionadded:: 0.2
    """


# -- model front ends ----------------------------------------------------------------------


@hookspec
def kvcore_register_model_families(register: Callable[[ModelFamily], None]) -> None:
    """Register the model families this plugin contributes: what reads a ``config.json``.

    :param register: call it once per :class:`kvcore.ModelFamily`: a name, the
        ``model_type`` values it claims, and ``layer_specs(config, options)`` that turns a
        config (and the :class:`kvcore.ModelOptions`) into ``{layer name: spec}``. kvcore
        checks it at once: a model type another plugin's family already claims raises
        :class:`~kvcore.errors.DuplicateRegistrationError` naming both families and plugins.
        A family with a ``fallback`` test reads configs whose model type nobody claims.
    :returns: nothing; results are ignored.

    All implementations are called, once per plugin manager, when the registry is built;
    :meth:`kvcore.planning.registry.Registry.layer_specs` then calls the family that claims a
    config's model type.

    .. versionadded:: 0.2
    """


@hookspec(firstresult=True)
def kvcore_spec_for_module(module: Any, name: str, options: ModelOptions) -> KVCacheSpec | None:
    """Turn one ``torch.nn.Module`` (an attention or state layer) into its spec.

    :param module: a submodule of the model being scanned (a ``torch.nn.Module``).
    :param name: its qualified name in the model (``model.layers.3.self_attn``).
    :param options: the :class:`kvcore.ModelOptions` of the scan (tensor parallelism, dtypes,
        block size).
    :returns: the layer's spec, or ``None`` when the module is not a cache-holding layer this
        plugin recognises.

    Stops at the first non-None result. Called once per submodule during a model scan
    (:meth:`kvcore.planning.registry.Registry.spec_for_module`).

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def kvcore_count_parameters(config: Mapping[str, Any]) -> ParameterCount | None:
    """Count a model's weights from its ``config.json``, for sizing a KV cache from a GPU.

    :param config: the parsed config of the whole model (wrappers included: read
        ``text_config`` and ``vision_config`` yourself).
    :returns: a :class:`kvcore.ParameterCount` (the parameters in :class:`kvcore.WeightGroup`
        groups, each naming its modules so that ``quantization_config`` applies group by group;
        the weights' dtype; the widths the activation estimate needs), or ``None`` when the
        config's model type is not this plugin's.

    Stops at the first non-None result. The built-in counts (``kvcore.plugins.models.parameters``)
    are ``trylast=True``, so a plugin can count a built-in model type its own way. Called once per
    ``--gpu-memory`` budget (:func:`kvcore.planning.gpu_budget.count_parameters`); a config no
    plugin counts is an :class:`~kvcore.errors.UnknownModelError` that says to give the KV cache a
    byte budget of its own (``--memory`` on the command line).

    .. versionadded:: 0.3
    """


# -- runtime -------------------------------------------------------------------------------


@hookspec(firstresult=True)
def kvcore_cache_layout(spec: KVCacheSpec) -> CacheLayout | None:
    """Say how one page of a layer with ``spec`` is seen as tensors (shape, dtype, block dim).

    :param spec: the layer's spec (as planned: its block size is the group's).
    :returns: a :class:`kvcore.cache_layout.CacheLayout` whose parts all lie inside one page of
        ``spec.page_size_bytes`` bytes, or ``None`` to leave the decision to other plugins.

    Stops at the first non-None result. Built-in kinds implement it with ``trylast=True`` so an
    attention-backend plugin can choose its own layout. Called once per layer at allocation.

    .. versionadded:: 0.1
    """
