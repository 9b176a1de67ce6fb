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
def policy_names() -> str:
    """The registered policies' names, comma-separated (the built-ins' if plugins fail to load)."""
    try:
        from kvcore.planning.registry import Registry

        names = sorted(Registry.default().policies)
    except KVCoreError:
        names = list(BUILTIN_POLICIES)
    return ", ".join(names)


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


def policies_help() -> LazyHelp:
    """``--policies``' help: which to compare, the registered ones named."""
    return LazyHelp(
        lambda: f"policies to compare (default: every registered policy: {policy_names()})",
        "policies to compare",
    )
