"""Which policies compare, simulate and tune try without --policies (issue 38: an installed
package's baseline joined every run)."""

import attrs

from kvcore.cli.policy_defaults import default_policies, named_only
from kvcore.planning.manager import PluginOrigin
from kvcore.planning.registry import Registered, Registry


@attrs.frozen
class _Policy:
    auto_priority: int | None


def _entry(source: str, priority: int | None) -> Registered:
    origin = PluginOrigin(name="acme", source=source, module="acme.policy", distribution="acme-kv")
    return Registered(name="acme.baseline", obj=_Policy(priority), origin=origin)


def test_only_an_installed_baseline_is_named_only():
    assert named_only(_entry("entry point", None))
    assert not named_only(_entry("entry point", 10))  # one auto may pick: compared by default
    assert not named_only(_entry("explicit", None))  # registered on purpose by the caller
    assert not named_only(_entry("builtin", None))  # kvcore's own (kind_pools, unified_pool)


def test_every_builtin_is_compared_by_default():
    registry = Registry.default(autoload=False)
    assert default_policies(registry) == list(registry.policies)
    assert {"kind_pools", "unified_pool"} <= set(default_policies(registry))  # auto_priority None
