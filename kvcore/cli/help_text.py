"""Help text that names what is registered: the policies ``--policy`` takes, worked out only when
``--help`` is shown (building the registry loads every plugin, which no other parse needs)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from kvcore.errors import KVCoreError

#: The built-in policies, named when the registry cannot be built (a broken plugin).
BUILTIN_POLICIES = ("uniform", "shared_buffer", "equal_groups")


@cache
def policy_lists() -> tuple[str, str]:
    """The registered policies' names, comma-separated: those compared by default, and the
    baselines installed packages add, compared only when named
    (:func:`~kvcore.cli.policy_defaults.named_only`), each with its package. The built-ins' names and
    ``""`` if plugins fail to load."""
    try:
        from kvcore.cli.policy_defaults import named_only
        from kvcore.planning.registry import Registry

        entries = sorted(Registry.default().policy_entries(), key=lambda e: e.name)
    except KVCoreError:
        return ", ".join(BUILTIN_POLICIES), ""
    default = ", ".join(e.name for e in entries if not named_only(e))
    named = ", ".join(
        f"{e.name} (from {e.origin.distribution or e.origin.name})" for e in entries if named_only(e)
    )
    return default, named


def policy_names() -> str:
    """Every registered policy's name, comma-separated, an installed package's baseline marked
    with its package."""
    default, named = policy_lists()
    return f"{default}, {named}" if named else default


class LazyHelp(str):
    """An argparse help string made when the help is formatted: argparse expands a help string
    with ``help % params``, which calls ``make()`` here."""

    make: Callable[[], str]

    def __new__(cls, make: Callable[[], str], placeholder: str) -> LazyHelp:
        text = super().__new__(cls, placeholder)
        text.make = make
        return text

    def __mod__(self, params: Any) -> str:
        return str(self.make() % params)


def policy_help() -> LazyHelp:
    """``--policy``'s help: auto, or one of the registered policies, named."""
    return LazyHelp(
        lambda: f"allocation policy: auto (default) or one of {policy_names()}", "allocation policy"
    )


def _policies_text() -> str:
    default, named = policy_lists()
    baselines = f"; an installed package's baseline is compared when named: {named}" if named else ""
    return f"policies to compare (default: every registered one: {default}{baselines})"


def policies_help() -> LazyHelp:
    """``--policies``' help: which to compare, the registered ones named (the baselines
    installed packages add apart: compared only when named)."""
    return LazyHelp(_policies_text, "policies to compare")
