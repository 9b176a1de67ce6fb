"""Registries for tests: the built-ins plus the plugins under test, optionally the installed ones.

A plugin under test is usually installed too (``pip install -e .``), so with autoloading on its
entry point has already registered the very module a test passes explicitly. :func:`build_registry`
registers each explicit plugin only once, so both ways of finding it give one registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

import pluggy

from kvcore.errors import PluginValidationError
from kvcore.planning.manager import PluginOrigin, get_plugin_manager
from kvcore.planning.registry import Registry


def _plugin_name(plugin: object) -> str:
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return f"{type(plugin).__module__}:{type(plugin).__qualname__}"


def build_registry(*plugins: object, autoload: bool = False, block: Iterable[str] = ()) -> Registry:
    """A fresh registry: the built-ins, ``plugins``, and the installed entry points if ``autoload``.

    Args:
        plugins: plugin modules or objects to register explicitly (the plugin under test).
        autoload: also load the entry points of group ``kvcore`` (every installed plugin).
        block: plugin names not to register (built-in module names or entry-point names).

    Returns:
        A registry over a new plugin manager; nothing is shared with other registries. It loads
        strictly: a plugin that fails to load fails the test instead of being skipped.

    Raises:
        DuplicateRegistrationError: two plugins register the same kind or policy name.
        PluginLoadError: an installed entry point fails to import.
        PluginValidationError: a plugin implements a hook wrongly.
    """
    pm = get_plugin_manager(autoload=autoload, block=block, strict=True)
    for plugin in plugins:
        name = _plugin_name(plugin)
        if pm.is_registered(plugin) or pm.is_blocked(name):
            continue  # already found through its entry point, or blocked on purpose
        pm.register_plugin(plugin, name, PluginOrigin(name=name, source="explicit", module=name))
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginValidationError(
            f"plugin {_plugin_name(exc.plugin)} implements a hook kvcore does not have: {exc}; "
            "check the spelling against kvcore.hookspecs"
        ) from exc
    return Registry.from_plugin_manager(pm)
