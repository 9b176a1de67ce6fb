"""Which registered policies ``compare``, ``simulate`` and ``tune`` try when ``--policies``
names none (:func:`default_policies`), and which are tried only when named (:func:`named_only`):
the baselines installed packages add, which would otherwise join every run of the environment.
"""

from __future__ import annotations

from typing import Any

from kvcore.planning.registry import Registry

__all__ = ["default_policies", "named_only"]


def named_only(entry: Any) -> bool:
    """Whether a registered policy is compared only where ``--policies`` names it: one an
    installed package registers through an entry point and declares a baseline ``auto`` never
    picks (``auto_priority = None``). A package installed for its tests (the README's test
    command installs kvcore's example plugin) would otherwise add its baseline to every
    ``compare``, ``simulate`` and ``tune`` of the environment; kvcore's own policies and those
    registered explicitly are compared by default."""
    return entry.origin.source == "entry point" and getattr(entry.obj, "auto_priority", None) is None


def default_policies(registry: Registry) -> list[str]:
    """The policies ``compare``, ``simulate`` and ``tune`` try when ``--policies`` names none:
    every registered one but those :func:`named_only`."""
    return [entry.name for entry in registry.policy_entries() if not named_only(entry)]
