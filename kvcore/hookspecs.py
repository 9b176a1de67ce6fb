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
    import torch

    from kvcore.cache_layout import CacheLayout
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


# -- model front ends ----------------------------------------------------------------------


@hookspec(firstresult=True)
def kvcore_layer_specs(
    config: Mapping[str, Any], options: Mapping[str, Any]
) -> Mapping[str, KVCacheSpec] | None:
    """Turn a Hugging Face ``config.json`` (as a dict) into ``{layer name: spec}``.

    :param config: the parsed ``config.json`` of the whole model (wrappers included: read
        ``text_config`` yourself if your family nests the language model).
    :param options: model options such as ``tp`` (tensor-parallel size), ``kv_cache_dtype``
        and ``block_size``; see :mod:`kvcore.frontends.hf_config`.
    :returns: the specs of every layer that needs a cache, in model order, or ``None`` when
        this plugin does not know the model (look at ``model_type`` / ``architectures``).

    Stops at the first non-None result. Called once per model that is read.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def kvcore_spec_for_module(
    module: torch.nn.Module, name: str, options: Mapping[str, Any]
) -> KVCacheSpec | None:
    """Turn one ``torch.nn.Module`` (an attention or state layer) into its spec.

    :param module: a submodule of the model being scanned.
    :param name: its qualified name in the model (``model.layers.3.self_attn``).
    :param options: model options as for :func:`kvcore_layer_specs`.
    :returns: the layer's spec, or ``None`` when the module is not a cache-holding layer this
        plugin recognises.

    Stops at the first non-None result. Called once per submodule during a model scan.

    .. versionadded:: 0.1
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
