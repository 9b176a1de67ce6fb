"""kvcore's built-in spec kinds and model families, each an ordinary plugin module.

They are registered by :func:`kvcore.get_plugin_manager` through the same hooks a third-party
package implements; see ``kvcore.planning.manager.BUILTIN_PLUGINS``.
"""
